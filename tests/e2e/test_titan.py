"""`streamrl up` with the torchtitan trainer backend: FSDP2 over 2 gloo ranks, the tiny CPU task learns.

    pytest tests/e2e/test_titan.py

The same job as tests/e2e/test_up.py with trainer.backend=torchtitan and trainer.world_size=2
(torchtitan's Llama 3 with SDPA attention, parallelized by torchtitan's parallelize_llama).
"""

import pytest
import yaml

from bench.jobs import metrics, up

pytestmark = pytest.mark.slow

STEPS = 30


@pytest.mark.timeout(600)
def test_tiny_task_learns_with_torchtitan_fsdp2_on_two_ranks(tmp_path):
    run_dir = tmp_path / "titan"
    # lr 5e-3 (the tiny config has 3e-3 for 60 steps) shows the same rise in half the steps.
    res = up(
        run_dir,
        "trainer.backend=torchtitan",
        "trainer.world_size=2",
        f"trainer.steps={STEPS}",
        "trainer.lr=0.005",
        "run.export=false",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["skipped_step"] == 0 and r["grad_norm"] > 0 for r in rows)
    first = sum(r["reward_mean"] for r in rows[:10]) / 10
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    assert last - first >= 0.3, f"reward did not rise enough: first10={first:.3f} last10={last:.3f}"
    # The run's resolved config (what every role read) holds the backend and the 2 ranks.
    trainer = yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]
    assert trainer["backend"] == "torchtitan" and trainer["world_size"] == 2
