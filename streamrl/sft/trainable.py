"""Refuse an SFT run that would train on nothing: rows that all fail to tokenize, or tokenize to
no loss token (a chat jsonl with a tokenizer without a chat template), would otherwise train at
loss 0 with 0 loss tokens and "succeed".

    check_first_rows(tokenizer, train_rows, cfg.sft)   # `streamrl sft`, before any rank starts
    no_loss_tokens(step)                                # sft_train_step, a batch with none
"""

from __future__ import annotations

from streamrl.config.schema import SFTConfig
from streamrl.core.errors import ConfigError
from streamrl.sft.data import SampleError, tokenize_row

FIRST_ROWS = 16
"""Rows read before training: a single bad row is skipped and counted, none usable is an error."""

FIX = (
    "chat `messages` rows need a tokenizer with a chat template (the built tiny model: set "
    "model.tiny.chat_template=true; a model folder: a chat_template in tokenizer_config.json), "
    "sft.assistant_turns picks the assistant turns that are trained (all or last), "
    "and prompt/completion rows need sft.prompt_field/sft.completion_field"
)


def check_first_rows(tokenizer, rows, sft: SFTConfig, n: int = FIRST_ROWS) -> None:
    """ConfigError naming the fix if none of the first `n` rows has a loss token."""
    errors = []
    for i in range(min(n, len(rows))):
        try:
            tokenize_row(tokenizer, rows[i], sft)
            return
        except (SampleError, ValueError, TypeError) as exc:
            errors.append(f"row {i}: {exc}")
    if errors:
        raise ConfigError(
            f"none of the first {len(errors)} SFT rows has a loss token, so training would learn nothing "
            f"({errors[0]}); {FIX}"
        )


def no_loss_tokens(step_rows: int) -> ConfigError:
    return ConfigError(
        f"this SFT step's {step_rows} row(s) hold no loss token on any rank (every row was skipped or "
        f"masked), so the step would train on nothing; {FIX}"
    )
