"""The tiny charclass task's learning run through the trainer side alone (a diagnostic, not collected by
pytest): an on-policy loop whose sampler is the trainer's own model (adapter on with trainer.lora), the
real charclass task and reward, group advantages, GRPO with the KL term to the base (with LoRA computed
by the HFEngine step itself with the adapter disabled: reference.source=trainer, as in the job), and the
real HFEngine step. When tests/e2e/test_up_lora.py's learning gate fails, this says whether the trainer
side learns without the generator, the broker and the other roles:

    python -m tests.integration.train.lora_learning                          # configs/tiny-lora-cpu.yaml
    python -m tests.integration.train.lora_learning configs/tiny-cpu.yaml    # the full-weight tiny job

It prints the first/last-10 reward means and exits 1 unless the last 10 are at least 0.3 above the first
10 (the gate of tests/e2e/test_up.py and tests/e2e/test_up_lora.py). It was a test until 2026-12-07
(~100 s of `make test`, the same 40 steps of the same config as test_up_lora's gate, which now holds it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from streamrl.annotate.rewards import charclass_reward
from streamrl.assemble.advantages import batch_advantages
from streamrl.config.files import load_config
from streamrl.config.schema import Config
from streamrl.core.batch import Batch
from streamrl.core.messages import Rollout
from streamrl.feed.sources import load_task
from streamrl.models.tiny import resolve_model_path
from streamrl.train.dist import launch
from streamrl.train.hf_engine import HFEngine

STEPS = 40  # tests/e2e/test_up.py's run of the full-weight tiny job


@torch.no_grad()
def sample_group(model, prompt_ids: list[int], n: int, max_tokens: int, temperature: float, eos: int, gen):
    """n completions of one prompt from `model` (no KV cache: the tiny model's forwards are cheap),
    each cut after its first eos; with their sampling log-probs."""
    ids = torch.tensor([prompt_ids] * n)
    logps = []
    for _ in range(max_tokens):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1].float() / temperature
        logp = torch.log_softmax(logits, -1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen)
        logps.append(logp.gather(1, tok))
        ids = torch.cat([ids, tok], 1)
    comp, lp = ids[:, len(prompt_ids) :].numpy(), torch.cat(logps, 1).numpy()
    out = []
    for row, row_lp in zip(comp, lp):
        stop = int(np.argmax(row == eos)) + 1 if (row == eos).any() else len(row)
        out.append((row[:stop].astype(np.int32), row_lp[:stop].astype(np.float32)))
    return out


def _ref_logprobs(engine: HFEngine, batch: Batch) -> list[np.ndarray]:
    """A full-weight run's stand-in for its reference worker: the policy's own log-probs (KL 0)."""
    from streamrl.train.batching import pad_batch

    with torch.no_grad():
        padded = {k: v.to(engine.device) for k, v in pad_batch(batch, engine.pad_id).items()}
        logp, _ = engine.logprobs(padded)
    return [logp[i, : len(r.completion_ids)].numpy().astype(np.float32) for i, r in enumerate(batch.rollouts)]


def learning_run(cfg: Config, model_path: str, out: str, rank: int, world: int) -> None:
    """One rank (world 1): STEPS on-policy steps of cfg's job; the reward means go to `out`."""
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    engine = HFEngine(cfg, model_path, rank, world)
    tok = AutoTokenizer.from_pretrained(model_path)
    items = load_task(cfg.task, cfg.run.seed, max_tokens=cfg.generator.max_tokens)
    gen = torch.Generator().manual_seed(cfg.run.seed)
    rollout, rewards_per_step = cfg.rollout, []
    for step in range(STEPS):
        rollouts, rewards = [], []
        for g in range(rollout.groups_per_step):
            item = items[(step * rollout.groups_per_step + g) % len(items)]
            prompt = tok(item["text"])["input_ids"]
            engine.model.eval()
            samples = sample_group(
                engine.model, prompt, rollout.group_size, cfg.generator.max_tokens, cfg.generator.temperature,
                tok.eos_token_id, gen,
            )  # fmt: skip
            engine.model.train()
            for i, (comp, lp) in enumerate(samples):
                rollouts.append(
                    Rollout(
                        rollout_id=f"s{step}g{g}:{i}",
                        group_id=f"s{step}g{g}",
                        sample=i,
                        group_size=rollout.group_size,
                        prompt_ids=np.asarray(prompt, np.int32),
                        completion_ids=comp,
                        logprobs=lp,
                        version=step,
                    )  # fmt: skip
                )
                rewards.append(charclass_reward(item["text"], tok.decode(comp, skip_special_tokens=True), item["meta"]))
        rewards = np.asarray(rewards, np.float32)
        index = np.repeat(np.arange(rollout.groups_per_step), rollout.group_size)
        batch = Batch(
            rollouts, index, rewards, batch_advantages(rewards, index, cfg.loss.advantage), None,
            np.zeros(len(rollouts), np.int64),
        )  # fmt: skip
        if cfg.loss.kl_beta > 0 and not cfg.reference_in_trainer():  # with LoRA the step computes them
            batch.ref_logprobs = _ref_logprobs(engine, batch)
        engine.train_step(batch)
        rewards_per_step.append(float(rewards.mean()))
    Path(out).write_text(json.dumps(rewards_per_step))


def first_last(rewards: list[float]) -> tuple[float, float]:
    return float(np.mean(rewards[:10])), float(np.mean(rewards[-10:]))


def main(argv: list[str] | None = None) -> int:
    import sys
    import tempfile

    config = (argv if argv is not None else sys.argv[1:] or ["configs/tiny-lora-cpu.yaml"])[0]
    cfg = load_config(config)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(resolve_model_path(cfg.model, Path(tmp) / "models", cfg.run.seed))
        out = str(Path(tmp) / "rewards.json")
        launch(1, lambda rank, world: learning_run(cfg, model_path, out, rank, world))
        first, last = first_last(json.loads(Path(out).read_text()))
    print(f"{config}: lora={cfg.trainer.lora.enabled} lr={cfg.trainer.lr} first10={first:.3f} last10={last:.3f}")
    return 0 if last - first >= 0.3 else 1


if __name__ == "__main__":
    raise SystemExit(main())
