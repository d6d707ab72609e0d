"""TransparentLeaseRoute (issue 34): memcached leases for stock clients' plain get/set, through the router."""

from __future__ import annotations

import socket
import threading

import pytest
from pymemcache.client.base import Client as PyClient


def _config(mc_port: int, leases: bool, **fields: int) -> dict:
    pool = "PoolRoute|a"
    route: object = {"type": "TransparentLeaseRoute", "target": pool, **fields} if leases else pool
    return {"pools": {"a": {"servers": [f"127.0.0.1:{mc_port}"]}}, "route": route}


@pytest.mark.parametrize("leases", [False, True])
def test_stale_set_race_with_stock_client(memcached_factory, router_factory, leases: bool) -> None:
    """Reader misses, reads the old row; the writer commits and the key is deleted; the reader's set
    of the old row must not stay cached (it does without leases: the failure this route fixes)."""
    mc = memcached_factory()
    router = router_factory(_config(mc.port, leases))
    reader = PyClient(("127.0.0.1", router.port), timeout=5)
    direct = PyClient(("127.0.0.1", mc.port), timeout=5)
    assert reader.get(b"user:1") is None  # miss: the reader goes to the database, reads "old"
    direct.delete(b"user:1", noreply=False)  # the writer commits "new"; the invalidation deletes the key
    stored = reader.set(b"user:1", b"old", noreply=False)
    cached = direct.get(b"user:1")
    if leases:
        assert stored is False, "a fill whose lease was invalidated answers NOT_STORED"
        assert cached is None, f"stale value cached through the lease route: {cached!r}"
        # the next reader wins a fresh lease and its fill is stored
        assert reader.get(b"user:1") is None
        assert reader.set(b"user:1", b"new", noreply=False) is True
        assert reader.get(b"user:1") == b"new"
        assert reader.gets(b"user:1")[0] == b"new"
    else:
        assert cached == b"old"


def test_plain_semantics_kept(memcached_factory, router_factory) -> None:
    """A set without a token passes through; multi-key gets are answered per key with flags and cas."""
    mc = memcached_factory()
    router = router_factory(_config(mc.port, True))
    c = PyClient(("127.0.0.1", router.port), timeout=5)
    assert c.set(b"w", b"through", noreply=False) is True  # write-through set, no lease asked
    assert c.get_many([b"w", b"nope", b"w"]) == {b"w": b"through"}
    with _raw(router.port) as raw:  # byte-level check of the reply
        raw.sendall(b"set f 42 0 2\r\nhi\r\nget f nope f\r\n")
        want = b"STORED\r\nVALUE f 42 2\r\nhi\r\nVALUE f 42 2\r\nhi\r\nEND\r\n"
        got = b""
        while len(got) < len(want):
            chunk = raw.recv(4096)
            assert chunk, f"router closed after {got!r}"
            got += chunk
        assert got == want


def test_herd_waits_for_the_winner(memcached_factory, router_factory) -> None:
    """N concurrent readers of an invalidated hot key: one wins and fills, the rest wait for its value."""
    mc = memcached_factory()
    router = router_factory(_config(mc.port, True, lease_wait_ms=20, lease_retries=250))
    n = 30
    barrier = threading.Barrier(n)
    misses: list[int] = []
    values: list[bytes] = []
    lock = threading.Lock()

    def reader() -> None:
        c = PyClient(("127.0.0.1", router.port), timeout=30)
        barrier.wait()
        v = c.get(b"hot")
        if v is None:  # "go to the database"
            with lock:
                misses.append(1)
            c.set(b"hot", b"row", noreply=False)
            v = b"row"
        with lock:
            values.append(v)

    threads = [threading.Thread(target=reader) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(values) == n
    assert len(misses) <= 2, f"{len(misses)} of {n} readers went to the database"


def test_held_lease_bounded_wait_then_miss(memcached_factory, router_factory) -> None:
    """A winner that never fills: another reader waits lease_retries times, then gets a plain miss."""
    mc = memcached_factory()
    router = router_factory(_config(mc.port, True, lease_wait_ms=1, lease_retries=3))
    a = PyClient(("127.0.0.1", router.port), timeout=5)
    assert a.get(b"k") is None  # wins the lease, never sets
    assert a.get(b"k") is None  # Z: waits three times, then a miss


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)
