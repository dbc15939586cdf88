"""The Python API's pieces that need no job: configs built in Python (streamrl/config/build.py) with the
CLI's validation, functions and classes recorded by the spec every role imports, scripts imported by
their path (streamrl/core/imports.py), and `import streamrl` staying cheap (streamrl/__init__.py).
The job itself: tests/e2e/test_up.py runs examples/python_api.py; Job.stop: tests/integration/launch.

    pytest tests/unit/test_python_api.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import streamrl
from streamrl.annotate.rewards import resolve_reward
from streamrl.config.build import make_config, presets
from streamrl.config.schema import Config, RewardConfig
from streamrl.core.errors import ConfigError
from streamrl.core.imports import SCRIPT_MODULE_PREFIX, import_spec, spec_of
from streamrl.envs.base import CharclassDialog
from streamrl.envs.resolve import resolve_env
from streamrl.launch.preflight import check_reward_fn

ROOT = Path(__file__).resolve().parents[2]


def module_score(prompt: str, completion: str, meta: dict) -> float:
    return 1.0


class ModuleEnv(CharclassDialog):
    pass


# -- configs built in Python -------------------------------------------------------------------


def test_a_preset_with_sections_and_dotted_overrides():
    cfg = make_config("tiny-cpu", {"trainer.steps": 4, "loss.name": "gspo"}, reward={"count": 2})
    assert isinstance(cfg, Config) and cfg.trainer.steps == 4 and cfg.loss.name == "gspo"
    assert cfg.reward.count == 2 and cfg.reward.fn == "charclass"  # merged into the preset's section
    assert cfg.trainer.lr == 0.003  # the preset's value, untouched
    # --set-style strings are YAML scalars; overrides win over the sections
    assert make_config("tiny-cpu", ["trainer.steps=7"], trainer={"steps": 40}).trainer.steps == 7
    # a YAML path, a Config (its set fields), a section model
    path = ROOT / "configs" / "tiny-multiturn-cpu.yaml"
    assert make_config(path).env.fn == make_config(str(path)).env.fn == "charclass_dialog"
    again = make_config(cfg, trainer={"lr": 0.01})
    assert (again.trainer.steps, again.trainer.lr, again.reward.count) == (4, 0.01, 2)
    assert make_config(None, reward=RewardConfig(fn="math")).reward.fn == "math"
    assert "tiny-cpu" in presets() and "gsm8k-gpu" in presets()


def test_bad_input_fails_naming_the_field_and_the_fix():
    with pytest.raises(ConfigError, match=r"neither a YAML file nor a preset.*tiny-cpu"):
        make_config("tiny-cpux")
    with pytest.raises(ConfigError, match=r"trainer\.stepz: unknown field; did you mean trainer\.steps\?"):
        make_config("tiny-cpu", {"trainer.stepz": 3})
    with pytest.raises(ConfigError, match=r"trainer\.steps: Input should be a valid integer.*trainer\.steps=x"):
        make_config("tiny-cpu", ["trainer.steps=x"])
    with pytest.raises(ConfigError, match=r"keyword trainr=\.\.\., which is not a config section"):
        make_config("tiny-cpu", trainr={"steps": 3})
    with pytest.raises(ConfigError, match=r"rollout\.group_size>=2"):
        make_config("tiny-cpu", rollout={"group_size": 1})
    with pytest.raises(ConfigError, match="does not exist"):
        make_config(ROOT / "configs" / "missing.yaml")
    cfg = Config()
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        cfg.trainer.steps = 0  # assignments are validated too


def test_a_function_or_class_becomes_the_spec_roles_import():
    cfg = Config(reward={"fn": module_score}, env={"fn": ModuleEnv})
    assert cfg.reward.fn == f"{__name__}:module_score"
    assert cfg.env.fn == f"{__name__}:ModuleEnv"
    cfg.reward.fn = module_score  # on assignment too
    assert cfg.reward.fn == f"{__name__}:module_score"
    combined = make_config(None, reward={"components": [{"fn": module_score, "weight": 0.5}, {"fn": "charclass"}]})
    assert combined.reward.components[0].fn == f"{__name__}:module_score"
    assert resolve_reward(cfg.reward.fn) is module_score and resolve_env(cfg.env.fn) is ModuleEnv
    assert "module_score" in Config.model_validate(json.loads(cfg.model_dump_json())).reward.fn  # re-read: same


def test_code_no_other_process_can_import_is_refused_with_the_fix():
    def inner(prompt, completion, meta):
        return 0.0

    class Holder:
        def method(self, prompt, completion, meta):
            return 0.0

    cell = types.FunctionType(module_score.__code__, {}, "cell_fn")  # a notebook cell's function: no file
    cell.__module__, cell.__qualname__ = "__notebook__", "cell_fn"
    sys.modules["__notebook__"] = notebook = types.ModuleType("__notebook__")
    notebook.cell_fn = cell
    try:
        cases = {
            "lambda": lambda p, c, m: 0.0,
            "defined inside test_code_no_other_process": inner,
            "defined inside .*Holder": Holder.method,
            "no file": cell,
        }
        for why, fn in cases.items():
            with pytest.raises(ValueError, match=rf"reward\.fn: the function .*{why}.*define it at module level"):
                Config(reward={"fn": fn})
    finally:
        del sys.modules["__notebook__"]
    with pytest.raises(ConfigError, match="is a lambda"):
        spec_of(lambda: 0, "env.fn")


# -- scripts imported by their path ------------------------------------------------------------

SCRIPT = """
import sys
from pathlib import Path

