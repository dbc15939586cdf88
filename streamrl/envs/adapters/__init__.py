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

from streamrl.config.env_spec import ADAPTER_PREFIXES, NOT_ADAPTED, check_spec, split_spec
from streamrl.core.errors import ConfigError

__all__ = ["ADAPTERS", "NOT_ADAPTED", "check_spec", "make_factory", "prompts", "split_spec"]

ADAPTERS = {
    prefix: (f"streamrl.envs.adapters.{prefix}", package, what) for prefix, (package, what) in ADAPTER_PREFIXES.items()
}
"""prefix -> (adapter module, the PyPI package it needs, what the name is); the prefixes and the spec
syntax (split_spec, check_spec) are config's (streamrl/config/env_spec.py), which validates env.fn."""


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
