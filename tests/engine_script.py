"""Running a test program that starts a vLLM CPU engine in a fresh interpreter (vLLM starts its
EngineCore in a child process, so the engine needs a __main__ guard): the environment such a
program needs, and the spec.json -> out.json round trip of the programs that take one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_engine_script(script: Path | str, args: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    """`script args` on one thread, a 1 GiB KV cache, this tree first on the path (a carried site dir
    kept after it) and `env` on top."""
    # A fresh process chooses its own start method: an in-process engine test earlier in this pytest
    # worker may have set VLLM_WORKER_MULTIPROC_METHOD (choose_start_method records its choice there).
    full = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full.update(VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=path, OMP_NUM_THREADS="1", **env)
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout
    )


def run_scenarios(script: Path | str, tmp: Path, spec: dict, timeout: float, **env: str):
    """Run a program on `spec` (as tmp/spec.json) and return what it wrote to tmp/out.json; its stderr
    is kept in tmp/stderr.txt."""
    (tmp / "spec.json").write_text(json.dumps(spec))
    proc = run_engine_script(script, [str(tmp / "spec.json"), str(tmp / "out.json")], timeout, **env)
    (tmp / "stderr.txt").write_text(proc.stderr)
    assert proc.returncode == 0, f"{Path(script).name} failed:\n{proc.stdout[-2000:]}{proc.stderr[-6000:]}"
    return json.loads((tmp / "out.json").read_text())
