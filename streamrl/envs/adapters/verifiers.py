"""verifiers' environments (prime-rl's `verifiers` 0.4), unchanged, as streamrl envs.

    env.fn: verifiers:<taskset id>[?<taskset field>=<value>&env.<env field>=<value>&...]
    task.name: env            # prompts: the taskset's tasks, from index run.seed on
    reward.fn: env            # the rewards the env and the task record on the episode's trace

The env is what `vf eval <taskset id> --taskset.<field> <value>` runs: verifiers' own loader
builds the taskset (a built-in one or an installed taskset package) and the Env its package
exports (else verifiers' SingleAgentEnv). verifiers normally runs the model itself, as a harness
program talking to an OpenAI-compatible endpoint; here streamrl is that model. Each episode runs
the env's own `run(task, agents)` coroutine with a seat whose `interaction(task)` hands every
`turn()` to streamrl: the env's message is the observation, the model's next turn comes back as
the turn's reply. When `run()` returns, the task's own scoring (`@vf.reward`/`@vf.metric`,
plugged rewards, judges), then the env's `finalize()`, run on the trace, and its weighted
reward (`Trace.reward`) is the episode's reward.

A task is addressed by its index in the taskset (meta["idx"]), so any env worker rebuilds it.
An episode lives in one `run()` coroutine, which no replay can rebuild from the actions in
general (an env may draw process-global randomness, as TextArenaEnv does), so these envs are
not replayable: an episode whose env worker died restarts from its prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import threading
from urllib.parse import parse_qsl

from streamrl.core.errors import ConfigError
from streamrl.envs.base import Env

_ENVS: dict[str, tuple] = {}
"""name -> (vf.Env, the tasks loaded so far, the taskset's iterator): built once per process."""
_LOCK = threading.Lock()


def _parse(name: str) -> dict:
    """`<taskset id>?k=v&...` -> verifiers' env config data: `k` is a taskset config field, or
    `env.<path>` a field of the env's config (`env.id=best-of-n`, `env.player.max_turns=3`). A value
    is a string that verifiers' config coerces to its field's type, or JSON when it is an object or
    a list (e.g. `task={...}`)."""
    taskset_id, _, query = name.partition("?")
    data: dict = {"taskset": {"id": taskset_id}}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        try:
            value = json.loads(value) if value[:1] in "{[" and value else value
        except ValueError:
            raise ConfigError(f"env.fn=verifiers:{name}: {key}={value!r} is not valid JSON") from None
        path = key.split(".")[1:] if key.startswith("env.") else ["taskset", key]
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return data


def _reason(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):  # pydantic's ValidationError: one line per field
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors())
    return str(exc)


def _load(name: str):
    import verifiers.v1 as vf

    with _LOCK:
        if name not in _ENVS:
            try:
                env = vf.load_environment(vf.resolve_env_config(_parse(name)))
            except (ImportError, ValueError, TypeError, AttributeError) as exc:
                raise ConfigError(
                    f"env.fn=verifiers:{name}: verifiers cannot load this env ({_reason(exc)}); "
                    "the name is a taskset id (built in, e.g. textarena, or an installed taskset package, "
                    "e.g. vf_textarena_offline from examples/verifiers on PYTHONPATH) with the taskset's "
                    "config fields as ?key=value&... and the env's as env.<field>=value"
                ) from None
            _ENVS[name] = (env, [], iter(env.taskset))
        return _ENVS[name]


def _task(name: str, idx: int):
    """The taskset's task number `idx` (its `load()` runs once per process, as far as needed)."""
    env, loaded, tasks = _load(name)
    with _LOCK:
        while len(loaded) <= idx:
            task = next(tasks, None)
            if task is None:
                break
            loaded.append(task)
    if not loaded:
        raise ConfigError(f"env.fn=verifiers:{name}: the taskset yields no tasks")
    return env, loaded[idx % len(loaded)]  # a finite taskset wraps around


def _prompt_text(name: str, task) -> str:
    if task.data.prompt is None:
        raise ConfigError(
            f"env.fn=verifiers:{name}: task {task.data.idx} has no prompt (its user opens the conversation, "
            "e.g. the user-sim env); streamrl's episodes start from a prompt, so this env is not supported"
        )
    return "\n\n".join(t for t in (task.data.system_prompt, task.data.prompt_text) if t)


def _check_offline_scoring(name: str, task) -> None:
    """Scoring without a runtime skips a reward that needs one: refuse the env rather than train on
    a partial reward."""
    needs = [
        fn.__name__
        for fn in (*task.hooks("reward"), *task.hooks("metric"))
        if (p := inspect.signature(fn).parameters.get("runtime")) is not None and p.default is p.empty
    ]
    if needs or task.config.judges:
        raise ConfigError(
            f"env.fn=verifiers:{name}: the task's scoring needs what streamrl does not run "
            f"({', '.join(needs) or 'judges (a judge model)'}: a sandbox runtime or another model); "
            "pick a taskset scored from the conversation alone"
        )


class _Turn:
    """One request of the env for a model turn: `message` is what the env said first (None: the
    model speaks again, as after the prompt)."""

    def __init__(self, message: str | None):
        self.message = message
        self.reply: asyncio.Future = asyncio.get_running_loop().create_future()


