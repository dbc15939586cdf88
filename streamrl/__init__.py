"""streamrl: asynchronous streaming RL post-training of LLMs. The Python API (docs/python-api.md):

    import streamrl

    config = streamrl.load_config("tiny-cpu", {"trainer.steps": 20}, reward={"fn": score})
    result = streamrl.run(config)              # the job `streamrl up` runs; or streamrl.start(config) -> Job
    streamrl.export(result.run_dir, "out/hf")  # a checkpoint as a Hugging Face folder

Every name below is imported on first use, so `import streamrl` stays cheap (each role process
imports the package; the heavy parts load only where they are used).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Config": "streamrl.config.schema",
    "load_config": ("streamrl.config.build", "make_config"),
    "presets": "streamrl.config.build",
    "run": "streamrl.api",
    "start": "streamrl.api",
    "Job": "streamrl.api",
    "Result": "streamrl.api",
    "JobFailed": "streamrl.api",
    "check": "streamrl.api",
    "export": "streamrl.api",
    "evaluate": "streamrl.eval",  # `streamrl eval RUN --step N`'s library function (api-eval contract)
    "EvalResult": "streamrl.eval",
    "ConfigError": "streamrl.core.errors",
    "StreamRLError": "streamrl.core.errors",
}
"""Public name -> the module that defines it (or (module, its name there))."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'streamrl' has no attribute {name!r}")
    module_name, attr = where if isinstance(where, tuple) else (where, name)
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except AttributeError:
        raise AttributeError(f"streamrl.{name} needs {module_name}.{attr}, which this install lacks") from None
    globals()[name] = value  # found once; later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
