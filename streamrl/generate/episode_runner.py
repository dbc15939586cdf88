"""The generator's side of multi-turn episodes: run a group's G episodes, never blocking on envs.

    ctx = EpisodeContext.of(generator, engine, weights.pinned, requests)   # what it uses of the generator
    runner = EpisodeRunner(ctx); await runner.start()              # when env.fn is set
    ok = await runner.run_group(entry, prompt)                     # True: rollouts published

Each episode alternates a model turn (one vLLM request over the exact token history) and an
environment step: a StepRequest goes to `env_steps`, the episode's coroutine then waits on a
future, holding no engine slot, so the engine serves other episodes meanwhile (the exchange with
env workers: streamrl/generate/env_channel.py). The observation text is tokenized alone, on a
thread, and appended (streamrl.generate.episode_sample); one longer than env.max_observation_tokens
fails the episode. The episode ends when the env says done, after
env.max_turns model turns, or when the next turn would pass generator.max_model_len. Once all G
episodes are done the group's G rollouts are published together, so a group that fails publishes
nothing.

Failures: an observation with `error` (the env raised, timed out, returned garbage) or none within
env.observation_timeout_s fails the episode, and with it its group (its advantage baseline needs
all G): the group is closed as `failed` in the ledger, the prompt dead-lettered with the reason,
and `stats:episodes_failed` counted. An observation with error_kind "replay" (a non-replayable
env lost its state) restarts that episode from the prompt (`episodes_restarted`).

Generator death: after each model turn the episode's state (token history, log-probs, versions,
observation spans, actions, env rewards so far) is written to the hash `episode_state:{group_id}`
before its step request goes out. A generator that dies leaves its prompt un-acked; the generator
that claims it (each attempt counted in `ledger:group_starts`) continues every checkpointed episode
from its last model turn under a new episode id (`episodes_continued`): it sends that turn's step
again (a replayable env replays the earlier actions; a non-replayable one answers "replay" and the
episode restarts from the prompt) and carries on. Episodes without a checkpoint start from the prompt.
The hash is deleted once the group's rollouts are published or the group fails.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

from streamrl.config.schema import Config
from streamrl.core.accounting import count_group_start, fail_group
from streamrl.core.broker import Broker, Entry, Keys
from streamrl.core.consumer import StreamConsumer
from streamrl.core.errors import DecodeError
from streamrl.core.messages import EpisodeState, Observation, Prompt, Rollout, StepRequest, decode, encode
from streamrl.core.worker import Worker
from streamrl.generate.chat import ChatBridge
from streamrl.generate.env_channel import EnvChannel, EpisodeFailed, Lockstep
from streamrl.generate.episode_sample import EpisodeSample
from streamrl.generate.running_requests import RunningRequests
from streamrl.generate.vllm_engine import sample_seed

MAX_RESTARTS = 2
"""Restarts of one episode after its env lost state, before the episode fails."""


@dataclass(frozen=True)
class EpisodeContext:
    """What the episode runner uses of its generator, and nothing else of it."""

    cfg: Config
    worker_id: str
    broker: Broker
    keys: Keys
    log: Any
    count: Callable[..., None]
    """The generator's counters (its heartbeat and `stopped` line)."""
    consumer: StreamConsumer
    """The generator's reads (its observation stream) and dead letters (a failed group's prompt)."""
    engine: Any = None
    """The generator's VLLMEngine (model turns); None where none runs (tests of the env side)."""
    pinned: Callable[[], AbstractContextManager] | None = None
    """WeightFollower.pinned: the version (with LoRA the adapter) a model turn runs on."""
    requests: RunningRequests | None = None
    """The generator's running requests: a model turn counts as one while it streams."""

    @classmethod
    def of(cls, w: Worker, engine=None, pinned=None, requests=None) -> EpisodeContext:
        """The context of worker `w` (a generator) with its engine side."""
        return cls(w.cfg, w.worker_id, w.broker, w.keys, w.log, w.count, w.consumer, engine, pinned, requests)


