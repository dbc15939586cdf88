"""Supervised fine-tuning (`streamrl sft`): data, loss tokens, packing, eval."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streamrl.config.base import Section


class SFTConfig(Section):
    """Supervised fine-tuning (`streamrl sft`): data, which tokens carry the loss, packing, eval.
    Optimizer, steps, world size, backend and checkpoints come from `trainer`."""

    data: str = "charclass"
    """`charclass`: demonstrations of the charclass task built offline (prompt/completion pairs); a
    .jsonl or .parquet file; a folder written by `datasets.Dataset.save_to_disk`; or a name/path that
    `datasets.load_dataset` takes (with data_name, data_split, data_files)."""
    data_name: str | None = None
    """`datasets.load_dataset`'s config name."""
    data_split: str = "train"
    """Split to train on (`datasets` sources; a DatasetDict saved to disk too)."""
    data_files: str | list[str] | None = None
    """`datasets.load_dataset`'s data_files (e.g. the json/parquet builder with local files)."""
    eval_split: str | None = None
    """Held-out split for the eval loss; None holds out eval_fraction of the training rows instead."""
    eval_fraction: float = Field(0.05, ge=0, lt=1)
    """Fraction of the rows held out for the eval loss when eval_split is unset (0: no eval)."""
    eval_every: int = Field(10, ge=1)
    """Compute the eval loss every this many steps (and at the last step)."""
    eval_max_samples: int = Field(256, ge=1)
    """Held-out samples one eval uses (the first ones, always the same)."""
    num_demos: int = Field(512, ge=1)
    """Demonstrations built for data=charclass (task.charclass_length characters each)."""
    messages_field: str = "messages"
    """Column of OpenAI-format chat messages; rows without it need prompt_field and completion_field."""
    tools_field: str = "tools"
    """Column of OpenAI-format tool definitions passed to the chat template (optional)."""
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    """Prompt/completion pairs: the prompt is tokenized as the feeder tokenizes RL prompts (no special
    tokens added), the completion follows it with the EOS token appended; loss on the completion."""
    assistant_turns: Literal["all", "last"] = "all"
    """Which assistant turns of a conversation carry the loss: every one, or only the last."""
    max_seq_len: int = Field(1024, ge=2)
    """Longer samples are cut to this many tokens (counted as `truncated`)."""
    batch_size: int = Field(32, ge=1)
    """Samples per optimizer step (over all ranks); the loss is the mean over their loss tokens."""
    packing: bool = True
    """Pack samples into rows without padding; each document attends only to itself (position-id
    resets on the hf backend, a block-diagonal mask on torchtitan). False: one right-padded row per sample."""
    micro_batch_tokens: int = Field(4096, ge=2)
    """Token budget of one forward/backward (a packed row, or the padded rows' total); at least max_seq_len."""

    @model_validator(mode="after")
    def _budget(self) -> "SFTConfig":
        if self.micro_batch_tokens < self.max_seq_len:
            raise ValueError(
                f"sft.micro_batch_tokens={self.micro_batch_tokens} is below sft.max_seq_len="
                f"{self.max_seq_len}, so a full-length sample fits no micro-batch; raise "
                "micro_batch_tokens or lower max_seq_len"
            )
        return self
