"""A host without the `envs` extra collects the suite: `pytest -m gpu tests` deselects the env-adapter
e2e tests instead of stopping at their import, and selecting one still fails it, naming the fix
(never a silent skip). Runs pytest on that one file with textarena and verifiers hidden.

    pytest tests/unit/test_collect_without_extras.py -q
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HIDE = "import sys; sys.modules['textarena'] = sys.modules['verifiers'] = None; import pytest; "


def _pytest(*args: str) -> subprocess.CompletedProcess:
    code = HIDE + f"sys.exit(pytest.main({['-q', '-p', 'no:cacheprovider', *args]!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_deselected_env_adapter_tests_do_not_stop_collection():
    res = _pytest("--collect-only", "-m", "gpu", "tests/e2e/test_env_adapters.py")
    assert res.returncode == 5, res.stdout + res.stderr  # 5: nothing selected; 2 was the import error
    assert "error" not in res.stdout.lower(), res.stdout


def test_a_selected_env_adapter_test_fails_with_the_fix():
    res = _pytest("tests/e2e/test_env_adapters.py::test_textarena_game_drives_a_job")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "pip install -e '.[envs]'" in res.stdout
