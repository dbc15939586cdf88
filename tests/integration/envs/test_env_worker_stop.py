"""An env worker's stop does not wait for a step that never returns (issue 43): SIGTERM with a hung step
in progress and env.step_timeout_s=120 ends the worker within seconds, the step left pending (redone by
whoever takes it over), not acked as done.

    pytest tests/integration/envs/test_env_worker_stop.py
"""

import asyncio
import os
import signal
import subprocess
import time

import pytest

from streamrl.core.messages import encode
from tests.integration.envs.test_env_worker import env_cli, env_config, request
from workers.env import GROUP, STOP_DRAIN_S, EnvWorker

pytestmark = pytest.mark.anyio


async def test_sigterm_does_not_wait_for_a_hung_step(config, broker, tmp_path):
    cfg = env_config(config, "tests.programs.env_fns:Hang")
    keys = EnvWorker(cfg, broker, "probe").keys
    args = ["env", "--fn", "tests.programs.env_fns:Hang", "--run", cfg.run.name, "--broker", cfg.broker.url]
    args += ["--step-timeout", "120", "--id", "env-hung"]
    proc = env_cli(args, tmp_path / "env.out")
    try:
        await broker.add(keys.env_steps, encode(request(["anything"], episode="h0:0:a")))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # until the worker has taken the step (it is pending on it)
            groups = {g["name"]: g for g in await broker.group_info(keys.env_steps)}
            if GROUP in groups and groups[GROUP]["pending"] == 1:
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail(f"the env worker never took the step:\n{(tmp_path / 'env.out').read_text()}")
        await asyncio.sleep(0.5)  # the step is running (hung) now
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_DRAIN_S + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the env worker waited for its hung step:\n{(tmp_path / 'env.out').read_text()}")
        took = time.monotonic() - t0
        print(f"stopped {took:.1f}s after SIGTERM with a hung step (env.step_timeout_s=120)")
        assert took < STOP_DRAIN_S + 20
        groups = {g["name"]: g for g in await broker.group_info(keys.env_steps)}
        assert groups[GROUP]["pending"] == 1  # left for whoever takes it over, not acked
        assert await broker.stream_len(keys.observations("gen-0")) == 0  # and not answered
        assert "steps_left_running" in (tmp_path / "env.out").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