import streamrl
from streamrl.envs.base import CharclassDialog

from helper import BONUS   # a module beside the script: found as `python script.py` finds it


def score(prompt, completion, meta):
    return 0.5 + BONUS


class Echo(CharclassDialog):
    pass


if __name__ == "__main__":
    Path(__file__).with_name("ran").write_text("the job ran")
"""


def test_a_script_is_imported_by_path_without_running_its_main_block(tmp_path):
    (tmp_path / "helper.py").write_text("BONUS = 0.25\n")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    module_name, attr, fn = import_spec(f"{script}:score", "reward.fn", "unused")
    assert module_name.startswith(SCRIPT_MODULE_PREFIX) and module_name != "__main__" and attr == "score"
    assert fn("p", "c", {}) == 0.75
    assert import_spec(f"{script}:score", "reward.fn", "unused")[2] is fn  # imported once per process
    assert resolve_reward(f"{script}:score") is fn
    assert not (tmp_path / "ran").exists()
    env_cls = resolve_env(Config(env={"fn": f"{script}:Echo"}).env.fn)  # an env class the same way
    assert env_cls.__name__ == "Echo" and env_cls.__module__ == module_name
    cfg = Config(reward={"fn": f"{script}:score"})
    assert check_reward_fn(cfg) is None  # pre-flight imports it as the reward worker will
    with pytest.raises(ConfigError, match=r"the script .*nope\.py does not exist"):
        resolve_reward(f"{tmp_path / 'nope.py'}:score")
    with pytest.raises(ConfigError, match="has no function 'missing'"):
        resolve_reward(f"{script}:missing")
    with pytest.raises(ValueError, match="neither a built-in reward"):
        Config(reward={"fn": "train.py"})


def test_a_script_that_starts_its_job_unguarded_is_refused(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import streamrl\n\ndef score(prompt, completion, meta):\n    return 1.0\n\nstreamrl.run(streamrl.Config())\n"
    )
    problem = check_reward_fn(Config(reward={"fn": f"{script}:score"}))
    assert problem is not None and 'under `if __name__ == "__main__":`' in problem, problem


RUN_AS_SCRIPT = """
import sys
before = set(sys.modules)
import streamrl
loaded = sorted(m for m in set(sys.modules) - before if m.startswith(("streamrl.", "torch", "pydantic")))
from helper import helper_score

def score(prompt, completion, meta):
    return 1.0

if __name__ == "__main__":
    import json
    cfg = streamrl.Config(reward={"fn": score}, env={"fn": "charclass_dialog"})
    beside = streamrl.Config(reward={"fn": helper_score}).reward.fn
    installed = streamrl.Config(reward={"fn": streamrl.load_config}).reward.fn
    print(json.dumps({"loaded": loaded, "main": cfg.reward.fn, "beside": beside, "installed": installed}))
"""


def test_specs_of_the_running_script_and_its_neighbours(tmp_path):
    """In `python script.py`: a function of the script is recorded by the script's path, one of a module
    beside it (which role processes, started elsewhere, cannot import by name) by that module's path, an
    installed one by its module name. And `import streamrl` alone imports none of the library."""
    (tmp_path / "helper.py").write_text("def helper_score(prompt, completion, meta):\n    return 0.0\n")
    script = tmp_path / "job.py"
    script.write_text(RUN_AS_SCRIPT)
    res = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["loaded"] == [], out["loaded"]  # `import streamrl` is cheap: everything loads on first use
    assert out["main"] == f"{script}:score"
    assert out["beside"] == f"{tmp_path / 'helper.py'}:helper_score"
    assert out["installed"] == "streamrl.config.build:make_config"


def test_lazy_exports():
    assert streamrl.Config is Config and streamrl.load_config is make_config
    assert {"run", "start", "Job", "Result", "export", "check", "evaluate"} <= set(streamrl.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        streamrl.nope  # noqa: B018
    with pytest.raises(ConfigError, match="neither a YAML file nor a preset"):
        streamrl.check("no-such-preset")
