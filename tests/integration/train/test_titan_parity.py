"""Log-prob parity of the torchtitan trainer backend with Hugging Face, the hf backend and vLLM CPU.

    pytest tests/integration/train/test_titan_parity.py
    python tests/integration/train/test_titan_parity.py spec.json out.json   # the vLLM probe (subprocess)

The tiny Llama (streamrl.models.tiny) runs in TitanEngine on real gloo ranks: world 1 (activation
checkpointing on), world 2 (FSDP2 over 2 ranks), world 2 with tensor parallel 2, and the hf
backend's HFEngine on the same batch. Tolerances (float32 on CPU):
- torchtitan vs a plain transformers forward: 1e-5 nats per token (measured ~5e-7);
- one AdamW step on each weight: world 2 vs world 1 1e-5; torchtitan vs the hf backend and tp 2 vs
  world 1 5e-5 (other summation orders: Adam's first update divides by |grad|, so ~1e-7 of gradient
  noise moves a weight whose gradient is near 0 by ~1e-5 at lr=1e-3; measured max 1.4e-5, 1.2e-5);
- vLLM CPU prompt log-probs vs the engine: 1e-4 nats per token (different CPU kernels).
The weight round trip publishes the trained weights through the shm weight store, fetches them
and reloads them into the running vLLM engine (the generator's reload path).
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.config.schema import Config, GeneratorConfig, ParallelismConfig, TinyModelConfig, TrainerConfig
from streamrl.core.batch import Batch
from streamrl.models.tiny import build_tiny_model
from streamrl.train.batching import pad_batch
from streamrl.train.dist import broadcast_object, launch
from streamrl.train.engines import make_engine
from tests.engine_script import run_scenarios
from tests.integration.train.test_train_engine import make_batch

LP_ATOL, VLLM_ATOL = 1e-5, 1e-4


def hf_logprobs(model, batch: Batch) -> list[np.ndarray]:
    """Per-token log-probs (temperature 1) of each completion under a plain transformers forward."""
    out = []
    with torch.no_grad():
        for r in batch.rollouts:
            seq = torch.as_tensor(np.concatenate([r.prompt_ids, r.completion_ids]).astype(np.int64))[None]
            logp = torch.log_softmax(model(input_ids=seq).logits[0].float(), -1)
            p = len(r.prompt_ids)
            out.append(logp[torch.arange(p - 1, seq.shape[1] - 1), seq[0, p:]].numpy())
    return out


def _shard_logprobs(engine, batch: Batch) -> list[torch.Tensor]:
    shard = batch.shard(engine.dp_rank, engine.dp_size)
    with torch.no_grad():
        logp, _ = engine.logprobs({k: v.to(engine.device) for k, v in pad_batch(shard, engine.pad_id).items()})
    return [logp[i, : len(r.completion_ids)].cpu() for i, r in enumerate(shard.rollouts)]


def _rank_main(
    model_path: str,
    batch: Batch,
    out: str,
    backend: str,
    mbs: int,
    ac: bool,
    tp: int,
    rank: int,
    world: int,
    chunk: int = 4,
) -> None:
    """Every rank: log-probs before/after one step, the full state dicts, the metrics (to files).
    chunk = trainer.logprob_chunk_tokens (4: several chunks per micro-batch; 0: full logits)."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    cfg = Config(
        generator=GeneratorConfig(temperature=1.0),
        trainer=TrainerConfig(
            world_size=world,
            micro_batch_size=mbs,
            lr=1e-3,
            device="cpu",
            backend=backend,
            activation_checkpointing=ac,
            parallelism=ParallelismConfig(tp=tp),
            logprob_chunk_tokens=chunk,
        ),
    )
    batch = broadcast_object(batch if rank == 0 else None)
    engine = make_engine(cfg, model_path, rank, world)
    lp0 = _shard_logprobs(engine, batch)
    initial = engine.full_state_dict()
    metrics = engine.train_step(batch)
    final = engine.full_state_dict()
    lp1 = _shard_logprobs(engine, batch)
    out_dir = Path(out)
    # Ranks of one tensor-parallel group hold the same rows: only the first of each writes them.
    if rank % tp == 0:
        torch.save({"lp0": lp0, "lp1": lp1}, out_dir / f"lp_dp{engine.dp_rank}.pt")
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps(
            {"metrics": metrics, "none": [initial is None, final is None], "dp": [engine.dp_rank, engine.dp_size]}
        )
    )
    if rank == 0:
        save_file(initial, out_dir / "initial.safetensors")
        save_file(final, out_dir / "final.safetensors")


