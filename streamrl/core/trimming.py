"""Stream trimming that keeps the broker's memory bounded without deleting unconsumed work.

An entry may go once EVERY consumer group of its stream is past it: below each group's oldest
pending entry and at or below its last-delivered id. One Lua script computes that floor from
XINFO GROUPS / XPENDING and runs `XTRIM stream MINID ~ floor` atomically, so an entry delivered
between the two steps cannot be lost. A stream is not trimmed while a group the config expects
(e.g. `reference` when loss.kl_beta > 0) does not exist yet: its worker may still be starting.

    await trim_streams(broker, cfg)      # once
    asyncio.create_task(trim_periodically(broker, cfg, on_trimmed, log))   # the trainer's background task
"""

from __future__ import annotations

import asyncio
from typing import Callable

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys

_TRIM = """
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if not ok or #groups == 0 then return -1 end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local seen, floor = {}, nil
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  seen[f['name']] = true
  local low = f['last-delivered-id']
  if tonumber(f['pending']) > 0 then
    local summary = redis.call('XPENDING', KEYS[1], f['name'])
    if less(summary[2], low) then low = summary[2] end
  end
  if floor == nil or less(low, floor) then floor = low end
end
for i = 1, #ARGV do
  if not seen[ARGV[i]] then return -2 end
end
if floor == '0-0' then return 0 end
return redis.call('XTRIM', KEYS[1], 'MINID', '~', floor)
"""


def stream_groups(cfg: Config) -> dict[str, list[str]]:
    """Stream -> the consumer groups that must exist (and have consumed) before it is trimmed."""
    keys = Keys.of(cfg)
    # reference.source=trainer: no reference worker, so no "reference" group to wait for
    with_reference = cfg.loss.kl_beta > 0 and not cfg.reference_in_trainer()
    rollout_groups = ["reward", "trainer"] + (["reference"] if with_reference else [])
    rollout_groups += ["judge"] if cfg.judge is not None else []
    out = {keys.prompts: ["generator"]}
    out |= {stream: rollout_groups for stream in keys.rollout_streams}
    out |= {stream: ["trainer"] for stream in keys.annotation_streams}
    if cfg.env.fn:
        out[keys.env_steps] = ["env"]
    return out


async def trim_stream(broker: Broker, stream: str, expected_groups: list[str]) -> int:
    """Trim `stream` below what all its groups consumed. Returns entries removed; -1: no groups
    yet; -2: an expected group is missing (nothing trimmed)."""
    return int(await broker.script(_TRIM, [stream], list(expected_groups)))


async def trim_streams(broker: Broker, cfg: Config) -> dict[str, int]:
    return {stream: await trim_stream(broker, stream, groups) for stream, groups in stream_groups(cfg).items()}


async def trim_periodically(broker: Broker, cfg: Config, on_trimmed: Callable[[int], None], log) -> None:
    """Trim every `cfg.trainer.trim_every_s` seconds until cancelled; `on_trimmed(entries removed)`
    after each pass. A failed pass is logged (`trim_failed`) and the next one runs on schedule."""
    while True:
        await asyncio.sleep(cfg.trainer.trim_every_s)
        try:
            trimmed = await trim_streams(broker, cfg)
            on_trimmed(sum(n for n in trimmed.values() if n > 0))
        except Exception as exc:  # trimming is housekeeping: a broker hiccup must not stop training
            log.warning("trim_failed", error=repr(exc))
