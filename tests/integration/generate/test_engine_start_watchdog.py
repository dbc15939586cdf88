"""The start-up watchdog on a real generator process whose forked EngineCore hangs (a real process that
never answers vLLM's handshake, as the one deadlocked in GNU OpenMP did, issue 46), under the
supervisor's death path: its stacks (Python and native) are dumped to its log, it is killed, the
generator exits naming the phase, the supervisor restarts it with its engine started by spawn and
says so, and the restarted generator's engine starts (by spawn). A hang after the last restart
stops the job with the reason.

    pytest tests/integration/generate/test_engine_start_watchdog.py
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from streamrl.config.files import dump_config
from streamrl.config.schema import Config, TinyModelConfig
from streamrl.core.errors import EXIT_ENGINE_START_HUNG, WorkerDied
from streamrl.launch.supervisor import Child, Supervisor, kill_group
from streamrl.models.tiny import build_tiny_model

# ~70-100 s on a quiet 2-core VM; at load 20-30 one life's spawned start alone took up to 4 min.
pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[3]
HOOK = ROOT / "tests" / "programs" / "hang_after_fork"
TIMEOUT_S = 20
"""generator.start_timeout_s here: past the engine config's build (vLLM is imported before the start by the
hook, tests/programs/hang_after_fork/sitecustomize.py), well short of a real start."""


def _events(path: Path, event: str) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def _wait(proc, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while (code := proc.poll()) is None:
        assert time.monotonic() < deadline, f"the generator did not exit within {timeout:.0f}s"
        time.sleep(0.2)
    return code


def test_a_hung_engine_start_is_dumped_killed_and_restarted_with_spawn(tmp_path, config, monkeypatch):
    model = build_tiny_model(TinyModelConfig(), tmp_path / "model", seed=0)
    cfg = Config.model_validate(
        {
            **config.model_dump(),
            "model": {"path": str(model)},
            "generator": {"start_timeout_s": TIMEOUT_S, "engine_start_method": "fork", "cpu_worker_in_engine": True},
            "weights": {"backend": "shm"},
            "supervisor": {"max_restarts": 1, "backoff_s": 0.1},
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{HOOK}{os.pathsep}{ROOT}")
    monkeypatch.setenv("STREAMRL_TEST_HANG_FORKED_CHILD", "1")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    said: list[str] = []
    sup = Supervisor(cfg, run_dir, cfg.broker.url, say=said.append)
    dump_config(sup.cfg, sup.config_path)  # what `up` writes first; the setting survives it
    child = sup.spawn("generator", 0)
    try:
        code = _wait(child.proc, TIMEOUT_S + 150)
        assert code == EXIT_ENGINE_START_HUNG, child.log_path.read_text()[-3000:]
        out = child.log_path.read_text()
        # the dump: this process's Python stacks (faulthandler), then py-spy's native + Python stacks of
        # the generator and of its hung EngineCore, whose innermost frame is the hang
        assert "vLLM engine start hung for 20s in: starting the EngineCore by fork" in out
        assert "Current thread" in out or "Thread 0x" in out  # faulthandler
        assert out.count("--- native and Python stacks of pid") >= 2
        assert "_hang_in_forked_child (" in out and "sitecustomize.py" in out
        hung = _events(run_dir / "logs" / "generator-0.jsonl", "engine_start_hung")
        assert hung and hung[0]["phase"].startswith("starting the EngineCore by fork")
        sup._on_death(child, code)
        line = next(s for s in said if "restarting in" in s)
        assert line.startswith("generator-0 (generator) exited with code 75: engine start hung: ")
        assert "generator.start_timeout_s=20s; it hung while starting the EngineCore by fork" in line
        assert "in _hang_in_forked_child (" in line  # the EngineCore's frame, named in the message
        assert "with its vLLM engine started by spawn, not fork (restart 1 of 1)" in line
        # The restart's spawned EngineCore imports torch + vLLM inside the start's clock (~20-60 s here
        # under load): the second life reads a realistic timeout from RUN_DIR/config.yaml.
        sup.cfg.generator.start_timeout_s = 600
        dump_config(sup.cfg, sup.config_path)
        sup._respawn(child)
        deadline = time.monotonic() + 480
        while not (started := _events(run_dir / "logs" / "generator-0.jsonl", "engine_started")):
            assert child.proc.poll() is None, child.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the restarted generator's engine did not start"
            time.sleep(0.5)
        assert started[0]["start_method"] == "spawn"
        child.proc.send_signal(signal.SIGTERM)
        assert _wait(child.proc, 60) == 0
        # a hang after the last allowed restart stops the job, naming the hang and the setting
        dead = Child("generator", "generator-0", child.proc, child.log_path, restarts=1, oom_mark=sup.oom.mark())
        with open(child.log_path, "a") as f:
            f.write("engine start hung: the vLLM engine did not start within generator.start_timeout_s=20s\n")
        with pytest.raises(WorkerDied, match=r"engine start hung: .*supervisor.max_restarts=1"):
            sup._on_death(dead, EXIT_ENGINE_START_HUNG)
    finally:
        kill_group(child.proc)
