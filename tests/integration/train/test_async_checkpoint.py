"""streamrl.train.checkpoint.Checkpointer: the training thread pays only for staging; the write happens in
the background, the checkpoint is invisible until complete (also after a crash mid-write), and a
resume from it restores exactly the state at the save.

    pytest tests/integration/train/test_async_checkpoint.py

The "slow filesystem" is DCP's real FileSystemWriter whose write_data waits for a gate the test
opens: the assertions are about ordering (start() returned while the write could not have
finished), never about seconds.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from streamrl.core.errors import StreamRLError
from streamrl.train.checkpoint import Checkpointer, latest_checkpoint, list_checkpoints, load_checkpoint
from streamrl.train.dist import launch


class GatedWriter(FileSystemWriter):
    """FileSystemWriter whose data write waits for `gate` (or raises `error`)."""

    def __init__(self, path: str, gate: threading.Event | None = None, error: Exception | None = None):
        super().__init__(path)
        self.gate, self.error = gate, error

    def write_data(self, plan, planner):
        if self.gate is not None:
            self.gate.wait()
        if self.error is not None:
            raise self.error
        return super().write_data(plan, planner)


def make_engine(seed: int) -> SimpleNamespace:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler, steps_done=0)


def train(engine, steps: int) -> None:
    for _ in range(steps):
        engine.optimizer.zero_grad()
        engine.model(torch.randn(5, 8)).pow(2).sum().backward()
        engine.optimizer.step()
        engine.scheduler.step()
        engine.steps_done += 1


def snapshot(engine) -> dict:
    return {
        "model": {k: v.clone() for k, v in engine.model.state_dict().items()},
        "adam": {i: {k: v.clone() for k, v in s.items()} for i, s in engine.optimizer.state_dict()["state"].items()},
        "lr": engine.scheduler.get_last_lr(),
        "steps": engine.steps_done,
    }


def assert_same(a: dict, b: dict) -> None:
    assert a["lr"] == b["lr"] and a["steps"] == b["steps"]
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0)
    for i in a["adam"]:
        for k in a["adam"][i]:
            torch.testing.assert_close(a["adam"][i][k], b["adam"][i][k], rtol=0, atol=0)


def _nonblocking_main(run_dir: str, rank: int, world: int) -> None:
    run_dir = Path(run_dir)
    engine = make_engine(0)
    train(engine, 3)
    at_save = snapshot(engine)
    gate = threading.Event()
    ckpt = Checkpointer(run_dir, keep=2, storage_writer=functools.partial(GatedWriter, gate=gate))
    pending = ckpt.start(engine, 3, {"note": "async"})
    # start() returned while the write is held at the gate: the training thread did not wait for it.
    assert not pending.done()
    assert list_checkpoints(run_dir) == {} and latest_checkpoint(run_dir) is None
    assert (run_dir / "checkpoints" / ".tmp-step-00000003").is_dir()
    train(engine, 2)  # training goes on and changes the weights in place while the write waits
    gate.set()
    path = ckpt.wait()
    assert list_checkpoints(run_dir) == {3: path}
    fresh = make_engine(1)
    meta = load_checkpoint(fresh, path)
    assert meta["version"] == 3 and meta["note"] == "async"
    assert_same(snapshot(fresh), at_save)  # the staged state, not the weights trained after start()
    # Resuming from it continues exactly like the original run from the same point.
    torch.manual_seed(7)
    train(fresh, 2)
    original = make_engine(0)
    train(original, 3)
    torch.manual_seed(7)
    train(original, 2)
    assert_same(snapshot(fresh), snapshot(original))
    ckpt.close()


def test_start_returns_before_the_write_and_the_checkpoint_appears_only_when_complete(tmp_path):
    launch(1, functools.partial(_nonblocking_main, str(tmp_path)))


def _failing_main(run_dir: str, rank: int, world: int) -> None:
    engine = make_engine(0)
    train(engine, 1)
    ckpt = Checkpointer(Path(run_dir), storage_writer=functools.partial(GatedWriter, error=OSError("disk full")))
    ckpt.start(engine, 1, {})
    try:
        ckpt.wait()
        raise AssertionError("a failed background write must raise in wait()")
    except StreamRLError as exc:
        assert "writing checkpoint 1" in str(exc) and "disk full" in str(exc)
    assert list_checkpoints(Path(run_dir)) == {}


def test_a_failed_background_write_raises_and_publishes_nothing(tmp_path):
    launch(1, functools.partial(_failing_main, str(tmp_path)))


def _crash_main(run_dir: str, rank: int, world: int) -> None:
    """Checkpoint 1 completes; checkpoint 2 is killed mid-write (SIGKILL while its data is held)."""
    engine = make_engine(0)
    train(engine, 1)
    Checkpointer(Path(run_dir)).start(engine, 1, {}).finalize()
    train(engine, 1)
    ckpt = Checkpointer(Path(run_dir), storage_writer=functools.partial(GatedWriter, gate=threading.Event()))
    ckpt.start(engine, 2, {})
    os.kill(os.getpid(), signal.SIGKILL)


def _crash_child(run_dir: str) -> None:
    launch(1, functools.partial(_crash_main, run_dir))


def test_a_crash_mid_write_leaves_the_previous_checkpoint_as_latest(tmp_path):
    proc = mp.get_context("spawn").Process(target=_crash_child, args=(str(tmp_path),))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    root = tmp_path / "checkpoints"
    assert sorted(list_checkpoints(tmp_path)) == [1]
    assert latest_checkpoint(tmp_path) == root / "step-00000001"
    assert (root / ".tmp-step-00000002").is_dir() and not (root / ".tmp-step-00000002" / "meta.json").exists()
    launch(1, functools.partial(_resave_main, str(tmp_path)))
    assert sorted(list_checkpoints(tmp_path)) == [1, 2] and not (root / ".tmp-step-00000002").exists()


def _resave_main(run_dir: str, rank: int, world: int) -> None:
    engine = make_engine(0)
    meta = load_checkpoint(engine, latest_checkpoint(Path(run_dir)))
    assert meta["version"] == 1
    train(engine, 1)
    ckpt = Checkpointer(Path(run_dir))
    ckpt.start(engine, 2, {})
    ckpt.close()


@pytest.mark.parametrize("background", [True, False])
def test_pending_reports_its_stall_and_sync_mode_is_done_on_return(tmp_path, background):
    launch(1, functools.partial(_mode_main, str(tmp_path), background))


def _mode_main(run_dir: str, background: bool, rank: int, world: int) -> None:
    engine = make_engine(0)
    train(engine, 1)
    ckpt = Checkpointer(Path(run_dir), background=background)
    pending = ckpt.start(engine, 1, {})
    assert pending.stall_s > 0
    if not background:
        assert pending.done()
    assert ckpt.wait() == Path(run_dir) / "checkpoints" / "step-00000001"
    ckpt.close()


def make_sharded_engine(seed: int, world: int) -> SimpleNamespace:
    """make_engine's model, FSDP2-sharded over `world` CPU ranks (its state dicts hold DTensors)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler, steps_done=0)


