"""The Node.js examples (examples/node: producer, env) for tests: install its packages with `npm ci` when
node_modules is missing (a fresh clone), and start it as a subprocess.

    proc = start_node_producer(url, run="tiny", key="judge", log_path=tmp / "node.log")
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parents[1] / "examples" / "node"


def ensure_node_modules() -> None:
    if not shutil.which("node") or not shutil.which("npm"):
        raise RuntimeError("the Node.js producer tests need node >= 18 and npm on PATH (apt install nodejs npm)")
    if (NODE_DIR / "node_modules" / "redis").is_dir() and (NODE_DIR / "node_modules" / "@msgpack").is_dir():
        return
    res = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True, timeout=300
    )
    if res.returncode != 0:
        raise RuntimeError(f"npm ci in {NODE_DIR} failed (needs the npm registry):\n{res.stdout}\n{res.stderr}")


def start_node_producer(url: str, run: str, key: str, log_path: Path, *extra: str) -> subprocess.Popen:
    ensure_node_modules()
    env = {**os.environ, "STREAMRL_BROKER_URL": url}
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            ["node", "producer.mjs", "--run", run, "--key", key, *extra],
            cwd=NODE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def start_node_env(url: str, run: str, log_path: Path, *extra: str) -> subprocess.Popen:
    """examples/node/env.mjs: the charclass dialog env, speaking the env protocol (docs/protocol.md)."""
    ensure_node_modules()
    env = {**os.environ, "STREAMRL_BROKER_URL": url}
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            ["node", "env.mjs", "--run", run, *extra], cwd=NODE_DIR, env=env, stdout=out, stderr=subprocess.STDOUT
        )
