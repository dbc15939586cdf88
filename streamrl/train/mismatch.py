"""How far the generator's log-probs are from the trainer's on the tokens of one step, per staleness.

    meter = MismatchMeter(); meter.add(logp, old_logprobs, mask, staleness)   # each micro-batch
    sums, peaks = meter.local()        # all-reduce sums with SUM and peaks with MAX over the ranks
    metrics = mismatch_metrics(sums, peaks)

With w = pi_train / pi_behaviour per token (the trainer's forward of this step, detached, against
the generator's recorded log-probs), for the rollouts of staleness 0 (`_s0`; what remains is the
numerics: vLLM's kernels, bf16, MoE routing) and > 0 (`_stale`; also the weight lag):
    mismatch_kl_*          KL(behaviour || trainer) per token, k3 estimate E_b[w - 1 - log w]
    mismatch_ratio_max_*   max w;  mismatch_ratio_p99_*  its 99th percentile (max over ranks)
    mismatch_ess_*         normalised effective sample size (sum w)^2 / (n sum w^2), 1 = on-policy
    mismatch_tokens_*      the tokens it is measured on
A group with no tokens this step has no keys. Pure torch/numpy; the engine does the reductions.
"""

from __future__ import annotations

import numpy as np
import torch

GROUPS = ("s0", "stale")
_CLAMP = 20.0  # log-ratio bound so a garbage or very stale token cannot overflow exp


class MismatchMeter:
    def __init__(self):
        self._ratios: dict[str, list[torch.Tensor]] = {g: [] for g in GROUPS}

    def add(self, logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, staleness) -> None:
        """One micro-batch: [B, T] log-probs, behaviour log-probs, mask; [B] staleness per row."""
        lr = torch.clamp(logp.detach().double() - old.detach().double(), -_CLAMP, _CLAMP)
        real = mask.detach().bool()
        st = np.asarray(staleness)
        if st.shape[0] != lr.shape[0]:  # an empty shard's one fully masked row (pad_batch)
            st = np.zeros(lr.shape[0])
        stale = torch.as_tensor(st > 0, device=lr.device)[:, None].expand_as(real)
        for g, rows in (("s0", ~stale), ("stale", stale)):
            # kept on the device: one copy per step in local(), not a sync per micro-batch
            self._ratios[g].append(torch.exp(lr[real & rows]))

    def local(self) -> tuple[dict[str, float], dict[str, float]]:
        """(this rank's sums, this rank's peaks), the same keys on every rank."""
        sums, peaks = {}, {}
        for g in GROUPS:
            w = torch.cat(self._ratios[g]).cpu().numpy() if self._ratios[g] else np.zeros(0)
            sums[f"n_{g}"] = float(w.size)
            sums[f"w_{g}"] = float(w.sum())
            sums[f"w2_{g}"] = float((w * w).sum())
            sums[f"k3_{g}"] = float((w - 1 - np.log(w)).sum()) if w.size else 0.0
            peaks[f"max_{g}"] = float(w.max()) if w.size else 0.0
            peaks[f"p99_{g}"] = float(np.percentile(w, 99)) if w.size else 0.0
        return sums, peaks


def mismatch_metrics(sums: dict[str, float], peaks: dict[str, float]) -> dict[str, float]:
    out = {}
    for g in GROUPS:
        n = sums[f"n_{g}"]
        if n == 0:
            continue
        out[f"mismatch_kl_{g}"] = sums[f"k3_{g}"] / n
        out[f"mismatch_ratio_max_{g}"] = peaks[f"max_{g}"]
        out[f"mismatch_ratio_p99_{g}"] = peaks[f"p99_{g}"]
        out[f"mismatch_ess_{g}"] = sums[f"w_{g}"] ** 2 / (n * sums[f"w2_{g}"])
        out[f"mismatch_tokens_{g}"] = n
    return out
