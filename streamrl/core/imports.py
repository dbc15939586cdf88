"""`package.module:attr` specs from the config or the command line (loss.name, --fn, env.fn):
import the module and fetch the attribute, with one error naming the spec and the fix.

    module_name, attr, obj = import_spec("my_envs:Calculator", "env 'my_envs:Calculator'", "install it ...")
"""

from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager

from streamrl.core.errors import ConfigError


def import_spec(spec: str, where: str, fix: str) -> tuple[str, str, object]:
    """(module name, attribute name, the attribute or None) of `spec`; an ImportError becomes a
    ConfigError "{where}: cannot import module {module!r} ({exc}); {fix}". Callers check what they got."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import module {module_name!r} ({exc}); {fix}") from exc
    return module_name, attr, getattr(module, attr, None)


@contextmanager
def cwd_on_path():
    """The current directory on sys.path for the block, as it is for the roles (`python -m
    streamrl.cli` in this directory), so a user's `my_module:fn` imports here as it will there."""
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        if added:
            sys.path.remove(os.getcwd())
