"""LoRA adapters over the `mooncake` backend (trainer.lora): an adapter published by the trainer's
engine reaches a generator in another process as a PEFT folder that peft loads, byte for byte.

    pytest tests/integration/weights/test_mooncake_lora.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.config.schema import Config, TinyModelConfig
from streamrl.models.tiny import build_tiny_model
from streamrl.weights.shm import shm_root
from streamrl.weights.store import make_publisher
from tests.integration.weights.mooncake_procs import cfg_of
from tests.integration.weights.test_adapter_publish import _assert_peft_dir
from tests.programs.lora_adapter import adapter_payload, tiny_peft

pytest.importorskip("mooncake.engine", reason="the mooncake extra (make setup installs it)")
pytestmark = pytest.mark.anyio

FETCH = r"""
import asyncio, json, sys
from pathlib import Path
from brokers.connect import connect
from streamrl.weights.store import make_loader
from tests.integration.weights.mooncake_procs import cfg_of

async def main(url, run, run_dir):
    broker = await connect(url, retries=3)
    loader = make_loader(cfg_of(url, run), broker, Path(run_dir))
    handle = await loader.latest()
    local = await loader.fetch(handle)  # not closed: the folder stays for the test to load
    print(json.dumps({"local": local, "adapter": handle.is_adapter, "source": loader.last_source}), flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


async def test_adapter_reaches_a_generator_process_as_a_peft_dir(config: Config, broker, tmp_path: Path):
    tiny_dir = build_tiny_model(TinyModelConfig(), tmp_path / "tiny", seed=0)
    model = tiny_peft(tiny_dir, seed=1)
    state, peft_config = adapter_payload(model)
    pub = make_publisher(cfg_of(config.broker.url, config.run.name), broker, None)
    try:
        h = await pub.publish(1, state, adapter=peft_config)
        assert h.is_adapter and h.bytes == sum(t.numel() * t.element_size() for t in state.values())
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
        out = subprocess.run(
            [sys.executable, "-c", FETCH, config.broker.url, config.run.name, str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        row = json.loads(out.stdout.strip().splitlines()[-1])
        assert row["adapter"] and row["source"] == "trainer"
        _assert_peft_dir(Path(row["local"]), state, peft_config, model, tiny_dir)
    finally:
        await pub.close()
        shutil.rmtree(shm_root(config.run.name, tmp_path), ignore_errors=True)
