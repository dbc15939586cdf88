"""Issue 46's deadlock on the CPU build: a process that ran a multi-threaded torch op (GNU OpenMP's
thread pool started) and then started vLLM with engine_start_method=auto forked its EngineCore, which
hung for ever in its first OpenMP parallel region (libgomp waiting for pool threads the child does not
have). Before the fix this test timed out; now the pool is released at the fork, the engine still
starts by fork (its start-time gain kept) and answers a request.

    pytest tests/integration/generate/test_engine_start_openmp.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from streamrl.config.schema import TinyModelConfig
from streamrl.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[3]
HANG_S = 420
"""Well past this start (10-20 s on the 2-core VM, 180 s at load 30): a hung start fails the test, never the suite."""


def test_auto_start_after_a_multithreaded_torch_op_forks_without_deadlock(tmp_path):
    model = build_tiny_model(TinyModelConfig(), tmp_path / "model", seed=0)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(REPO)}
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    env.pop("OMP_NUM_THREADS", None)
    script = REPO / "tests" / "programs" / "openmp_fork_script.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(model)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its EngineCore too is killed below if the start hangs
    )
    try:
        out, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"the engine start hung for {HANG_S}s (forked after OpenMP's pool started):\n{err[-3000:]}"
        ) from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-4000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["threads_after_op"] >= 2  # the pool's worker thread was running before the start
    assert got["start_method"] == "fork"  # the fast start kept
    assert got["openmp_threads_released"] >= 1  # ... from a fork-safe state
    assert got["tokens"] == 4
