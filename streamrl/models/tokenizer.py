"""The tokenizer of a model folder for a role that only tokenizes (the feeder): the one AutoTokenizer
picks, loaded without importing torch where AutoTokenizer's pick is known.

`from transformers import AutoTokenizer` imports torch (transformers 5: the auto classes import the
generation config, which imports torch): about 4 s of CPU at every feeder start on a 2-core machine,
for a role that never touches a tensor (the tiny job's feeder: 6.2 s of CPU with it, 2.0 s without).
A folder whose tokenizer_config.json names transformers' generic `TokenizersBackend` (no custom
code) and whose model type AutoTokenizer leaves on that class (GENERIC_MODEL_TYPES: AutoTokenizer
overrides the named class only for the model types it lists as mislabelled on the Hub) is loaded
with that class directly; everything else goes through AutoTokenizer. tests/unit/test_tokenizer_load.py
checks the pick against AutoTokenizer for each type listed, so a transformers release that changes
it fails there, not in a job.
"""

from __future__ import annotations

import json
from pathlib import Path

GENERIC_MODEL_TYPES = frozenset({"llama", "qwen3"})
"""Model types whose TokenizersBackend-labelled folders AutoTokenizer loads as TokenizersBackend
(the tiny models, streamrl.models.shapes' random-weight models)."""


def loads_directly(path: str | Path) -> bool:
    """AutoTokenizer would load `path` as TokenizersBackend, known from its files without importing it."""
    folder = Path(path)
    conf, model = _json(folder / "tokenizer_config.json"), _json(folder / "config.json")
    if conf.get("tokenizer_class") != "TokenizersBackend" or "auto_map" in conf or "auto_map" in model:
        return False
    return model.get("model_type") in GENERIC_MODEL_TYPES


def load_tokenizer(path: str | Path):
    """AutoTokenizer.from_pretrained(path), without torch where loads_directly says the class."""
    if loads_directly(path):
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # not a local folder (a hub id), or no such file: AutoTokenizer decides
        return {}
    return data if isinstance(data, dict) else {}
