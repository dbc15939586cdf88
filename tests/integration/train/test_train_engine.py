"""HFEngine on real torch.distributed (gloo, CPU) with the real tiny Llama: world 1 and world 2.

    pytest tests/integration/train/test_train_engine.py

One world-1 run (in this process) and one world-2 run (2 spawned ranks) execute the same rank
function, which records log-probs, metrics and gathered weights to files; the tests compare them
with a plain (non-FSDP) transformers forward and with each other.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from streamrl.config.schema import Config, GeneratorConfig, LossConfig, TrainerConfig
from streamrl.core.batch import Batch
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Rollout
from streamrl.train.batching import pad_batch
from streamrl.train.dist import RankFailed, broadcast_object, launch
from streamrl.train.hf_engine import HFEngine

TEMPERATURE = 0.8
EXTRA_STEPS = 4  # after the compared first step, world 1 keeps training to show learning


def make_batch(vocab: int, seed: int = 0) -> Batch:
    """Six rollouts of ragged lengths; advantages +1 / -1 alternating (three groups of two)."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 5), (6, 2), (2, 7), (4, 4), (5, 3), (1, 6)]
    rollouts = [
        Rollout(
            rollout_id=f"g{i // 2}:{i % 2}",
            group_id=f"g{i // 2}",
            sample=i % 2,
            group_size=2,
            prompt_ids=rng.integers(4, vocab, p).astype(np.int32),
            completion_ids=rng.integers(4, vocab, c).astype(np.int32),
            logprobs=np.zeros(c, np.float32),
            version=0,
        )
        for i, (p, c) in enumerate(shapes)
    ]
    return Batch(
        rollouts=rollouts,
        group_index=np.arange(6) // 2,
        rewards=np.zeros(6, np.float32),
        advantages=np.array([1, -1] * 3, np.float32),
        ref_logprobs=None,
        # mixed, so the mismatch metrics (streamrl/train/mismatch.py) report both groups
        staleness=np.array([0, 1, 0, 2, 0, 0], np.int64),
    )


def reference_logprobs(model, batch: Batch) -> list[np.ndarray]:
    """log_softmax(logits / T) of a plain HF forward, one unpadded sequence at a time."""
    out = []
    with torch.no_grad():
        for r in batch.rollouts:
            seq = torch.as_tensor(np.concatenate([r.prompt_ids, r.completion_ids]).astype(np.int64))[None]
            logp = torch.log_softmax(model(input_ids=seq).logits[0].float() / TEMPERATURE, -1)
            p = len(r.prompt_ids)
            idx = torch.arange(p - 1, seq.shape[1] - 1)
            out.append(logp[idx, seq[0, p:]].numpy())
    return out


def _save_shard_logprobs(engine: HFEngine, batch: Batch, path: Path) -> None:
    shard = batch.shard(engine.rank, engine.world_size)
    with torch.no_grad():
        padded = {k: v.to(engine.device) for k, v in pad_batch(shard, engine.pad_id).items()}
        logp, _ = engine.logprobs(padded)
    rows = [logp[i, : len(r.completion_ids)].cpu() for i, r in enumerate(shard.rollouts)]
    torch.save(rows, path)


