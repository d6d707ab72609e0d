"""Look-aside reads with memcached leases: no stale sets, no thundering herds (paper section 3.2.1).

    cache = LeaseCache(connect(cluster.routers), name="west-a")
    user = cache.get_or_fill(f"user:{uid}", lambda: db.query_one(...), ttl=300)

See `leases.client` for the protocol and docs/client.md for the guarantees.
"""

from leases.client import DEFAULT_LEASE_TTL, LeaseCache, WaitPolicy, check_key, connect
from leases.metrics import ClientStats
from leases.serializer import JsonSerializer

__all__ = ["DEFAULT_LEASE_TTL", "ClientStats", "JsonSerializer", "LeaseCache", "WaitPolicy", "check_key", "connect"]
