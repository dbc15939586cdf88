"""The README's reward-function example (examples/rewards/length_reward.py) through the real loader
(`reward.fn` -> streamrl.annotate.rewards.resolve_reward), the reward worker against redis, and a fresh
`streamrl worker reward` process started the way the README says (folder on PYTHONPATH).

    pytest tests/integration/annotate/test_reward_example.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.annotate.rewards import resolve_reward
from streamrl.core.errors import ConfigError
from streamrl.core.messages import decode, encode
from streamrl.tasks.charclass import charclass_items
from tests.integration.annotate.one_rollout import rollout
from workers.reward import RewardWorker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_DIR = ROOT / "examples" / "rewards"
SPEC = "length_reward:score"


def test_loader_resolves_the_example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    score = resolve_reward(SPEC)
    meta = charclass_items(1, length=8, seed=0)[0]["meta"]  # what the feeder puts in a charclass prompt
    assert score("digits:", "1234", meta) == 0.5 and score("digits:", "123456789", meta) == 1.0
    assert score("q\nAnswer:", "x" * 16, {"task": "gsm8k", "answer": "42"}) == 0.5  # no length: 32 chars


def test_loader_refuses_an_async_function(monkeypatch, tmp_path):
    (tmp_path / "async_reward.py").write_text("async def score(prompt, completion, meta):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="is an `async def`; reward.fn must be a plain `def`"):
        resolve_reward("async_reward:score")


async def test_reward_worker_scores_with_the_example(config, broker, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    cfg = config.model_copy(deep=True)
    cfg.reward.fn = SPEC
    worker = RewardWorker(cfg, broker, "reward-0")
    await worker.start()
    meta = {"task": "charclass", "cls": "digits", "chars": "0123456789", "length": 4}
    for i, text in enumerate(["12", "1234", "   1   "]):
        await broker.add(worker.keys.rollouts, encode(rollout(i, text, "digits:", meta)))
    while await worker.step():
        pass
    out = {a.rollout_id: a for a in (decode(e.data) for e in await broker.read(worker.keys.annotations))}
    assert {k: (a.value, a.error) for k, a in out.items()} == {"g0:0": (0.5, ""), "g1:0": (1.0, ""), "g2:0": (0.25, "")}


async def test_readme_command_runs_the_example_in_a_fresh_worker(config, broker, redis_server, tmp_path):
    """`PYTHONPATH=examples/rewards streamrl ... reward.fn=length_reward:score`, as a separate process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), "examples/rewards"])}
    cmd = [
        sys.executable,
        "-m",
        "streamrl.cli",
        "worker",
        "reward",
        "--broker",
        redis_server.url,
        "--run",
        config.run.name,
        "--set",
        f"reward.fn={SPEC}",
        "--set",
        f"model.path={tmp_path}",
        "--id",
        "reward-0",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        keys = RewardWorker(config, broker, "probe").keys
        await broker.add(keys.rollouts, encode(rollout(0, "x" * 16, "digits:", {"task": "gsm8k", "answer": "7"})))
        deadline = time.monotonic() + 60
        while not (found := await broker.read(keys.annotations)) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            await asyncio.sleep(0.1)
        assert found, "no annotation within 60 s"
        a = decode(found[0].data)
        assert (a.rollout_id, a.key, a.value, a.error) == ("g0:0", "reward", 0.5, "")
    finally:
        proc.terminate()
        proc.wait(20)
