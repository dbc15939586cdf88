"""Can a Hugging Face hub id in model.path be loaded on this machine? The pre-flight's question
(streamrl/launch/preflight.py), answered in seconds before anything starts: transformers and vLLM,
asked for an id that is not in the local cache on a machine without network, retry for about a
minute, and the job has started by then.

    problem = hub_id_problem("Qwen/Qwen3-0.6B", "model.path")   # None: cached, or the hub knows it
"""

from __future__ import annotations

import os

OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
RESOLVE_TIMEOUT_S = 5.0
"""One look-up at the hub, no retries: a machine without network answers (or times out) within it."""


def offline() -> str | None:
    """The variable that puts Hugging Face offline here, if one does (read now, not at import)."""
    return next((v for v in OFFLINE_VARS if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")), None)


def is_cached(model_id: str, cache_dir: str | None = None) -> bool:
    """The local Hugging Face cache holds the model's config.json (what every loader reads first)."""
    from huggingface_hub import try_to_load_from_cache

    cache_dir = cache_dir or os.environ.get("HF_HUB_CACHE") or _home_cache()
    return isinstance(try_to_load_from_cache(model_id, "config.json", cache_dir=cache_dir), str)


def _home_cache() -> str | None:
    home = os.environ.get("HF_HOME")
    return os.path.join(home, "hub") if home else None


def hub_id_problem(model_id: str, where: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> str | None:
    """Why `model_id` (a hub id in the setting `where`) cannot be loaded here, naming the fix; None when
    the local cache holds it or the hub answers for it."""
    if is_cached(model_id):
        return None
    fix = (
        f"download it first where there is network (`hf download {model_id}`, into this machine's "
        f"HF_HOME), or set {where} to a local model folder"
    )
    if var := offline():
        return f"{where}={model_id!r} is a Hugging Face hub id that is not in the local cache, and {var} is set; {fix}"
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi(endpoint=os.environ.get("HF_ENDPOINT")).model_info(model_id, timeout=timeout_s)
    except GatedRepoError:
        return None  # it exists; the loaders say whether this machine's token may read it
    except RepositoryNotFoundError:
        return (
            f"{where}={model_id!r}: the Hugging Face hub has no such model (or it is private: "
            "`hf auth login`); check the id, or set it to a local model folder"
        )
    except (httpx.TransportError, OSError) as exc:
        if isinstance(exc, HfHubHTTPError):
            return None  # the hub answered (some other HTTP error): network works, let the loaders try
        return (
            f"{where}={model_id!r} is a Hugging Face hub id that is not in the local cache, and the hub "
            f"cannot be reached from here ({type(exc).__name__}: {exc}); {fix}"
        )
    return None
