"""Shared fixtures: one real embedded redis-server per test session, a fresh broker per test.

Async tests run on anyio's pytest plugin (asyncio backend): mark them `@pytest.mark.anyio`
(or `pytestmark = pytest.mark.anyio` in the module) and take `broker`, `config`, `run_name`.

    pytest tests/integration/broker/test_broker.py

Every test also runs under tests/watchdog.py, which ends the session when a test's setup + call +
teardown outlast its timeout by a grace period (a hang the per-test timeout cannot interrupt).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from brokers.connect import connect
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


# The e2e modules in two halves of about equal time (`--durations` of a full run on main, s per module:
# up 285, faults 214, titan 141, sft_then_rl 85, env_adapters 82, eval 73, bench_e2e 50 | multiturn 243,
# elastic 223, run_dirs 125, reward_failures 94, tools 72, bench_env 69, ctrl_c 34). A new module joins the
# second half; move it when the halves drift apart.
E2E_FIRST_HALF = frozenset(
    f"tests/e2e/test_{name}.py"
    for name in ("up", "faults", "titan", "sft_then_rl", "env_adapters", "eval", "bench_e2e", "config_errors")
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

    return E2EInTwoUnits(config, log)