def _rank_main(
    model_path: str,
    batch: Batch,
    out: str,
    mbs: int,
    ac: bool,
    extra_steps: int,
    rank: int,
    world: int,
    device: str = "cpu",
) -> None:
    """Runs on every rank: the sequence of engine calls whose results the tests inspect."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    out_dir = Path(out)
    # logprob_chunk_tokens=4: several chunks per micro-batch, so every comparison below covers them.
    cfg = Config(
        generator=GeneratorConfig(temperature=TEMPERATURE),
        trainer=TrainerConfig(
            world_size=world,
            micro_batch_size=mbs,
            lr=1e-3,
            device=device,
            activation_checkpointing=ac,
            grad_clip=1.0,
            logprob_chunk_tokens=4,
        ),
    )
    batch = broadcast_object(batch if rank == 0 else None)
    engine = HFEngine(cfg, model_path, rank, world)
    _save_shard_logprobs(engine, batch, out_dir / f"lp0_rank{rank}.pt")
    initial = engine.full_state_dict()
    metrics = engine.train_step(batch)
    final = engine.full_state_dict()
    _save_shard_logprobs(engine, batch, out_dir / f"lp1_rank{rank}.pt")
    # `final` is saved only after these steps: if it aliased the live weights, world 1 (which
    # keeps training) would no longer match world 2 in test_world_2_and_world_1_give_the_same_step.
    history = [metrics] + [engine.train_step(batch) for _ in range(extra_steps)]
    _save_shard_logprobs(engine, batch, out_dir / f"lpN_rank{rank}.pt")
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps({"history": history, "initial_is_none": initial is None, "final_is_none": final is None})
    )
    if rank == 0:
        torch.save(initial, out_dir / "initial.pt")
        weights = out_dir / "weights"
        weights.mkdir()
        save_file(final, weights / "model.safetensors")
        shutil.copy(Path(model_path) / "config.json", weights / "config.json")


def _gather_lp(out: Path, world: int, tag: str) -> list[np.ndarray]:
    return [row.numpy() for rank in range(world) for row in torch.load(out / f"{tag}_rank{rank}.pt")]


@pytest.fixture(scope="module")
def runs(tiny, batch, tmp_path_factory) -> dict[int, Path]:
    """world 1: 2 micro-batches of 3, activation checkpointing on; world 2: 2 micro-batches per rank of 1 and 2."""
    out = {1: tmp_path_factory.mktemp("world1"), 2: tmp_path_factory.mktemp("world2")}
    launch(1, functools.partial(_rank_main, str(tiny), batch, str(out[1]), 3, True, EXTRA_STEPS))
    assert not dist.is_initialized(), "launch(1) must destroy its in-process group"
    launch(2, functools.partial(_rank_main, str(tiny), batch, str(out[2]), 2, False, 0))
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_recomputed_logprobs_match_plain_hf_forward(runs, batch, world):
    got = _gather_lp(runs[world], world, "lp0")
    for g, want in zip(got, [r.logprobs for r in batch.rollouts], strict=True):
        np.testing.assert_allclose(g, want, atol=1e-5, rtol=0)


def test_step_metrics_report_the_generator_trainer_mismatch_per_staleness(runs):
    history = json.loads((runs[1] / "rank0.json").read_text())["history"]
    groups = {"s0": 5 + 7 + 3 + 6, "stale": 2 + 4}  # completion tokens of the rows of staleness 0 / > 0
    for m in (history[0], history[-1]):
        for g, tokens in groups.items():
            keys = [f"mismatch_{k}_{g}" for k in ("kl", "ratio_max", "ratio_p99", "ess", "tokens")]
            assert all(np.isfinite(m[k]) for k in keys), {k: m.get(k) for k in keys}
            assert m[f"mismatch_tokens_{g}"] == tokens
    # the behaviour log-probs are the initial policy's: on-policy at the first step ...
    assert history[0]["mismatch_kl_s0"] == pytest.approx(0, abs=1e-6)
    assert history[0]["mismatch_ess_s0"] == pytest.approx(1, abs=1e-6)
    assert history[0]["mismatch_ratio_max_s0"] == pytest.approx(1, abs=1e-4)
    # ... and after EXTRA_STEPS optimizer steps on the same rollouts the trainer has moved away
    last = history[-1]
    assert last["mismatch_kl_s0"] > 1e-6 and last["mismatch_ess_s0"] < 1
    assert last["mismatch_ratio_max_s0"] >= last["mismatch_ratio_p99_s0"] > 0


def test_world_2_and_world_1_give_the_same_step(runs):
    m1, m2 = (json.loads((runs[w] / "rank0.json").read_text())["history"][0] for w in (1, 2))
    other = json.loads((runs[2] / "rank1.json").read_text())["history"][0]
    assert m2 == other, "every rank must return the same all-reduced metrics"
    # grad_norm is the pre-clip norm: a wrong scale across ranks or micro-batches shows here even
    # though Adam's first update is scale-invariant.
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert m1["grad_norm"] > 1e-3
    for key in set(m1) - {"time_s", "padded_tokens"}:  # padding depends on the split
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-6), key
    assert m1["tokens"] == 27 and m1["seqs"] == 6 and m1["lr"] == 1e-3 and m1["skipped_step"] == 0
    # Entropy is logged even without an entropy bonus (trainer.log_entropy): near log(vocab) at init.
    assert 0.5 * np.log(100) < m1["entropy"] <= np.log(100) + 1e-6
    from safetensors.torch import load_file

    w1, w2 = (load_file(runs[w] / "weights" / "model.safetensors") for w in (1, 2))
    initial = torch.load(runs[1] / "initial.pt")
    moved = max((w1[k] - initial[k]).abs().max().item() for k in w1)
    assert moved > 1e-4, "the step must change the weights"
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=1e-5, rtol=0, msg=k)


def test_training_raises_logprobs_of_positive_advantage_sequences(runs, batch):
    before, after = _gather_lp(runs[1], 1, "lp0"), _gather_lp(runs[1], 1, "lpN")
    for b, a, adv in zip(before, after, batch.advantages, strict=True):
        delta = float(a.sum() - b.sum())
        assert delta > 0.05 if adv > 0 else delta < -0.05, (adv, delta)
    history = json.loads((runs[1] / "rank0.json").read_text())["history"]
    assert len(history) == 1 + EXTRA_STEPS and all(np.isfinite(h["grad_norm"]) for h in history)


@pytest.mark.parametrize("world", [1, 2])
def test_full_state_dict_is_the_hf_state_dict_on_rank_0_only(runs, hf_model, world):
    initial = torch.load(runs[world] / "initial.pt")
    expected = hf_model.state_dict()
    assert list(initial) == list(expected)
    for k, v in expected.items():
        assert initial[k].device.type == "cpu" and initial[k].is_contiguous()
        torch.testing.assert_close(initial[k], v, atol=0, rtol=0, msg=k)
    ranks = [json.loads((runs[world] / f"rank{r}.json").read_text()) for r in range(world)]
    assert [r["initial_is_none"] for r in ranks] == [False] + [True] * (world - 1)
    assert [r["final_is_none"] for r in ranks] == [False] + [True] * (world - 1)


@pytest.mark.parametrize("world", [1, 2])
def test_published_weights_reload_with_identical_outputs(runs, batch, world):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(runs[world] / "weights", dtype=torch.float32).eval()
    engine_lp = _gather_lp(runs[world], world, "lp1")
    for g, want in zip(engine_lp, reference_logprobs(model, batch), strict=True):
        np.testing.assert_allclose(g, want, atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_nccl_ranks_on_gpu_match_the_cpu_run(runs, batch, tiny, tmp_path):
    """The NCCL path: same batch on 1-2 GPUs gives the CPU run's log-probs and updated weights."""
    world = min(2, torch.cuda.device_count())
    if world == 0:
        pytest.skip("needs a CUDA GPU")
    launch(world, functools.partial(_rank_main, str(tiny), batch, str(tmp_path), 2, False, 0, device="cuda"))
    for g, want in zip(_gather_lp(tmp_path, world, "lp0"), [r.logprobs for r in batch.rollouts], strict=True):
        np.testing.assert_allclose(g, want, atol=1e-4, rtol=0)
    m_gpu = json.loads((tmp_path / "rank0.json").read_text())["history"][0]
    m_cpu = json.loads((runs[1] / "rank0.json").read_text())["history"][0]
    assert m_gpu["grad_norm"] == pytest.approx(m_cpu["grad_norm"], rel=1e-4)
    from safetensors.torch import load_file

    w_gpu, w_cpu = (load_file(d / "weights" / "model.safetensors") for d in (tmp_path, runs[1]))
    assert list(w_gpu) == list(w_cpu)
    for k in w_cpu:
        assert w_gpu[k].device.type == "cpu"
        torch.testing.assert_close(w_gpu[k], w_cpu[k], atol=1e-4, rtol=0, msg=k)


