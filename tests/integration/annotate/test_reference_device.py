"""reference.device: the frozen reference model runs where the config says, independently of the trainer.

    pytest tests/integration/annotate/test_reference_device.py -q

A real ReferenceWorker on the tiny model and a real redis-server: with trainer.device=cuda (a GPU
trainer) and reference.device=cpu, the reference model loads on the CPU and publishes log-probs
equal to the model's own; `auto` keeps following trainer.device.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrl.config.schema import TinyModelConfig
from streamrl.core.messages import Rollout, decode, encode
from streamrl.models.hf import completion_logprobs, load_hf_model
from streamrl.models.tiny import build_tiny_model
from workers.reference import ReferenceWorker, reference_device

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("m") / "tiny", seed=0)


def test_auto_follows_the_trainer_and_an_explicit_choice_wins(config):
    cfg = config.model_copy(deep=True)
    cfg.trainer.device = "cpu"
    assert reference_device(cfg) == torch.device("cpu")
    cfg.trainer.device, cfg.reference.device = "cuda", "cpu"
    assert reference_device(cfg) == torch.device("cpu")
    cfg.reference.device = "auto"
    assert reference_device(cfg) == torch.device("cuda")


async def test_reference_on_cpu_while_the_trainer_is_on_cuda(config, broker, tiny_dir):
    cfg = config.model_copy(deep=True)
    cfg.model.path = str(tiny_dir)
    cfg.trainer.device, cfg.reference.device = "cuda", "cpu"
    worker = ReferenceWorker(cfg, broker, "reference-0")
    await worker.start()
    assert {p.device.type for p in worker.model.parameters()} == {"cpu"}
    r = Rollout(
        rollout_id="g0:0",
        group_id="g0",
        sample=0,
        group_size=1,
        prompt_ids=np.array([4, 5]),
        completion_ids=np.array([6, 7, 8]),
        logprobs=np.zeros(3),
        version=0,
    )
    await broker.add(worker.keys.rollouts, encode(r))
    assert await worker.step()
    (entry,) = await broker.read(worker.keys.annotations)
    ann = decode(entry.data)
    want = completion_logprobs(load_hf_model(str(tiny_dir)), [r.prompt_ids], [r.completion_ids])[0]
    assert ann.key == "ref_logprobs" and ann.error == ""
    np.testing.assert_allclose(ann.value, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on a machine without a GPU")
def test_preflight_names_the_fix_for_a_cuda_reference_without_a_gpu(config):
    from streamrl.launch.preflight import check_cuda

    cfg = config.model_copy(deep=True)
    cfg.loss.kl_beta, cfg.reference.device, cfg.trainer.device = 0.01, "cuda", "cpu"
    assert "reference.device=cuda" in check_cuda(cfg) and "reference.device=cpu" in check_cuda(cfg)
    cfg.reference.device = "cpu"
    assert check_cuda(cfg) is None


async def test_eval_rollouts_get_no_reference_logprobs(config, broker, tiny_dir):
    cfg = config.model_copy(deep=True)
    cfg.model.path, cfg.reference.device = str(tiny_dir), "cpu"
    worker = ReferenceWorker(cfg, broker, "reference-0")
    await worker.start()
    for gid in ("eval-0-1-0", "g0"):
        await broker.add(
            worker.keys.rollouts,
            encode(
                Rollout(
                    rollout_id=f"{gid}:0",
                    group_id=gid,
                    sample=0,
                    group_size=1,
                    prompt_ids=np.array([4, 5]),
                    completion_ids=np.array([6]),
                    logprobs=np.zeros(1),
                    version=0,
                )
            ),
        )
    assert await worker.step()
    assert [decode(e.data).rollout_id for e in await broker.read(worker.keys.annotations)] == ["g0:0"]
    info = {g["name"]: g for g in await broker.group_info(worker.keys.rollouts)}
    assert info["reference"]["pending"] == 0  # the eval rollout is acked all the same
