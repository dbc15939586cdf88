"""The wire types: one dataclass per message kind, with its fields and their defaults (docs/protocol.md).

    Rollout(rollout_id=new_rollout_id("g7", 1), group_id="g7", sample=1, ...)   # encode() it to send

Encoding, decoding and the checks a decoded message passes are in codec.py and validate.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass
class Prompt:
    """One prompt group admitted by the feeder (stream `prompts`)."""

    kind: ClassVar[str] = "prompt"
    group_id: str
    prompt_ids: np.ndarray
    group_size: int
    admitted_version: int
    """Trainer version at admission; a generator loads at least this version before generating."""
    text: str = ""
    meta: dict = field(default_factory=dict)
    """Task data the reward needs (e.g. the reference answer)."""
    index: int = 0
    """Feeder sequence number (0, 1, 2, ...)."""
    temperature: float | None = None
    """Sampling temperature for this group; None: the generator's (generator.temperature). Eval rounds set it."""


@dataclass
class Rollout:
    """One finished completion (stream `rollouts`)."""

    kind: ClassVar[str] = "rollout"
    rollout_id: str
    """`{group_id}:{sample}:{nonce}` (new_rollout_id): names exactly one generated completion; a
    regenerated sample (a restarted generator) gets a new nonce, a redelivered entry keeps its id."""
    group_id: str
    sample: int
    group_size: int
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    """Behaviour (sampling) log-prob of each completion token."""
    version: int
    """Weights version that produced the first completion token."""
    version_switches: list = field(default_factory=list)
    """[[token_index, version], ...]: from token_index on, tokens came from `version`."""
    finish_reason: str = "length"
    text: str = ""
    """Decoded completion."""
    prompt_text: str = ""
    meta: dict = field(default_factory=dict)
    worker: str = ""
    finished_at: float = field(default_factory=time.time)
    obs_spans: list = field(default_factory=list)
    """[[start, end], ...]: completion tokens [start, end) are environment observations of a
    multi-turn episode (loss mask 0, log-prob 0); empty for a single-turn completion."""

    def oldest_version(self) -> int:
        return min([self.version] + [int(v) for _, v in self.version_switches])

    def token_versions(self) -> np.ndarray:
        out = np.full(len(self.completion_ids), self.version, dtype=np.int64)
        for idx, ver in self.version_switches:
            out[int(idx) :] = int(ver)
        return out

    def token_mask(self) -> np.ndarray:
        """1.0 on model-sampled completion tokens, 0.0 on observation tokens (float32)."""
        out = np.ones(len(self.completion_ids), dtype=np.float32)
        for start, end in self.obs_spans:
            out[int(start) : int(end)] = 0.0
        return out


@dataclass
class Annotation:
    """A value attached to a rollout under a key (stream `annotations`). Idempotent per (rollout_id, key)."""

    kind: ClassVar[str] = "annotation"
    rollout_id: str
    key: str
    value: Any
    """A float, or packed float32 bytes (unpacked to np.ndarray) for per-token values."""
    producer: str = ""
    error: str = ""
    """Set when the producer could not score this rollout: the assembler drops its group (counted)."""
    parts: dict = field(default_factory=dict)
    """Optional {name: number}: the components a combined `reward` was summed from (reward.components),
    logged per step as reward_components["reward/<name>"]; never trained on separately."""
    text: str = ""
    """Optional: the producer's own words on this rollout (the judge's reply its score was read from),
    kept beside the rollout in RUN_DIR/samples.jsonl when it is sampled; never trained on."""


@dataclass
class Control:
    """Control messages (stream `control`)."""

    kind: ClassVar[str] = "control"
    action: str
    """`stop` (finish and exit), `weights` (a new version is published)."""
    version: int = -1
    reason: str = ""


@dataclass
class StepRequest:
    """One environment step of a multi-turn episode (stream `env_steps`, read by env workers).

    Carries everything a replayable env needs to rebuild its state on any worker: the task item
    and every action so far (the last one is the action to step with)."""

    kind: ClassVar[str] = "step_request"
    episode_id: str
    """`{group_id}:{sample}:{attempt nonce}`: a restarted episode gets a new one."""
    group_id: str
    sample: int
    turn: int
    """0-based index of this step; equals len(actions) - 1."""
    item: dict
    """The task item: {"text": prompt text, "meta": task data}."""
    actions: list
    """Text of each model turn so far (strings), the newest last."""
    reply_to: str
    """Generator id: the observation goes to stream `observations:{reply_to}`."""
    sent_at: float = field(default_factory=time.time)


@dataclass
class Observation:
    """An env worker's answer to one StepRequest (stream `observations:{generator id}`)."""

    kind: ClassVar[str] = "observation"
    episode_id: str
    turn: int
    text: str = ""
    """What the environment says; the generator tokenizes it and appends it to the episode."""
    reward: float = 0.0
    """This step's reward (the episode's env reward is the sum over its steps)."""
    done: bool = False
    error: str = ""
    """Set when the step failed (env raised, timed out, returned garbage): the episode fails."""
    error_kind: str = ""
    """`replay` when the env lost its state and cannot replay (the episode restarts), else empty."""
    env_worker: str = ""
    step_s: float = 0.0
    """Seconds the env itself took for this step (replay included)."""
    messages: list = field(default_factory=list)
    """Chat messages [{role, content}] this step appends (tool results, a user turn): a generator with
    tools.chat renders them with the model's chat template; empty: `text` is the observation."""
    counts: dict = field(default_factory=dict)
    """Numeric counters of this step (e.g. tool_calls, tool_errors), summed over the episode into metrics."""


@dataclass
class EpisodeState:
    """A multi-turn episode's checkpoint, written by its generator after each model turn (hash
    `episode_state:{group_id}`, field = sample): what another generator needs to continue the
    episode from that turn if this one dies (streamrl/generate/episode_runner.py). Not a stream entry."""

    kind: ClassVar[str] = "episode_state"
    episode_id: str
    """The attempt that wrote it; a continuation runs under a new nonce."""
    group_id: str
    sample: int
    turn: int
    """The model turn just sampled, whose env step is pending; equals len(actions) - 1."""
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    """Every model and observation token so far, in order (the exact history)."""
    logprobs: np.ndarray
    version: int
    version_switches: list = field(default_factory=list)
    obs_spans: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    """Text of each model turn so far (the step requests' actions)."""
    texts: list = field(default_factory=list)
    """Model turn and observation texts in order (the rollout's text)."""
    step_s: list = field(default_factory=list)
    env_reward: float = 0.0
    counts: dict = field(default_factory=dict)
    """The env's counters summed over the steps so far (tool_calls, tool_errors, ...)."""
    writer: str = ""
    """Generator id that wrote it (logs)."""


MESSAGE_TYPES: dict[str, type] = {
    t.kind: t for t in (Prompt, Rollout, Annotation, Control, StepRequest, Observation, EpisodeState)
}