def _optional_inputs_main(model_path: str, batch: Batch, out: str, rank: int, world: int) -> None:
    """decoupled_ppo + entropy bonus + KL: the engine fills prox_logprobs, entropy, ref_logprobs."""
    cfg = Config(
        generator=GeneratorConfig(temperature=TEMPERATURE),
        loss=LossConfig(name="decoupled_ppo", kl_beta=0.1, entropy_coef=0.01),
        trainer=TrainerConfig(device="cpu", micro_batch_size=4),
    )
    engine = HFEngine(cfg, model_path, rank, world)
    assert engine.requirements == {"prox_logprobs", "entropy", "ref_logprobs"}
    bare = copy.copy(batch)
    bare.ref_logprobs = None
    try:
        engine.train_step(bare)
        raise AssertionError("a batch without ref_logprobs must be refused when kl_beta > 0")
    except ConfigError as exc:
        Path(out, "refused.txt").write_text(str(exc))
    with_ref = copy.copy(batch)
    # Reference = behaviour policy shifted by 0.1 nat per token: the k3 KL is then known in closed form.
    with_ref.ref_logprobs = [r.logprobs - 0.1 for r in batch.rollouts]
    Path(out, "metrics.json").write_text(json.dumps(engine.train_step(with_ref)))


def test_prox_entropy_and_ref_inputs_reach_the_loss(tiny, batch, tmp_path):
    launch(1, functools.partial(_optional_inputs_main, str(tiny), batch, str(tmp_path)))
    assert "kl_beta > 0" in (tmp_path / "refused.txt").read_text()
    m = json.loads((tmp_path / "metrics.json").read_text())
    # On-policy first step: prox == current == behaviour, so the ratio is exactly 1 and nothing clips.
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["clip_frac_low"] == m["clip_frac_high"] == 0.0
    assert m["kl"] == pytest.approx(np.exp(-0.1) + 0.1 - 1, rel=1e-3)  # k3 with log(ref/pi) = -0.1
    assert 0 < m["entropy"] < np.log(100) and m["skipped_step"] == 0 and np.isfinite(m["grad_norm"])


