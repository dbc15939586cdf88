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

from brokers.embedded import EmbeddedRedis
from brokers.redis_streams import RedisBroker, connect
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


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadscope`), scheduled
    here: all e2e tests form one unit, run one after another on one worker, while the other worker
    takes the unit and integration tests a file at a time (a file's module fixtures, e.g. a started
    vLLM generator, are built once, on one worker). Each e2e test is a whole job (five or more
    processes on the CI machine's two cores); two at once would double each other's wall time and
    strain their time bounds. (xdist's own `--dist loadgroup` cannot do this under pytest 9: it
    renames tests through a node attribute pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class E2EOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            # xdist's documented extension point: the unit of work a test belongs to
            path = nodeid.split("::", 1)[0]
            return "tests/e2e" if path.startswith("tests/e2e/") else path

    return E2EOnOneWorker(config, log)
