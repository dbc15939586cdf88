"""A trainer rank's FatalError keeps its type through streamrl.train.dist.launch, so the trainer process
exits with EXIT_NO_RESTART (streamrl.launch.runtime) instead of a crash `streamrl up` would restart."""

import pytest
import torch.distributed as dist

from streamrl.core.errors import FatalError
from streamrl.train.dist import launch


def _fatal_on_rank_1(rank: int, world: int) -> None:
    if rank == 1:
        raise FatalError("nothing can be trained (test)")
    dist.barrier()  # left waiting: launch terminates it


def _fatal_alone(rank: int, world: int) -> None:
    raise FatalError("nothing can be trained (test, one rank)")


def test_fatal_error_passes_through_launch():
    with pytest.raises(FatalError, match=r"^nothing can be trained \(test, one rank\)$"):
        launch(1, _fatal_alone)
    assert not dist.is_initialized()
    with pytest.raises(FatalError, match=r"trainer rank 1: nothing can be trained \(test\)"):
        launch(2, _fatal_on_rank_1)
