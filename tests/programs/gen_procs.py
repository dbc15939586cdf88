"""Real generator processes for the kill tests: `streamrl worker generator` (vLLM CPU engine, real
redis) started in their own sessions, so one SIGKILL of the process group takes the generator and
its EngineCore child down together, as a kernel OOM kill or `kill -9 -PGID` would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import redis
import yaml

REPO = Path(__file__).resolve().parents[2]


class Generators:
    """Two (or more) generator processes of one run, started together so their engines boot in parallel."""

    def __init__(self, tmp: Path, url: str, run: str, config: dict, ids: list[str]):
        self.tmp, self.url, self.run = tmp, url, run
        cfg_path = tmp / "generator.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.procs: dict[str, subprocess.Popen] = {}
        for wid in ids:
            cmd = [
                sys.executable,
                "-m",
                "streamrl.cli",
                "worker",
                "generator",
                "--config",
                str(cfg_path),
                "--broker",
                url,
                "--run",
                run,
                "--run-dir",
                str(tmp),
                "--id",
                wid,
            ]
            self.procs[wid] = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=env,
                stdout=open(tmp / f"{wid}.out", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self, wid: str) -> str:
        return (self.tmp / f"{wid}.out").read_text(errors="replace")[-4000:]

    def wait_ready(self, timeout: float = 240) -> None:
        """Until every generator's heartbeat exists (its engine is up and it reads prompts)."""
        deadline = time.time() + timeout
        with redis.Redis.from_url(self.url) as r:
            for wid, proc in self.procs.items():
                while not r.exists(f"streamrl:{self.run}:workers:generator:{wid}"):
                    assert proc.poll() is None, f"{wid} exited:\n{self.output(wid)}"
                    assert time.time() < deadline, f"{wid} not ready after {timeout}s:\n{self.output(wid)}"
                    time.sleep(0.2)

    def sigkill(self, wid: str) -> list[int]:
        """SIGKILL the generator's whole process group; returns the pids that died (it and its children)."""
        proc = self.procs[wid]
        tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        _, alive = psutil.wait_procs(tree, timeout=10)
        assert not alive, f"still running after SIGKILL: {alive}"
        return [p.pid for p in tree]

    def alive(self) -> list[str]:
        return [w for w, p in self.procs.items() if p.poll() is None]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


def heartbeat(url: str, run: str, wid: str) -> dict:
    with redis.Redis.from_url(url) as r:
        raw = r.get(f"streamrl:{run}:workers:generator:{wid}")
    return json.loads(raw) if raw else {}
