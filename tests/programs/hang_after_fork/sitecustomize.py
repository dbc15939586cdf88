"""An engine made to hang: put this folder first on PYTHONPATH with STREAMRL_TEST_HANG_FORKED_CHILD=1 and
every child this process forks (a generator's forked vLLM EngineCore) sleeps for ever right after the
fork, as an EngineCore deadlocked in GNU OpenMP did (issue 46); a spawned one starts normally (its
parent is not the process that loaded this). vLLM is imported here, before the start's clock runs: on
the loaded 2-core VM its import alone took over 25 s, which a short generator.start_timeout_s would
catch instead of the hang. Used by tests/integration/generate/test_engine_start_watchdog.py.
"""

import os

if os.environ.get("STREAMRL_TEST_HANG_FORKED_CHILD") == "1":
    _PARENT = os.getpid()

    def _hang_in_forked_child() -> None:
        if os.getppid() == _PARENT:
            import time

            while True:
                time.sleep(3600)

    os.register_at_fork(after_in_child=_hang_in_forked_child)
    import vllm.engine.arg_utils  # noqa: F401, E402
    import vllm.v1.engine.async_llm  # noqa: F401, E402
