"""The durable ledger of prompt groups and the end-of-run accounting invariant (RUN_DIR/summary.json).

Unit: prompt GROUPS (one feeder admission = one group of `group_size` rollouts). Every group
ends in exactly one outcome, recorded once (HSETNX) in the broker hash `ledger:groups`:
`trained:<step>`, `dropped_stale`, `filtered` (dynamic sampling), `failed` (an error
annotation, a rejected prompt) or `requeued` (its prompt re-entered as group `<id>r`, which is
itself counted as admitted). The trainer writes `trained:<step>` together with the step's
record in `ledger:steps` (the write-ahead log of which groups and rollouts each step trains)
BEFORE it trains; a step counts as trained once a checkpoint covers it (`trainer:checkpointed`).

    admitted = trained + dropped_stale + filtered + failed + requeued + in_flight + lost

`in_flight` groups have no final outcome but are visibly somewhere in the pipeline (an un-acked
prompt, an un-acked rollout for the trainer, a logged step not yet covered by a checkpoint);
`lost` is what is left over and must be 0. `double_trained` counts samples (`group:sample`, so
two copies of one regenerated sample count as one sample) that appear in more than one trained step. `streamrl up` calls `write_summary` at the end of every run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import redis

from streamrl.core.broker import Broker, Keys
from streamrl.core.broker_url import is_cluster_url, sync_client
from streamrl.core.messages import is_eval_group, sample_key

FINAL = ("dropped_stale", "filtered", "failed", "requeued")

# KEYS: ledger hash, released counter. ARGV: group id, outcome, release (1/0). Atomic, so a crash
# never records the outcome without freeing the feeder's slot (or frees it twice).
_CLOSE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  if ARGV[3] == '1' then redis.call('INCR', KEYS[2]) end
  return 1
end
return 0
"""

# KEYS: ledger hash, steps hash. ARGV: step, record (json), group ids... Returns {1, clashes} for a
# new step, {0, record} when the step is already logged (a resumed trainer replaying it).
_LOG_STEP = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
if old then return {0, old} end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local clash = 0
for i = 3, #ARGV do
  if redis.call('HSETNX', KEYS[1], ARGV[i], 'trained:' .. ARGV[1]) == 0 then clash = clash + 1 end