def full_snapshot(engine) -> dict:
    """snapshot() of a sharded engine: every DTensor gathered (collective)."""
    from torch.distributed.tensor import DTensor

    def full(t):
        return t.full_tensor().clone() if isinstance(t, DTensor) else t.clone()

    return {
        "model": {k: full(v) for k, v in engine.model.state_dict().items()},
        "adam": {i: {k: full(v) for k, v in s.items()} for i, s in engine.optimizer.state_dict()["state"].items()},
        "lr": engine.scheduler.get_last_lr(),
        "steps": engine.steps_done,
    }


def _ptrs(tree) -> list[int]:
    """data_ptr of every non-scalar tensor in a nested state (a DTensor's local tensor)."""
    from torch.distributed.tensor import DTensor

    if isinstance(tree, torch.Tensor):
        local = tree._local_tensor if isinstance(tree, DTensor) else tree
        return [local.data_ptr()] if tree.dim() > 0 else []
    if isinstance(tree, dict):
        return [p for v in tree.values() for p in _ptrs(v)]
    if isinstance(tree, (list, tuple)):
        return [p for v in tree for p in _ptrs(v)]
    return []


def _prepared_main(run_dir: str, rank: int, world: int) -> None:
    run_dir = Path(run_dir)
    engine = make_sharded_engine(0, world)
    ckpt = Checkpointer(run_dir, keep=3)
    ckpt.prepare(engine)  # start-up, no optimizer state yet: the pool is allocated on a helper thread
    assert ckpt.prepared(timeout=60) and ckpt.prepare_s > 0
    pooled = {p for ts in ckpt._preparing.result().free.values() for t in ts for p in _ptrs(t)}
    # One buffer per model tensor and two (exp_avg, exp_avg_sq) per parameter.
    assert len(pooled) == 3 * len(list(engine.model.parameters()))
    train(engine, 1)
    ckpt.prepare(engine)  # after the first step: the buffers take the state's structure from the pool
    buffers = ckpt._stager.state_dict_cache
    assert buffers is not None and len(_ptrs(buffers)) == len(pooled) and set(_ptrs(buffers)) == pooled
    at_save = [full_snapshot(engine)]
    first = ckpt.start(engine, 1, {})
    # The save copied into those buffers (it allocated none), and the next save reuses them.
    assert ckpt._stager.state_dict_cache is buffers and first.prepare_s == ckpt.prepare_s
    train(engine, 2)
    ckpt.prepare(engine)  # prepared: a no-op
    at_save.append(full_snapshot(engine))
    ckpt.start(engine, 3, {})
    assert ckpt._stager.state_dict_cache is buffers and _ptrs(ckpt._stager.state_dict_cache) == _ptrs(buffers)
    ckpt.close()
    # Each checkpoint holds the state at its own save: the second save overwrote the buffers only
    # after the first one's write had finished.
    for version, want in zip((1, 3), at_save):
        fresh = make_sharded_engine(1, world)
        load_checkpoint(fresh, list_checkpoints(run_dir)[version])
        assert_same(full_snapshot(fresh), want)


def _unprepared_main(run_dir: str, rank: int, world: int) -> None:
    """A save with no prepare() before it still works (buffers allocated by start())."""
    engine = make_engine(0)
    train(engine, 1)
    ckpt = Checkpointer(Path(run_dir))
    at_save = snapshot(engine)
    ckpt.start(engine, 1, {})
    assert ckpt._stager.state_dict_cache is not None
    path = ckpt.wait()
    ckpt.close()
    fresh = make_engine(1)
    load_checkpoint(fresh, path)
    assert_same(snapshot(fresh), at_save)


def test_a_save_without_prepare_allocates_its_buffers(tmp_path):
    launch(1, functools.partial(_unprepared_main, str(tmp_path)))


@pytest.mark.parametrize("world", [1, 2])
def test_prepared_staging_buffers_are_allocated_before_the_first_save_and_reused(tmp_path, world):
    launch(world, functools.partial(_prepared_main, str(tmp_path)))
