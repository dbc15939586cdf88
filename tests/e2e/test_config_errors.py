"""Configuration errors stop `streamrl up` before anything starts, fast, naming the fix
(streamrl/launch/preflight.py), and a role that hits one at start-up stops the job without restarts
(EXIT_NO_RESTART, streamrl/launch/recovery.py).

    pytest tests/e2e/test_config_errors.py
"""

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from bench.jobs import cli_args
from streamrl.core.errors import EXIT_NO_RESTART

ROOT = Path(__file__).resolve().parents[2]


def cli(
    *args: str, env_extra: dict | None = None, timeout: int = 120, cache: Path
) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "STREAMRL_CACHE": str(cache), **(env_extra or {})}
    t0 = time.monotonic()
    res = subprocess.run(
        cli_args(*args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return res, time.monotonic() - t0


def running_with(needle: str) -> list[str]:
    """Command lines of live processes that mention `needle` (a run directory)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if needle in cmd:
            out.append(cmd)
    return out


def vllm_shim(tmp: Path) -> dict:
    """PYTHONPATH with a `vllm` package in front that fails to import, as on a machine without vLLM."""
    pkg = tmp / "shim" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError(\"No module named 'vllm' (test shim)\")\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp / "shim"), os.environ.get("PYTHONPATH", str(ROOT))])}


CASES = {
    "reward_fn_misspelt": (["reward.fn=tests.integration.reward_fnz:misbehave"], "reward.fn=", "PYTHONPATH"),
    "reward_fn_missing_function": (["reward.fn=tests.programs.reward_fns:nope"], "has no function 'nope'", "define"),
    "dataset_missing": (["task.name=gsm8k", "task.path=/nonexistent/train.jsonl"], "task.path=", "set task.path"),
    "model_path_missing": (["model.path=/nonexistent/model"], "model.path=", "unset model.path"),
    "env_fn_unimportable": (["env.fn=tests.programs.no_such_envs:Calc"], "env.fn: env ", "PYTHONPATH"),
    "broker_unreachable": (["broker.url=redis://127.0.0.1:1/0"], "unreachable", "broker.url=embedded"),
    "cuda_without_gpu": (["trainer.device=cuda"], "needs a CUDA GPU", "trainer.device=cpu"),
    "vllm_not_installed": ([], "needs vLLM", "pip install vllm"),
    # the objective is resolved by preflight (the schema checks the name's syntax only)
    "loss_name_unknown": (["loss.name=ppo2"], "unknown loss.name='ppo2'", "set loss.name to one of"),
    "loss_setting_of_another_objective": (
        ["loss.name=reinforce", "loss.eps_high=0.3"],
        "loss.eps_high is not a setting of loss.name=reinforce",
        "remove it",
    ),
}


# Pre-flight lists every problem its cheap checks find, so one `up` proves several cases at once. Cases
# that cannot share a run: the same field twice (reward.fn, loss.name), and vLLM's import, which is
# checked only once the cheap checks pass.
GROUPS = {
    "cheap": [
        "reward_fn_misspelt",
        "dataset_missing",
        "model_path_missing",
        "env_fn_unimportable",
        "broker_unreachable",
        "cuda_without_gpu",
        "loss_name_unknown",
    ],
    "cheap_second_fields": ["reward_fn_missing_function", "loss_setting_of_another_objective"],
    "slow_vllm": ["vllm_not_installed"],
}


def test_groups_cover_every_case():
    assert sorted(c for cases in GROUPS.values() for c in cases) == sorted(CASES)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_up_fails_fast_on_config_errors(tmp_path, group):
    cases = GROUPS[group]
    import torch

    if torch.cuda.is_available():  # trainer.device=cuda is valid here
        cases = [c for c in cases if c != "cuda_without_gpu"]
    env = vllm_shim(tmp_path) if "vllm_not_installed" in cases else None
    sets = [s for c in cases for s in CASES[c][0]]
    run_dir = tmp_path / "run"
    args = ["up", "--config", str(ROOT / "configs" / "tiny-cpu.yaml"), "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    res, took = cli(*args, env_extra=env, cache=tmp_path / "cache")
    assert res.returncode == 2, res.stdout + res.stderr
    for case in cases:
        _, what, fix = CASES[case]
        assert what in res.stderr and fix in res.stderr, (case, res.stderr)
    if len(cases) > 1:
        assert f"{len(cases)} problems" in res.stderr, res.stderr
    assert took < 15, f"took {took:.1f}s"
    assert not run_dir.exists(), "a config error must not leave a run directory behind"
    assert running_with(str(run_dir)) == []
    # `streamrl config` runs the same checks.
    res, _ = cli(
        "config",
        "--config",
        str(ROOT / "configs" / "tiny-cpu.yaml"),
        *[a for s in sets for a in ("--set", s)],
        env_extra=env,
        cache=tmp_path / "cache",
    )
    assert res.returncode == 2, res.stdout[-500:] + res.stderr
    for case in cases:
        assert CASES[case][1] in res.stderr, (case, res.stderr)


def test_config_can_skip_the_checks(tmp_path):
    """--no-preflight prints the resolved config even where the checks would fail (the test above
    shows `config` listing every problem)."""
    sets = [
        "--set",
        "model.path=/nonexistent/model",
        "--set",
        "task.name=gsm8k",
        "--set",
        "task.path=/nonexistent.jsonl",
    ]
    res, _ = cli("config", "--no-preflight", *sets, cache=tmp_path / "cache")
    assert res.returncode == 0 and "/nonexistent/model" in res.stdout, res.stderr


def test_worker_config_error_exits_no_restart(tmp_path, redis_server):
    """A role that cannot start because of its config exits with EXIT_NO_RESTART and the fix."""
    res, _ = cli(
        "worker",
        "reward",
        "--broker",
        redis_server.url,
        "--run",
        "cfgerr",
        "--id",
        "reward-0",
        "--set",
        "reward.fn=tests.integration.reward_fnz:misbehave",
        cache=tmp_path / "cache",
    )
    assert res.returncode == EXIT_NO_RESTART, res.stdout[-2000:] + res.stderr[-2000:]
    assert "fatal error (not restarted): reward could not start" in res.stderr and "PYTHONPATH" in res.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_up_stops_at_once_when_a_worker_cannot_start(tmp_path):
    """An error pre-flight did not see (skipped here) raised inside a worker at start-up: no restarts."""
    run_dir = tmp_path / "run"
    res, took = cli(
        "up",
        "--no-preflight",
        "--config",
        str(ROOT / "configs" / "tiny-cpu.yaml"),
        "--run-dir",
        str(run_dir),
        "--set",
        "reward.fn=tests.integration.reward_fnz:misbehave",
        "--set",
        "generator.count=0",
        "--set",
        "loss.kl_beta=0",
        "--set",
        "trainer.steps=2",
        "--set",
        "supervisor.backoff_s=0.2",
        timeout=240,
        cache=tmp_path / "cache",
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "reward-0 (reward) stopped: reward could not start: ConfigError" in out and "PYTHONPATH" in out, out[-3000:]
    assert "restarting" not in out, out[-3000:]
    assert running_with(str(run_dir)) == []
    print(f"stopped after {took:.1f}s")
