"""env.fn's adapter spec syntax, `<adapter>:<that library's name for the env>`: which prefixes are
adapters (streamrl/envs/adapters/ runs them) and which were considered and not built, checked when
the config loads without importing any adapter or library.

    split_spec("textarena:GuessTheNumber-v0")   # ("textarena", "GuessTheNumber-v0")
    split_spec("my_envs:Counter")               # None: a user's module:Class
    check_spec("openenv:echo")                  # the error naming why there is no openenv adapter
"""

from __future__ import annotations

import re

ADAPTER_PREFIXES = {
    "textarena": ("textarena", "TextArena's games, e.g. textarena:GuessTheNumber-v0"),
    "verifiers": (
        "verifiers",
        "a verifiers taskset id and its config, e.g. verifiers:vf_textarena_offline?game=Secretary-v0",
    ),
}
"""prefix -> (the PyPI package its adapter needs, what the name is). Reserved: a user module of that
name is not imported as `module:Class`; streamrl.envs.adapters.<prefix> is the adapter."""
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
    if m and (m.group(1) in ADAPTER_PREFIXES or m.group(1) in NOT_ADAPTED):
        return m.group(1), m.group(2)
    return None


def check_spec(spec: str) -> str | None:
    """The error for an adapter spec that cannot be used (syntax only, nothing imported), else None."""
    parts = split_spec(spec)
    if parts and parts[0] in NOT_ADAPTED:
        return (
            f"env.fn={spec!r}: there is no {parts[0]} adapter: {NOT_ADAPTED[parts[0]]}; use one of "
            f"{', '.join(f'{k}:<name>' for k in ADAPTER_PREFIXES)} or a streamrl.envs.base.Env class"
        )
    return None
