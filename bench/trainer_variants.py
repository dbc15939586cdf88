"""bench trainer_mfu's variant strings (BACKEND+option+...) applied to a config's trainer section."""

from __future__ import annotations


def apply_variant(cfg, variant: str) -> None:
    """BACKEND[+compile][+ac][+nochunk][+chunk=N][+mbt=N][+mbs=N][+bucket=N][+pack=N][+kernel=K][+lora=R] onto cfg.trainer
    (bench/trainer_mfu.py's docstring says what each does)."""
    from streamrl.core.errors import ConfigError

    backend, *parts = variant.split("+")
    cfg.trainer.backend = backend
    cfg.trainer.parallelism.compile = "compile" in parts
    cfg.trainer.activation_checkpointing = "ac" in parts
    for part in parts:
        key, _, value = part.partition("=")
        if key == "nochunk":
            cfg.trainer.logprob_chunk_tokens = 0
        elif key == "chunk" and value.isdigit():
            cfg.trainer.logprob_chunk_tokens = int(value)
        elif key == "mbt" and value.isdigit():
            cfg.trainer.micro_batch_tokens = int(value)
        elif key == "mbs" and value.isdigit() and int(value) > 0:
            cfg.trainer.micro_batch_size = int(value)
        elif key == "bucket" and value.isdigit() and int(value) > 0:
            cfg.trainer.seq_bucket = int(value)
        elif key == "pack" and value.isdigit():
            cfg.trainer.pack_rows = int(value)
        elif key == "kernel" and value in ("auto", "compiled", "eager"):
            cfg.trainer.logprob_kernel = value
        elif key == "lora" and value.isdigit():
            cfg.trainer.lora.rank = int(value)  # adapters only (trainer.lora's other fields as configured)
        elif key not in ("compile", "ac"):
            raise ConfigError(
                f"variant {variant!r}: unknown option {part!r}; use compile, ac, nochunk, chunk=N, mbt=N, mbs=N, bucket=N, pack=N, kernel=auto|compiled|eager, lora=R"
            )