def _lp(out: Path, tag: str) -> list[np.ndarray]:
    dp = json.loads((out / "rank0.json").read_text())["dp"][1]
    return [row.numpy() for r in range(dp) for row in torch.load(out / f"lp_dp{r}.pt")[tag]]


def _read(out: Path, name: str):
    from safetensors.torch import load_file

    return json.loads((out / name).read_text()) if name.endswith(".json") else load_file(out / name)


@pytest.fixture(scope="module")
def batch(tiny) -> Batch:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    b = make_batch(model.config.vocab_size)
    for r, lp in zip(b.rollouts, hf_logprobs(model, b)):  # on-policy first step
        r.logprobs = lp.astype(np.float32)
    return b


@pytest.fixture(scope="module")
def runs(tiny, batch, tmp_path_factory) -> dict[str, Path]:
    # The hf run forms the full logits, the torchtitan runs take the hidden-state path (one chunk:
    # several chunks change the summation order, which Adam's first step amplifies past these
    # tolerances on near-zero gradients; test_chunked_titan_step_has_the_full_logits_gradient
    # compares several chunks on the gradient itself).
    specs = {
        "titan1": (1, "torchtitan", 3, True, 2048),
        "titan2": (2, "torchtitan", 2, False, 2048),
        "hf1": (1, "hf", 3, False, 0),
    }
    out = {}
    for name, (world, backend, mbs, ac, chunk) in specs.items():
        out[name] = tmp_path_factory.mktemp(name)
        launch(world, functools.partial(_rank_main, str(tiny), batch, str(out[name]), backend, mbs, ac, 1, chunk=chunk))
    return out


@pytest.mark.parametrize("run", ["titan1", "titan2"])
def test_titan_logprobs_match_the_hf_forward(runs, batch, run):
    for got, want in zip(_lp(runs[run], "lp0"), [r.logprobs for r in batch.rollouts], strict=True):
        np.testing.assert_allclose(got, want, atol=LP_ATOL, rtol=0)


@pytest.mark.parametrize("run", ["titan1", "titan2"])
def test_full_state_dict_is_the_checkpoint_in_hf_names_on_rank_0_only(runs, tiny, run):
    initial, ckpt = _read(runs[run], "initial.safetensors"), _read(Path(tiny), "model.safetensors")
    assert sorted(initial) == sorted(ckpt)
    for k in ckpt:  # from_hf then to_hf (q/k permutations included) is exact
        torch.testing.assert_close(initial[k], ckpt[k], atol=0, rtol=0, msg=k)
    world = 2 if run == "titan2" else 1
    nones = [_read(runs[run], f"rank{r}.json")["none"] for r in range(world)]
    assert nones == [[False, False]] + [[True, True]] * (world - 1)


