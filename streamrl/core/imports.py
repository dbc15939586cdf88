"""`package.module:attr` and `path/to/script.py:attr` specs from the config or the command line
(reward.fn, env.fn, loss.name, --fn): import the module and fetch the attribute, with one error naming
the spec and the fix; and the spec of a Python function or class (the Python API records a reward
function defined in the calling script as `/abs/path/script.py:score`, which every role imports).

    module_name, attr, obj = import_spec("my_envs:Calculator", "env 'my_envs:Calculator'", "install it ...")
    module_name, attr, obj = import_spec("/home/me/train.py:score", "reward.fn=...", "...")
    spec_of(score, "reward.fn")       # "my_rewards:score", or "/home/me/train.py:score" for __main__'s
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from streamrl.core.errors import ConfigError

MODULE_SPEC = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*"
"""`package.module:attr`."""
SCRIPT_SPEC = r"[^:\s][^:]*\.py:[A-Za-z_]\w*"
"""`path/to/script.py:attr`: a file imported by its path (absolute, or relative to the job's directory)."""
CODE_SPEC = re.compile(f"{MODULE_SPEC}|{SCRIPT_SPEC}")
"""What a config field naming user code accepts (reward.fn, env.fn)."""
SCRIPT_MODULE_PREFIX = "streamrl_script_"
"""Module names a script gets when imported by path; never `__main__`, so its `if __name__ == "__main__":`
block (the job it starts) does not run again in the process that imports it."""

importing_script: list[str] = []
"""Scripts being imported by path right now (innermost last): the Python API refuses to start a job
from inside one (a script whose job is not under `if __name__ == "__main__":`)."""


def import_spec(spec: str, where: str, fix: str) -> tuple[str, str, object]:
    """(module name, attribute name, the attribute or None) of `spec`; an ImportError becomes a
    ConfigError "{where}: cannot import module {module!r} ({exc}); {fix}". Callers check what they got."""
    module_name, _, attr = spec.rpartition(":")
    if module_name.endswith(".py"):
        module = import_script(module_name, where)
        return module.__name__, attr, getattr(module, attr, None)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import module {module_name!r} ({exc}); {fix}") from exc
    return module_name, attr, getattr(module, attr, None)


def import_script(path: str, where: str):
    """The module of a script file, imported once per process under a name that is not `__main__`
    (the running script itself is reused as it is: not run a second time). Its folder goes first on
    sys.path, as `python script.py` puts it, so the script's own `import helpers` works."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(
            f"{where}: the script {path} does not exist (relative paths are read from the job's directory, "
            f"{os.getcwd()}); give the path of the .py file that defines it"
        )
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__file__", None) and Path(main.__file__).resolve() == file:
        return main
    # The same name in every process (hash() is salted per process), distinct per file.
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:8]
    name = SCRIPT_MODULE_PREFIX + re.sub(r"\W", "_", file.stem) + "_" + digest
    if name in sys.modules:
        return sys.modules[name]
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    importing_script.append(str(file))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        importing_script.pop()
    return module


def spec_of(obj: object, where: str) -> str:
    """The spec that imports `obj` (a function or class) in another process: `module:name` where its
    module imports from the job's path, else `/abs/path/file.py:name` (a function of the running
    script, `__main__`, or of a module beside it). ConfigError when no process could import it: a
    lambda, a function defined inside another one, a method, or code without a file (a notebook cell)."""
    name, qualname = getattr(obj, "__name__", None), getattr(obj, "__qualname__", None)
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    kind = "class" if inspect.isclass(obj) else "function"
    if name == "<lambda>":
        problem = "is a lambda, which has no name another process can import"
    elif name is None or qualname != name:
        inside = qualname.rsplit(".", 1)[0].replace(".<locals>", "") if qualname else "?"
        problem = f"is defined inside {inside} (not at module level)"
    elif module is None or getattr(module, name, None) is not obj:
        problem = (
            f"is not reachable as {getattr(module, '__name__', '?')}.{name} (redefined, or wrapped by a decorator)"
        )
    elif getattr(module, "__file__", None) is None:
        problem = "comes from code with no file (an interactive session or a notebook)"
    else:
        return f"{_module_path(module)}:{name}"
    raise ConfigError(
        f"{where}: the {kind} {obj!r} {problem}; every role is a separate process that imports it by name, so "
        f"define it at module level in a .py file (`def {name if name and name != '<lambda>' else 'score'}(...)` in "
        "your script, or in a module) and pass it, or pass its name as 'package.module:name'"
    )


def as_spec(value: object, where: str) -> object:
    """A config field's value with a function or class replaced by its spec (spec_of); anything else
    as it is (the field's own validation judges it). For the `mode="before"` validators of reward.fn, env.fn."""
    return spec_of(value, where) if callable(value) and not isinstance(value, str) else value


def _module_path(module) -> str:
    """`module`'s name where a role process (started in this directory, on the same PYTHONPATH) imports
    it by that name; else its file's absolute path."""
    name = module.__name__
    if name != "__main__" and not name.startswith(SCRIPT_MODULE_PREFIX):
        top = name.split(".")[0]
        script_dir = _script_dir()
        search = [os.getcwd()] + [p for p in sys.path if p and os.path.abspath(p) != script_dir]
        if importlib.machinery.PathFinder.find_spec(top, search) is not None or top in sys.builtin_module_names:
            return name
    return str(Path(module.__file__).resolve())


def _script_dir() -> str | None:
    """The running script's folder (sys.path[0] of `python script.py`), which role processes lack."""
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    return os.path.abspath(os.path.dirname(file)) if file and getattr(main, "__spec__", None) is None else None


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
