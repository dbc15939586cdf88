"""The ToolEnv's python tool runs model-written code in the real sandbox (bubblewrap): results and
tracebacks come back as tool messages, a call stopped by a limit is a counted tool error, and the
episode goes on."""

from __future__ import annotations

import json

import pytest

from streamrl.config.schema import Config
from streamrl.envs.base import check_step
from streamrl.envs.resolve import env_factory, resolve_env
from streamrl.envs.sandbox.executor import sandbox_problem

pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}")


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_python_tool_results_errors_and_limits():
    cfg = Config(env={"fn": "streamrl.envs.tool_env:ToolEnv"}, tools={"names": ["python"], "sandbox": {"wall_s": 2}})
    env = env_factory(resolve_env(cfg.env.fn), cfg)()
    env.reset({"text": "q", "meta": {}})
    _, _, done, info = check_step(env.step(call("print(17 * 23)") + call("1/0") + call("while True: pass")))
    out = [m["content"] for m in info["messages"]]
    assert not done and info["counts"] == {"tool_calls": 3, "tool_errors": 1}
    assert out[0] == "391"
    assert "ZeroDivisionError" in out[1] and out[1].endswith("[exit code 1]")
    assert out[2] == "[killed: wall limit]"
    _, _, done, info = check_step(env.step("#### 391"))
    assert done and info["counts"] == {"tool_calls": 0, "tool_errors": 0}


def test_bad_sandbox_limits_name_the_fix():
    from streamrl.core.errors import ConfigError

    cfg = Config(env={"fn": "streamrl.envs.tool_env:ToolEnv"}, tools={"names": ["python"], "sandbox": {"wall": 2}})
    with pytest.raises(ConfigError, match="tools.sandbox: .*SandboxLimits fields"):
        env_factory(resolve_env(cfg.env.fn), cfg)
