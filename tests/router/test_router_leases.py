"""TransparentLeaseRoute (issue 34): memcached leases for stock clients' plain get/set, through the router."""

from __future__ import annotations

import socket
import threading

import pytest
from pymemcache.client.base import Client as PyClient

from tests.conftest import run_threads


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

    run_threads(reader, n)
    assert len(values) == n
    assert len(misses) <= 2, f"{len(misses)} of {n} readers went to the database"


def test_held_lease_bounded_wait_then_miss(memcached_factory, router_factory) -> None:
    """A winner that never fills: another reader waits lease_retries times, then gets a plain miss."""
    mc = memcached_factory()
    router = router_factory(_config(mc.port, True, lease_wait_ms=1, lease_retries=3))
    a = PyClient(("127.0.0.1", router.port), timeout=5)
    assert a.get(b"k") is None  # wins the lease, never sets
    assert a.get(b"k") is None  # Z: waits three times, then a miss


def test_a_winner_that_never_fills_loses_the_lease_at_lease_ttl(memcached_factory, router_factory) -> None:
    """The lease is memcached's vivified item: it expires at `lease_ttl`, and the next reader wins and fills."""
    from ops.harness import wait_until

    mc = memcached_factory()
    router = router_factory(_config(mc.port, True, lease_ttl=1, lease_wait_ms=1, lease_retries=1))
    a = PyClient(("127.0.0.1", router.port), timeout=5)
    b = PyClient(("127.0.0.1", router.port), timeout=5)

    def won() -> int:
        return int(b.stats()[b"lease_won"])

    assert a.get(b"k") is None and won() == 1  # a wins the lease, and never fills
    assert b.get(b"k") is None and won() == 1  # held: b waits once, then a plain miss (no lease for b)
    # memcached's clock ticks in seconds: the item vivified with TTL 1 is gone within ~2 s
    wait_until(lambda: b.get(b"k") is None and won() == 2, 10, "the next reader to win the expired lease")
    assert b.set(b"k", b"row", noreply=False) is True  # b's fill, under its own token
    assert a.get(b"k") == b"row" and int(b.stats()[b"lease_fills_stored"]) == 1


def test_multi_key_get_keeps_each_keys_lease_across_servers(memcached_factory, router_factory) -> None:
    """One multi-key get over two servers mixing hits, misses that win and keys whose lease another client
    holds: answered as the keys were asked (hits as VALUE blocks, END once), each key's lease handled on its
    own — won tokens kept per key, held keys waited for per key (one filled during the wait is a hit), a
    stale value served."""
    mc1, mc2 = memcached_factory(), memcached_factory()
    pool = "PoolRoute|a"
    route = {"type": "TransparentLeaseRoute", "target": pool, "lease_wait_ms": 50, "lease_retries": 10, "stale_ttl": 30}
    servers = [f"127.0.0.1:{mc1.port}", f"127.0.0.1:{mc2.port}"]
    router = router_factory({"pools": {"a": {"servers": servers}}, "route": route})
    a = PyClient(("127.0.0.1", router.port), timeout=10)
    b = PyClient(("127.0.0.1", router.port), timeout=10)
    direct = [PyClient(("127.0.0.1", mc.port), timeout=5) for mc in (mc1, mc2)]
    hits = [b"hit:%d" % i for i in range(4)]
    for k in hits:
        assert a.set(k, b"v-" + k, noreply=False) is True  # no token: written through
    home = {k: [d.get(k) is not None for d in direct].index(True) for k in hits}
    assert set(home.values()) == {0, 1}, f"the hit keys should span both servers: {home}"
    for k in (b"held:1", b"held:2"):
        assert b.get(k) is None  # b wins these leases and does not fill them (yet)
    assert b.set(b"stale:1", b"old", noreply=False) is True
    assert b.delete(b"stale:1", noreply=False) is True  # marked stale (stale_ttl)
    assert b.get(b"stale:1") is None  # b wins its refill: other readers get the stale value
    before = _stats(router.port)

    def fill_later() -> None:
        threading.Event().wait(0.1)  # within a's waits (10 x 50 ms)
        b.set(b"held:2", b"filled", noreply=False)

    filler = threading.Thread(target=fill_later)
    asked = [hits[0], b"miss:1", b"held:1", hits[1], b"stale:1", b"held:2", hits[2], b"miss:2", hits[0], hits[3]]
    with _raw(router.port) as raw:
        filler.start()
        raw.sendall(b"get " + b" ".join(asked) + b"\r\n")
        got = _read_until(raw, b"END\r\n")
        filler.join()
    values = {k: b"v-" + k for k in hits} | {b"stale:1": b"old", b"held:2": b"filled"}
    want = b"".join(b"VALUE %s 0 %d\r\n%s\r\n" % (k, len(values[k]), values[k]) for k in asked if k in values)
    assert got == want + b"END\r\n"
    after = _stats(router.port)
    delta = {k: after[k] - before[k] for k in after if k != "lease_tokens"}
    assert delta["lease_won"] == 2 and delta["lease_stale_served"] == 1, delta  # miss:1, miss:2; stale:1
    # held:1 waited every retry and gave up; held:2 waited until b filled it
    assert delta["lease_waits"] >= 10 + 1 and delta["lease_gave_up"] == 1, delta
    # a's tokens were kept per key: its fills store, one invalidated since its lease is refused
    assert a.set(b"miss:1", b"row1", noreply=False) is True
    for d in direct:
        d.delete(b"miss:2", noreply=False)
    assert a.set(b"miss:2", b"row2", noreply=False) is False
    assert b.set(b"held:1", b"row", noreply=False) is True  # b's own token still good
    assert a.get_many([b"miss:1", b"held:1", b"miss:2"]) == {b"miss:1": b"row1", b"held:1": b"row"}
    # gets: the cas of each hit is the server's own
    cas = {k: direct[home[k]].gets(k)[1] for k in hits[:2]}
    with _raw(router.port) as raw:
        raw.sendall(b"gets %s nope %s\r\n" % (hits[1], hits[0]))
        got = _read_until(raw, b"END\r\n")
    want = b"".join(b"VALUE %s 0 %d %s\r\nv-%s\r\n" % (k, len(k) + 2, cas[k], k) for k in (hits[1], hits[0]))
    assert got == want + b"END\r\n"


