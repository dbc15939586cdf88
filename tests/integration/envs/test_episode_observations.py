"""The generator's observation reader (streamrl/generate/episode_runner.py) against a real redis-server: malformed
observations are dead-lettered and acked, duplicates ignored, a missing one times out the episode."""

import asyncio
import time

import msgpack
import pytest

from streamrl.core.messages import Observation, StepRequest, decode, encode
from streamrl.core.worker import Worker
from streamrl.generate.env_channel import READ_GROUP, EpisodeFailed
from streamrl.generate.episode_runner import EpisodeContext, EpisodeRunner

pytestmark = pytest.mark.anyio


async def runner(config, broker, **env) -> tuple[EpisodeRunner, Worker]:
    cfg = config.model_copy(deep=True)
    cfg.env.fn = "charclass_dialog"
    for k, v in env.items():
        setattr(cfg.env, k, v)
    w = Worker(cfg, broker, "gen-0")
    r = EpisodeRunner(EpisodeContext.of(w))  # the reader needs only the Worker side
    await broker.ensure_group(r.env.stream, READ_GROUP)
    return r, w


def req(turn: int = 0, episode_id: str = "g0:0:x") -> StepRequest:
    return StepRequest(
        episode_id=episode_id,
        group_id="g0",
        sample=0,
        turn=turn,
        item={"text": "?", "meta": {}},
        actions=["a"] * (turn + 1),
        reply_to="gen-0",
    )


async def test_malformed_observations_are_dead_lettered_and_the_good_one_delivered(config, broker):
    r, w = await runner(config, broker)
    waiting = asyncio.create_task(r.env.observe(req()))
    await asyncio.sleep(0.05)
    steps = await broker.read(r.keys.env_steps)
    assert len(steps) == 1 and decode(steps[0].data).actions == ["a"]  # the step request went out
    # Bad entries that name another episode (one that names a waiting episode fails it: below).
    bad_done = msgpack.packb(
        {**{"schema": 1, "kind": "observation"}, **Observation("g0:1:y", 0).__dict__, "done": 1}, use_bin_type=True
    )
    for payload in (b"\x00garbage", encode(req(episode_id="g0:1:y")), bad_done):
        await broker.add(r.env.stream, payload)
    await broker.client.xadd(r.env.stream, {"x": b"no d field"})
    good = Observation(episode_id="g0:0:x", turn=0, text="\ndigits:", env_worker="env-0")
    await broker.add(r.env.stream, encode(good))
    await broker.add(r.env.stream, encode(good))  # a redone step's duplicate
    while await r.env.read_once():
        pass
    assert (await asyncio.wait_for(waiting, 5)) == good
    dead = [e.data.split(b"\n", 1)[0].decode() for e in await broker.read(r.keys.deadletter, count=100)]
    assert len(dead) == 4, dead
    assert any("not valid msgpack" in d for d in dead) and any("done must be a bool" in d for d in dead)
    assert any("does not belong on this stream" in d for d in dead) and any("no 'd' field" in d for d in dead)
    assert w.stats["observations_ignored"] == 1
    info = {g["name"]: g for g in await broker.group_info(r.env.stream)}
    assert info[READ_GROUP]["pending"] == 0


def observation(drop: str = "", **fields) -> bytes:
    data = {"schema": 1, "kind": "observation", **Observation("g0:0:x", 0, text="t", reward=0.25).__dict__, **fields}
    data.pop(drop, None)
    return msgpack.packb(data, use_bin_type=True)


@pytest.mark.parametrize(
    "payload, why",
    [
        (observation(drop="reward"), "missing required field.s. reward"),
        (observation(drop="text"), "missing required field.s. text"),
        (observation(drop="done"), "missing required field.s. done"),
        (observation(drop="turn"), "missing required field.s. turn"),
        (observation(reward=float("nan")), "reward is NaN"),
        (encode(req()), "a step_request message does not belong"),
    ],
    ids=["no-reward", "no-text", "no-done", "no-turn", "nan-reward", "wrong-kind"],
)
async def test_a_malformed_observation_fails_its_waiting_episode_at_once_with_the_reason(config, broker, payload, why):
    """No silent default (a missing reward is not 0.0) and no wait for env.observation_timeout_s:
    the entry is dead-lettered and the episode it names fails now, with the decoder's reason."""
    r, _ = await runner(config, broker, observation_timeout_s=60)
    waiting = asyncio.create_task(r.env.observe(req()))
    await asyncio.sleep(0.05)
    await broker.add(r.env.stream, payload)
    t0 = time.monotonic()
    await r.env.read_once()
    with pytest.raises(EpisodeFailed, match=f"turn 0 of g0:0:x was dead-lettered: .*{why}"):
        await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - t0 < 5
    dead = [e.data.split(b"\n", 1)[0].decode() for e in await broker.read(r.keys.deadletter, count=10)]
    assert len(dead) == 1 and why.split(".")[0] in dead[0], dead
    assert not r.env.waiting


