"""What one micro-batch hands an objective: log-probs, advantages, mask and the optional inputs,
with the global-batch sizes that make micro-batched, data-parallel gradients exact (docs/losses.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class LossInputs:
    logprobs: torch.Tensor
    """[B, T] current-policy log-probs of the completion tokens (requires grad)."""
    old_logprobs: torch.Tensor
    """[B, T] behaviour (sampling) log-probs recorded by the generator."""
    advantages: torch.Tensor
    """[B] one advantage per sequence."""
    mask: torch.Tensor
    """[B, T] float, 1.0 on real completion tokens, 0.0 on padding."""
    ref_logprobs: torch.Tensor | None = None
    """[B, T] reference-model log-probs; needed when kl_beta > 0 (reported as `kl` when given)."""
    prox_logprobs: torch.Tensor | None = None
    """[B, T] proximal policy = the weights before this optimizer step (decoupled_ppo), no grad.
    With one optimizer step per batch this is simply logprobs.detach()."""
    entropy: torch.Tensor | None = None
    """[B, T] per-token entropy of the current policy; needed when entropy_coef > 0."""
    total_tokens: float = 0.0
    """Sum of mask over the WHOLE global batch (all micro-batches, all ranks). 0: this micro-batch."""
    total_seqs: float = 0.0
    """Sequences in the whole global batch. 0: this micro-batch."""
    dp_world_size: int = 1
    """FSDP averages gradients over this many ranks; the loss is multiplied by it to undo that."""