def test_multi_key_get_whose_batch_fails_over_takes_the_full_route(memcached_factory, router_factory) -> None:
    """The first server of a FailoverRoute hangs: the batch of mgs sent to it times out, and each of its keys
    takes the full route (the failover child), as a single-key get would."""
    first, second = memcached_factory(), memcached_factory()
    pools = {
        "first": {"servers": [f"127.0.0.1:{first.port}"], "server_timeout": 300},
        "second": {"servers": [f"127.0.0.1:{second.port}"]},
    }
    failover = {"type": "FailoverRoute", "children": ["PoolRoute|first", "PoolRoute|second"]}
    router = router_factory({"pools": pools, "route": {"type": "TransparentLeaseRoute", "target": failover}})
    to_second = PyClient(("127.0.0.1", second.port), timeout=5)
    to_second.set_many({b"a": b"1", b"b": b"2"}, noreply=False)
    first.pause()
    try:
        with _raw(router.port) as raw:
            raw.sendall(b"get a nope b\r\n")
            got = _read_until(raw, b"END\r\n")
    finally:
        first.resume()
    assert got == b"VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nEND\r\n"
    assert _stats(router.port)["lease_won"] == 1  # "nope" won its lease on the second server
    assert _mg(second.port, b"nope v").startswith(b"VA 0 "), "the lease (an empty item) was taken there"


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_lease_counters_in_stats_and_metrics(memcached_factory, router_factory) -> None:
    """What the handle did is visible: leases won, waits and give-ups, fills stored and refused, tokens held and
    evicted at the bound — in `stats` (memcached's names) and in /metrics (docs/metrics.md)."""
    import urllib.request

    from ops.harness import free_port

    mc = memcached_factory()
    router = router_factory(
        _config(mc.port, True, lease_wait_ms=1, lease_retries=2, max_tokens=2), metrics_port=free_port()
    )
    c = PyClient(("127.0.0.1", router.port), timeout=5)
    direct = PyClient(("127.0.0.1", mc.port), timeout=5)

    def stats() -> dict[str, int]:
        return {k.decode(): int(v) for k, v in c.stats().items() if k.decode().startswith("lease_")}

    assert c.get(b"a") is None and c.get(b"b") is None  # two leases won, two tokens held
    assert stats() == dict.fromkeys(("lease_won", "lease_tokens"), 2) | dict.fromkeys(
        (
            "lease_waits",
            "lease_gave_up",
            "lease_fills_stored",
            "lease_fills_refused",
            "lease_tokens_evicted",
            "lease_stale_marks",
            "lease_stale_served",
            "lease_pairing_redirects",  # a FailoverRoute's (test_router_lease_commands)
        ),
        0,
    )
    assert c.get(b"a") is None  # held by the token above: waits twice, gives up
    direct.delete(b"b", noreply=False)
    assert c.set(b"b", b"stale", noreply=False) is False  # invalidated since the lease: refused
    assert c.get(b"c") is None and c.get(b"d") is None  # the bound is 2: the oldest token ("a") is evicted
    assert c.set(b"d", b"fresh", noreply=False) is True
    got = stats()
    assert got["lease_won"] == 4 and got["lease_waits"] == 2 and got["lease_gave_up"] == 1, got
    assert got["lease_fills_refused"] == 1 and got["lease_fills_stored"] == 1, got
    assert got["lease_tokens_evicted"] == 1 and got["lease_tokens"] == 1, got  # "c" left ("a" evicted, b/d used)
    with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for line in (
        "squeal_router_lease_won_total 4",
        "squeal_router_lease_fills_refused_total 1",
        "squeal_router_lease_tokens_evicted_total 1",
        "squeal_router_lease_tokens 1",
    ):
        assert f"\n{line}\n" in text, line


