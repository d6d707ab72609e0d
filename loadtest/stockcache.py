"""The web tier's cache as a stock memcached client sees it: pymemcache's plain get/set/delete (issue 34).

`StockCache` is what a web server with an ordinary memcached library does: on a miss it reads the database
and `set`s the value; it sends no meta command and has no lease code. Through a router whose pool has
`leases` (docs/client.md, "Stock clients") it gets leases anyway: a miss wins one inside the router, readers
of a key whose lease is held wait there for the fill, and a fill after an invalidation is answered
`NOT_STORED`. Through a plain pool it is the thundering herd. The herd experiment compares the two.

It has the part of `leases.LeaseCache`'s interface the web tier and remote markers use (`get_or_fill`, `get`,
`set`, `exists`, `delete`, `stats`) and counts into the same `ClientStats`; the lease counters stay 0 here
(the router keeps its own: `stats` `lease_*`).
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient
from pymemcache.exceptions import MemcacheError

from leases import ClientStats, check_key
from leases.serializer import JSON_FLAG
from router_config import Address

log = logging.getLogger(__name__)

T = TypeVar("T")

# pymemcache's `get` answers None for a miss, and the web tier caches None ("no such row") as JSON null:
# a sentinel default tells the two apart.
_MISS = object()


class JsonSerde:
    """Values as the web tier's JsonSerializer writes them (JSON, client flag JSON_FLAG), so a value filled by
    either client reads back in the other and `squealctl verify`'s codec understands both."""

    def serialize(self, key: Any, value: Any) -> tuple[bytes, int]:
        return json.dumps(value, separators=(",", ":"), default=str).encode(), JSON_FLAG

    def deserialize(self, key: Any, value: bytes, flags: int) -> Any:
        if flags != JSON_FLAG:
            raise ValueError(f"not a JSON value (client flag {flags})")
        return json.loads(value)


def stock_client(routers: Sequence[Address], *, timeout: float = 1.0, tls_context: ssl.SSLContext | None = None) -> Any:
    """A pymemcache client of the cluster's routers: one `Client`, or a `HashClient` over several (a key
    always goes to one router, where its lease lives: a `set` through another router carries none)."""
    kwargs: dict[str, Any] = {
        "serde": JsonSerde(),
        "connect_timeout": timeout,
        "timeout": timeout,
        "default_noreply": False,  # a fill's NOT_STORED is the router refusing it: we count those
        "tls_context": tls_context,
    }
    if len(routers) == 1:
        return Client((routers[0].host, routers[0].port), **kwargs)
    return HashClient([(a.host, a.port) for a in routers], **kwargs)


class StockCache:
    """Look-aside reads with plain get/set: miss → loader → set. `client` is a pymemcache client."""

    def __init__(self, client: Any, *, name: str = "default") -> None:
        self.client = client
        self.name = name
        self.stats = ClientStats(name=name)

    def get_or_fill(self, key: str, loader: Callable[[], T], ttl: int, *, stale_ok: bool = False) -> T:
        """The cached value of `key`, or `loader()`'s result, then `set` for `ttl` seconds.

        `stale_ok` is accepted for LeaseCache's signature and ignored: a stock client cannot ask for a stale
        value (a pool's `stale_ttl` serves one inside the router). Memcache failures fall back to the loader
        and are counted, never raised; the loader's own exceptions propagate.
        """
        check_key(key)
        try:
            value = self.client.get(key, default=_MISS)
        except (MemcacheError, OSError, ValueError) as e:  # ValueError: a value not written as JSON
            self._report(key, "get", e)
            self.stats.incr("misses")
            value = loader()
            self.stats.incr("loads")
            return value  # not filled: the cache could not be read, or holds someone else's value
        if value is not _MISS:
            self.stats.incr("hits")
            return value
        self.stats.incr("misses")
        value = loader()
        self.stats.incr("loads")
        try:
            stored = self.client.set(key, value, expire=ttl)
        except (MemcacheError, OSError) as e:
            self._report(key, "set", e)
            return value
        # NOT_STORED from a lease pool: the key was invalidated since our miss, so what we read may be older
        # than that write; the router kept it out of the cache.
        self.stats.incr("fills" if stored else "fills_refused")
        return value

    def get(self, key: str) -> Any | None:
        """The cached value, or None (a miss, or memcache could not be read)."""
        check_key(key)
        try:
            return self.client.get(key)
        except (MemcacheError, OSError, ValueError) as e:
            self._report(key, "get", e)
            return None

    def set(self, key: str, value: Any, ttl: int) -> bool:
        """Unconditional `set` (remote markers); False if not stored or memcache could not be reached."""
        check_key(key)
        try:
            return bool(self.client.set(key, value, expire=ttl))
        except (MemcacheError, OSError) as e:
            self._report(key, "set", e)
            return False

    def exists(self, key: str) -> bool | None:
        """Whether `key` holds a value; None if memcache could not be asked. (Through a lease pool a miss here
        takes a lease like any plain `get`: remote markers live in the regional pool, which has none.)"""
        check_key(key)
        try:
            return self.client.get(key, default=_MISS) is not _MISS
        except (MemcacheError, OSError, ValueError) as e:
            self._report(key, "get", e)
            return None

    def delete(self, key: str) -> bool:
        """`delete <key>`: gone (or never there). False only if memcache could not be reached."""
        check_key(key)
        try:
            self.client.delete(key)
        except (MemcacheError, OSError) as e:
            self._report(key, "delete", e)
            return False
        return True

    def _report(self, key: str, op: str, error: BaseException) -> None:
        self.stats.incr("errors")
        log.warning("%s: memcache %s of %r failed (%s); using the database", self.name, op, key, error)