def _grads_main(
    model_path: str,
    batch: Batch,
    out: str,
    chunk: int,
    rank: int,
    world: int,
    backend: str = "hf",
    micro_batch_tokens: int = 0,
) -> None:
    """One step with an entropy bonus and a KL term; the full gradient of every weight to a file."""
    from streamrl.train.engines import make_engine

    cfg = Config(
        generator=GeneratorConfig(temperature=TEMPERATURE),
        loss=LossConfig(kl_beta=0.1, entropy_coef=0.01),
        trainer=TrainerConfig(
            world_size=world,
            device="cpu",
            micro_batch_size=2,
            logprob_chunk_tokens=chunk,
            grad_clip=1e9,
            backend=backend,
            micro_batch_tokens=micro_batch_tokens,
        ),
    )
    # (grad_clip 1e9: no clipping, the raw gradients are compared)
    batch = broadcast_object(batch if rank == 0 else None)
    batch = copy.copy(batch)
    batch.ref_logprobs = [r.logprobs - 0.1 for r in batch.rollouts]
    engine = make_engine(cfg, model_path, rank, world)
    metrics = engine.train_step(batch)
    grads = {n: p.grad.full_tensor() for n, p in engine.model.named_parameters()}
    if rank == 0:
        torch.save({"grads": grads, "metrics": metrics}, Path(out) / "grads.pt")


@pytest.mark.parametrize("arch", ["llama", "qwen3-tied"])
def test_chunked_logprobs_and_token_budget_micro_batches_give_the_full_logits_gradient(tiny, batch, tmp_path, arch):
    """The engine's step with chunked log-probs (3 tokens a chunk, FSDP over 2 ranks) has the
    gradient of the full-logits step (row-count slices, 1 rank), entropy bonus and KL included; also
    with the LM head tied to the embeddings (Qwen3), where FSDP's root group holds the shared weight.
    On the Llama the 2-rank step also packs its rows by trainer.micro_batch_tokens (sorted by length,
    here 2 micro-batches of 1-2 rows on each rank, each padded to its own longest row): the same
    gradient, the same input tokens, fewer padded positions. (One 2-rank run for both: each spawn of
    two ranks cost ~20 s of CPU; either part broken breaks the equality.)"""
    from streamrl.models.shapes import build_random_model

    model = str(tiny if arch == "llama" else build_random_model("qwen3-tiny", tmp_path / "qwen3", "float32"))
    budget = 16 if arch == "llama" else 0
    full, chunked = tmp_path / "full", tmp_path / "chunked"
    full.mkdir(), chunked.mkdir()
    launch(1, functools.partial(_grads_main, model, batch, str(full), 0))
    launch(2, functools.partial(_grads_main, model, batch, str(chunked), 3, micro_batch_tokens=budget))
    a, b = torch.load(full / "grads.pt"), torch.load(chunked / "grads.pt")
    assert a["metrics"]["grad_norm"] == pytest.approx(b["metrics"]["grad_norm"], rel=1e-5)
    assert a["metrics"]["grad_norm"] > 1e-3
    for key in ("loss", "entropy", "kl", "pg_loss"):
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], rel=1e-5, abs=1e-7), key
    assert list(a["grads"]) == list(b["grads"])
    for name, g in a["grads"].items():
        torch.testing.assert_close(b["grads"][name], g, atol=1e-6, rtol=1e-5, msg=name)
    if budget:
        assert (
            a["metrics"]["input_tokens"]
            == b["metrics"]["input_tokens"]
            == sum(len(r.prompt_ids) + len(r.completion_ids) for r in batch.rollouts)
        )
        assert b["metrics"]["padded_tokens"] < a["metrics"]["padded_tokens"]