async def test_a_missing_observation_fails_the_episode_after_the_timeout(config, broker):
    r, _ = await runner(config, broker, observation_timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(EpisodeFailed, match="no observation for turn 1 within 0.3s"):
        await r.env.observe(req(turn=1))
    assert 0.3 <= time.monotonic() - t0 < 2
    assert not r.env.waiting


async def test_only_checkpoints_that_fit_the_prompt_are_continued(config, broker):
    import numpy as np

    from streamrl.core.messages import EpisodeState, Prompt

    r, w = await runner(config, broker, max_turns=2)
    prompt = Prompt(group_id="g0", prompt_ids=np.array([1, 40]), group_size=4, admitted_version=0)

    def state(sample: int, turn: int = 0, prompt_ids=(1, 40)) -> bytes:
        return encode(
            EpisodeState(
                episode_id=f"g0:{sample}:a",
                group_id="g0",
                sample=sample,
                turn=turn,
                actions=["x"] * (turn + 1),
                prompt_ids=np.array(prompt_ids),
                completion_ids=np.array([5, 6]),
                logprobs=np.array([-1.0, -2.0]),
                version=0,
            )
        )

    await broker.hset(
        r.state_key("g0"),
        {"0": state(0), "1": state(1, prompt_ids=(1, 41)), "2": state(2, turn=2), "3": b"\x00garbage", "9": state(0)},
    )
    saved = await r._load_states(prompt)
    assert list(saved) == [0] and saved[0].completion_ids.tolist() == [5, 6]
    assert w.stats["episode_states_invalid"] == 4  # other prompt, turn past max_turns, garbage, wrong field


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from streamrl.models.tiny import TinyModelConfig, build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("m") / "tiny", 0))


async def tokens_with_loop_gap(r: EpisodeRunner, text: str) -> tuple[object, float]:
    """(token ids or the EpisodeFailed raised, the longest the event loop went without a tick)."""
    from streamrl.generate.episode_sample import EpisodeSample

    gaps = [0.0]

    async def tick():
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    obs = Observation(episode_id="g0:0:x", turn=0, text=text, env_worker="env-0")
    try:
        out = await r._observation_tokens(obs, EpisodeSample([1, 2]), "g0:0:x")
    except EpisodeFailed as exc:
        out = exc
    ticker.cancel()
    return out, max(gaps)


async def test_a_large_observation_is_tokenized_off_the_event_loop(config, broker, tokenizer):
    r, _ = await runner(config, broker, max_observation_tokens=2_000_000)
    r.tokenizer, r.chat = tokenizer, None
    text = "digits: 12345 hello. " * 40_000  # 840k characters: ~2 s to tokenize on the CI machine
    ids, gap = await tokens_with_loop_gap(r, text)
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert gap < 0.75, f"the event loop stalled {gap:.2f}s while an observation was tokenized"


async def test_an_observation_past_max_observation_tokens_fails_its_episode(config, broker, tokenizer):
    r, _ = await runner(config, broker, max_observation_tokens=1000)
    r.tokenizer, r.chat = tokenizer, None
    out, _ = await tokens_with_loop_gap(r, "ab" * 600)  # 1200 tokens: counted, then failed
    assert isinstance(out, EpisodeFailed)
    assert "turn 0 of g0:0:x (env-0) is 1200 tokens, more than env.max_observation_tokens=1000" in str(out)
    t0 = time.monotonic()
    out, gap = await tokens_with_loop_gap(r, "x" * 5_000_000)  # 5 MB: its length alone says so
    assert isinstance(out, EpisodeFailed) and "is at least" in str(out), out
    assert time.monotonic() - t0 < 1 and gap < 0.5
    assert (await tokens_with_loop_gap(r, "ab" * 500))[0] == tokenizer("ab" * 500, add_special_tokens=False)[
        "input_ids"
    ]


class LosesState(EpisodeRunner):
    """Every attempt ends as a non-replayable env's "replay" answer does (None), or fails."""

    fail = False

    async def _attempt(self, prompt, sample, saved):
        if self.fail:
            raise EpisodeFailed("env step 0: tool crashed")
        return None


def prompt():
    import numpy as np

    from streamrl.core.messages import Prompt

    return Prompt(group_id="g0", prompt_ids=np.array([1, 40]), group_size=2, admitted_version=0)


async def test_the_replay_answer_that_fails_the_episode_is_not_counted_as_a_restart(config, broker):
    from streamrl.generate.episode_runner import MAX_RESTARTS

    r = LosesState(EpisodeContext.of(w := Worker(config, broker, "gen-0")))
    with pytest.raises(EpisodeFailed, match=f"lost the episode's state {MAX_RESTARTS + 1} times"):
        await r._episode(prompt(), 0)
    assert int(await broker.get(r.keys.stat("episodes_restarted"))) == MAX_RESTARTS
    assert w.stats["episodes_restarted"] == MAX_RESTARTS


async def test_a_group_failed_by_its_episodes_counts_in_groups_failed(config, broker):
    """The trainer adds stats:groups_failed to metrics.jsonl's `failed` (it stayed 0 before)."""
    from streamrl.core.broker import Entry

    r = LosesState(EpisodeContext.of(Worker(config, broker, "gen-0")))
    r.fail = True
    entry_id = await broker.add(r.keys.prompts, encode(prompt()))
    assert await r.run_group(Entry(entry_id, encode(prompt()), {}), prompt()) is False
    assert int(await broker.get(r.keys.stat("groups_failed"))) == 1
    assert int(await broker.get(r.keys.stat("episodes_failed"))) == 2
