"""What a vLLM engine's exception means to the generator: a refused request (the group fails, the
generator goes on) or a dead engine (the generator exits so the supervisor restarts it)."""

from __future__ import annotations


def is_bad_request(exc: BaseException) -> bool:
    """vLLM refused the request: ValueError in older builds, VLLMClientError subclasses in newer ones."""
    return isinstance(exc, ValueError) or any(c.__name__ == "VLLMClientError" for c in type(exc).__mro__)


def is_engine_dead(exc: BaseException) -> bool:
    """vLLM's EngineDeadError (by name: its module moved between vLLM versions), also inside the
    ExceptionGroup of a group's TaskGroup: missing it there retried dead-engine groups and left the
    generator alive but unable to generate (seen after an EngineCore crash)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(is_engine_dead(e) for e in exc.exceptions)
    return type(exc).__name__ == "EngineDeadError"
