"""Pre-flight refusals of what used to surface only after start (issue 43, item 5), each naming the fix:
an env.fn or reward function that does not import, a reward function with the wrong signature or one
that returns None on a task item, a hub id in model.path that this machine cannot load; and a run
directory whose job never trained is not "used". Real modules written to disk. (`streamrl config` and
`up` exiting 2 on an unimportable env.fn: tests/e2e/test_config_errors.py.)

    pytest tests/integration/launch/test_preflight_user_code.py
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from streamrl.config.files import load_config
from streamrl.launch.code_checks import check_env_fn, check_reward_calls, check_tool_fns
from streamrl.launch.preflight import CHEAP, check_model_path
from streamrl.launch.rundir import clear_unstarted, earlier_run
from streamrl.models.hub import hub_id_problem

REWARDS = """
import time

def no_meta(prompt, completion):
    return 1.0

def falls_through(prompt, completion, meta):
    if completion:
        return 1.0

def a_dict(prompt, completion, meta):
    return {"score": 1.0}

def fine(prompt, completion, meta, scale=1.0):
    return scale * len(completion)

def slow(prompt, completion, meta):
    time.sleep(60)

def raises(prompt, completion, meta):
    raise KeyError("answer")
"""


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """A folder with the user's modules, the working directory (the roles import from there)."""
    (tmp_path / "pf_rewards.py").write_text(REWARDS)
    (tmp_path / "pf_broken_env.py").write_text("from streamrl.envs.base import Env\nundefined_name\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cfg(*sets: str):
    return load_config(None, list(sets))


def test_env_fn_that_does_not_import_is_refused(user_code):
    missing = check_env_fn(cfg("env.fn=pf_no_such_module:Calc"))
    assert "cannot import module 'pf_no_such_module'" in missing and "PYTHONPATH" in missing, missing
    broken = check_env_fn(cfg("env.fn=pf_broken_env:Calc"))
    assert "env.fn='pf_broken_env:Calc': importing it raised NameError" in broken, broken
    assert "fix that module (the env workers import it the same way)" in broken
    assert check_env_fn(cfg("env.fn=tests.programs.env_fns:Counter")) is None
    assert check_env_fn(cfg("env.fn=pf_no_such_module:Calc", "env.count=0")) is None  # env workers run elsewhere


def test_a_tool_module_that_raises_while_importing_is_named(user_code):
    (user_code / "pf_tools.py").write_text("def lookup(q: str) -> str:\n    return q\n\nraise RuntimeError('no db')\n")
    msg = check_tool_fns(cfg("tools.names=[pf_tools:lookup]"))
    assert "tools.names='pf_tools:lookup': importing it raised RuntimeError: no db" in msg, msg


def test_reward_with_the_wrong_signature_is_refused(user_code):
    msg = check_reward_calls(cfg("reward.fn=pf_rewards:no_meta"))
    assert "reward.fn='pf_rewards:no_meta' has the signature no_meta(prompt, completion)" in msg, msg
    assert "change its parameters to (prompt, completion, meta)" in msg
    assert check_reward_calls(cfg("reward.fn=pf_rewards:fine")) is None  # an extra defaulted parameter is fine


def test_reward_returning_none_or_a_non_number_on_a_task_item_is_refused(user_code):
    msg = check_reward_calls(cfg("reward.fn=pf_rewards:falls_through"))
    assert "returned None (no return statement reached?)" in msg and "with the completion ''" in msg, msg
    msg = check_reward_calls(cfg("reward.components=[{fn: charclass}, {fn: 'pf_rewards:a_dict', weight: 0.5}]"))
    assert msg.startswith("reward.components[1].fn='pf_rewards:a_dict' returned dict"), msg


def test_a_slow_or_raising_reward_is_not_judged_by_the_probe(user_code):
    t0 = time.monotonic()
    assert check_reward_calls(cfg("reward.fn=pf_rewards:slow"), timeout_s=0.5) is None
    assert time.monotonic() - t0 < 5  # the call is left running on its daemon thread
    assert check_reward_calls(cfg("reward.fn=pf_rewards:raises")) is None


def _cached(cache: Path, repo: str) -> None:
    """What `hf download` leaves in a Hugging Face cache for `repo` (its config.json)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "snapshots" / "abc123").mkdir(parents=True)
    (root / "snapshots" / "abc123" / "config.json").write_text("{}")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("abc123")


def test_hub_id_unreachable_or_offline_is_refused_in_seconds_and_a_cached_one_passes(tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # first: huggingface_hub keeps what it read at import
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: a machine without network
    t0 = time.monotonic()
    msg = hub_id_problem("streamrl-test/not-downloaded", "judge.model.path", timeout_s=2)
    assert time.monotonic() - t0 < 10, "one look-up, not the loaders' minute of retries"
    assert "the hub cannot be reached from here (ConnectError" in msg and "set judge.model.path to a local" in msg, msg
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = check_model_path(cfg("model.path=streamrl-test/not-downloaded"))
    assert "model.path='streamrl-test/not-downloaded' is a Hugging Face hub id that is not in the local cache" in msg
    assert "HF_HUB_OFFLINE is set" in msg and "hf download streamrl-test/not-downloaded" in msg, msg
    _cached(cache, "streamrl-test/cached")
    assert check_model_path(cfg("model.path=streamrl-test/cached")) is None  # no look-up: the cache holds it
    assert {check_model_path, check_env_fn, check_reward_calls, check_tool_fns} <= set(
        CHEAP
    )  # what `config` and `up` run


def test_a_run_dir_whose_job_never_trained_is_not_used(tmp_path):
    run = tmp_path / "run"
    (run / "broker").mkdir(parents=True)  # the embedded broker's data of a job that failed at start
    (run / "broker" / "appendonly.aof").write_text("x")
    (run / "logs").mkdir()
    (run / "logs" / "trainer-0.out").write_text("OSError: We couldn't connect to 'https://huggingface.co'")
    (run / "config.yaml").write_text("run: {name: tiny}\n")
    (run / "summary.json").write_text("{}")
    assert earlier_run(run) is None
    assert clear_unstarted(run) == ["broker", "summary.json"]
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "logs"]  # its logs are kept
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert earlier_run(run) == "metrics.jsonl"
