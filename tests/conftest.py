"""Shared fixtures: one real embedded redis-server per test session, a fresh broker per test.

Async tests run on anyio's pytest plugin (asyncio backend): mark them `@pytest.mark.anyio`
(or `pytestmark = pytest.mark.anyio` in the module) and take `broker`, `config`, `run_name`.

    pytest tests/integration/brokers/test_broker.py

Every test also runs under tests/watchdog.py, which ends the session when a test's setup + call +
teardown outlast its timeout by a grace period (a hang the per-test timeout cannot interrupt).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

# One torch (OpenMP) thread per process, set before anything imports torch: `make test` runs two xdist
# workers on 2 cores, each with in-process torch and role subprocesses (which inherit this); at a thread
# per core each, their spin-waits ate the cores (a 30-step tiny job beside the suite: 93-107 s -> 49 s).
# `streamrl up` does the same for its roles on a CPU host (streamrl/launch/cpu_threads.py).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from brokers.connect import connect  # noqa: E402 (after the thread setting above)
from brokers.embedded import EmbeddedRedis
from brokers.local_cluster import LocalCluster
from brokers.redis_streams import RedisBroker
from streamrl.config.schema import BrokerConfig, Config, RunConfig
from tests import watchdog
from tests.watchdog import pytest_runtest_protocol  # noqa: F401 (a hook: pytest finds it by name here)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Async tests and fixtures run on asyncio only (the production event loop)."""
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A private redis-server (127.0.0.1, password, AOF) in a temporary dir; stopped after the session."""
    server = EmbeddedRedis(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    watchdog.servers.append(server)
    yield server
    watchdog.servers.remove(server)
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A local Redis Cluster, 3 masters + 3 replicas on loopback (brokers/local_cluster.py); stopped after
    the session. Tests that kill nodes start their own LocalCluster instead of breaking this shared one."""
    cluster = LocalCluster(Path(tmp_path_factory.mktemp("cluster")))
    cluster.start()
    watchdog.servers.append(cluster)
    yield cluster
    watchdog.servers.remove(cluster)
    cluster.stop()


@pytest.fixture
async def broker(redis_server: EmbeddedRedis) -> RedisBroker:
    """A connected RedisBroker on an empty database (FLUSHALL before the test); closed after it (bounded)."""
    b = await connect(redis_server.url, retries=3)
    await b.client.flushall()
    yield b
    await b.close()


@pytest.fixture
def run_name(request: pytest.FixtureRequest) -> str:
    """A run name unique to this test (valid for `run.name`), so key namespaces never collide."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:40]
    return f"{stem}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def config(redis_server: EmbeddedRedis, run_name: str) -> Config:
    """A default Config pointed at the session's server, with this test's run name and short claim times."""
    return Config(
        run=RunConfig(name=run_name), broker=BrokerConfig(url=redis_server.url, claim_idle_ms=200, block_ms=50)
    )


# The e2e modules in two halves of about equal time. CI's `--durations` (clean clone, 2 cores, `make test`
# at 22:40; s per module, ~ where some of its tests were not among the 25 shown): up ~165, faults 354,
# titan 89, sft_then_rl 73, env_adapters ~85, eval 92, bench_e2e 44, config_errors ~70 (~970) | multiturn
# 373, elastic 301, run_dirs ~80, reward_failures ~130, tools 45, bench_env 78, ctrl_c 47 (~1050). Since
# then faults lost a job (two-rank resume joined the role kills), elastic one (both producer keys in one
# job), multiturn one (the kills joined the learning run), and every job its tiny-model build: about
# 860 | 850. The halves need only differ by less than the unit and integration files (~700 s), which
# fill whichever worker is free. Added since: multihost (second half; 211 s here under load), judge (first half).
# Since: test_eval's job joined test_titan's, test_reward_failures' flaky-reward job test_run_dirs'.
# At 8cf04a4 (CI-like clean clone, 28 min): 723 | 1,048. Then test_bench_e2e's job joined test_up's (first
# half, about -50), the password job test_tools' and test_elastic's three jobs became one (second half,
# about -55 and -75), so multihost (~90) moved to the first half: about 760 | 820.
# Then (this VM, clean clone, 20:56): 605 | 681; test_bench_e2e's job joined test_titan's and test_ctrl_c's
# test_faults' resumed run (both first half), -36 and -39 from the second: about 610 | 610.
# A new module joins the lighter half; move one when they drift apart (the run's "test time per worker" says).
E2E_FIRST_HALF = frozenset(
    f"tests/e2e/test_{name}.py"
    for name in ("up", "faults", "titan", "sft_then_rl", "env_adapters", "config_errors", "judge", "multihost")
)


def e2e_unit(path: str) -> str | None:
    """Which of the two e2e units a test file belongs to (None: not e2e)."""
    if not path.startswith("tests/e2e/"):
        return None
    return "tests/e2e[1]" if path in E2E_FIRST_HALF else "tests/e2e[2]"


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadscope`), scheduled
    here: the e2e tests form two units of about equal time (e2e_unit), each run one test after another
    on one worker, and the unit and integration tests go a file at a time to whichever worker is free
    (a file's module fixtures, e.g. a started vLLM generator, are built once, on one worker). With all
    e2e tests in one unit that worker was the whole suite's critical path (about 31 of its 31 minutes
    while the other worker idled after about half of that); two e2e jobs at once cost each about what
    an e2e job beside the integration tests costs. (xdist's own `--dist loadgroup` cannot do this under
    pytest 9: it renames tests through a node attribute pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class E2EInTwoUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            # xdist's documented extension point: the unit of work a test belongs to
            path = nodeid.split("::", 1)[0]
            return e2e_unit(path) or path

        def _assign_work_unit(self, node) -> None:
            # The two e2e units first, one per worker: xdist orders units by test count, which put them
            # 11th and 17th, behind unit-test files; a late start of either is wall time added at the end,
            # while the unit and integration files, handed out after them, fill whichever worker is free.
            for scope in [s for s in self.workqueue if s.startswith("tests/e2e[")]:
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return E2EInTwoUnits(config, log)


_seconds: dict[str, dict[str, float]] = {}
"""Test time (setup + call + teardown) per xdist worker and per unit, as the reports come in."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # under xdist: the worker that ran it (the controller's view)
    worker = node.gateway.id if node is not None else "main"
    unit = e2e_unit(report.nodeid.split("::", 1)[0]) or "unit+integration"
    per = _seconds.setdefault(worker, {})
    per[unit] = per.get(unit, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """One line per worker: its summed test time and the e2e unit in it. The wall time is the busier
    worker's; when the e2e halves drift apart (or one outgrows 20 min), move a module in E2E_FIRST_HALF."""
    if not any(u.startswith("tests/e2e[") for per in _seconds.values() for u in per):
        return
    terminalreporter.section("test time per worker (s)")
    for worker, per in sorted(_seconds.items()):
        parts = ", ".join(f"{u} {s:.0f}" for u, s in sorted(per.items()))
        terminalreporter.write_line(f"{worker}: {sum(per.values()):.0f} ({parts})")