end
return {1, clash}
"""

# KEYS: prompts stream, admitted counter. ARGV: new admitted total, payloads... SET (not INCRBY),
# so a client retry of a transaction whose reply was lost cannot count the same groups twice.
_ADMIT = """
for i = 2, #ARGV do redis.call('XADD', KEYS[1], '*', 'd', ARGV[i]) end
redis.call('SET', KEYS[2], ARGV[1])
return #ARGV - 1
"""

# KEYS: group starts hash. ARGV: group id. Returns the group's attempts so far, this one included.
_COUNT_START = "return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)"


class LedgerKeys:
    def __init__(self, keys: Keys):
        self.groups = keys.ledger_groups
        self.steps = keys.ledger_steps
        self.checkpointed = keys.trainer_checkpointed
        """Newest trainer version a checkpoint covers (steps above it will be replayed on resume)."""


async def close_group(broker: Broker, keys: Keys, group_id: str, outcome: str, release: bool = True) -> bool:
    """Record a group's final outcome once; free its admission slot if `release`. False if already closed.
    Eval groups (streamrl/eval/rounds.py) were never admitted, so they have no outcome and no slot to free."""
    if is_eval_group(group_id):
        return False
    lk = LedgerKeys(keys)
    return bool(await broker.script(_CLOSE, [lk.groups, keys.trainer_released], [group_id, outcome, int(release)]))


async def fail_group(broker: Broker, keys: Keys, group_id: str, reason: str) -> None:
    """A generator gives a group up (an episode failed, a prompt it cannot generate): its outcome
    `failed`, counted in `stats:groups_failed` (metrics.jsonl's `failed`) with its reason kept in
    `stats:last_group_failure`, where the trainer's failure streak (streamrl/assemble/failure_streak.py)
    reads both: such a group never reaches the trainer's streams."""
    if await close_group(broker, keys, group_id, "failed"):
        await broker.set(keys.last_group_failure, reason)
        await broker.incr(keys.stat("groups_failed"))


async def log_step(
    broker: Broker, keys: Keys, step: int, group_ids: list[str], rollout_ids: list[str]
) -> tuple[bool, dict]:
    """Write-ahead record of step `step` -> (new, record). new=False: the step was logged before
    (replay after a resume) and `record` is the logged one."""
    lk = LedgerKeys(keys)
    record = {"groups": group_ids, "rollouts": rollout_ids}
    new, extra = await broker.script(_LOG_STEP, [lk.groups, lk.steps], [step, json.dumps(record), *group_ids])
    if int(new) == 1:
        return True, {**record, "clashes": int(extra)}
    return False, json.loads(extra)


async def admit(broker: Broker, keys: Keys, payloads: list[bytes], new_total: int) -> None:
    """Append prompt entries and move the admitted counter to `new_total`, atomically."""
    await broker.script(_ADMIT, [keys.prompts, keys.feeder_admitted], [new_total, *payloads])


async def count_group_start(broker: Broker, keys: Keys, group_id: str) -> int:
    """Count one attempt at a multi-turn group in `ledger:group_starts` (more than 1: a generator died
    and another continued it); `summarize` reports the restarts. Returns the attempts so far."""
    return int(await broker.script(_COUNT_START, [keys.ledger_group_starts], [group_id]))


async def logged_steps(broker: Broker, keys: Keys) -> dict[int, dict]:
    raw = await broker.hgetall(LedgerKeys(keys).steps)
    return {int(k): json.loads(v) for k, v in raw.items()}


async def outcomes(broker: Broker, keys: Keys) -> dict[str, str]:
    return {k: v.decode() for k, v in (await broker.hgetall(LedgerKeys(keys).groups)).items()}


async def resume_plan(broker: Broker, keys: Keys, version: int) -> tuple[dict[int, dict], set[str], set[str]]:
    """For a trainer resuming at checkpoint `version`: (logged steps above it to replay, groups that
    are closed for good, groups of the steps to replay)."""
    steps = await logged_steps(broker, keys)
    replay = {s: rec for s, rec in steps.items() if s > version}
    replay_groups = {g for rec in replay.values() for g in rec["groups"]}
    closed = {g for g in await outcomes(broker, keys) if g not in replay_groups}
    return replay, closed, replay_groups


# -- the end-of-run summary (synchronous: the supervisor calls it after every role stopped) ---------
def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _id_tuple(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _live_group_ids(r: redis.Redis, stream: str, group: str) -> set[str]:
    """Group ids of entries `group` has not acked yet (pending, or not delivered to it at all)."""
    from streamrl.core.errors import DecodeError
    from streamrl.core.messages import decode

    try:
        info = {_s(g["name"]): g for g in r.xinfo_groups(stream)}
    except redis.ResponseError:
        return set()
    out: set[str] = set()
    last = _id_tuple(_s(info[group]["last-delivered-id"])) if group in info else (-1, -1)
    pending = set()
    if group in info and int(info[group]["pending"]):
        pending = {_s(p["message_id"]) for p in r.xpending_range(stream, group, "-", "+", 10**7)}
    for entry_id, fields in r.xrange(stream, "-", "+"):
        eid = _s(entry_id)
        if eid in pending or _id_tuple(eid) > last:
            try:
                out.add(decode(fields[b"d"]).group_id)
            except (DecodeError, KeyError, AttributeError):
                pass  # not an admitted group's entry (dead-lettered by the consumer)
    return out


def summarize(url: str, run: str, episodes_per_group: int = 0, partitions: int = 1) -> dict:
    """The accounting of run `run` on the broker at `url` (groups; see the module docstring).
    `episodes_per_group` > 0 (a multi-turn run: rollout.group_size) adds `episodes` (below);
    `partitions`: the run's rollout.partitions."""
    keys = Keys(run, partitions, is_cluster_url(url))
    lk = LedgerKeys(keys)
    r = sync_client(url)
    try:
        admitted_feeder = int(r.get(keys.feeder_admitted) or 0)
        durable = int(r.get(lk.checkpointed) or 0)
        ledger = {_s(k): _s(v) for k, v in r.hgetall(lk.groups).items()}
        steps = {int(k): json.loads(v) for k, v in r.hgetall(lk.steps).items()}
        live = _live_group_ids(r, keys.prompts, "generator")
        for stream in keys.rollout_streams:
            live |= _live_group_ids(r, stream, "trainer")
        trainer_version = int(r.get(keys.trainer_version) or 0)
        deadletters = int(r.xlen(keys.deadletter))
        starts = [int(v) for v in r.hvals(keys.ledger_group_starts)] if episodes_per_group else []
        episode_stats = {
            n: int(r.get(keys.stat(n)) or 0) for n in ("episodes_failed", "episodes_restarted", "episodes_continued")
        }
    finally:
        r.close()
    admitted_ids = {f"g{i}" for i in range(admitted_feeder)}
    admitted_ids |= {g + "r" for g, o in ledger.items() if o == "requeued"}
    counts = Counter()
    pending_replay = set()
    for gid, outcome in ledger.items():
        if gid not in admitted_ids:
            continue  # counted as unknown_outcomes below
        if outcome.startswith("trained:"):
            if int(outcome.split(":")[1]) <= durable:
                counts["trained"] += 1
            else:
                pending_replay.add(gid)
        else:
            counts[outcome] += 1
    closed = {g for g in ledger if g not in pending_replay}
    open_ids = admitted_ids - closed
    in_flight = open_ids & (live | pending_replay)
    rollouts = Counter(sample_key(rid) for s, rec in steps.items() if s <= durable for rid in rec["rollouts"])
    out = {
        "unit": "groups",
        "admitted": len(admitted_ids),
        "trained": counts["trained"],
        "dropped_stale": counts["dropped_stale"],
        "filtered": counts["filtered"],
        "failed": counts["failed"],
        "requeued": counts["requeued"],
        "in_flight": len(in_flight),
        "lost": len(open_ids - in_flight),
        "double_trained": sum(n - 1 for n in rollouts.values() if n > 1),
        "trained_rollouts": sum(rollouts.values()),
        "trained_steps": len([s for s in steps if s <= durable]),
        "checkpointed_version": durable,
        "trainer_version": trainer_version,
        "unknown_outcomes": len(closed - admitted_ids),
        "dead_lettered": deadletters,
        "lost_groups": sorted(open_ids - in_flight)[:20],
    }
    total = sum(out[k] for k in ("trained", "dropped_stale", "filtered", "failed", "requeued", "in_flight", "lost"))
    # Share of admitted groups generated in vain for staleness (issue 28's figure; requeued ones are
    # admitted again, so they count once as requeued and once more as their `<id>r` copy).
    out["dropped_stale_frac"] = round(out["dropped_stale"] / max(1, out["admitted"]), 4)
    out["invariant_holds"] = total == out["admitted"] and out["lost"] == 0 and out["double_trained"] == 0
    if episodes_per_group:
        out["episodes"] = _episodes(out, episodes_per_group, starts, episode_stats)
    return out


def _episodes(groups: dict, per_group: int, starts: list[int], stats: dict) -> dict:
    """The invariant in episodes. A group is G episodes of one task item and ends as one outcome
    (one failed episode fails its group: its baseline needs all G), so each outcome counts G
    episodes; `episodes_failed` are the episodes that failed themselves (env error, timeout),
    `episodes_restarted` those restarted after a non-replayable env lost its state,
    `groups_restarted` the extra attempts of groups whose generator died, and `episodes_continued`
    the episodes of those attempts that went on from their last model turn (the rest restarted)."""
    out = {"unit": "episodes", "per_group": per_group}
    for k in ("admitted", "trained", "dropped_stale", "filtered", "failed", "requeued", "in_flight", "lost"):
        out[k] = groups[k] * per_group
    out["double_trained"] = groups["double_trained"]
    out["episodes_failed"] = stats["episodes_failed"]
    out["episodes_restarted"] = stats["episodes_restarted"]
    out["episodes_continued"] = stats["episodes_continued"]
    out["groups_restarted"] = sum(n - 1 for n in starts if n > 1)
    out["invariant_holds"] = groups["invariant_holds"]
    return out


def write_summary(
    url: str, run: str, run_dir: Path, episodes_per_group: int = 0, partitions: int = 1, extra: dict | None = None
) -> dict:
    """summarize() into RUN_DIR/summary.json, with `extra` fields of the job (e.g. first_step_s)."""
    summary = {**summarize(url, run, episodes_per_group, partitions), **(extra or {})}
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
