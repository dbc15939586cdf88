"""Pre-flight checks of the user's code that the roles call (streamrl/launch/preflight.py runs them):
env.fn and tools.names import; each reward function takes the arguments the reward workers pass and,
called once on a task item, returns a number. Found here, these stop `streamrl config` and `up` before
anything starts, instead of an env worker's restarts or ~25 s of dead-lettered groups.

    check_env_fn(cfg)          # None, or the problem naming the fix
    check_tool_fns(cfg)
    check_reward_calls(cfg)

The probe call: a reward function is called twice on the task's first item (completions: the item's
answer, and ""), on a daemon thread, for at most PROBE_TIMEOUT_S. Reward functions are meant to be
pure (the workers call them thousands of times, on any completion), so two more calls cost nothing;
one that is slow (a remote grader) is left running and not judged; one that raises is not judged
either (the probe's completions are not the model's). Only a result that is not a number refuses the
config. `--no-preflight` skips it.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import math
import threading

from streamrl.config.env_spec import ADAPTER_PREFIXES
from streamrl.config.rollout import EXTERNAL
from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.core.imports import cwd_on_path

PROBE_TIMEOUT_S = 5.0
CALLED_AS = "fn(prompt: str, completion: str, meta: dict) -> float"
"""How the reward workers call a reward function (workers/reward.py)."""


def _user_code_error(setting: str, spec: str, exc: Exception, who: str) -> str:
    return (
        f"{setting}={spec!r}: importing it raised {type(exc).__name__}: {exc}; "
        f"fix that module ({who} import it the same way)"
    )


def check_env_fn(cfg: Config) -> str | None:
    """env.fn imports and names an env class, as the env workers `up` starts resolve it."""
    from streamrl.envs import adapters
    from streamrl.envs.resolve import resolve_env

    fn = cfg.env.fn
    if not fn or fn == EXTERNAL or cfg.env.count == 0:
        return None  # single-turn, or env workers started elsewhere (with their own code)
    if parts := adapters.split_spec(fn):  # another library's env: installed? (building one may load its data)
        package = ADAPTER_PREFIXES[parts[0]][0] if parts[0] in ADAPTER_PREFIXES else parts[0]
        if importlib.util.find_spec(package) is None:
            return f"env.fn={fn!r} needs the {package} package, which is not installed; pip install -e '.[envs]'"
        return None
    try:
        with cwd_on_path():
            resolve_env(fn, tuple(cfg.env.latency_ms))
    except ConfigError as exc:
        return f"env.fn: {exc}"
    except Exception as exc:  # the module itself raised while importing: user code
        return _user_code_error("env.fn", fn, exc, "the env workers")
    return None


def check_tool_fns(cfg: Config) -> str | None:
    """tools.names load as the env workers load them (streamrl.envs.tools.check_tools), the working
    directory on the path; a user's tool module that raises while importing is named with its error."""
    from streamrl.envs.tools import check_tools

    try:
        with cwd_on_path():
            return check_tools(cfg)
    except Exception as exc:  # the module itself raised while importing: user code
        return _user_code_error("tools.names", ", ".join(cfg.tools.names), exc, "the env workers")


def _user_rewards(cfg: Config) -> list[tuple[str, str]]:
    """(setting, spec) of every `package.module:function` reward the reward workers call."""
    if cfg.reward.count == 0:
        return []
    if cfg.reward.components:
        specs = [(f"reward.components[{i}].fn", c.fn) for i, c in enumerate(cfg.reward.components)]
    else:
        specs = [("reward.fn", cfg.reward.fn)]
    return [(setting, spec) for setting, spec in specs if spec and ":" in spec]


def signature_problem(setting: str, spec: str, fn) -> str | None:
    """`fn` cannot be called as the reward workers call it (positionally: prompt, completion, meta)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function without one: the probe decides
        return None
    try:
        sig.bind("prompt", "completion", {})
    except TypeError as exc:
        return (
            f"{setting}={spec!r} has the signature {fn.__name__}{sig}, but the reward workers call it as "
            f"{CALLED_AS} ({exc}); change its parameters to (prompt, completion, meta)"
        )
    return None


def probe_item(cfg: Config) -> dict | None:
    """The task's first item ({"text", "meta"}) where it is cheap to read (a synthetic task, a local
    jsonl/parquet file with a text prompt); None otherwise (no probe)."""
    from streamrl.feed.datasets import LOCAL_JSON, record_item, records

    task = cfg.task
    if task.name in ("charclass", "charclass_dialog"):
        from streamrl.feed.sources import load_task

        items = load_task(task, seed=cfg.run.seed, max_tokens=cfg.generator.max_tokens)
        return items[0] if items else None
    path = task.dataset.path or ""
    local = path.endswith((*LOCAL_JSON, ".parquet"))
    if task.name in ("dataset", "gsm8k") and task.fields.messages is None and local:
        try:
            for where, record in itertools.islice(records(task), 1):
                return record_item(task, record, where)
        except Exception:  # check_task reports a bad file
            return None
    return None


def _call(fn, args: tuple, timeout_s: float) -> tuple[str, object]:
    """("ok", value), ("raised", exc) or ("slow", None): fn(*args) on a daemon thread (never joined past
    the timeout, so a call that never returns cannot hold up `streamrl config`)."""
    out: list = []

    def run() -> None:
        try:
            out.append(("ok", fn(*args)))
        except Exception as exc:  # user code
            out.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True, name="reward-probe")
    thread.start()
    thread.join(timeout_s)
    return out[0] if out else ("slow", None)


def result_problem(setting: str, spec: str, value: object, completion: str) -> str | None:
    """A probe's result that the reward workers would fail the rollout on: float() of it (what they
    take) fails or is not finite."""
    try:
        if math.isfinite(float(value)):
            return None
    except (TypeError, ValueError):
        pass
    shown = "None (no return statement reached?)" if value is None else f"{type(value).__name__} {str(value)[:60]!r}"
    return (
        f"{setting}={spec!r} returned {shown} when called on the task's first item with the completion "
        f"{completion[:40]!r}; the reward workers need a finite float from every call ({CALLED_AS}): "
        "return a number on every path"
    )


def check_reward_calls(cfg: Config, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Each user reward function takes (prompt, completion, meta) and, probed on the task's first item,
    returns a number. Import problems are check_reward_fn's (preflight.py): none is reported twice."""
    from streamrl.annotate.rewards import resolve_reward

    item = None
    for setting, spec in _user_rewards(cfg):
        try:
            with cwd_on_path():
                fn = resolve_reward(spec)
        except Exception:  # check_reward_fn says why
            continue
        if problem := signature_problem(setting, spec, fn):
            return problem
        item = item or probe_item(cfg) or {}
        if not item:
            continue
        meta = dict(item.get("meta", {}))
        for completion in (str(meta.get("answer", "")), ""):
            status, value = _call(fn, (item.get("text", ""), completion, meta), timeout_s)
            if status != "ok":
                break  # slow or raising on a made-up completion: not this check's to judge
            if problem := result_problem(setting, spec, value, completion):
                return problem
    return None
