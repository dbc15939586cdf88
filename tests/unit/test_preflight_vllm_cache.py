"""The pre-flight `import vllm` check remembers a success per install and re-checks any other one."""

from __future__ import annotations

import sys

from streamrl.config.schema import Config
from streamrl.launch.preflight import _vllm_install_key, check_vllm


def test_a_success_is_stamped_and_a_changed_install_is_checked_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))  # the install's own folder
    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))
    cfg = Config()
    assert cfg.generator.count > 0
    assert check_vllm(cfg) is None
    assert not (tmp_path / "cache").exists()  # remembered in the install, not in the job's cache
    stamps = list((tmp_path / "prefix" / ".streamrl-preflight").iterdir())
    assert [p.name for p in stamps] == [f"vllm-import-ok-{_vllm_install_key()}"]

    # A `vllm` that fails to import, first on the path (as PYTHONPATH puts it for the subprocess):
    # another install, so the stamp of the good one does not answer for it.
    shim = tmp_path / "shim"
    (shim / "vllm").mkdir(parents=True)
    (shim / "vllm" / "__init__.py").write_text('raise ImportError("broken vllm (test shim)")\n')
    monkeypatch.setenv("PYTHONPATH", f"{shim}:{sys.path[0]}")
    monkeypatch.syspath_prepend(str(shim))
    assert _vllm_install_key() != stamps[0].name.removeprefix("vllm-import-ok-")
    error = check_vllm(cfg)
    assert error is not None and "broken vllm (test shim)" in error
    assert len(list((tmp_path / "prefix" / ".streamrl-preflight").iterdir())) == 1  # a failure is never stamped
