"""The judge role (`judge:`): a vLLM engine on a judge model of its own that scores each rollout from a
prompt template, its output parsed into a number by a regex or a JSON field (workers/judge.py).

    judge:
      model: {path: Qwen/Qwen3-8B}        # or `policy`: the job's own model at its initial weights
      template: "Question: {prompt}\\nAnswer: {completion}\\nReference: {reference}\\nScore 0-10:"
      score: {regex: '(\\d+)'}
      weight: 0.1                         # its share of the trained reward

The section is absent by default (no judge workers); present, `streamrl up` starts `count` judges and
every trained rollout needs the judge's annotation under `key`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from streamrl.config.base import Section

PLACEHOLDERS = ("{prompt}", "{completion}", "{reference}")
"""What judge.template may name: the task's prompt, the rollout's completion, the task's reference
answer (meta["answer"]). Only these are replaced; every other brace is literal text (JSON examples)."""
POLICY = "policy"
"""judge.model.path: the job's own model (model.path, or the tiny offline build), at its initial weights."""


class JudgeModelConfig(Section):
    path: str | None = None
    """A local Hugging Face folder (or hub name vLLM can load) of the judge model, or `policy`: the job's
    own model at its initial weights (the tiny CPU configs judge with the tiny model itself)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "auto"
    """vLLM dtype of the judge; `auto`: model.dtype when path=policy, else the checkpoint's."""


class JudgeScore(Section):
    """How a number is read from the judge's text: exactly one of `regex` and `json_field`."""

    regex: str | None = None
    """A regex searched in the output; the score is its group `score` if it has one, else group 1,
    e.g. '(\\d+(?:\\.\\d+)?)\\s*/\\s*10'. No match, or a group that is not a number: an annotation error."""
    json_field: str | None = None
    """A field of the last JSON object in the output, dotted for nesting (`verdict.score`); a missing
    field, invalid JSON or a non-number: an annotation error."""

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            pattern = re.compile(value)
        except re.error as exc:
            raise ValueError(f"judge.score.regex={value!r} is not a regex ({exc}); fix the pattern") from exc
        if pattern.groups == 0:
            raise ValueError(
                f"judge.score.regex={value!r} has no group, so it does not say which part is the score; "
                "wrap the number in parentheses, e.g. 'Score: (\\d+)'"
            )
        return value

    @model_validator(mode="after")
    def _one(self) -> "JudgeScore":
        if (self.regex is None) == (self.json_field is None):
            raise ValueError("judge.score: set exactly one of regex (e.g. 'Score: (\\d+)') and json_field (e.g. score)")
        return self


class JudgeConfig(Section):
    count: int = Field(1, ge=0)
    """Judge worker processes `streamrl up` starts (`streamrl scale judge=N` changes it while it runs)."""
    key: str = Field("judge", pattern=r"^[A-Za-z0-9_.-]+$")
    """Annotation key the judges write; its name in metrics.jsonl's reward_components."""
    weight: float = 1.0
    """Weight of the judge's score in the trained reward: annotations.reward_weight * reward +
    judge.weight * judge + the external keys' weighted values."""
    model: JudgeModelConfig = JudgeModelConfig()
    """The judge model: its own, any size (its engine is not the generator's)."""
    template: str = Field("", validate_default=True)
    """The judge's prompt; {prompt}, {completion} and {reference} are replaced (see PLACEHOLDERS) and
    {completion} is required. A rollout whose task has no reference answer fails a template that names it."""
    chat_template: bool = False
    """Wrap the rendered template as one user message in the judge tokenizer's chat template (an instruct
    judge); false: the rendered text is the prompt as is (the tiny model has no chat template)."""
    chat_template_kwargs: dict[str, bool | str | int] = {}
    """Extra arguments of apply_chat_template, e.g. {enable_thinking: false} for a Qwen3 judge."""
    score: JudgeScore = JudgeScore(regex=r"(-?\d+(?:\.\d+)?)")
    """How the score is read from the judge's output (default: its first number)."""
    allowed_tokens: list[str] = []
    """Restrict the judge's output to these tokens (vLLM's allowed_token_ids; each must be one token of
    the judge's tokenizer), e.g. the ten digits, so a small judge always answers with a number.
    Empty: any token."""
    max_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0)
    """0: greedy. Each rollout's request is seeded from (run.seed, rollout id), so a rollout judged
    again (its judge was killed before acking) gets the same score."""
    batch_size: int = Field(32, ge=1)
    """Rollouts a judge reads and sends to its engine at once."""
    on_error: Literal["drop", "score"] = "drop"
    """A rollout whose judge output did not parse (or whose prompt did not render): `drop` fails its
    group (the feeder admits a replacement); `score` trains it with error_value (see reward.on_error)."""
    error_value: float = 0.0
    gpu_memory_utilization: float = Field(0.1, gt=0, le=1)
    """vLLM's GPU memory share of the judge's engine (policy and judge on one GPU: keep the sum of both
    engines' shares and the trainer's memory under 1). Which GPU: supervisor.devices.judge."""
    max_model_len: int = Field(512, ge=16)
    """Longest judge prompt + output in tokens; a longer one is that rollout's annotation error."""
    kv_cache_memory_gb: float | None = Field(None, gt=0)
    """GPU build: the judge engine's KV cache, fixed (as generator.kv_cache_memory_gb: on a GPU shared with
    the trainer, vLLM's start-up profile counts the trainer's memory as its own). None: vLLM's profile."""
    enforce_eager: bool = True
    """False: CUDA graphs on a GPU (faster decoding, slower start); the CPU build runs eager either way."""
    cpu_kvcache_gb: int = Field(1, ge=1)
    """KV-cache size on the CPU build of vLLM."""
    start_timeout_s: float = Field(600.0, gt=0)
    """The judge engine's start still unfinished after this long: its stacks are dumped to the log, it
    is killed and the judge exits naming the phase it hung in, to be restarted with spawn (as
    generator.start_timeout_s)."""

    @field_validator("template")
    @classmethod
    def _template(cls, value: str) -> str:
        if "{completion}" not in value:
            raise ValueError(
                f"judge.template={value[:80]!r} does not contain {{completion}}, so the judge never sees "
                "what it scores; put {completion} (and optionally {prompt}, {reference}) in it"
            )
        return value

    @model_validator(mode="after")
    def _model(self) -> "JudgeConfig":
        if not self.model.path:
            raise ValueError(
                "judge.model.path is not set; set it to the judge model's folder (or hub name), or to "
                "`policy` to judge with the job's own model"
            )
        if self.max_tokens >= self.max_model_len:
            raise ValueError(
                f"judge.max_tokens={self.max_tokens} leaves no room for the prompt in judge.max_model_len="
                f"{self.max_model_len}; raise max_model_len or lower max_tokens"
            )
        return self
