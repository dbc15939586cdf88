"""Pick the trainer's compute engine from trainer.backend.

    engine = make_engine(cfg, model_path, rank, world)   # HFEngine (hf) or TitanEngine (torchtitan)

Both implement streamrl/train/engine_interface.TrainerEngine (through streamrl/train/step_engine.StepEngine); torchtitan is imported only when its
backend is chosen.
"""

from __future__ import annotations

from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.train.engine_interface import TrainerEngine


def make_engine(cfg: Config, model_path: str, rank: int, world_size: int) -> TrainerEngine:
    """The engine for cfg.trainer.backend, built on this rank (collective: every rank calls it)."""
    backend = cfg.trainer.backend
    if backend == "hf":
        from streamrl.train.hf_engine import HFEngine

        return HFEngine(cfg, model_path, rank, world_size)
    if backend == "torchtitan":
        try:
            from streamrl.train.titan_engine import TitanEngine
        except ImportError as exc:
            raise ConfigError(
                f"trainer.backend=torchtitan needs the torchtitan package ({exc}); "
                "pip install torchtitan, or set trainer.backend=hf"
            ) from exc
        return TitanEngine(cfg, model_path, rank, world_size)
    raise ConfigError(f"trainer.backend={backend!r} is unknown; set trainer.backend=hf or torchtitan")