class _Seat:
    """One of the env's agents, played by streamrl: what `agents.<name>` is inside `run()`."""

    def __init__(self, episode: VerifiersEnv, name: str, config):
        self.episode, self.name, self.config = episode, name, config

    @contextlib.asynccontextmanager
    async def interaction(self, task):
        yield await self.episode._open(self, task)
        await self.episode._close(task)

    async def run(self, task):
        """SingleAgentEnv's `agents.agent.run(task)`: the model answers the prompt once."""
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return interaction.trace


class _Interaction:
    def __init__(self, episode: VerifiersEnv, trace, max_turns: int | None):
        self.episode, self.trace, self.max_turns = episode, trace, max_turns

    async def turn(self, message: str | None = None):
        import verifiers.v1 as vf

        if self.max_turns is not None and self.trace.num_turns >= self.max_turns:
            return vf.Segment(messages=[], terminated=True)
        if message is not None:
            self.episode._append(vf.UserMessage(content=message), sampled=False)
        request = _Turn(message)
        await self.episode._events.put(request)
        action = await request.reply
        reply = vf.AssistantMessage(content=action)
        self.episode._append(reply, sampled=True)
        return vf.Segment(messages=[reply])


class VerifiersEnv(Env):
    """One verifiers episode: the env's `run()` coroutine, paused at each model turn."""

    replayable = False

    def __init__(self, name: str):
        self.name = name
        self._events: asyncio.Queue = asyncio.Queue()
        self._runner: asyncio.Task | None = None
        self._pending: _Turn | None = None
        self._seat: _Seat | None = None
        self.trace = None

    async def reset(self, item: dict) -> None:
        import verifiers.v1 as vf

        idx = (item.get("meta") or {}).get("idx")
        if idx is None:
            raise ValueError(
                f"verifiers:{self.name} plays the taskset's own tasks: use task.name=env (the item has no meta.idx)"
            )
        self.env, self.task = _task(self.name, int(idx))
        agents = vf.Agents(self.env.config, lambda name, spec: _Seat(self, name, spec))
        self._runner = asyncio.ensure_future(self._run(agents))
        first = await self._next()
        if not isinstance(first, _Turn) or first.message is not None:
            raise RuntimeError(
                f"verifiers:{self.name}: run() did not start with the model answering the prompt ({first!r:.80})"
            )
        self._pending = first

    async def _run(self, agents):
        await self.env.setup(agents)
        await self.env.run(self.task, agents)
        if self.trace is None:
            raise RuntimeError(f"{type(self.env).__name__}.run() ran no agent")
        import verifiers.v1 as vf

        episode = vf.Episode(
            env=vf.EnvInfo(id=self.env.config.env_id), task=self.trace.task, traces=[self.trace], ok=True
        )
        await self.env.finalize(self.task, episode)

    async def _next(self):
        """The env's next request for a model turn, or "done" when its run() has returned."""
        if not self._runner.done():
            getter = asyncio.ensure_future(self._events.get())
            await asyncio.wait([getter, self._runner], return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                return getter.result()
            getter.cancel()
        if exc := self._runner.exception():
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # an env's TaskGroup
                exc = exc.exceptions[0]
            raise RuntimeError(f"verifiers env {type(self.env).__name__} raised {type(exc).__name__}: {exc}") from exc
        return "done"

    async def _open(self, seat: _Seat, task):
        import verifiers.v1 as vf

        if self._seat is not None:  # user-sim's two seats, best-of-n's n attempts of one seat
            raise RuntimeError(
                f"{type(self.env).__name__} opens more than one agent run per episode ({self._seat.name}, "
                f"then {seat.name}); streamrl plays one model conversation per episode"
            )
        self._seat = seat
        self.trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=seat.config),
        )
        if task.data.system_prompt:
            self._append(vf.SystemMessage(content=task.data.system_prompt), sampled=False)
        if task.data.prompt is not None:
            self._append(vf.UserMessage(content=task.data.prompt_text), sampled=False)
        return _Interaction(self, self.trace, seat.config.max_turns)

    async def _close(self, task) -> None:
        # What verifiers' Rollout.close does after the harness: the task scores its trace.
        self.trace.is_completed = True
        self.trace.ok = True
        await task.score(self.trace)

    def _append(self, message, sampled: bool) -> None:
        import verifiers.v1 as vf

        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(vf.MessageNode(parent=parent, message=message, sampled=sampled))

    async def step(self, action: str) -> tuple[str, float, bool]:
        if not self._pending.reply.done():  # cancelled when run() failed elsewhere meanwhile
            self._pending.reply.set_result(action)
        event = await self._next()
        if event == "done":
            return "", float(self.trace.reward), True
        self._pending = event
        return event.message or "", 0.0, False


def make_factory(name: str):
    env, task = _task(name, 0)
    _prompt_text(name, task)
    _check_offline_scoring(name, task)
    return lambda: VerifiersEnv(name)


def prompts(name: str, n: int, seed: int) -> list[dict]:
    items = []
    for idx in itertools.count(seed):
        if len(items) == n:
            break
        _env, task = _task(name, idx)
        items.append(
            {"text": _prompt_text(name, task), "meta": {"task": "env", "env": f"verifiers:{name}", "idx": idx}}
        )
    return items
