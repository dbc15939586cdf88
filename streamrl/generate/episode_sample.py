"""Building the training sample of a multi-turn episode, token-in/token-out (pure, no I/O).

    s = EpisodeSample(prompt_ids)
    s.add_model(ids, logprobs, version)      # a model turn, streamed in deltas (call once per delta)
    s.add_observation(obs_ids)               # the env's answer, tokenized alone and appended
    fields = s.rollout_fields()              # completion_ids, logprobs, version, version_switches, obs_spans
    s = EpisodeSample.restore(prompt_ids, ...)  # from those fields (an episode checkpoint), to continue

The sample is exactly the sequence the model was conditioned on: the prompt ids, then every
sampled id and every observation id in order. History is never re-tokenized, so what the
trainer scores is what vLLM sampled from. Observation tokens carry log-prob 0, loss mask 0 and
the version of the model token before them, so version switches (and staleness, which is the
oldest version in the rollout) only ever come from model tokens.

The prefix-break rule (`split_extension`): an environment that hands back the whole new context
as token ids (a chat template re-rendered around the new message) extends the history only if
those ids start with the history ids exactly; the suffix is then the observation. Where they do
not (a template that rewrites earlier turns, a tokenizer that merges across the boundary), the
history cannot be continued token-exactly and the episode continues as a new sample whose prompt
is the new context. streamrl's generator tokenizes a text observation on its own and appends it,
which is an exact extension by construction (docs/protocol.md, "Environment steps").
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class EpisodeSample:
    def __init__(self, prompt_ids: Sequence[int]):
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.version: int | None = None
        self.switches: list[list[int]] = []
        self.obs_spans: list[list[int]] = []
        self.model_tokens = 0

    @classmethod
    def restore(
        cls,
        prompt_ids: Sequence[int],
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        version: int,
        switches: Sequence[Sequence[int]],
        obs_spans: Sequence[Sequence[int]],
    ) -> EpisodeSample:
        """The sample as `rollout_fields()` described it (an episode checkpoint), ready to continue."""
        s = cls(prompt_ids)
        s.token_ids = [int(t) for t in token_ids]
        s.logprobs = [float(x) for x in logprobs]
        s.version = int(version) if s.token_ids else None
        s.switches = [[int(i), int(v)] for i, v in switches]
        s.obs_spans = [[int(a), int(b)] for a, b in obs_spans]
        s.model_tokens = len(s.token_ids) - s.env_tokens
        return s

    def __len__(self) -> int:
        """Prompt plus completion tokens: the context length the next turn starts from."""
        return len(self.prompt_ids) + len(self.token_ids)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.token_ids

    def _current_version(self) -> int | None:
        return self.switches[-1][1] if self.switches else self.version

    def add_model(self, token_ids: Sequence[int], logprobs: Sequence[float], version: int) -> None:
        """Sampled tokens made by weights `version` (a switch is recorded where the version changes)."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} token ids but {len(logprobs)} log-probs")
        if not token_ids:
            return
        if self.version is None:
            if self.token_ids:  # an observation before any model token has no version to inherit
                raise ValueError("an episode sample must start with a model turn")
            self.version = int(version)
        elif int(version) != self._current_version():
            self.switches.append([len(self.token_ids), int(version)])
        self.token_ids.extend(int(t) for t in token_ids)
        self.logprobs.extend(float(x) for x in logprobs)
        self.model_tokens += len(token_ids)

    def add_observation(self, token_ids: Sequence[int]) -> None:
        """Observation tokens: masked out of the loss, log-prob 0, no version of their own."""
        if not token_ids:
            return
        if self.version is None:
            raise ValueError("an episode sample must start with a model turn")
        start = len(self.token_ids)
        self.token_ids.extend(int(t) for t in token_ids)
        self.logprobs.extend([0.0] * len(token_ids))
        if self.obs_spans and self.obs_spans[-1][1] == start:
            self.obs_spans[-1][1] = len(self.token_ids)
        else:
            self.obs_spans.append([start, len(self.token_ids)])

    @property
    def env_tokens(self) -> int:
        return sum(e - s for s, e in self.obs_spans)

    def loss_mask(self) -> np.ndarray:
        out = np.ones(len(self.token_ids), dtype=np.float32)
        for s, e in self.obs_spans:
            out[s:e] = 0.0
        return out

    def token_versions(self) -> np.ndarray:
        out = np.full(len(self.token_ids), -1 if self.version is None else self.version, dtype=np.int64)
        for idx, ver in self.switches:
            out[idx:] = ver
        return out

    def rollout_fields(self) -> dict:
        """The Rollout fields this sample fills (streamrl.core.messages.Rollout)."""
        return {
            "prompt_ids": np.asarray(self.prompt_ids, dtype=np.int32),
            "completion_ids": np.asarray(self.token_ids, dtype=np.int32),
            "logprobs": np.asarray(self.logprobs, dtype=np.float32),
            "version": 0 if self.version is None else self.version,
            "version_switches": [list(s) for s in self.switches],
            "obs_spans": [list(s) for s in self.obs_spans],
        }


def split_extension(history: Sequence[int], new_context: Sequence[int]) -> list[int] | None:
    """The observation ids if `new_context` extends `history` token-exactly, else None (the
    prefix-break rule: the episode must continue as a new sample with `new_context` as prompt)."""
    n = len(history)
    if len(new_context) < n or list(new_context[:n]) != list(history):
        return None
    return list(new_context[n:])


def episode_metrics(rollouts: list) -> dict:
    """Per-step metrics of a batch's multi-turn episodes (empty for single-turn rollouts):
    mean model turns, env step latency p50/p99 (as the generator waited for it), observation tokens,
    and the sum of each env counter (tool_calls, tool_errors) over the batch's episodes."""
    eps = [r.meta for r in rollouts if "turns" in r.meta and "env_step_s" in r.meta]
    if not eps:
        return {}
    steps = np.asarray([t for m in eps for t in m["env_step_s"]] or [0.0], dtype=np.float64)
    return {
        "turns_mean": float(np.mean([m["turns"] for m in eps])),
        "env_step_s_p50": float(np.percentile(steps, 50)),
        "env_step_s_p99": float(np.percentile(steps, 99)),
        "env_tokens": int(sum(int(m.get("env_tokens", 0)) for m in eps)),
        # The env's counters (ToolEnv: tool_calls, tool_errors), summed over the batch's episodes.
        **{
            key: sum(m.get("env_counts", {}).get(key, 0) for m in eps)
            for key in sorted({k for m in eps for k in m.get("env_counts", {})})
        },
    }
