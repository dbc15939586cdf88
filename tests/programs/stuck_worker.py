"""A role process whose stop never finishes and that owns a child process (as a generator owns
vLLM's EngineCore): run by tests/integration/core/test_forced_exit.py.

    python -m tests.programs.stuck_worker REDIS_URL PIDFILE
"""

import asyncio
import subprocess
import sys

from streamrl.config.schema import BrokerConfig, Config, RunConfig
from streamrl.core.worker import Worker
from streamrl.launch.runtime import serve


class StuckWorker(Worker):
    role = "stuck"

    async def start(self) -> None:
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(sys.argv[2], "w") as f:
            f.write(str(self.child.pid))

    async def step(self) -> bool:
        await asyncio.sleep(0.05)
        return False

    def stop_budget_s(self) -> float:
        return 0.5

    async def close(self) -> None:
        await asyncio.Event().wait()  # a shutdown that never completes


if __name__ == "__main__":
    cfg = Config(run=RunConfig(name="stuck"), broker=BrokerConfig(url=sys.argv[1]))
    serve(lambda broker: StuckWorker(cfg, broker, "stuck-0"), sys.argv[1], retries=3)
