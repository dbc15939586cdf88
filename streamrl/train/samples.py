"""What the model generates: a few rollouts of each step in RUN_DIR/samples.jsonl, one JSON object per
rollout, written by the trainer next to metrics.jsonl (metrics.samples_per_step bounds them).

    rows = sample_rows(batch, step=3, n=4)        # pure: the first rollout of n groups (then the next ...)
    read_samples(run_dir, step=3)                 # what `streamrl samples RUN_DIR --step 3` prints

The completions otherwise live only on the broker's `rollouts` stream, which is trimmed and gone
with the broker. A row is what a reader needs to judge a completion: the prompt, the text, the
reward and each component, the version that sampled it and its staleness, and for a multi-turn
episode its turns (model turns and environment observations, in order).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

FILE = "samples.jsonl"


def _spread(group_index, n: int) -> list[int]:
    """n row indices, one per group first (groups in order), then a second of each, ... (pure)."""
    by_group: dict[int, list[int]] = {}
    for i, g in enumerate(group_index):
        by_group.setdefault(int(g), []).append(i)
    out: list[int] = []
    depth = 0
    while len(out) < n and any(depth < len(v) for v in by_group.values()):
        out += [v[depth] for v in by_group.values() if depth < len(v)]
        depth += 1
    return sorted(out[:n])


def turns(text: str, turn_chars: list | None) -> list[dict]:
    """An episode's text cut into its turns: model turn, observation, model turn, ... (the episode
    runner records each piece's length as meta.turn_chars); [] for a single-turn completion."""
    if not turn_chars:
        return []
    out, at = [], 0
    for i, size in enumerate(turn_chars):
        out.append({"role": "model" if i % 2 == 0 else "env", "text": text[at : at + int(size)]})
        at += int(size)
    return out


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def sample_rows(batch, step: int, n: int, weights: dict[str, float] | None = None) -> list[dict]:
    """Up to n rows of `batch` (spread over its groups) as samples.jsonl records; `weights`
    (Config.reward_weights) go into each row so a reader sees how the reward was summed; pure."""
    if n <= 0 or len(batch) == 0:
        return []
    rows = []
    for i in _spread(batch.group_index, n):
        r = batch.rollouts[i]
        row = {
            "step": step,
            "group_id": r.group_id,
            "sample": r.sample,
            "prompt": r.prompt_text,
            "completion": r.text,
            "reward": _num(batch.rewards[i]),
            "reward_components": {k: _num(v[i]) for k, v in batch.reward_components.items()},
            "advantage": _num(batch.advantages[i]),
            "version": r.oldest_version(),
            "staleness": int(batch.staleness[i]),
            "finish_reason": r.finish_reason,
            "tokens": len(r.completion_ids),
        }
        if weights:
            row["reward_weights"] = dict(weights)
        if texts := {k: v[i] for k, v in batch.annotation_texts.items() if v[i]}:
            row["annotation_texts"] = texts  # the judge's reply, under its key
        if episode := turns(r.text, r.meta.get("turn_chars")):
            row["turns"] = episode
        rows.append(row)
    return rows


def read_samples(run_dir: Path, step: int | None = None) -> list[dict]:
    path = Path(run_dir) / FILE
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if step is None or r.get("step") == step]


def _g(x) -> str:
    """A number as the console shows it: 3 significant digits (0.0125, 0.562, 12.3), integers bare."""
    return "none" if x is None else f"{x:.3g}"


def reward_part(row: dict) -> str:
    """`reward 0.111 = 0 x reward 0.562 + 0.111 x judge 1` where the row says how its reward was summed
    (reward_weights) and more than one key (or a weight other than 1) went in; else `reward 0.562` with
    the components in parentheses; pure."""
    comps = {k: v for k, v in row.get("reward_components", {}).items() if v is not None}
    weights = row.get("reward_weights") or {}
    summed = [k for k in weights if k in comps]
    if summed and (len(summed) > 1 or weights[summed[0]] != 1):
        terms = " + ".join(f"{_g(weights[k])} x {k} {_g(comps[k])}" for k in summed)
        rest = ", ".join(f"{k} {_g(v)}" for k, v in comps.items() if k not in weights)
        return f"reward {_g(row['reward'])} = {terms}" + (f" ({rest})" if rest else "")
    parts = ", ".join(f"{k}={_g(v)}" for k, v in comps.items())
    return f"reward {_g(row['reward'])}" + (f" ({parts})" if parts else "")


def header_parts(row: dict) -> list[str]:
    """What a sample's header says, in order: the console's (`format_sample`) and the HTML page's
    (streamrl/report/samples_html.py)."""
    calls = row.get("tool_calls")
    return [
        f"group {row['group_id']} #{row['sample']}",
        reward_part(row),
        f"version {row['version']}",
        f"staleness {row['staleness']}",
        f"{row['tokens']} tokens ({row['finish_reason']})",
        *([f"tools called: {', '.join(calls) if calls else 'none'}"] if calls is not None else []),
    ]


def format_sample(row: dict) -> str:
    """One sample as readable console text (`streamrl samples`)."""
    head = "  ".join([f"step {row['step']}", *header_parts(row)])
    lines = [head, "  prompt: " + row["prompt"].strip().replace("\n", "\n          ")]
    if row.get("turns"):
        for t in row["turns"]:
            lines.append(f"  {t['role']:>5}: " + t["text"].strip().replace("\n", "\n         "))
    else:
        lines.append("  completion: " + row["completion"].strip().replace("\n", "\n              "))
    for key, text in row.get("annotation_texts", {}).items():  # what the judge said
        lines.append(f"  {key} said: " + text.strip().replace("\n", "\n    "))
    return "\n".join(lines)
