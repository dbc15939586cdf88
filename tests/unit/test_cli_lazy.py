"""`streamrl CMD` imports only CMD's module (every role process starts as `streamrl worker ...`, and
each other command's imports would add to its start-up); `streamrl --help` still lists them all.

    pytest tests/unit/test_cli_lazy.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from streamrl.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]

LOADED = """
import contextlib, io, sys
from streamrl.cli import main
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    main(sys.argv[1:])
print(sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("streamrl.commands.")))
"""


def _loaded(*argv: str) -> list[str]:
    res = subprocess.run([sys.executable, "-c", LOADED, *argv], cwd=ROOT, capture_output=True, text=True, check=True)
    return eval(res.stdout.strip().splitlines()[-1])  # the list printed last


def test_a_command_imports_only_its_own_module():
    loaded = _loaded("worker", "--help")
    assert "worker" in loaded and "report" not in loaded and "producer" not in loaded  # the heavy others
    assert set(loaded) <= {"worker", "common", "acl_users"}  # worker's own module and what it imports


def test_help_lists_every_command():
    parser, modules = build_parser()
    assert set(modules) == set(COMMANDS)
    assert set(_loaded("--help")) >= set(COMMANDS)


EXITS = """
import atexit, sys
atexit.register(lambda: print("interpreter teardown ran", flush=True))
sys.argv = ["streamrl", *sys.argv[1:]]
from streamrl.cli import entry
entry()
"""


def test_up_and_worker_end_their_process_without_the_interpreter_teardown(tmp_path):
    from streamrl.core.errors import EXIT_NO_RESTART

    missing = str(tmp_path / "missing.yaml")
    res = subprocess.run(
        [sys.executable, "-c", EXITS, "worker", "feeder", "--config", missing, "--broker", "redis://unused"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == EXIT_NO_RESTART
    assert "fatal error (not restarted): config error" in res.stderr  # flushed before the exit
    assert "interpreter teardown ran" not in res.stdout
    res = subprocess.run(
        [sys.executable, "-c", EXITS, "config", "--config", missing], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 2 and "interpreter teardown ran" in res.stdout  # other commands exit normally
