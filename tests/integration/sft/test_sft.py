"""SFT on the real engines (gloo, CPU, the tiny Llama): packed loss = unpacked loss on both backends,
a resumed run continues exactly, the export loads in transformers (and vLLM, CPU build) with the
trainer's log-probs.

    pytest tests/integration/sft/test_sft.py
    flock /tmp/streamrl-heavy.lock pytest tests/integration/sft/test_sft.py -k vllm     # starts vLLM

Tolerances: packing and micro-batching only reorder float32 sums, so the loss, gradient norm and
eval loss agree to 1e-5 relative (PACK_RTOL); an export is the checkpoint's float32 weights, so
transformers reproduces the engine's log-probs to 1e-5 (LP_ATOL) and vLLM to 1e-4 (VLLM_ATOL,
its CPU kernels sum in another order).
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.config.schema import Config, TinyModelConfig
from streamrl.models.tiny import build_tiny_model
from streamrl.train.checkpoint import list_checkpoints, load_checkpoint
from streamrl.train.dist import launch
from streamrl.train.export import checkpoint_model_state, export_checkpoint
from streamrl.train.metrics import read_metrics
from tests.engine_script import run_scenarios
from tests.integration.train.test_train_engine import make_batch

PACK_RTOL, LP_ATOL, VLLM_ATOL = 1e-5, 1e-5, 1e-4
BACKENDS = ["hf", "torchtitan"]


def _rows(n: int, seed: int) -> list[dict]:
    """Prompt/completion pairs of ragged lengths (3..40 tokens), so rows pack several documents."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    return [
        {
            "prompt": "".join(rng.choices(letters, k=rng.randint(1, 12)) + [":"]),
            "completion": "".join(rng.choices(letters, k=rng.randint(1, 27))),
        }
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    # A larger init than the default (0.02, near-uniform attention) so attention across documents shows in the loss.
    return build_tiny_model(TinyModelConfig(init_std=0.2), tmp_path_factory.mktemp("m") / "tiny", seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(64, seed=1)))
    return path


def sft_config(tiny: Path, data: Path, backend: str, **sft) -> Config:
    return Config.model_validate(
        {
            "model": {"path": str(tiny)},
            "sft": {
                "data": str(data),
                "batch_size": 16,
                "max_seq_len": 48,
                "micro_batch_tokens": 96,
                "eval_fraction": 0.25,
                "eval_every": 2,
                **sft,
            },
            "trainer": {
                "backend": backend,
                "steps": 4,
                "lr": 3e-3,
                "lr_schedule": "cosine",
                "warmup_steps": 1,
                "checkpoint_every": 2,
                "checkpoint_keep": 3,
            },
        }
    )


def _one_step(cfg: Config, out: str, rank: int, world: int) -> None:
    from streamrl.sft.step import sft_eval_loss
    from workers.sft import SFTRun

    run = SFTRun(cfg, Path(out).parent, rank, world)
    m = run.step(0)
    m["eval_loss"] = sft_eval_loss(run.engine, run.eval_samples)
    Path(out).write_text(json.dumps(m))


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_loss_equals_unpacked_loss(tiny, data, tmp_path, backend):
    got = {}
    for packing in (True, False):
        cfg = sft_config(tiny, data, backend, packing=packing)
        out = tmp_path / f"{packing}.json"
        launch(1, functools.partial(_one_step, cfg, str(out)))
        got[packing] = json.loads(out.read_text())
    packed, padded = got[True], got[False]
    assert packed["padding_frac"] == 0.0 and padded["padding_frac"] > 0.1
    assert packed["loss_tokens"] == padded["loss_tokens"] > 100
    for key in ("loss", "grad_norm", "eval_loss"):
        assert packed[key] == pytest.approx(padded[key], rel=PACK_RTOL), key


