"""Latency of one sandboxed Python call (streamrl/envs/sandbox/executor.py) on a trivial snippet, against the bare
interpreter's start-up: what each `python` tool call costs before the code itself runs.

    python -m bench.sandbox                       # 200 sequential calls, then 8 threads x 25 calls
    python -m bench.sandbox --calls 50 --threads 4

Prints one JSON object: p50/p99/mean ms of sequential sandboxed calls, the same for a bare
`python -I -c pass` subprocess, and calls/s with --threads callers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from streamrl.envs.sandbox.bwrap import interpreter
from streamrl.envs.sandbox.cgroup import available
from streamrl.envs.sandbox.executor import SandboxLimits, run_python


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def _summary(ms: list[float]) -> dict:
    return {
        "p50_ms": round(_pct(ms, 0.5), 1),
        "p99_ms": round(_pct(ms, 0.99), 1),
        "mean_ms": round(statistics.fmean(ms), 1),
        "n": len(ms),
    }


def measure(calls: int, threads: int) -> dict:
    limits = SandboxLimits()
    run_python("print(1)", limits)  # warm the page cache
    sandboxed = []
    for _ in range(calls):
        t = time.perf_counter()
        res = run_python("print(1)", limits)
        sandboxed.append((time.perf_counter() - t) * 1e3)
        if res.stdout != "1\n":
            raise RuntimeError(f"the sandbox did not run the snippet: {res}")
    bare = []
    for _ in range(calls):
        t = time.perf_counter()
        subprocess.run([interpreter(), "-I", "-c", "print(1)"], check=True, capture_output=True)
        bare.append((time.perf_counter() - t) * 1e3)
    per_thread = max(1, calls // threads)
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda _: run_python("print(1)", limits), range(per_thread * threads)))
    wall = time.perf_counter() - t
    if any(r.stdout != "1\n" for r in results):
        raise RuntimeError("a concurrent call did not run the snippet")
    return {
        "sandboxed": _summary(sandboxed),
        "bare_python": _summary(bare),
        "concurrent": {"threads": threads, "calls": len(results), "calls_per_s": round(len(results) / wall, 1)},
        "root": os.geteuid() == 0,
        "cgroups": sorted(available()),
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--threads", type=int, default=8)
    a = p.parse_args()
    print(json.dumps(measure(a.calls, a.threads)))
