"""The trainer's MetricsWriter keeps metrics.samples_per_step rollouts of a real batch (assembled from a
real redis-server) in RUN_DIR/samples.jsonl and TensorBoard's text tab; a resume drops the rows above
its checkpoint, as it does metrics.jsonl's.

    pytest tests/integration/train/test_samples_file.py -q
"""

import asyncio

import pytest

from streamrl.config.schema import MetricsConfig
from streamrl.train.checkpoint import truncate_metrics
from streamrl.train.metrics import MetricsWriter
from streamrl.train.samples import read_samples
from tests.integration.assemble.test_assembler import make, publish_group

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_a_step_writes_its_samples(config, broker, tmp_path):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=2, loss__kl_beta=0.0)
    cfg.metrics = MetricsConfig(samples_per_step=3, sinks=["tensorboard"])
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 0, 0, 1])
    await publish_group(broker, owner.keys, "g1", [0.5, 0.5, 0.5, 0.5])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    writer = MetricsWriter(tmp_path, cfg)
    writer.write_samples(batch, 1)
    writer.write_samples(batch, 2)
    writer.close()
    rows = read_samples(tmp_path, 1)
    assert [(r["group_id"], r["sample"]) for r in rows] == [("g0", 0), ("g0", 1), ("g1", 0)]
    assert rows[0]["prompt"] == "ab" and rows[0]["completion"] == "xyz" and rows[0]["reward"] == 1.0
    assert rows[0]["reward_components"]["reward"] == 1.0 and rows[0]["staleness"] == 0
    truncate_metrics(tmp_path, 1)
    assert {r["step"] for r in read_samples(tmp_path)} == {1}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert "samples/text_summary" in acc.Tags()["tensors"]


def test_samples_per_step_0_writes_no_file(tmp_path, config):
    cfg = config.model_copy(deep=True)
    cfg.metrics = MetricsConfig(samples_per_step=0)
    MetricsWriter(tmp_path, cfg).close()
    assert not (tmp_path / "samples.jsonl").exists()
