"""Broker implementations: Redis Streams (`redis_streams`) and the embedded redis-server launcher.

from brokers import EmbeddedRedis, connect
with EmbeddedRedis(run_dir / "broker") as server:
    broker = await connect(server.url)
"""

from brokers.connect import connect
from brokers.embedded import EmbeddedRedis, find_redis_server
from brokers.redis_streams import RedisBroker, redact

__all__ = ["EmbeddedRedis", "RedisBroker", "connect", "find_redis_server", "redact"]
