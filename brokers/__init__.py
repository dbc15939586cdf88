"""Broker implementations: Redis Streams (`redis_streams`) and the embedded redis-server launcher.

from brokers import EmbeddedRedis, connect
with EmbeddedRedis(run_dir / "broker") as server:
    broker = await connect(server.url)
"""

from brokers.embedded import EmbeddedRedis, find_redis_server
from brokers.redis_streams import RedisBroker, connect, redact

__all__ = ["EmbeddedRedis", "RedisBroker", "connect", "find_redis_server", "redact"]
