"""The start-up watchdog's message and its reading of a py-spy dump (streamrl/generate/start_watchdog.py);
the watchdog itself runs on a real hung engine in tests/integration/generate/test_engine_start_watchdog.py."""

from __future__ import annotations

from streamrl.generate.start_watchdog import hang_message, innermost_frame

DUMP = """Process 25723: python -m streamrl.cli worker generator
Python v3.11.7 (/usr/bin/python3.11)

Thread 25723 (idle): "MainThread"
    clock_nanosleep (libc.so.6)
    fill_kernel (libtorch_cpu.so)
    __init__ (vllm/v1/utils.py:120)
    Popen._launch (multiprocessing/popen_fork.py:66)
Thread 25800 (idle): "other"
    run (threading.py:982)
"""


def test_the_innermost_python_frame_of_the_first_thread_is_named():
    assert innermost_frame(DUMP) == "__init__ (vllm/v1/utils.py:120)"
    assert innermost_frame("Error: failed to attach") == ""


def test_the_message_names_the_setting_the_phase_the_process_and_the_restart():
    msg = hang_message("starting the EngineCore by fork", 600, "generator.start_timeout_s", ["pid 7 in f (a.py:1)"])
    assert "did not start within generator.start_timeout_s=600s" in msg
    assert "hung while starting the EngineCore by fork (pid 7 in f (a.py:1))" in msg
    assert "restarts this role with the engine started by spawn" in msg
    assert "raise generator.start_timeout_s" in msg
