"""Evaluation during training: held-out prompts generated at the current policy version, scored by
the reward workers, never trained and never counted in the training accounting.

    eval: {every_steps: 10, samples: 8, num_prompts: 16, temperature: 1.0}    (streamrl/config/schema.py)

Protocol (docs/protocol.md, "Evaluation"): at trainer version v (v = 0 with eval.at_start, each multiple
of eval.every_steps below trainer.steps, and the final version with eval.at_end) the feeder appends one eval round to `prompts`:
groups `eval-<v>-<n>-<i>` (n prompts, i = 0..n-1) with group_size = eval.samples, admitted_version v
and the eval temperature. Generators treat them like any prompt (they load version >= v first);
the reward workers score them; the trainer's assembler recognises the group ids and hands them to
its EvalCollector (streamrl/eval/collector.py) instead of a batch: they are acked once their round is
scored and never enter a step, the ledger or the feeder's admission counts. The round's metrics
(eval/pass@k, eval/mean@k, eval/maj@k, ...) go into the next metrics.jsonl row with `eval/step` = v;
the final round's into the last row, which the trainer holds back (at most eval.final_timeout_s) for it.

Pure functions here (the estimators are unit-tested against brute force); EvalIssuer is the
feeder's half.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from math import comb

import numpy as np

from streamrl.core.messages import eval_group_id

# KEYS: prompts stream, last-issued key. ARGV: version, payloads... Appends the round and records its
# version atomically, once: a feeder restarted (or retrying a lost reply) never issues a round twice.
_ISSUE = """
local last = tonumber(redis.call('GET', KEYS[2]) or '-1')
if last >= tonumber(ARGV[1]) then return 0 end
for i = 2, #ARGV do redis.call('XADD', KEYS[1], '*', 'd', ARGV[i]) end
redis.call('SET', KEYS[2], ARGV[1])
return #ARGV - 1
"""


def due_version(version: int, last_issued: int, every: int, at_start: bool, steps: int, at_end: bool = False) -> bool:
    """Whether the feeder issues a round at trainer version `version`, the last round having been
    issued at `last_issued` (-1: none). A round is due once per multiple of `every` (and at 0 with
    `at_start`) that `version` has reached; at the final version `steps` only with `at_end` (the
    trainer then waits for it before it writes its last row)."""
    if version > steps or version <= last_issued:
        return False
    if version == steps:
        return at_end
    multiple = version // every * every
    if multiple == 0 and not at_start:
        return False
    return multiple > last_issued


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_correct(answers: list[str], correct: list[bool]) -> bool:
    """maj@n of one prompt: is the most frequent answer correct? Ties go to the answer seen first;
    an answer counts as correct when most of its samples were scored correct."""
    counts = Counter(answers)
    best = max(counts.values())
    top = next(a for a in answers if counts[a] == best)
    hits = [ok for a, ok in zip(answers, correct) if a == top]
    return sum(hits) * 2 > len(hits)


def round_metrics(rewards: np.ndarray, answers: list[list[str]], threshold: float, ks: list[int]) -> dict[str, float]:
    """Metrics of one eval round: rewards [prompts, samples], answers per prompt and sample; a sample
    is correct when its reward >= threshold. pass@k for each k in ks (<= samples), and with n = samples:
    mean@n (mean reward), maj@n (majority vote correct), plus the fraction correct."""
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.shape[1]
    correct = rewards >= threshold
    out = {
        f"eval/pass@{k}": float(np.mean([pass_at_k(n, int(row.sum()), k) for row in correct]))
        for k in sorted({k for k in ks if 1 <= k <= n})
    }
    out[f"eval/mean@{n}"] = float(rewards.mean())
    out[f"eval/maj@{n}"] = float(np.mean([majority_correct(a, list(c)) for a, c in zip(answers, correct)]))
    out["eval/correct_frac"] = float(correct.mean())
    out["eval/prompts"] = int(rewards.shape[0])
    return out


@dataclass(frozen=True)
class EvalSample:
    """One scored eval completion: what a round's metrics read of it."""

    prompt: int
    """Index of its prompt in the round (0..prompts-1)."""
    sample: int
    """Its index among the prompt's eval.samples completions."""
    reward: float
    """The reward it counts (counted_reward: a failed reward function already mapped)."""
    answer: str
    """answer_key of its text (what maj@n compares)."""
    error: bool
    """Whether its reward function failed."""
    version: int
    """The oldest policy version among its tokens."""
    tokens: int
    """Completion length in tokens."""


def counted_reward(value: float, error: str, reward) -> float:
    """The reward an eval completion counts (`reward`: the config's reward section): a failed reward
    function scores reward.error_value under reward.on_error=score, else 0 (incorrect); a round is
    reported, never dropped, so a failure cannot be left out as a training group is."""
    if not error:
        return float(value)
    return float(reward.error_value) if reward.on_error == "score" else 0.0


def round_record(step: int, prompts: int, samples: list[EvalSample], ev) -> dict:
    """The eval/* metrics of one evaluation at policy version `step`: `samples` holds every one of
    prompts x ev.samples completions (ev: the config's eval section). What an eval round writes
    into metrics.jsonl (streamrl/eval/collector.py) and what `streamrl eval` prints
    (streamrl/launch/evaluate.py)."""
    n = ev.samples
    rewards = np.zeros((prompts, n))
    answers: list[list[str]] = [[""] * n for _ in range(prompts)]
    for x in samples:
        rewards[x.prompt, x.sample] = x.reward
        answers[x.prompt][x.sample] = x.answer
    return {
        "eval/step": step,
        **round_metrics(rewards, answers, ev.threshold, [*ev.pass_k, n]),
        "eval/reward_errors": sum(x.error for x in samples),
        "eval/version_min": int(min(x.version for x in samples)),
        "eval/completion_len_mean": float(np.mean([x.tokens for x in samples])),
    }


def answer_key(completion: str, meta: dict) -> str:
    """What majority voting compares: for charclass the scored characters; otherwise the answer part
    (after </think> and '####', as the math reward reads it), whitespace-normalised."""
    from streamrl.tasks.math_answers import answer_part

    if "length" in meta and "chars" in meta:
        return completion[: int(meta["length"])]
    return " ".join(answer_part(completion).split())


class EvalIssuer:
    """The feeder's half: append an eval round to `prompts` when one is due (idempotent across restarts)."""

    def __init__(self, cfg, keys, items: list[dict], make_prompt):
        """`items`: the eval task's items (first eval.num_prompts are used); `make_prompt(item, group_id,
        group_size, version)` builds the Prompt (the feeder tokenizes)."""
        self.cfg, self.keys = cfg, keys
        self.items = items[: cfg.eval.num_prompts]
        self.make_prompt = make_prompt
        self.issued_key = keys.eval_issued
        self.last: int | None = None

    async def maybe_issue(self, broker, version: int) -> int:
        """Issue the round for `version` if due; returns the prompts appended (0 if none)."""
        from streamrl.core.messages import encode

        ev = self.cfg.eval
        if self.last is None:
            raw = await broker.get(self.issued_key)
            self.last = int(raw) if raw is not None else -1
        if not due_version(version, self.last, ev.every_steps, ev.at_start, self.cfg.trainer.steps, ev.at_end):
            return 0
        n = len(self.items)
        payloads = [
            encode(self.make_prompt(item, eval_group_id(version, n, i), ev.samples, version))
            for i, item in enumerate(self.items)
        ]
        added = int(await broker.script(_ISSUE, [self.keys.prompts, self.issued_key], [version, *payloads]))
        self.last = version
        return added
