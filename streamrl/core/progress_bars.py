"""Hugging Face's progress bars off for a job's console and its roles' logs."""

from __future__ import annotations

import os
import sys


def quiet_progress_bars() -> None:
    """No tqdm bars from transformers ("Loading weights" per model load) or the hub on the console of
    `up`, the Python API's jobs and `sft`, nor in the logs of the roles they start (they inherit the variable); a user's
    HF_HUB_DISABLE_PROGRESS_BARS=0 keeps them (a hub model that transformers or vLLM downloads then shows
    its download bar again)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "1":
        return
    if "huggingface_hub" in sys.modules:  # imported already: it read the variable before it was set
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()
