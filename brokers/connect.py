"""Connect to the broker a URL names: one redis-server (`redis://`, `rediss://`, `unix://`;
brokers/redis_streams.py) or a Redis Cluster (`redis+cluster://`; brokers/cluster.py).

    broker = await connect(cfg.broker.url)
"""

from __future__ import annotations

from typing import Any

from brokers.cluster import ClusterBroker, connect_cluster
from brokers.redis_streams import RedisBroker, connect_server
from streamrl.core.broker_url import is_cluster_url


async def connect(url: str, retries: int = 20, *args: Any, **kwargs: Any) -> RedisBroker | ClusterBroker:
    """Connect and check the broker answers, retrying with back-off; BrokerError (naming the fix) when it gives up."""
    if is_cluster_url(url):
        return await connect_cluster(url, retries, *args, **kwargs)
    return await connect_server(url, retries, *args, **kwargs)
