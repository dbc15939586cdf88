"""The multi-host rehearsal (issue 29): one multi-turn job whose roles run as on three hosts,
network namespaces made by tests/multihost.py: feeder and trainer on "trainer", two generators on
"gen", the reward and env workers on "workers", a Redis Cluster (3 masters, 3 replicas; rollouts and
annotations in 3 partitions) reached over the veth addresses only,
weights pulled one-sidedly from the trainer's memory over the veths (`weights.backend: mooncake`). Every
role is started with the commands docs/multihost.md gives (read from the page), and the job ends
with `streamrl account` exact.

    sudo pytest tests/e2e/test_multihost.py       # root: network namespaces; ~2 minutes on 2 cores
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.jobs import metrics, summary
from streamrl.core.broker import Keys
from streamrl.core.broker_url import is_cluster_url, sync_client
from tests.multihost import hosts, skip_or_fail_without_netns, start_cluster

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "multihost.md"
RUN = "multihost"
STEPS = 2
PLACEMENT = {"gen": ["generator", "generator"], "workers": ["reward", "env"], "trainer": ["feeder", "trainer"]}
"""host -> its roles, started in this order; the job starts (feeder, trainer) once both generators are up."""

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _netns_here():
    skip_or_fail_without_netns()


def doc_commands() -> dict[str, list[str]]:
    """role -> argv of the first bash block of docs/multihost.md (`streamrl worker ROLE ...`), plus
    "account"; comments dropped, placeholders (C.yaml, RUN, DIR, $URL) left for `fill`."""
    block = DOC.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    out = {}
    for line in block.splitlines():
        words = shlex.split(line.split("#", 1)[0])
        if words[:2] == ["streamrl", "worker"]:
            out[words[2]] = words
        elif words[:2] == ["streamrl", "account"]:
            out["account"] = words
    return out


def fill(words: list[str], **values: str) -> list[str]:
    """The doc's command with its placeholders filled; `streamrl` is this interpreter's streamrl.cli."""
    names = {"C.yaml": values["config"], "RUN": values["run"], "DIR": values["run_dir"], "$URL": values["url"]}
    return [sys.executable, "-m", "streamrl.cli"] + [names.get(w, w) for w in words[1:]]


def write_config(shared: Path) -> Path:
    """configs/tiny-multiturn-cpu.yaml cut to a short job, with the model on the shared folder and the
    weights pulled from the trainer's memory (`weights.engine_addr: auto`: each host's veth address)."""
    from streamrl.config.schema import ModelConfig
    from streamrl.models.tiny import resolve_model_path

    cfg = yaml.safe_load((ROOT / "configs" / "tiny-multiturn-cpu.yaml").read_text())
    cfg.pop("broker")  # every command passes --broker
    cfg["model"]["path"] = str(resolve_model_path(ModelConfig(**cfg["model"]), shared / "models", cfg["run"]["seed"]))
    cfg["rollout"].update(group_size=4, groups_per_step=2)
    cfg["env"].update(latency_ms=[5, 20])
    cfg["generator"]["max_inflight_groups"] = 1  # one group each at a time: both generators get work
    cfg["trainer"]["steps"] = STEPS
    cfg["rollout"]["partitions"] = 3  # past one node: each partition's streams on their own master
    cfg["weights"] = {"backend": "mooncake"}
    path = shared / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def reach(net, host: str, address: str, port: int) -> bool:
    probe = f"import socket; socket.create_connection(({address!r}, {port}), 2)"
    return net.run(host, [sys.executable, "-c", probe], timeout=30).returncode == 0


@pytest.mark.timeout(900)
def test_a_job_on_three_hosts_with_the_documented_commands_is_exact(tmp_path):
    commands = doc_commands()
    assert set(commands) >= {"feeder", "trainer", "generator", "reward", "env", "account"}, commands
    shared = tmp_path / "shared"
    config = write_config(shared)
    with hosts(list(PLACEMENT)) as net:
        broker = start_cluster(net.gateway, tmp_path / "cluster")
        try:
            # Reached over the veth only: each host's loopback is its own, with no broker on it.
            port = broker.masters()[0]
            assert reach(net, "gen", net.gateway, port) and not reach(net, "gen", "127.0.0.1", port)
            values = {"config": str(config), "run": RUN, "run_dir": str(tmp_path / "trainer-run"), "url": broker.url}
            procs: dict[str, subprocess.Popen] = {}
            for host, roles in PLACEMENT.items():
                if host == "trainer":
                    _wait_for_heartbeats(broker.url, "generator", 2, procs, tmp_path / "logs")
                env = {k: v for k, v in os.environ.items() if k != "STREAMRL_BROKER_URL"}
                env.update(STREAMRL_CACHE=str(tmp_path / host / "cache"), PYTHONUNBUFFERED="1")
                for i, role in enumerate(roles):
                    name = f"{host}-{role}-{i}"
                    argv = fill(commands[role], **values)
                    procs[name] = net.popen(host, argv, tmp_path / "logs" / f"{name}.log", env, ROOT)
            trainer = procs["trainer-trainer-1"]
            _wait_for_trainer(trainer, procs, tmp_path / "logs")
            assert trainer.returncode == 0, _logs(tmp_path / "logs")
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for name, proc in procs.items():
                assert proc.wait(timeout=120) == 0, f"{name} exited {proc.returncode}:\n{_logs(tmp_path / 'logs')}"
            res = net.run("trainer", fill(commands["account"], **values), timeout=120, cwd=ROOT)
            assert res.returncode == 0, res.stdout + res.stderr
        finally:
            broker.stop()
    s = summary(tmp_path / "trainer-run")
    assert s["invariant_holds"] and s["lost"] == 0 and s["double_trained"] == 0 and s["trained_steps"] == STEPS, s
    assert s["episodes"]["invariant_holds"] and s["episodes"]["lost"] == 0, s["episodes"]
    assert "invariant holds" in res.stdout
    rows = metrics(tmp_path / "trainer-run")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)) and all(r["turns_mean"] > 1 for r in rows)
    # The versions went from the trainer's engine, advertised on its veth address, to the generators'.
    engines = _engines(tmp_path / "logs")
    assert engines["trainer-trainer-1"][0].startswith(net.addr["trainer"] + ":"), engines
    assert all(engines[f"gen-generator-{i}"][0].startswith(net.addr["gen"] + ":") for i in range(2)), engines
    assert {p for sessions in engines.values() for p in sessions[1:]} <= {"tcp"}, engines  # no RDMA NIC here
    for i in range(2):  # both generators of host "gen" generated, and stopped cleanly
        stopped = [
            ln for ln in (tmp_path / "logs" / f"gen-generator-{i}.log").read_text().splitlines() if "stopped" in ln
        ]
        assert stopped, i
        print(stopped[-1])


def _check_alive(procs, logs: Path, deadline: float, what: str) -> None:
    dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
    assert not dead and time.monotonic() < deadline, f"waiting for {what}; exited: {dead}\n{_logs(logs)}"


def _wait_for_heartbeats(url: str, role: str, n: int, procs, logs: Path, timeout: float = 300) -> None:
    r = sync_client(url)
    deadline = time.monotonic() + timeout
    try:
        while len(list(r.scan_iter(match=Keys(RUN, cluster=is_cluster_url(url)).worker(role, "*")))) < n:
            _check_alive(procs, logs, deadline, f"{n} {role} heartbeats")
            time.sleep(0.5)
    finally:
        r.close()


def _wait_for_trainer(trainer, procs, logs: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while trainer.poll() is None:
        _check_alive(procs, logs, deadline, "the trainer to finish")
        time.sleep(0.5)


def _engines(logs: Path) -> dict[str, list[str]]:
    """process -> [its transfer engine's session, protocol] from its `weights_engine_started` line."""
    out = {}
    for path in logs.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if "weights_engine_started" in line:
                fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
                out[path.stem] = [fields["session"], fields["protocol"]]
    return out


def _logs(logs: Path, tail: int = 1500) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-tail:]}" for p in sorted(logs.glob("*.log")))
