"""Whether a model's tokenizer has a chat template, read from its files (no tokenizer loaded), and the
line `streamrl up` and `streamrl config --explain` print about how the job's prompts are rendered.

    has_chat_template("runs/models/qwen")     # True / False; None: a hub id not in the local cache
    prompt_format(cfg)                        # "prompts: the chat template of ... (task.chat_template=auto; ...)"

The feeder decides with the loaded tokenizer (`tokenizer.chat_template`), through the same rule
(Config.chat_prompts); these files are where transformers reads that attribute from: the
`chat_template` key of tokenizer_config.json, chat_template.jinja (transformers >= 4.50 writes it
there), or a folder of named templates.
"""

from __future__ import annotations

import json
from pathlib import Path

from streamrl.config.schema import Config

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _config_has_template(config_file: Path) -> bool:
    try:
        return bool(json.loads(config_file.read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def has_chat_template(path: str | Path) -> bool | None:
    """True when the tokenizer files at `path` (a model folder, or a hub id in the local Hugging Face
    cache) hold a chat template; None when `path` is a hub id the cache does not hold."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        if any((folder / name).is_file() for name in TEMPLATE_FILES) or (folder / "additional_chat_templates").is_dir():
            return True
        return _config_has_template(folder / "tokenizer_config.json")
    from huggingface_hub import try_to_load_from_cache

    found = False
    for name in ("tokenizer_config.json", *TEMPLATE_FILES):
        cached = try_to_load_from_cache(str(path), name)
        if isinstance(cached, str):
            found = True
            if name != "tokenizer_config.json" or _config_has_template(Path(cached)):
                return True
    return False if found else None


def prompt_format(cfg: Config) -> str:
    """How the feeder renders this job's prompts, in one line naming the setting that changes it.
    `cfg.model.path` is the resolved one (the tiny model's folder when it was unset)."""
    setting = f"task.chat_template={str(cfg.task.chat_template).lower()}"
    if cfg.task.fields.messages is not None:
        return f"prompts: task.fields.messages={cfg.task.fields.messages!r}, rendered with the model's chat template"
    has = has_chat_template(cfg.model.path) if cfg.model.path else bool(cfg.model.tiny.chat_template)
    if has is None and cfg.task.chat_template == "auto" and not cfg.tools.chat and cfg.env.fn is None:
        return (
            f"prompts: the chat template of {cfg.model.path} if its tokenizer has one ({setting}; the model "
            "is not in the local cache to check); --set task.chat_template=false for raw text"
        )
    if cfg.chat_prompts(bool(has)):
        why = "tools.chat=true" if cfg.tools.chat else setting
        raw = "" if cfg.tools.chat else "; --set task.chat_template=false for raw text"
        return f"prompts: rendered with the chat template of the model's tokenizer ({why}{raw})"
    if cfg.task.chat_template is False:
        return f"prompts: raw text ({setting})"
    if cfg.env.fn is not None:
        return f"prompts: raw text (episodes render with the chat template only with tools.chat=true; {setting})"
    return f"prompts: raw text (the model's tokenizer has no chat template; {setting})"


def check_chat_template(cfg: Config) -> str | None:
    """Pre-flight: task.chat_template=true needs a tokenizer with a chat template (a hub id not in the
    local cache is left to the feeder)."""
    if cfg.task.chat_template is not True or cfg.task.fields.messages is not None or cfg.tools.chat:
        return None  # tools.chat: ChatBridge says so at start
    has = has_chat_template(cfg.model.path) if cfg.model.path else bool(cfg.model.tiny.chat_template)
    if has is False:
        where = (
            f"model.path={cfg.model.path!r}" if cfg.model.path else "the tiny model (model.tiny.chat_template=false)"
        )
        return (
            f"task.chat_template=true renders prompts with the tokenizer's chat template, but {where} has none; "
            "use an instruct/chat model, set model.tiny.chat_template=true for the tiny model, or set "
            "task.chat_template=auto (raw text where there is no template)"
        )
    return None
