"""What `env.fn` (or `streamrl env --fn`) names, resolved to a factory of Envs: a built-in env, another
library's env through an adapter (streamrl/envs/adapters), or a user's `package.module:Class`.

    make = env_factory(resolve_env(cfg.env.fn), cfg)      # the env worker's
    env = make()                                          # one Env per episode

Apart from streamrl/envs/base.py so that the adapters, which build on base.Env, are not imported back by it.
"""

from __future__ import annotations

import inspect

from streamrl.core.errors import ConfigError
from streamrl.core.imports import CODE_SPEC, import_spec
from streamrl.envs import adapters as env_adapters
from streamrl.envs.base import CharclassDialog

BUILTIN_ENVS = {"charclass_dialog": CharclassDialog}


def resolve_env(spec: str, latency_ms: tuple[float, float] = (20.0, 200.0)):
    """A factory `() -> Env` for a built-in name, an adapter spec (`textarena:<game>`) or
    `package.module:Class`; ConfigError names the fix."""
    if spec in BUILTIN_ENVS:
        cls = BUILTIN_ENVS[spec]
        return lambda: cls(latency_ms=tuple(latency_ms))
    if env_adapters.split_spec(spec):  # another library's env, run unchanged (streamrl/envs/adapters)
        return env_adapters.make_factory(spec)
    if not CODE_SPEC.fullmatch(spec):
        raise ConfigError(
            f"env {spec!r} is neither a built-in env ({', '.join(BUILTIN_ENVS)}) nor "
            "`package.module:Class` (or `path/to/script.py:Class`), e.g. --fn my_envs:Calculator"
        )
    module_name, attr, cls = import_spec(spec, f"env {spec!r}", "install it or add its folder to PYTHONPATH")
    if not (inspect.isclass(cls) and callable(getattr(cls, "step", None))):
        raise ConfigError(
            f"env {spec!r}: {module_name!r} has no class {attr!r} with reset(item) and step(action); "
            "subclass streamrl.envs.base.Env"
        )
    return cls


def env_factory(cls, cfg):
    """`() -> Env` for what resolve_env returned; an env class with a `from_config(cfg)` classmethod
    (streamrl.envs.tool_env.ToolEnv) is built from the job's config, and built once here so a bad config
    fails the worker's start, not its first step."""
    make = getattr(cls, "from_config", None)
    if inspect.isclass(cls) and callable(make):
        make(cfg)
        return lambda: make(cfg)
    return cls