@pytest.mark.parametrize("arch", ["llama", "qwen3-tied"])
def test_hf_hidden_states_path_equals_the_logits_path_in_float64(tiny, batch, arch, tmp_path):
    """decoder_hidden_states + chunked log-probs on real transformers models (the tiny Llama, and a
    Qwen3 with tied embeddings): the logits path's values and gradients of every weight, float64."""
    from transformers import AutoModelForCausalLM

    from streamrl.models.hf import check_plain_head, decoder_hidden_states
    from streamrl.models.logprobs import gathered_logprobs
    from streamrl.models.shapes import build_random_model

    path = tiny if arch == "llama" else build_random_model("qwen3-tiny", tmp_path / "qwen3", "float32")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    assert model.config.tie_word_embeddings == (arch == "qwen3-tied")
    t = pad_batch(batch, 0)
    weights = torch.linspace(-1, 1, t["mask"].numel(), dtype=torch.float64).view_as(t["mask"]) * t["mask"]

    def grads(lp, ent):
        loss = (weights * lp).sum() + 0.1 * (weights * ent).sum()
        return lp.detach(), torch.autograd.grad(loss, list(model.parameters()))

    logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"]).logits
    # token_logprobs' indexing in float64 (token_logprobs itself softmaxes in float32)
    logp_all = torch.log_softmax(logits[torch.arange(len(batch))[:, None], t["positions"]] / TEMPERATURE, -1)
    lp_full = logp_all.gather(-1, t["targets"][..., None])[..., 0]
    ent_full = -(logp_all.exp() * logp_all).sum(-1)
    want_lp, want = grads(lp_full * t["mask"].double(), ent_full * t["mask"].double())
    head = check_plain_head(model)
    hidden = decoder_hidden_states(model, t["input_ids"], t["attention_mask"])
    lp, ent = gathered_logprobs(
        hidden, head.weight, head.bias, t["positions"], t["targets"], t["lengths"], TEMPERATURE, 5, True
    )
    got_lp, got = grads(lp, ent)
    torch.testing.assert_close(got_lp, want_lp, rtol=0, atol=1e-12)
    for (name, _), g, w in zip(model.named_parameters(), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10, msg=name)


def _fail_on_rank_1(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("boom from the test")
    dist.barrier()  # left waiting: launch must terminate it rather than hang


def _fail_alone(rank: int, world: int) -> None:
    raise KeyError("lonely")


def test_launch_names_the_failing_rank():
    with pytest.raises(RankFailed, match=r"rank 1 failed(.|\n)*ValueError: boom from the test") as err:
        launch(2, _fail_on_rank_1)
    assert err.value.rank == 1
    with pytest.raises(RankFailed, match="rank 0 failed: KeyError") as err:
        launch(1, _fail_alone)
    assert not dist.is_initialized()


def test_reference_worker_logprobs_match_the_plain_forward(hf_model, batch):
    """streamrl.models.hf.completion_logprobs (the reference worker's) goes through the same chunked
    function: equal to a plain per-sequence forward, ragged rows and an empty completion included."""
    from streamrl.models.hf import completion_logprobs

    prompts = [r.prompt_ids for r in batch.rollouts] + [batch.rollouts[0].prompt_ids]
    completions = [r.completion_ids for r in batch.rollouts] + [np.zeros(0, np.int32)]
    got = completion_logprobs(hf_model, prompts, completions, TEMPERATURE, chunk_tokens=4)
    for g, want in zip(got[:-1], reference_logprobs(hf_model, batch), strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, want, atol=1e-5, rtol=0)
    assert got[-1].shape == (0,)


def _engine_logprobs_main(model_path: str, batch: Batch, out: str, chunk: int, rank: int, world: int) -> None:
    torch.set_num_threads(1)
    cfg = Config(
        generator=GeneratorConfig(temperature=TEMPERATURE),
        trainer=TrainerConfig(world_size=world, device="cpu", logprob_chunk_tokens=chunk),
    )
    _save_shard_logprobs(HFEngine(cfg, model_path, rank, world), batch, Path(out) / f"lp_rank{rank}.pt")


@pytest.mark.parametrize("chunk", [0, 4])
def test_reference_worker_and_trainer_logprobs_are_identical(tiny, hf_model, batch, tmp_path, chunk):
    """The two sides of the KL term come from one function (streamrl.models.hf.causal_lm_logprobs) with
    the trainer's logprob_chunk_tokens: the reference worker's log-probs of the same model and tokens
    are bit for bit the trainer engine's, with full logits (0) and chunked (4)."""
    from workers.reference import ReferenceWorker

    launch(1, functools.partial(_engine_logprobs_main, str(tiny), batch, str(tmp_path), chunk))
    trainer = _gather_lp(tmp_path, 1, "lp")
    cfg = Config(generator=GeneratorConfig(temperature=TEMPERATURE), trainer=TrainerConfig(logprob_chunk_tokens=chunk))
    worker = ReferenceWorker(cfg, None, "reference-test")
    worker.model = hf_model
    reference = worker._logprobs(batch.rollouts)
    for t, r in zip(trainer, reference, strict=True):
        np.testing.assert_array_equal(t, r)
