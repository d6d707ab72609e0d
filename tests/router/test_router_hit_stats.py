"""Get hits and misses through the router (issue 26 item 6): `stats` has memcached's `get_hits`/`get_misses`, per
route (`route:<prefix>:get_hits`) and per pool (`pool:<name>:get_hits`), and /metrics the same by label, so a
dashboard shows the hit rate through the router. Classic gets count keys (single, batched multi-key), meta
gets count `VA`/`HD` as hits and `EN` as misses (gets that touch — gat, `mg … T` — are touches, as
memcached counts them); real memcached behind the router, whose own counters agree."""

from __future__ import annotations

import urllib.request

from ops.harness import free_port
from tests.router.conftest import Conn


def stats_of(address: str) -> dict[str, str]:
    c = Conn(address)
    c.send(b"stats\r\n")
    out = {}
    while (line := c.line()) != b"END":
        _, name, value = line.decode().split(" ", 2)
        out[name] = value
    c.close()
    return out


def test_get_hits_and_misses_are_counted_per_route_and_pool(memcached_factory, router_factory):
    a = [memcached_factory(), memcached_factory()]
    b = [memcached_factory()]
    config = {
        "pools": {"A": {"servers": [m.address for m in a]}, "B": {"servers": [m.address for m in b]}},
        "routes": [
            {"aliases": ["/a/b/"], "route": "PoolRoute|A"},
            {"aliases": ["/a/c/"], "route": "PoolRoute|B"},
        ],
    }
    mport = free_port()
    router = router_factory(config, metrics_port=mport)
    c = Conn(router.address)
    keys = [f"k{i}" for i in range(6)]
    for k in keys:
        assert c.call(f"set /a/b/{k} 0 0 1\r\nv\r\n".encode()) == b"STORED"
    # hits: 1 + 6 + 2 (mg VA, mg HD) = 9; misses: 1 + 3 + 1 (mg EN) = 5. gat is a touch, as memcached counts it
    # (measured: `gat` and `mg … T` count in its touch_hits/touch_misses, not get_hits)
    assert c.call(b"get /a/b/k0\r\n").startswith(b"VALUE")
    assert c.call(b"get /a/b/nope\r\n") == b"END"
    multi = c.call(("get " + " ".join(f"/a/b/{k}" for k in [*keys, "x1", "x2", "x3"]) + "\r\n").encode())
    assert multi.count(b"VALUE ") == 6
    assert c.call(b"mg /a/b/k1 v\r\n").startswith(b"VA 1")
    assert c.call(b"mg /a/b/k2\r\n") == b"HD"
    assert c.call(b"mg /a/b/nope\r\n") == b"EN"
    assert c.call(b"gat 100 /a/b/k3 /a/b/k4 /a/b/nope\r\n").count(b"VALUE ") == 2
    assert c.call(b"get /a/c/k0\r\n") == b"END"
    c.close()

    st = stats_of(router.address)
    assert (st["get_hits"], st["get_misses"]) == ("9", "6"), st
    assert (st["route:/a/b/:get_hits"], st["route:/a/b/:get_misses"]) == ("9", "5")
    assert (st["route:/a/c/:get_hits"], st["route:/a/c/:get_misses"]) == ("0", "1")
    assert (st["pool:A:get_hits"], st["pool:A:get_misses"]) == ("9", "5")
    assert (st["pool:B:get_hits"], st["pool:B:get_misses"]) == ("0", "1")
    # memcached's own counters (it counts gets the same way: a key is a hit or a miss, mg too)
    servers = [stats_of(m.address) for m in a]
    assert sum(int(s["get_hits"]) for s in servers) == 9
    # the gat's keys reach memcached as `gat` (never `mg … T`), which it counts in touch_hits/touch_misses
    assert sum(int(s["get_misses"]) for s in servers) == 5
    assert sum(int(s["touch_hits"]) for s in servers) == 2 and sum(int(s["touch_misses"]) for s in servers) == 1

    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as response:
        body = response.read().decode()
    for line in [
        'squeal_router_get_hits_total{route="/a/b/"} 9',
        'squeal_router_get_misses_total{route="/a/b/"} 5',
        'squeal_router_get_misses_total{route="/a/c/"} 1',
        'squeal_router_pool_get_hits_total{pool="A"} 9',
        'squeal_router_pool_get_misses_total{pool="B"} 1',
    ]:
        assert line in body.splitlines(), line

    # `stats reset` starts them again (the /metrics counters keep counting)
    c = Conn(router.address)
    assert c.call(b"stats reset\r\n") == b"RESET"
    assert c.call(b"get /a/b/k5\r\n").startswith(b"VALUE")
    c.close()
    st = stats_of(router.address)
    assert (st["get_hits"], st["get_misses"], st["pool:A:get_hits"]) == ("1", "0", "1"), st

    # a multi-get one server answers whole (no routing prefix to strip: its reply is passed on as it is)
    c = Conn(router.address)

    def server_of(key: str) -> str:
        reply = c.call(f"get __mcrouter__.route(get,{key})\r\n".encode())
        return reply.split(b"\r\n")[1].decode()

    target = server_of("k0")
    same = [k for k in keys if server_of(k) == target]
    missing = next(f"m{i}" for i in range(100) if server_of(f"m{i}") == target)
    reply = c.call(("get " + " ".join([*same, missing]) + "\r\n").encode())
    assert reply.count(b"VALUE ") == len(same)
    c.close()
    st = stats_of(router.address)
    assert (st["get_hits"], st["get_misses"]) == (str(1 + len(same)), "1"), st
    assert (st["pool:A:get_hits"], st["pool:A:get_misses"]) == (str(1 + len(same)), "1"), st


def test_a_lease_routes_batched_gets_count_in_the_pool(memcached_factory, router_factory):
    """A TransparentLeaseRoute sends a multi-key get's keys as one batch of `mg … N` per server and reads
    the replies where they lie: the pool still counts each key, as memcached answered it (a hit's `VA`
    and a miss that wins the lease, also a `VA`, are hits; the route's own counters say which won)."""
    m = memcached_factory()
    config = {
        "pools": {"A": {"servers": [m.address]}},
        "route": {"type": "TransparentLeaseRoute", "target": "PoolRoute|A", "lease_ttl": 10},
    }
    router = router_factory(config)
    c = Conn(router.address)
    for k in ("k0", "k1", "k2"):
        assert c.call(f"set {k} 0 0 1\r\nv\r\n".encode()) == b"STORED"
    multi = c.call(b"get k0 nope1 k1 k2 nope2\r\n")
    assert multi.count(b"VALUE ") == 3
    c.close()
    st = stats_of(router.address)
    # 5 `VA` replies: 3 values, 2 vivified misses whose leases this get won
    assert (st["pool:A:get_hits"], st["pool:A:get_misses"]) == ("5", "0"), st
    assert st["lease_won"] == "2", st
