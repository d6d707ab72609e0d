"""Leases against real memcached (and squeal-router when built) and a real MariaDB.

Interleavings use threading.Event, not sleeps: the reader's loader signals once it has read the old
row and then blocks until the writer has committed and invalidated.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from client_support import new_user
from prometheus_client import REGISTRY

from leases import LeaseCache, WaitPolicy, connect
from tests.conftest import run_threads


def _reader_blocked_in_loader(cache: LeaseCache, key: str, load, release: threading.Event):
    """Start a reader whose loader reads the row, signals `loaded`, then waits for `release`."""
    loaded = threading.Event()
    result: list = []

    def loader():
        row = load()
        loaded.set()
        assert release.wait(10), "writer never released the reader"
        return row

    t = threading.Thread(target=lambda: result.append(cache.get_or_fill(key, loader, ttl=300)))
    t.start()
    assert loaded.wait(10), "reader never reached its loader"
    return t, result


def _stale_set_race(cache: LeaseCache, master_sql, invalidation: str):
    """The race: reader A misses and reads a new user's old row in its loader; writer B commits `name = 'new'`
    and invalidates the key (`invalidation`: "delete" or "invalidate", the cache's method); then A goes on and
    finishes. Returns (the user's id, its key, A's loader, A's results, what B's invalidation returned)."""
    uid = new_user(master_sql, "old")
    key = f"user:{uid}"

    def load():
        return master_sql.query_one("SELECT id, name FROM users WHERE id = %s", (uid,))

    release = threading.Event()
    reader, result = _reader_blocked_in_loader(cache, key, load, release)
    # Writer B: commit, then invalidate the cache (what squeal or the web server does after a write).
    master_sql.execute("UPDATE users SET name = 'new' WHERE id = %s", (uid,))
    invalidated = getattr(cache, invalidation)(key)
    release.set()
    reader.join(10)
    return uid, key, load, result, invalidated


@pytest.mark.parametrize("invalidation", ["delete", "invalidate"])
def test_stale_set_race_fill_refused(make_cache, master_sql, invalidation):
    """Reader A misses, wins the lease and reads the old row; writer B commits and deletes (or `md I`);
    A's fill is refused and the next read returns B's value."""
    cache = make_cache()
    uid, key, load, result, invalidated = _stale_set_race(cache, master_sql, invalidation)
    assert invalidated
    assert result == [{"id": uid, "name": "old"}]  # A's caller gets what the database said when asked
    assert cache.stats.lease_wins == 1
    assert cache.stats.fills_refused == 1 and cache.stats.fills == 0
    assert REGISTRY.get_sample_value("squeal_client_fills_refused_total", {"cache": cache.name}) == 1
    assert cache.get_or_fill(key, load, ttl=300)["name"] == "new"
    assert cache.get(key) == {"id": uid, "name": "new"}


def test_stale_set_happens_without_leases(make_cache, master_sql):
    """The control: the same interleaving with leases off caches the old row (so the test above can fail)."""
    cache = make_cache(leases=False)
    _, key, load, _, _ = _stale_set_race(cache, master_sql, "delete")
    assert cache.get_or_fill(key, load, ttl=300)["name"] == "old"  # stale set: the cache now lies


def _herd(cache: LeaseCache, key: str, master_sql, uid: int, readers: int = 200) -> tuple[int, list]:
    """`readers` threads read one cold key at once; returns (database queries, values returned)."""
    queries = 0
    lock = threading.Lock()
    start = threading.Barrier(readers)
    results: list = []

    def loader():
        nonlocal queries
        with lock:
            queries += 1
        # A real query that takes a database round trip plus 50 ms, like a slow feed query.
        return master_sql.query_one("SELECT id, name, SLEEP(0.05) AS s FROM users WHERE id = %s", (uid,))

    def read():
        # A web server's connections are already open when a herd arrives; 200 first connects landing
        # at once would measure the connect path (and can time out through a proxy), not leases.
        cache.get(f"{key}:warm-up")
        start.wait(10)
        try:
            results.append(cache.get_or_fill(key, loader, ttl=300))
        finally:
            master_sql.close()

    run_threads(read, readers, 30)
    return queries, results


def test_thundering_herd(make_cache, master_sql, capsys):
    """200 concurrent readers of one cold key: 1 database query with leases, many without."""
    uid = new_user(master_sql, "herd")

    leased = make_cache(max_pool_size=256)
    with_leases, results = _herd(leased, f"user:{uid}", master_sql, uid)
    assert len(results) == 200 and all(r["name"] == "herd" for r in results)
    assert with_leases == 1, leased.stats.snapshot()
    assert leased.stats.lease_wins == 1 and leased.stats.loads == 1
    assert leased.stats.waits > 0 and leased.stats.errors == 0

    # The next lease period: a delete (new version) lets exactly one more reader load it.
    leased.delete(f"user:{uid}")
    again, _ = _herd(leased, f"user:{uid}", master_sql, uid)
    assert again == 1

    plain = make_cache(leases=False, max_pool_size=256)
    without_leases, results = _herd(plain, f"user:{uid}:plain", master_sql, uid)
    assert len(results) == 200
    with capsys.disabled():
        print(
            f"\nthundering herd, 200 readers of one cold key: {with_leases} database query with leases, "
            f"{without_leases} without"
        )
    assert without_leases > 10


def test_losers_serve_stale_while_one_revalidates(make_cache, master_sql):
    """After `md I`, one reader refreshes; stale_ok readers get the old value at once, others wait for the new."""
    cache = make_cache()
    uid = new_user(master_sql, "v1")
    key = f"user:{uid}"

    def load():
        return master_sql.query_one("SELECT id, name FROM users WHERE id = %s", (uid,))

    assert cache.get_or_fill(key, load, ttl=300)["name"] == "v1"
    master_sql.execute("UPDATE users SET name = 'v2' WHERE id = %s", (uid,))
    assert cache.invalidate(key, stale_ttl=30)

    release = threading.Event()
    refresher, _ = _reader_blocked_in_loader(cache, key, load, release)  # holds the lease (X W)
    stale = [cache.get_or_fill(key, load, ttl=300, stale_ok=True) for _ in range(20)]
    assert all(v["name"] == "v1" for v in stale)
    assert cache.stats.stale_served == 20 and cache.stats.loads == 1  # nobody but the refresher loaded

    waiter_result: list = []
    waiter = threading.Thread(target=lambda: waiter_result.append(cache.get_or_fill(key, load, ttl=300)))
    waiter.start()
    release.set()
    refresher.join(10)
    waiter.join(10)
    assert waiter_result[0]["name"] == "v2"  # a reader without stale_ok waited for the fresh value
    assert cache.stats.fills == 2 and cache.stats.loads == 2


def test_one_lease_per_lease_ttl(make_cache, master_sql):
    """A winner that never fills (crashed) holds the key's lease for lease_ttl; then one new lease is issued."""
    cache = make_cache(lease_ttl=2, wait=WaitPolicy(first=0.01, max_step=0.05, budget=0.3))
    uid = new_user(master_sql, "ttl")
    key = f"user:{uid}"
    crashed = cache._mg(key, cache._lease_flags)  # take the lease as a winner that dies before filling
    assert crashed.flags.win is True
    issued = time.monotonic()

    def load():
        return master_sql.query_one("SELECT id, name FROM users WHERE id = %s", (uid,))

    # While the dead winner's lease lives, readers only wait, then read the database without filling.
    assert cache.get_or_fill(key, load, ttl=300)["name"] == "ttl"
    assert cache.stats.lease_wins == 0 and cache.stats.wait_exhausted == 1 and cache.stats.fills == 0
    while time.monotonic() - issued < 2.2:
        time.sleep(0.05)
    assert cache.get_or_fill(key, load, ttl=300)["name"] == "ttl"
    assert cache.stats.lease_wins == 1 and cache.stats.fills == 1


def test_loader_failure_releases_the_lease(make_cache, master_sql):
    cache = make_cache(wait=WaitPolicy(budget=1.0))
    key = "user:loader-fails"

    def broken():
        raise RuntimeError("database unavailable")

    with pytest.raises(RuntimeError):
        cache.get_or_fill(key, broken, ttl=300)
    # The next reader wins a new lease at once instead of waiting out lease_ttl.
    assert cache.get_or_fill(key, lambda: {"ok": 1}, ttl=300) == {"ok": 1}
    assert cache.stats.lease_wins == 2 and cache.stats.waits == 0


def test_memcached_down_reads_fall_back_to_database(memcached_factory, master_sql, caplog):
    mc = memcached_factory()
    cache = LeaseCache(connect([mc.address], recv_timeout=0.5), name="down-test")
    uid = new_user(master_sql, "fallback")
    key = f"user:{uid}"

    def load():
        return master_sql.query_one("SELECT id, name FROM users WHERE id = %s", (uid,))

    assert cache.get_or_fill(key, load, ttl=300)["name"] == "fallback"
    mc.kill()
    with caplog.at_level("WARNING", logger="leases.client"):
        for _ in range(3):
            assert cache.get_or_fill(key, load, ttl=300)["name"] == "fallback"
        assert cache.delete(key) is False  # reported, not raised
    assert cache.stats.errors >= 4 and cache.stats.loads == 4
    assert any("failed" in r.getMessage() and key in r.getMessage() for r in caplog.records)


def test_memcached_hung_reads_fall_back(memcached_factory, master_sql):
    """A SIGSTOPped memcached (accepts, never answers): the read times out and falls back."""
    mc = memcached_factory()
    cache = LeaseCache(connect([mc.address], recv_timeout=0.3), name="hung-test")
    uid = new_user(master_sql, "hung")
    mc.pause()
    try:
        started = time.monotonic()
        row = cache.get_or_fill(f"user:{uid}", lambda: {"id": uid}, ttl=300)
        assert row == {"id": uid}
        assert time.monotonic() - started < 3
        assert cache.stats.errors >= 1
    finally:
        mc.resume()


def test_wait_policy_is_bounded_and_jittered():
    policy = WaitPolicy(first=0.01, max_step=0.1, backoff=2, budget=1.0)
    runs = [list(policy.steps()) for _ in range(5)]
    for steps in runs:
        assert sum(steps) == pytest.approx(1.0)
        assert max(steps) <= 0.15 and steps[0] <= 0.015
    assert len({tuple(r) for r in runs}) == 5  # jittered: no two readers retry in lock-step


def test_invalid_keys_rejected(make_cache):
    cache = make_cache()
    with pytest.raises(ValueError):
        cache.get_or_fill("has space", lambda: 1, ttl=10)
    with pytest.raises(ValueError):
        cache.get_or_fill("k" * 251, lambda: 1, ttl=10)


def test_a_failed_request_logs_one_line_not_meta_memcache_s_traceback(memcached_factory, master_sql, caplog):
    """meta-memcache logs a WARNING with a full traceback for each failed connect or request; the web tier's
    log gets one line per failure: the client's own WARNING (it falls back to the database)."""
    mc = memcached_factory()
    cache = LeaseCache(connect([mc.address], recv_timeout=0.5, mark_down_period=0), name="quiet-test")
    uid = new_user(master_sql, "quiet")
    key = f"user:{uid}"

    def load():
        return master_sql.query_one("SELECT id, name FROM users WHERE id = %s", (uid,))

    assert cache.get_or_fill(key, load, ttl=300)["name"] == "quiet"  # a pooled connection, then the server dies
    mc.kill()
    with caplog.at_level("WARNING"):  # everything the web tier's log would show
        for _ in range(3):
            assert cache.get_or_fill(key, load, ttl=300)["name"] == "quiet"
        assert cache.delete(key) is False
    text = "\n".join(logging.Formatter("%(levelname)s %(name)s: %(message)s").format(r) for r in caplog.records)
    assert cache.stats.errors >= 4
    assert text.count("\n") + 1 == len(caplog.records) == cache.stats.errors, text  # one line per failure
    assert {r.name for r in caplog.records} == {"leases.client"}, text