class EpisodeRunner:
    def __init__(self, ctx: EpisodeContext):
        self.ctx = ctx
        self.cfg, self.keys = ctx.cfg, ctx.keys
        self.env = EnvChannel(ctx.cfg, ctx.consumer, ctx.count)
        """Step requests out, observations back to the waiting episode."""
        self.lockstep = Lockstep() if self.cfg.env.lockstep else None
        self._longest: int | None = None

    async def start(self) -> None:
        self.tokenizer = self.ctx.engine.get_tokenizer()
        self.chat = ChatBridge(self.tokenizer, self.cfg.tools) if self.cfg.tools.chat else None
        await self.env.start()

    async def close(self) -> None:
        await self.env.close()

    def only_waiting_on_env(self) -> bool:
        """No model turn runs and some episode waits for an observation: what the generator still holds
        waits on env workers (on a stop, those are stopping too, or hung in a step that never returns)."""
        requests = self.ctx.requests
        return bool(self.env.waiting) and (requests is None or requests.active == 0)

    # -- one group / one episode ---------------------------------------------------------------
    async def run_group(self, entry: Entry, prompt: Prompt) -> bool:
        """Run the group's episodes; publish its rollouts (True) or close it as failed (False)."""
        await count_group_start(self.ctx.broker, self.keys, prompt.group_id)
        saved = await self._load_states(prompt)
        tasks = [asyncio.create_task(self._episode(prompt, s, saved.get(s))) for s in range(prompt.group_size)]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            raise
        failed = [t for t in done if not t.cancelled() and isinstance(t.exception(), EpisodeFailed)]
        other = [t.exception() for t in done if not t.cancelled() and t.exception() is not None and t not in failed]
        if failed or other:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if other:
            raise other[0]  # engine or broker trouble: the generator's usual retry/fatal handling
        if failed:
            # Said as the env worker says it ("episode ID turn N: what"): one cause on the console.
            reason = str(failed[0].exception())
            await self.ctx.broker.incr(self.keys.stat("episodes_failed"), len(failed))
            self.ctx.count("episodes_failed", len(failed))
            self.ctx.log.warning("episode_failed", group_id=prompt.group_id, reason=reason)
            await self.ctx.consumer.dead_letter(self.keys.prompts, entry, reason)
            await fail_group(self.ctx.broker, self.keys, prompt.group_id, reason)
            await self.ctx.broker.delete(self.state_key(prompt.group_id))
            return False
        rollouts = [t.result() for t in tasks]
        await self.ctx.broker.add_many(self.keys.rollouts_for(prompt.group_id), [encode(r) for r in rollouts])
        # A death between these two lines continues the episodes once more under new ids; the
        # trainer trains the first copy of each sample (docs/protocol.md, "Rollout ids").
        await self.ctx.broker.delete(self.state_key(prompt.group_id))
        self.ctx.count("rollouts", len(rollouts))
        self.ctx.count("episodes", len(rollouts))
        return True

    # -- checkpoints -------------------------------------------------------------------------
    def state_key(self, group_id: str) -> str:
        return self.keys.episode_state(group_id)

    async def _load_states(self, prompt: Prompt) -> dict[int, EpisodeState]:
        """The group's episode checkpoints a dead generator left (empty on a first attempt). One
        that does not fit this prompt or config is skipped: that episode starts from the prompt."""
        out = {}
        for name, blob in (await self.ctx.broker.hgetall(self.state_key(prompt.group_id))).items():
            try:
                st = decode(blob, expect=EpisodeState)
                if st.group_id != prompt.group_id or str(st.sample) != name:
                    raise DecodeError(f"it is for {st.group_id} sample {st.sample}")
                if not 0 <= st.sample < prompt.group_size or st.turn >= self.cfg.env.max_turns:
                    raise DecodeError(
                        f"sample {st.sample} / turn {st.turn} is outside this job's group_size / env.max_turns"
                    )
                if st.prompt_ids.tolist() != prompt.prompt_ids.tolist():
                    raise DecodeError("its prompt ids differ from the prompt's")
            except DecodeError as exc:
                self.ctx.count("episode_states_invalid")
                self.ctx.log.warning("episode_state_skipped", group_id=prompt.group_id, sample=name, reason=str(exc))
                continue
            out[st.sample] = st
        return out

    async def _save_state(
        self,
        prompt: Prompt,
        sample: int,
        episode_id: str,
        s: EpisodeSample,
        actions: list,
        texts: list,
        step_s: list,
        env_reward: float,
        counts: dict,
    ) -> None:
        st = EpisodeState(
            episode_id=episode_id,
            group_id=prompt.group_id,
            sample=sample,
            turn=len(actions) - 1,
            actions=list(actions),
            texts=list(texts),
            step_s=list(step_s),
            env_reward=env_reward,
            counts=dict(counts),
            writer=self.ctx.worker_id,
            **s.rollout_fields(),
        )
        await self.ctx.broker.hset(self.state_key(prompt.group_id), {str(sample): encode(st)})

    async def _episode(self, prompt: Prompt, sample: int, saved: EpisodeState | None = None) -> Rollout:
        restart = False
        for _ in range(MAX_RESTARTS + 1):
            if restart:  # counted when the next attempt begins: the last "replay" answer fails the episode
                self.ctx.count("episodes_restarted")
                await self.ctx.broker.incr(self.keys.stat("episodes_restarted"))
            result = await self._attempt(prompt, sample, saved)
            saved = None  # a restart (the env lost its state) begins at the prompt
            if result is not None:
                return result
            restart = True
        raise EpisodeFailed(f"the env lost the episode's state {MAX_RESTARTS + 1} times (not replayable)")

    async def _attempt(self, prompt: Prompt, sample: int, saved: EpisodeState | None) -> Rollout | None:
        episode_id = f"{prompt.group_id}:{sample}:{uuid.uuid4().hex[:8]}"
        if self.lockstep is None:
            return await self._run(prompt, sample, episode_id, saved)
        await self.lockstep.join(episode_id)
        try:
            return await self._run(prompt, sample, episode_id, saved)
        finally:
            await self.lockstep.leave(episode_id)

    async def _run(self, prompt: Prompt, sample: int, episode_id: str, saved: EpisodeState | None) -> Rollout | None:
        """One try at the episode (from `saved`'s last model turn if given); None when the env lost
        its state and it must start over."""
        ctx, env = self.ctx, self.cfg.env
        s = EpisodeSample(prompt.prompt_ids.tolist())
        item = {"text": prompt.text, "meta": prompt.meta}
        actions, texts, step_s = [], [], []
        env_reward, finish, counts = 0.0, "max_turns", {}
        max_len = self.cfg.generator.max_model_len
        first, env_worker = 0, ""
        if saved is not None:
            s = EpisodeSample.restore(
                saved.prompt_ids,
                saved.completion_ids,
                saved.logprobs,
                saved.version,
                saved.version_switches,
                saved.obs_spans,
            )
            actions, texts, step_s = list(saved.actions), list(saved.texts), list(saved.step_s)
            env_reward, first = float(saved.env_reward), saved.turn
            counts = dict(saved.counts)  # the tool calls of the turns kept count once, here
            ctx.count("episodes_continued")
            await ctx.broker.incr(self.keys.stat("episodes_continued"))
            ctx.log.info(
                "episode_continued",
                episode_id=episode_id,
                previous=saved.episode_id,
                turns_kept=first + 1,
                tokens_kept=len(s.token_ids),
                written_by=saved.writer,
            )
        for turn in range(first, env.max_turns):
            if saved is None or turn > first:  # a continued episode resends its last turn's step first
                room = max_len - len(s)
                if room < 1:
                    finish = "length"
                    break
                action = await self._model_turn(s, prompt, sample, turn, room)
                actions.append(action)
                texts.append(action)
                await self._save_state(prompt, sample, episode_id, s, actions, texts, step_s, env_reward, counts)
            req = StepRequest(
                episode_id=episode_id,
                group_id=prompt.group_id,
                sample=sample,
                turn=turn,
                item=item,
                actions=list(actions),
                reply_to=ctx.worker_id,
            )
            t0 = time.monotonic()
            obs = await self.env.observe(req, env_worker)
            env_worker = obs.env_worker
            step_s.append(round(time.monotonic() - t0, 6))
            if obs.error_kind == "replay":
                return None
            if obs.error:
                raise EpisodeFailed(f"episode {episode_id} turn {turn}: {obs.error}")
            env_reward += obs.reward
            for key, value in obs.counts.items():
                counts[key] = counts.get(key, 0) + value
            if obs.done:
                finish = "stop"
                break
            if turn == env.max_turns - 1:
                break
            obs_ids = await self._observation_tokens(obs, s, episode_id)
            if len(s) + len(obs_ids) >= max_len:  # no room for the next model turn
                finish = "length"
                break
            s.add_observation(obs_ids)
            texts.append(obs.text)
            if self.lockstep is not None:
                await self.lockstep.wait(episode_id)
        if not actions:
            raise EpisodeFailed(f"the prompt ({len(s)} tokens) leaves no room under generator.max_model_len={max_len}")
        meta = {
            **prompt.meta,
            "env_reward": env_reward,
            "turns": len(actions),
            "env_step_s": step_s,
            "env_tokens": s.env_tokens,
            "env_counts": counts,
            "turn_chars": [len(t) for t in texts],  # model turn, observation, ...: samples.jsonl's turns
        }
        return Rollout(
            rollout_id=episode_id,  # one id per generated episode (docs/protocol.md, "Rollout ids")
            group_id=prompt.group_id,
            sample=sample,
            group_size=prompt.group_size,
            finish_reason=finish,
            text="".join(texts),
            prompt_text=prompt.text,
            meta=meta,
            worker=ctx.worker_id,
            finished_at=time.time(),
            **s.rollout_fields(),
        )

    async def _observation_tokens(self, obs: Observation, s: EpisodeSample, episode_id: str) -> list[int]:
        """The observation's token ids, tokenized on a thread: a multi-MB observation takes seconds
        to tokenize, which on the loop would stall every episode and the weight sync. One longer than
        env.max_observation_tokens fails the episode; when its length in characters alone proves it
        (no token is longer than the vocabulary's longest), without tokenizing it at all."""
        limit = self.cfg.env.max_observation_tokens
        chars = len(obs.text) + sum(len(m["content"]) for m in obs.messages)
        if chars > limit * self._longest_token():
            n = f"at least {chars // self._longest_token()}"
        else:
            ids = await asyncio.to_thread(self._observation_ids, obs, s)
            if len(ids) <= limit:
                return ids
            n = str(len(ids))
        raise EpisodeFailed(
            f"the observation for turn {obs.turn} of {episode_id} ({obs.env_worker}) is {n} tokens, "
            f"more than env.max_observation_tokens={limit}: shorten the env's answers or raise the limit"
        )

    def _longest_token(self) -> int:
        if self._longest is None:  # once: ~1 ms over a 150k vocabulary
            self._longest = max(len(t) for t in self.tokenizer.get_vocab())
        return self._longest

    def _observation_ids(self, obs: Observation, s: EpisodeSample) -> list[int]:
        """The observation's token ids: with tools.chat, its messages (or its text as a user message)
        through the chat template's delta; otherwise its text tokenized alone. Either way an exact
        extension of the history (streamrl/generate/chat.py)."""
        if self.chat is None:
            return self.tokenizer(obs.text, add_special_tokens=False)["input_ids"]
        messages = obs.messages or [{"role": "user", "content": obs.text}]
        return self.chat.observation_ids(messages, s.context)

    async def _model_turn(self, s: EpisodeSample, prompt: Prompt, sample: int, turn: int, room: int) -> str:
        """Sample one model turn over the exact history; tokens carry the version that made them."""
        ctx = self.ctx
        seed = sample_seed(self.cfg.run.seed, f"{prompt.group_id}#{turn}", sample)
        params = ctx.engine.sampling_params(seed, max_tokens=min(self.cfg.generator.max_tokens, room))
        request_id = f"{ctx.worker_id}:{prompt.group_id}:{sample}:{turn}:{uuid.uuid4().hex[:8]}"
        text = []
        before = s.model_tokens
        # LoRA: the turn runs on the adapter newest at its start.
        with ctx.requests.running(request_id), ctx.pinned() as pin:
            async for delta in ctx.engine.stream(s.context, params, request_id, pin.request):
                ctx.requests.delivered()
                # Full weights: consumed before a weight switch completes (WeightFollower.switch
                # drains), so the version current now is the one that produced these tokens.
                s.add_model(delta.token_ids, delta.logprobs, pin.version)
                text.append(delta.text)
        ctx.count("tokens_generated", s.model_tokens - before)
        return "".join(text)
