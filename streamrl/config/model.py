"""The policy model: a local Hugging Face folder, or the tiny offline model's shape."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streamrl.config.base import Section


class TinyModelConfig(Section):
    # Defaults: the smallest shape (87k parameters, head dim 32 = vLLM CPU's minimum) that learns the
    # charclass task quickly, so CPU tests stay short (docs/performance.md, "Learning on the tiny task").
    hidden_size: int = Field(64, ge=32)
    intermediate_size: int = Field(128, ge=32)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(2, ge=1)
    num_kv_heads: int = Field(1, ge=1)
    max_position_embeddings: int = Field(256, ge=16)
    init_std: float = Field(0.02, gt=0)
    """Std of the normal weight init (near-uniform next-token distribution at 0.02)."""
    chat_template: bool = False
    """Build the Qwen-style chat variant (streamrl/models/tiny_chat.py): <|im_start|>/<|im_end|> tokens, eos <|im_end|>, a chat template."""

    @model_validator(mode="after")
    def _heads(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                "model.tiny: hidden_size must be divisible by num_heads and num_heads by "
                f"num_kv_heads (got {self.hidden_size}/{self.num_heads}/{self.num_kv_heads})"
            )
        if self.hidden_size // self.num_heads not in (32, 64, 80, 96, 112, 128, 256):
            raise ValueError(
                f"model.tiny: head dim {self.hidden_size // self.num_heads} is not supported by "
                "vLLM's CPU attention; choose hidden_size/num_heads in {32, 64, 128}"
            )
        return self


class ModelConfig(Section):
    path: str | None = None
    """A local Hugging Face model folder. None builds the tiny offline model (model.tiny)."""
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