def test_stale_ttl_marks_deletes_stale_and_serves_them_while_one_reader_refills(
    memcached_factory, router_factory
) -> None:
    """`stale_ttl` (stale-while-revalidate): squeal's `md KEY q` and a client's `delete` keep the value,
    marked stale for at most stale_ttl seconds; the first reader wins the refill (a miss), the next ones get
    the stale value at once instead of waiting; a fill from before the delete is still refused."""
    mc = memcached_factory()
    router = router_factory(_config(mc.port, True, stale_ttl=30, lease_wait_ms=20, lease_retries=2))
    direct = PyClient(("127.0.0.1", mc.port), timeout=5)
    first = PyClient(("127.0.0.1", router.port), timeout=5)
    second = PyClient(("127.0.0.1", router.port), timeout=5)

    def squeal_deletes(key: bytes) -> None:  # squeal's delete line, quiet, then its batch end
        with _raw(router.port) as raw:
            raw.sendall(b"md " + key + b" q\r\nmn\r\n")
            assert _read_until(raw, b"MN\r\n") == b"MN\r\n"

    # the race: a reader wins a lease on a miss, reads the old row; the row changes and squeal deletes
    assert first.get(b"user:1") is None
    squeal_deletes(b"user:1")
    assert first.set(b"user:1", b"old", noreply=False) is False  # its fill predates the delete: refused
    # the lease's placeholder, now stale, has no value to serve: the next reader refills, others wait
    assert first.get(b"user:1") is None
    assert second.get(b"user:1") is None  # (waited its 2 retries for the fill, then a miss)
    assert first.set(b"user:1", b"new", noreply=False) is True
    assert second.get(b"user:1") == b"new"

    # a cached value deleted by squeal stays readable, stale, while one reader refills it
    direct.set(b"user:2", b"v1", noreply=False)
    squeal_deletes(b"user:2")
    marked = _mg(mc.port, b"user:2 t")
    assert b" X" in marked and int(marked.split(b" t", 1)[1].split()[0]) <= 30, marked
    # (that direct read took the refill win, as any first read of a stale item does: give it back)
    squeal_deletes(b"user:2")
    assert first.get(b"user:2") is None  # the winner goes to the database
    assert second.get(b"user:2") == b"v1"  # the others get the stale value at once
    assert first.set(b"user:2", b"v2", noreply=False) is True
    assert second.get(b"user:2") == b"v2"
    fresh = _mg(mc.port, b"user:2 t")
    assert b" X" not in fresh and b"t-1" in fresh, fresh  # the fill replaced the stale item

    direct.set(b"k", b"v", noreply=False)
    assert first.delete(b"k", noreply=False) is True  # a classic delete keeps its classic answer
    assert first.delete(b"gone", noreply=False) is False
    assert b" X" in _mg(mc.port, b"k v")
    stats = _stats(router.port)
    assert stats["lease_stale_marks"] == 5 and stats["lease_stale_served"] == 1, stats


def test_without_stale_ttl_a_delete_deletes(memcached_factory, router_factory) -> None:
    mc = memcached_factory()
    router = router_factory(_config(mc.port, True))
    direct = PyClient(("127.0.0.1", mc.port), timeout=5)
    direct.set(b"k", b"v", noreply=False)
    c = PyClient(("127.0.0.1", router.port), timeout=5)
    assert c.delete(b"k", noreply=False) is True
    assert direct.get(b"k") is None
    assert _stats(router.port)["lease_stale_marks"] == 0


def _read_until(sock: socket.socket, end: bytes) -> bytes:
    got = b""
    while not got.endswith(end):
        chunk = sock.recv(4096)
        assert chunk, f"closed after {got!r}"
        got += chunk
    return got


def _mg(port: int, key_and_flags: bytes) -> bytes:
    with _raw(port) as raw:
        raw.sendall(b"mg " + key_and_flags + b"\r\n")
        return _read_until(raw, b"\r\n")


def _stats(port: int) -> dict[str, int]:
    c = PyClient(("127.0.0.1", port), timeout=5)
    return {k.decode(): int(v) for k, v in c.stats().items() if k.decode().startswith("lease_")}
