"""Config files: a YAML file plus `--set section.field=value` overrides, validated into a
`Config` (streamrl/config/schema.py) with errors that name the field and the fix; and the resolved
config (objective defaults applied) written back for every role of a run.

    cfg = load_config("configs/tiny-cpu.yaml", ["trainer.steps=20"])
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from streamrl.config.schema import Config
from streamrl.core.broker_url import redact_url, split_password
from streamrl.core.errors import ConfigError

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text) if text.strip() else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b=c` strings (values parsed as YAML scalars) to a nested dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} is not of the form section.field=value, e.g. --set trainer.steps=20")
        dotted, value = item.split("=", 1)
        set_dotted(data, dotted, _parse_scalar(value), f"--set {item!r}")
    return data


def set_dotted(data: dict, dotted: str, value: Any, where: str) -> None:
    """data[a][b] = value for dotted `a.b` (sections created as needed); `where` names it in the error."""
    parts = dotted.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {part!r} is a value, not a section")
    node[parts[-1]] = value


def _section_fields(loc: tuple) -> list[str]:
    """The field names of the section at `loc` (the path to an unknown key's parent), for "did you mean"."""
    model: Any = Config
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = field.annotation
        args = [a for a in get_args(model) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = args[0] if args else model  # `X | None`, list[X]: the section X
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _hint(e: dict, overrides: dict[str, str]) -> str:
    """What to do about one validation error, and which --set it came from."""
    loc = tuple(p for p in e["loc"] if not isinstance(p, int))
    where = ".".join(str(p) for p in e["loc"]) or "(top level)"
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _section_fields(loc[:-1]), n=1)
        parent = ".".join(str(p) for p in loc[:-1])
        msg = f"unknown field; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else "unknown field"
        msg += " (`streamrl config --explain` lists every field with its description)"
    dotted = ".".join(str(p) for p in loc)
    # The --set that wrote this field or a field inside it, or the unknown section it created (a
    # misspelled `trainr.steps`).
    unknown = e["type"] == "extra_forbidden"
    given = next(
        (k for k in overrides if dotted == k or dotted.startswith(k + ".") or (unknown and k.startswith(dotted + "."))),
        None,
    )
    if given is None:
        return f"  {where}: {msg}"
    raw = redact_url(overrides[given]) if given.startswith("broker.") else overrides[given]
    parsed = _parse_scalar(raw)
    if e["type"] == "string_type" and not isinstance(parsed, str):
        msg += f"; YAML reads {raw!r} as the {type(parsed).__name__} {parsed!r}: quote it, --set '{given}=\"{raw}\"'"
    return f"  {where}: {msg} (from --set {given}={raw})"


def _format_errors(err: ValidationError, source: str, overrides: list[str] = ()) -> str:
    given = dict(item.split("=", 1) for item in overrides)
    given = {k.strip(): v for k, v in given.items()}
    lines = [_hint(e, given) for e in err.errors()]
    # Blame the --set where every error came from one, not the file it was applied to.
    head = "invalid --set (applied to " if all("(from --set" in x for x in lines) else "invalid config ("
    return "\n".join([f"{head}{source}):", *lines])


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load and validate a config; raise ConfigError naming the field and the fix."""
    path = Path(path) if path else DEFAULT_CONFIG
    data = apply_overrides(read_config_file(path), overrides or [])
    return validate_config(data, str(path), overrides or [])


def read_config_file(path: Path) -> dict:
    """A YAML config file's sections, not yet validated; ConfigError when it is missing or not a mapping."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass --config configs/tiny-cpu.yaml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def validate_config(data: dict, source: str, overrides: list[str] = ()) -> Config:
    """`data` validated into a Config; the ConfigError names each bad field, and the --set of `overrides`
    (`section.field=value` strings) it came from."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source, overrides)) from None


def resolved_dump(cfg: Config, secrets_dir: Path | None = None) -> dict:
    """The config as every role will read it: each field written out, and `loss:` resolved against
    its objective (streamrl.losses.resolve_loss: sapo's seq_mean, dapo's dynamic_sampling, the
    fixed horizon). Writing the plain dump instead would turn each objective default the user left
    alone into the shared default "set by the user" (gspo: aggregation=token_mean), which the
    objective then rejects or silently runs with; resolved, re-reading it resolves identically.

    A password inside broker.url never appears: with `secrets_dir` it is written to
    secrets_dir/password (mode 0600) and broker.password_file names that file, so a role re-reading
    the dump still connects; without, the URL is shown with `***` (for printing)."""
    from streamrl.core.imports import cwd_on_path
    from streamrl.losses.registry import loss_settings  # lazy: imports the objective (and torch)

    data = cfg.model_dump(mode="json")
    # Without max_tokens: an unset loss.horizon stays unset ("generator.max_tokens"), so it follows a
    # --set generator.max_tokens on --resume as it would have in the user's config.
    with cwd_on_path():  # a `my_losses:fn` objective imports as the trainer will import it
        data["loss"] = loss_settings(cfg.loss).model_dump(mode="json")
    stripped, password = split_password(cfg.broker.url)
    if password is not None and secrets_dir is None:
        data["broker"]["url"] = redact_url(cfg.broker.url)
    elif password is not None:
        data["broker"]["url"] = stripped
        data["broker"]["password_file"] = str(write_secret(secrets_dir / "password", password))
    return data


def write_secret(path: Path, secret: str) -> Path:
    """Write `secret` to `path`, readable by its owner only (the folder too), whatever the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
        out.write(secret + "\n")
    return path.resolve()


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write RUN_DIR/config.yaml: it means what `cfg` means wherever it is read (every role, every
    rank, `streamrl config --config`, `--resume`). It holds no secret: an inline broker password goes
    to RUN_DIR/broker/password (0600), which the written broker.password_file names."""
    path = Path(path)
    path.write_text(yaml.safe_dump(resolved_dump(cfg, secrets_dir=path.parent / "broker"), sort_keys=False))
