"""Adapters that run other libraries' environments, unchanged, as streamrl env workers.

    env.fn: textarena:GuessTheNumber-v0       # <adapter>:<that library's name for the env>
    env.fn: verifiers:vf_textarena_offline?game=Secretary-v0
    task.name: env                            # the prompts are the env's own first observations

A spec `<adapter>:<name>` whose prefix is an adapter below selects it (the prefixes are reserved:
a user module of that name is not imported as `module:Class`). Each adapter module provides
`make_factory(name) -> () -> streamrl.envs.base.Env` (one instance per episode) and
`prompts(name, n, seed) -> [{"text", "meta"}]`, the task items of `task.name: env`: the env reset
with seed `seed + i`, its first observation as the prompt, the seed in meta so that any env
worker rebuilds the same game. Importing this package imports none of the libraries; an adapter
imports its library when it is used. docs/environments.md lists the adapters and their limits.
"""

from __future__ import annotations

import importlib
import re

from streamrl.core.errors import ConfigError

ADAPTERS = {
    "textarena": (
        "streamrl.envs.adapters.textarena",
        "textarena",
        "TextArena's games, e.g. textarena:GuessTheNumber-v0",
    ),
    "verifiers": (
        "streamrl.envs.adapters.verifiers",
        "verifiers",
        "a verifiers taskset id and its config, e.g. verifiers:vf_textarena_offline?game=Secretary-v0",
    ),
}
"""prefix -> (adapter module, the PyPI package it needs, what the name is)."""
NOT_ADAPTED = {
    "openenv": "PyPI openenv-core 0.3 installs beside this stack, but its wheel ships no environment: OpenEnv's "
    "envs live in its repository and on the Hugging Face Hub as HTTP servers in Docker images, which a job cannot "
    "fetch offline; see docs/environments.md",
}
"""Prefixes of libraries an adapter was considered for and not built, with why (named in errors)."""
_SPEC = re.compile(r"([a-z_]+):(\S+)")


def split_spec(spec: str) -> tuple[str, str] | None:
    """(adapter, name) for `<adapter>:<name>` with a known or considered adapter prefix, else None."""
    m = _SPEC.fullmatch(spec or "")
    if m and (m.group(1) in ADAPTERS or m.group(1) in NOT_ADAPTED):
        return m.group(1), m.group(2)
    return None


def check_spec(spec: str) -> str | None:
    """The error for an adapter spec that cannot be used (syntax only, nothing imported), else None."""
    parts = split_spec(spec)
    if parts and parts[0] in NOT_ADAPTED:
        return (
            f"env.fn={spec!r}: there is no {parts[0]} adapter: {NOT_ADAPTED[parts[0]]}; use one of "
            f"{', '.join(f'{k}:<name>' for k in ADAPTERS)} or a streamrl.envs.base.Env class"
        )
    return None


def _module(spec: str):
    parts = split_spec(spec)
    if parts is None:
        raise ConfigError(
            f"{spec!r} is not an adapter spec; expected one of {', '.join(f'{k}:<name>' for k in ADAPTERS)}"
        )
    if problem := check_spec(spec):
        raise ConfigError(problem)
    module_name, package, _ = ADAPTERS[parts[0]]
    try:
        return importlib.import_module(module_name), parts[1]
    except ImportError as exc:
        raise ConfigError(
            f"env.fn={spec!r} needs the {package!r} package ({exc}); install it with "
            f"`pip install -e '.[envs]'` (or `pip install {package}`)"
        ) from exc


def make_factory(spec: str):
    """A factory `() -> Env` running the adapted library's env named in `spec`; ConfigError names the fix."""
    module, name = _module(spec)
    return module.make_factory(name)


def prompts(spec: str, n: int, seed: int) -> list[dict]:
    """The task items of `task.name: env`: `n` first observations of the env (seeds seed..seed+n-1)."""
    module, name = _module(spec)
    return module.prompts(name, n, seed)
