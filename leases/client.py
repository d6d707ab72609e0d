"""Look-aside reads with memcached leases (paper section 3.2.1), on meta-memcache's meta commands.

Protocol (memcached 1.6 meta commands, see DESIGN.md "Protocol facts"):

* read: ``mg <key> v c f N<lease_ttl>``.
  - a value with no W/Z flag: a hit.
  - ``W`` (won): this caller holds the lease; an empty placeholder was created (or a stale value was
    handed out with ``X W``). It runs the loader and fills with ``ms <key> C<cas> T<ttl>``.
  - ``Z`` (lost): someone else holds the lease. Wait a short jittered time and read again (bounded), or,
    with ``stale_ok`` and a stale value (``X Z``), return the stale value at once.
* fill: the ``C<cas>`` compare makes the fill fail if the key was deleted (``NF``) or invalidated with
  ``md … I`` (``EX``) after the lease was handed out. That is what prevents a stale set: a writer's
  delete that lands between our database read and our fill wins.
* rate limit: the ``N<lease_ttl>`` placeholder lives ``lease_ttl`` seconds and, while it lives,
  memcached gives ``W`` to nobody else. So a key gets at most one lease (one database load) per
  ``lease_ttl`` (the paper uses 10 s), unless the lease ends earlier for a good reason: the winner
  filled the key, or a delete/invalidate made a newer version that must be loaded anyway. A winner
  that crashes blocks its key for at most ``lease_ttl``; a winner whose loader raises releases the
  lease at once (``md <key> C<cas>``: only our own placeholder is removed).

Failures: if memcached cannot be reached, reads go straight to the loader (the database), the error
is counted (``squeal_client_errors_total``) and logged, and nothing is raised to the caller.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from meta_memcache import (
    CacheClient,
    Key,
    MemcacheError,
    Miss,
    RequestFlags,
    ServerAddress,
    Success,
    Value,
    connection_pool_factory_builder,
    is_error_response,
)
from meta_memcache.connection.pool import ConnectionPool
from meta_memcache.interfaces.cache_api import CacheApi

from leases.metrics import ClientStats
from leases.serializer import JsonSerializer
from leases.tls import tls_socket_factory

log = logging.getLogger(__name__)


class _FailuresReportedOnce(logging.Filter):
    """meta-memcache's connection pool logs a WARNING with a full traceback for every failed connect or
    request; `LeaseCache` reports each failure itself, in one line, and falls back. Those records pass only
    while someone debugs meta-memcache (its logger enabled for DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


# (once per process: the module is imported once)
logging.getLogger("meta_memcache.connection.pool").addFilter(_FailuresReportedOnce())

T = TypeVar("T")

DEFAULT_LEASE_TTL = 10  # seconds; the paper's "one token per key every 10 seconds"
MAX_KEY_BYTES = 250


class _Failed:
    """A memcache request that could not be made (server down, timeout, protocol error)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass(frozen=True)
class WaitPolicy:
    """How a reader that lost the lease (Z) waits: jittered exponential steps within a total budget.

    The winner usually fills within a database round trip, so the first step is short. After
    `budget` seconds the reader stops waiting and reads the database itself without filling (it
    holds no lease, so it must not write).
    """

    first: float = 0.005
    max_step: float = 0.1
    backoff: float = 1.5
    budget: float = 3.0

    def steps(self) -> Iterable[float]:
        """Sleep durations, each jittered to 50–150 % so a herd does not retry in lock-step."""
        step, spent = self.first, 0.0
        while spent < self.budget:
            d = min(step * random.uniform(0.5, 1.5), self.budget - spent)
            spent += d
            yield d
            step = min(step * self.backoff, self.max_step)


def _address(server: Any) -> ServerAddress:
    if isinstance(server, ServerAddress):
        return server
    if isinstance(server, str):
        host, _, port = server.rpartition(":")
        return ServerAddress(host, int(port))
    if isinstance(server, tuple):
        return ServerAddress(server[0], int(server[1]))
    return ServerAddress(server.host, int(server.port))  # router_config.Address and friends


def connect(
    servers: Iterable[Any],
    *,
    connect_timeout: float = 0.5,
    recv_timeout: float = 1.0,
    mark_down_period: float = 2.0,
    max_pool_size: int = 64,
    tls: Callable[[], ssl.SSLContext] | None = None,
) -> CacheApi:
    """A meta-memcache client for `servers` ("host:port", (host, port) or objects with .host/.port).

    Point it at a cluster's routers (one logical server; the router hashes) or, without a router, at
    memcached itself. Errors come back as error responses instead of exceptions
    (`raise_on_server_error=False`) so the read path can fall back; a server that fails is marked down
    for `mark_down_period` seconds so a dead memcached costs one failed connect, not one per request.

    `tls`: a function returning a verifying client context (`router_config.client_context(topo.tls,
    "webtier")`): every connection is TLS (leases/tls.py), a failed handshake is one WARNING line and the
    server counts as down.
    """
    builder = connection_pool_factory_builder(
        initial_pool_size=0,
        max_pool_size=max_pool_size,
        mark_down_period_s=mark_down_period,
        connection_timeout=connect_timeout,
        recv_timeout=recv_timeout,
    )
    if tls is not None:
        builder = _tls_pool_builder(tls, max_pool_size, mark_down_period, connect_timeout, recv_timeout)
    return CacheClient.cache_client_from_servers(
        [_address(s) for s in servers], builder, serializer=JsonSerializer(), raise_on_server_error=False
    )


def _tls_pool_builder(
    tls: Callable[[], ssl.SSLContext],
    max_pool_size: int,
    mark_down_period: float,
    connect_timeout: float,
    recv_timeout: float,
) -> Callable[[ServerAddress], ConnectionPool]:
    def build(address: ServerAddress) -> ConnectionPool:
        return ConnectionPool(
            server=str(address),
            socket_factory_fn=tls_socket_factory(address.host, address.port, tls, connect_timeout, recv_timeout),
            initial_pool_size=0,
            max_pool_size=max_pool_size,
            mark_down_period_s=mark_down_period,
            version=address.version,
        )

    return build


def check_key(key: str) -> None:
    """memcache text-protocol keys: at most 250 bytes, no whitespace or control bytes."""
    raw = key.encode()
    if not raw or len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"memcache key must be 1-{MAX_KEY_BYTES} bytes, got {len(raw)}: {key[:60]!r}")
    if any(b <= 0x20 or b == 0x7F for b in raw):
        raise ValueError(f"memcache key contains whitespace or control bytes: {key!r}")


class LeaseCache:
    """The web tier's look-aside cache: `get_or_fill` with leases, plus delete/invalidate.

    `leases=False` turns leases off (plain get → miss → loader → set), for the thundering-herd
    comparison and to show the stale-set race that leases prevent.
    Counters: `self.stats` (plain ints) and the `squeal_client_*` Prometheus counters labelled `name`.
    """

    def __init__(
        self,
        client: CacheApi,
        *,
        name: str = "default",
        leases: bool = True,
        lease_ttl: int = DEFAULT_LEASE_TTL,
        wait: WaitPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.name = name
        self.leases = leases
        self.lease_ttl = lease_ttl
        self.wait = wait or WaitPolicy()
        self.stats = ClientStats(name=name)
        self._sleep = sleep
        self._lease_flags = RequestFlags(
            return_value=True, return_cas_token=True, return_client_flag=True, vivify_on_miss_ttl=lease_ttl
        )
        self._plain_flags = RequestFlags(return_value=True, return_client_flag=True)

    # -- read path ---------------------------------------------------------------------------------

    def get_or_fill(self, key: str, loader: Callable[[], T], ttl: int, *, stale_ok: bool = False) -> T:
        """The cached value of `key`, or `loader()`'s result (then cached for `ttl` seconds).

        With leases, only the lease winner calls `loader` and fills; losers wait (bounded) for its fill.
        `stale_ok`: a loser may return a stale value (marked by `md … I`) at once instead of waiting.
        The loader's own exceptions propagate; memcache failures never do.
        """
        check_key(key)
        if not self.leases:
            return self._get_or_fill_plain(key, loader, ttl)
        waits = iter(self.wait.steps())
        first = True
        while True:
            r = self._mg(key, self._lease_flags)
            if isinstance(r, _Failed):
                return self._fallback(key, loader, r, first)
            if not isinstance(r, Value):
                # vivify-on-miss always answers with a value; a bare miss means the stored value could
                # not be decoded (meta-memcache reports that as a miss). Load, but do not overwrite.
                return self._load_unfilled(key, loader, first)
            f = r.flags
            if f.win is True:
                if f.cas_token is None:
                    # Without the lease's CAS a fill would be an unconditional set: exactly the stale set
                    # leases exist to prevent. (A proxy that drops the `c` flag would cause this.)
                    log.warning("%s: lease on %r came without a CAS token; not filling", self.name, key)
                    return self._load_unfilled(key, loader, first)
                self._count_miss(first)
                self.stats.incr("lease_wins")
                return self._fill(key, loader, ttl, cas=f.cas_token, placeholder=r.size == 0)
            if not f.stale and (f.win is None or r.size > 0):
                self.stats.incr("hits")
                return r.value
            # Lost the lease (Z): a placeholder, or a stale value someone is already refreshing.
            self._count_miss(first)
            first = False
            if f.stale and r.size > 0 and stale_ok:
                self.stats.incr("stale_served")
                return r.value
            step = next(waits, None)
            if step is None:
                self.stats.incr("wait_exhausted")
                log.warning(
                    "%s: lease on %r not filled within %.1fs; reading the database", self.name, key, self.wait.budget
                )
                return self._load_unfilled(key, loader, first=False)
            self.stats.incr("waits")
            self._sleep(step)

    def _get_or_fill_plain(self, key: str, loader: Callable[[], T], ttl: int) -> T:
        r = self._mg(key, self._plain_flags)
        if isinstance(r, _Failed):
            return self._fallback(key, loader, r, True)
        if isinstance(r, Value) and (r.size > 0 or r.flags.win is None) and not r.flags.stale:
            self.stats.incr("hits")
            return r.value
        self.stats.incr("misses")
        value = loader()
        self.stats.incr("loads")
        w = self._ms(key, value, RequestFlags(cache_ttl=ttl))
        if isinstance(w, Success):
            self.stats.incr("fills")
        elif isinstance(w, _Failed):
            self._report(key, "set", w)
        return value

    def _fill(self, key: str, loader: Callable[[], T], ttl: int, *, cas: int | None, placeholder: bool) -> T:
        try:
            value = loader()
        except BaseException:
            if placeholder:
                # Give the lease back so waiters retry now instead of after lease_ttl; C<cas> removes
                # only our own placeholder, never a value someone stored meanwhile.
                self._md(key, RequestFlags(cas_token=cas))
            raise
        self.stats.incr("loads")
        w = self._ms(key, value, RequestFlags(cache_ttl=ttl, cas_token=cas))
        if isinstance(w, Success):
            self.stats.incr("fills")
        elif isinstance(w, _Failed):
            self._report(key, "fill", w)
        else:
            # NF: deleted since the lease was issued; EX: invalidated (CAS moved on). The value we read
            # may predate that write, so it must not be cached. The caller still gets it: it was the
            # database's answer when read.
            self.stats.incr("fills_refused")
            log.debug("%s: fill of %r refused (%s): key changed after our lease", self.name, key, type(w).__name__)
        return value

    def _load_unfilled(self, key: str, loader: Callable[[], T], first: bool) -> T:
        self._count_miss(first)
        value = loader()
        self.stats.incr("loads")
        return value

    def _fallback(self, key: str, loader: Callable[[], T], failure: _Failed, first: bool) -> T:
        self._report(key, "get", failure)
        return self._load_unfilled(key, loader, first)

    def _count_miss(self, first: bool) -> None:
        if first:
            self.stats.incr("misses")

    # -- writes --------------------------------------------------------------------------------------

    def get(self, key: str) -> Any | None:
        """Peek: the cached value, or None (miss, placeholder, stale, or memcache down). No lease taken."""
        check_key(key)
        r = self._mg(key, self._plain_flags)
        if isinstance(r, Value) and r.size > 0 and not r.flags.stale:
            return r.value
        return None

    def set(self, key: str, value: Any, ttl: int) -> bool:
        """Unconditional set (for markers and tests; the read path fills through leases)."""
        check_key(key)
        w = self._ms(key, value, RequestFlags(cache_ttl=ttl))
        if isinstance(w, _Failed):
            self._report(key, "set", w)
            return False
        return isinstance(w, Success)

    def exists(self, key: str) -> bool | None:
        """Whether `key` holds a live (not stale) item; None if memcache could not be asked."""
        check_key(key)
        r = self._mg(key, RequestFlags())
        if isinstance(r, _Failed):
            self._report(key, "get", r)
            return None
        return isinstance(r, Success) and not r.flags.stale

    def delete(self, key: str) -> bool:
        """`md <key>`: gone (or never there). False only if memcache could not be reached."""
        return self._delete(key, RequestFlags())

    def invalidate(self, key: str, stale_ttl: int = 30) -> bool:
        """`md <key> I T<stale_ttl>`: keep the value but mark it stale; outstanding leases lose their fill
        (EX) and the next reader gets the stale value with a fresh lease (stale-while-revalidate)."""
        return self._delete(key, RequestFlags(mark_stale=True, cache_ttl=stale_ttl))

    def _delete(self, key: str, flags: RequestFlags) -> bool:
        check_key(key)
        r = self._md(key, flags)
        if isinstance(r, _Failed):
            self._report(key, "delete", r)
            return False
        return True

    # -- meta-memcache calls, failures as values ------------------------------------------------------

    def _mg(self, key: str, flags: RequestFlags) -> Value | Success | Miss | _Failed:
        return self._meta(self.client.meta_get, key, flags=flags)

    def _ms(self, key: str, value: Any, flags: RequestFlags) -> Any:
        return self._meta(self.client.meta_set, key, value, flags=flags)

    def _md(self, key: str, flags: RequestFlags) -> Any:
        return self._meta(self.client.meta_delete, key, flags=flags)

    @staticmethod
    def _meta(call: Callable[..., Any], key: str, *args: Any, flags: RequestFlags) -> Any:
        """`call(Key(key), *args, flags=flags)`: a client error or an error response comes back as `_Failed`."""
        try:
            r = call(Key(key), *args, flags=flags)
        except MemcacheError as e:
            return _Failed(str(e) or type(e).__name__)
        if is_error_response(r):
            return _Failed("server error or unreachable")
        return r

    def _report(self, key: str, op: str, failure: _Failed) -> None:
        self.stats.incr("errors")
        log.warning("%s: memcache %s of %r failed (%s); using the database", self.name, op, key, failure.reason)