@pytest.mark.parametrize("other, atol", [("titan2", 1e-5), ("hf1", 5e-5)])
def test_one_step_matches_world_1_and_the_hf_backend(runs, other, atol):
    m1, m2 = (_read(runs[r], "rank0.json")["metrics"] for r in ("titan1", other))
    assert m1["grad_norm"] > 1e-3 and m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    for key in set(m1) - {"time_s", "padded_tokens"}:  # padding depends on the split
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-6), key
    w1, w2, w0 = (
        _read(runs["titan1"], "final.safetensors"),
        _read(runs[other], "final.safetensors"),
        _read(runs["titan1"], "initial.safetensors"),
    )
    assert max((w1[k] - w0[k]).abs().max().item() for k in w1) > 5e-4, "the step must move the weights"
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def test_tensor_parallel_2_matches_world_1(tmp_path, batch):
    """tp=2 needs KV heads divisible by 2: the tiny shape with 2 KV heads, world 1 vs tp 2."""
    model = build_tiny_model(TinyModelConfig(num_kv_heads=2), tmp_path / "kv2", seed=0)
    from transformers import AutoModelForCausalLM

    b = make_batch(100, seed=1)
    for r, lp in zip(b.rollouts, hf_logprobs(AutoModelForCausalLM.from_pretrained(model).eval(), b)):
        r.logprobs = lp.astype(np.float32)
    (tmp_path / "w1").mkdir(), (tmp_path / "tp2").mkdir()
    launch(1, functools.partial(_rank_main, str(model), b, str(tmp_path / "w1"), "torchtitan", 3, False, 1, chunk=0))
    launch(2, functools.partial(_rank_main, str(model), b, str(tmp_path / "tp2"), "torchtitan", 3, False, 2))
    assert _read(tmp_path / "tp2", "rank1.json")["dp"] == [0, 1]  # both ranks train the same rows
    for got, want in zip(_lp(tmp_path / "tp2", "lp0"), [r.logprobs for r in b.rollouts], strict=True):
        np.testing.assert_allclose(got, want, atol=LP_ATOL, rtol=0)
    m1, m2 = (_read(tmp_path / d, "rank0.json")["metrics"] for d in ("w1", "tp2"))
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5), "metrics must not be summed over TP ranks"
    w1, w2 = _read(tmp_path / "w1", "final.safetensors"), _read(tmp_path / "tp2", "final.safetensors")
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=5e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("arch", ["llama", "qwen3-tied"])
def test_chunked_titan_step_has_the_full_logits_gradient(tiny, batch, tmp_path, arch):
    """torchtitan backend, 3-token chunks over FSDP2 on 2 ranks vs full logits on 1 rank: the same
    gradient of every weight (entropy bonus and KL included), also with tied embeddings (Qwen3)."""
    from streamrl.models.shapes import build_random_model
    from tests.integration.train.test_train_engine import _grads_main

    model = str(tiny if arch == "llama" else build_random_model("qwen3-tiny", tmp_path / "qwen3", "float32"))
    full, chunked = tmp_path / "full", tmp_path / "chunked"
    full.mkdir(), chunked.mkdir()
    launch(1, functools.partial(_grads_main, model, batch, str(full), 0, backend="torchtitan"))
    launch(2, functools.partial(_grads_main, model, batch, str(chunked), 3, backend="torchtitan"))
    a, b = torch.load(full / "grads.pt"), torch.load(chunked / "grads.pt")
    assert a["metrics"]["grad_norm"] > 1e-3
    assert a["metrics"]["grad_norm"] == pytest.approx(b["metrics"]["grad_norm"], rel=1e-5)
    assert list(a["grads"]) == list(b["grads"])
    for name, g in a["grads"].items():
        torch.testing.assert_close(b["grads"][name], g, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.anyio
async def test_vllm_gives_the_engine_logprobs_before_and_after_a_store_round_trip(
    runs, batch, tiny, config, broker, tmp_path
):
    from streamrl.weights.shm import shm_root
    from streamrl.weights.store import make_loader, make_publisher

    store, loader = make_publisher(config, broker, tmp_path), make_loader(config, broker, tmp_path)
    try:
        await store.publish(1, _read(runs["titan2"], "final.safetensors"))
        local = await loader.fetch(await loader.latest())
        got = _run_probe(tiny, local, batch, tmp_path)
    finally:
        await loader.close()
        shutil.rmtree(shm_root(config.run.name, tmp_path), ignore_errors=True)
    for tag, key in (("lp0", "before"), ("lp1", "after")):
        for engine_lp, vllm_lp in zip(_lp(runs["titan2"], tag), got[key], strict=True):
            np.testing.assert_allclose(np.asarray(vllm_lp), engine_lp, atol=VLLM_ATOL, rtol=0, err_msg=key)
    moved = max(np.abs(np.subtract(a, b)).max() for a, b in zip(got["before"], got["after"]))
    assert moved > 1e-3, "the reload must change vLLM's log-probs (the step moved the weights)"


def _run_probe(tiny: Path, local: str, batch: Batch, tmp_path: Path) -> dict:
    seqs = [np.concatenate([r.prompt_ids, r.completion_ids]).astype(int).tolist() for r in batch.rollouts]
    spec = {
        "model": str(tiny),
        "reload": local,
        "seqs": seqs,
        "prompt_lens": [len(r.prompt_ids) for r in batch.rollouts],
    }
    return run_scenarios(__file__, tmp_path, spec, timeout=400, VLLM_ENABLE_V1_MULTIPROCESSING="0")


def _vllm_probe(spec: dict) -> dict:
    """Completion log-probs of each sequence from vLLM (prompt_logprobs), before and after reload."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=spec["model"], dtype="float32", max_model_len=256, enforce_eager=True, seed=0)
    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)

    def logprobs() -> list[list[float]]:
        outs = llm.generate([{"prompt_token_ids": s} for s in spec["seqs"]], params, use_tqdm=False)
        return [
            [o.prompt_logprobs[t][s[t]].logprob for t in range(p, len(s))]
            for o, s, p in zip(outs, spec["seqs"], spec["prompt_lens"])
        ]

    before = logprobs()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": spec["reload"]})
    return {"before": before, "after": logprobs()}


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(_vllm_probe(json.loads(Path(sys.argv[1]).read_text()))))
