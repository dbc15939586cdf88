"""Reference role: frozen-model log-probs of each completion, published as a `ref_logprobs` annotation.

    streamrl worker reference --config configs/tiny-cpu.yaml --broker redis://... --run tiny

Started only when loss.kl_beta > 0 and reference.source is `worker` (with trainer.lora, `auto` resolves
to `trainer`: the trainer computes them from its own model with the adapter disabled). The log-probs come from the trainer's own function
(streamrl.models.hf.causal_lm_logprobs, with trainer.logprob_chunk_tokens), so both sides of the KL
term are computed by the same code. The model runs on reference.device (`auto`: trainer.device;
`cpu` frees the GPUs for the trainer and generators). Reads `rollouts` with the consumer group "reference" in
batches of reference.batch_size, and acks after the annotations are written (the annotator loop,
streamrl/annotate/annotator.py). A rollout the model cannot score (malformed token ids) gets an annotation
with `error` and a dead-letter record.
"""

from __future__ import annotations

import asyncio

import torch

from streamrl.annotate.annotator import Annotator
from streamrl.core.messages import Rollout, is_eval_group
from streamrl.models.hf import completion_logprobs, load_hf_model, pick_device

GROUP = "reference"


def reference_device(cfg) -> torch.device:
    """reference.device, with `auto` meaning wherever the trainer runs (trainer.device)."""
    choice = cfg.reference.device
    return pick_device(cfg.trainer.device if choice == "auto" else choice)


class ReferenceWorker(Annotator):
    role = "reference"
    key = "ref_logprobs"
    group = GROUP

    async def start(self) -> None:
        self.device = reference_device(self.cfg)
        self.model = await asyncio.to_thread(load_hf_model, self.cfg.model.path, self.cfg.model.dtype, self.device)
        self.model.eval()
        for stream in self.keys.rollout_streams:
            await self.broker.ensure_group(stream, GROUP)

    def batch_size(self) -> int:
        return self.cfg.reference.batch_size

    def skip(self, rollout: Rollout) -> bool:
        return is_eval_group(rollout.group_id)  # eval rollouts are never trained: no KL term needs them

    def _logprobs(self, rollouts: list[Rollout]):
        with torch.inference_mode():
            return completion_logprobs(
                self.model,
                [r.prompt_ids for r in rollouts],
                [r.completion_ids for r in rollouts],
                self.cfg.generator.temperature,
                chunk_tokens=self.cfg.trainer.logprob_chunk_tokens,
                kernel=self.cfg.trainer.logprob_kernel,
            )

    async def _one(self, r: Rollout) -> tuple:
        """Score one rollout alone: its log-probs, or an error annotation's reason."""
        try:
            return (await self.calls.run(self._logprobs, [r]))[0], ""
        except Exception as exc:
            return 0.0, f"reference model failed on this rollout: {type(exc).__name__}: {exc}"[:500]

    async def annotate(self, rollouts: list[Rollout]) -> list[tuple]:
        try:
            return [(lp, "") for lp in await self.calls.run(self._logprobs, rollouts)]
        except Exception:  # a malformed rollout (e.g. token ids outside the vocabulary) fails the batch
            return [await self._one(r) for r in rollouts]