def test_cross_document_attention_would_change_the_loss(tiny, data):
    """Position resets are what keep packed documents apart: the same row with one running position
    (so attention spans documents) gives a different loss. Guards the packed == unpacked test."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from streamrl.sft.data import tokenize_row
    from streamrl.sft.pack import collate

    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    cfg = sft_config(tiny, data, "hf")
    samples = [tokenize_row(tok, r, cfg.sft) for r in _rows(4, seed=2)]
    t = collate(samples, packing=True, pad_id=0)
    keep = t["mask"] > 0

    def loss(pos):
        with torch.no_grad():
            # use_cache=False as in the engine: transformers looks for packed documents only without a cache.
            logits = model(input_ids=t["input_ids"], position_ids=pos, use_cache=False).logits
        return float(torch.nn.functional.cross_entropy(logits[keep], t["targets"][keep]))

    one_running = torch.arange(t["input_ids"].shape[1])[None]
    with torch.no_grad():
        separate = [
            float(
                torch.nn.functional.cross_entropy(
                    model(input_ids=torch.from_numpy(s.ids)[None]).logits[0, :-1][torch.from_numpy(s.mask[1:]) > 0],
                    torch.from_numpy(s.ids[1:])[torch.from_numpy(s.mask[1:]) > 0],
                    reduction="sum",
                )
            )
            for s in samples
        ]
    want = sum(separate) / float(keep.sum())
    assert loss(t["position_ids"]) == pytest.approx(want, rel=PACK_RTOL)
    assert abs(loss(one_running) - want) > 1e-3


def test_gpu_block_mask_is_the_cpu_dense_mask():
    """The torchtitan GPU path (flex_attention + document BlockMask) attends exactly like the CPU path
    (SDPA + dense block-diagonal mask); checked forward-only here, where flex has no backward."""
    from torch.nn.attention.flex_attention import flex_attention

    from streamrl.models.document_attention import document_block_mask, document_mask

    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 0, 1] * 20])  # 200 tokens: crosses flex's 128-token blocks
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, pos.shape[1], 32) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(pos))
    got = flex_attention(q, k, v, block_mask=document_block_mask(pos))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def runs(tiny, data, tmp_path_factory) -> dict[str, Path]:
    """A finished 4-step SFT run per backend (checkpoints at steps 2 and 4)."""
    from streamrl.config.files import dump_config
    from workers.sft import main

    out = {}
    for backend in BACKENDS:
        run_dir = tmp_path_factory.mktemp(f"run-{backend}")
        cfg = sft_config(tiny, data, backend)
        dump_config(cfg, run_dir / "config.yaml")
        main(cfg, run_dir)
        out[backend] = run_dir
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_continues_exactly(runs, tiny, data, tmp_path, backend):
    from workers.sft import main

    full = runs[backend]
    assert sorted(list_checkpoints(full)) == [2, 4]
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000004")  # as if it had died after step 3
    main(sft_config(tiny, data, backend), resumed, resume=True)
    a, b = read_metrics(full), read_metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    keys = ("loss", "grad_norm", "lr", "loss_tokens", "eval_loss")
    assert [{k: r.get(k) for k in keys} for r in a] == [{k: r.get(k) for k in keys} for r in b]
    assert a[0]["lr"] < a[1]["lr"] > a[3]["lr"]  # warm-up then cosine: the schedule was restored
    wa = checkpoint_model_state(full / "checkpoints" / "step-00000004")
    wb = checkpoint_model_state(resumed / "checkpoints" / "step-00000004")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert b[-1]["loss"] < b[0]["loss"]  # it learned


def _engine_logprobs(cfg: Config, ckpt: str, out: str, rank: int, world: int) -> None:
    from streamrl.train.batching import pad_batch
    from streamrl.train.engines import make_engine

    engine = make_engine(cfg, cfg.model.path, rank, world)
    load_checkpoint(engine, Path(ckpt))
    batch = make_batch(100)
    with torch.no_grad():
        lp, _ = engine.logprobs({k: v.to(engine.device) for k, v in pad_batch(batch, engine.pad_id).items()})
    rows = [lp[i, : len(r.completion_ids)].tolist() for i, r in enumerate(batch.rollouts)]
    Path(out).write_text(json.dumps(rows))


def trainer_logprobs(run_dir: Path, tmp_path: Path) -> list[list[float]]:
    from streamrl.config.files import load_config

    out = tmp_path / "engine_lp.json"
    ckpt = list_checkpoints(run_dir)[4]
    launch(1, functools.partial(_engine_logprobs, load_config(run_dir / "config.yaml"), str(ckpt), str(out)))
    return json.loads(out.read_text())


@pytest.mark.parametrize("backend", BACKENDS)
def test_export_loads_in_transformers_with_the_trainers_logprobs(runs, tiny, tmp_path, backend):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = export_checkpoint(runs[backend], tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(out)
    assert (
        AutoTokenizer.from_pretrained(out)("digits:", add_special_tokens=False)["input_ids"]
        == AutoTokenizer.from_pretrained(tiny)("digits:", add_special_tokens=False)["input_ids"]
    )
    assert GenerationConfig.from_pretrained(out).eos_token_id == 2
    want = trainer_logprobs(runs[backend], tmp_path)
    base = AutoModelForCausalLM.from_pretrained(tiny)
    for i, r in enumerate(make_batch(100).rollouts):
        seq = torch.as_tensor(np.concatenate([r.prompt_ids, r.completion_ids]).astype(np.int64))[None]
        p = len(r.prompt_ids)
        with torch.no_grad():
            got = torch.log_softmax(model(input_ids=seq).logits[0, p - 1 : -1], -1).gather(-1, seq[0, p:, None])[:, 0]
            was = torch.log_softmax(base(input_ids=seq).logits[0, p - 1 : -1], -1).gather(-1, seq[0, p:, None])[:, 0]
        np.testing.assert_allclose(got.numpy(), want[i], atol=LP_ATOL, rtol=0)
        assert (got - was).abs().max() > 1e-2  # the export holds the trained weights, not the base model's
    # An earlier step exports too, and differs.
    early = export_checkpoint(runs[backend], tmp_path / "hf2", step=2)
    a = AutoModelForCausalLM.from_pretrained(early).state_dict()
    assert any(not torch.equal(a[k], v) for k, v in model.state_dict().items())


def test_export_command(runs, tmp_path, capsys):
    from streamrl.cli import main

    assert main(["export", str(runs["torchtitan"]), "--step", "2", "--out", str(tmp_path / "out")]) == 0
    assert f"exported {tmp_path / 'out'}" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors").is_file()
    # safetensors writes 0600; the export's files all get the mode the others have (0644 under umask 022)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert set(modes.values()) == {0o644}, modes


def test_export_errors_name_the_fix(runs, tmp_path):
    from streamrl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="there are steps \\[2, 4\\]"):
        export_checkpoint(runs["hf"], tmp_path / "x", step=3)
    with pytest.raises(ConfigError, match="no config.yaml"):
        export_checkpoint(tmp_path, tmp_path / "x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="choose an empty or new directory"):
        export_checkpoint(runs["hf"], tmp_path / "busy")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_a_fresh_run_refuses_a_run_dir_with_checkpoints(runs, capsys):
    """Training from step 0 over an earlier run's checkpoints would export the earlier run's model."""
    from streamrl.cli import main

    run_dir = runs["hf"]
    code = main(["sft", "--config", str(run_dir / "config.yaml"), "--run-dir", str(run_dir)])
    assert code == 2 and f"pass --resume {run_dir}" in capsys.readouterr().err
    assert sorted(list_checkpoints(run_dir)) == [2, 4]


def test_export_gives_the_trainers_logprobs_in_vllm(runs, tmp_path):
    pytest.importorskip("vllm")
    out = export_checkpoint(runs["hf"], tmp_path / "hf")
    rollouts = make_batch(100).rollouts
    spec = {
        "model": str(out),
        "seqs": [np.concatenate([r.prompt_ids, r.completion_ids]).astype(int).tolist() for r in rollouts],
        "prompt_lens": [len(r.prompt_ids) for r in rollouts],
    }
    got = run_scenarios(__file__, tmp_path, spec, timeout=400, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    for vllm_lp, engine_lp in zip(got, trainer_logprobs(runs["hf"], tmp_path), strict=True):
        np.testing.assert_allclose(np.asarray(vllm_lp), engine_lp, atol=VLLM_ATOL, rtol=0)


def _vllm_probe(spec: dict) -> list[list[float]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], dtype="float32", max_model_len=256, enforce_eager=True, seed=0)
    outs = llm.generate(
        [{"prompt_token_ids": s} for s in spec["seqs"]],
        SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0),
        use_tqdm=False,
    )
    return [
        [o.prompt_logprobs[t][s[t]].logprob for t in range(p, len(s))]
        for o, s, p in zip(outs, spec["seqs"], spec["prompt_lens"])
    ]


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(_vllm_probe(json.loads(Path(sys.argv[1]).read_text()))))
