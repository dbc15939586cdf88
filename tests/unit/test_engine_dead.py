"""A dead vLLM engine ends the generator (so `streamrl up` restarts it) also when the error reaches
the group as an ExceptionGroup from its TaskGroup.

    pytest tests/unit/test_engine_dead.py
"""

from streamrl.generate.engine_errors import is_engine_dead


class EngineDeadError(Exception):
    """Matched by name, as vLLM's own (its module moved between versions)."""


def test_engine_dead_inside_a_task_group_is_recognised():
    assert is_engine_dead(EngineDeadError("core died"))
    assert is_engine_dead(
        ExceptionGroup("unhandled errors in a TaskGroup", [EngineDeadError("a"), EngineDeadError("b")])
    )
    nested = ExceptionGroup("outer", [ValueError("x"), ExceptionGroup("inner", [EngineDeadError("c")])])
    assert is_engine_dead(nested)
    assert not is_engine_dead(ExceptionGroup("unhandled errors in a TaskGroup", [ValueError("transient")]))
    assert not is_engine_dead(RuntimeError("broker restarting"))
