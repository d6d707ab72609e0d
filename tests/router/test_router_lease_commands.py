"""mcrouter's `lease-get` / `lease-set` through the router (issue 34, item 1), against real memcached.

The router sends them as memcached 1.6 meta leases (`mg KEY v f c N<ttl>`, `ms KEY <len> F T C<token>`)
and answers as mcrouter does: a hit is `VALUE`, a miss `LVALUE <key> <token> <flags> <bytes>` (token 1:
someone else holds the lease), then `END`; a fill is `STORED`, or `NOT_STORED` when the item changed or
went since the lease; a line mcrouter cannot parse is `CLIENT_ERROR malformed request` and the close.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from pymemcache.client.base import Client as PyClient

from ops.harness import ROUTER_BIN, free_port
from tests.router.conftest import Conn

LVALUE_EMPTY = re.compile(rb"LVALUE (\S+) (\d+) 0 0\r\n\r\nEND\r\n")


def _pool_config(mc_port: int) -> dict:
    return {"pools": {"a": {"servers": [f"127.0.0.1:{mc_port}"]}}, "route": "PoolRoute|a"}


def lease_get(conn: Conn, *keys: bytes) -> bytes:
    """Send `lease-get KEYS` and read its whole reply (value blocks framed by their lengths) up to END."""
    conn.send(b"lease-get " + b" ".join(keys) + b"\r\n")
    out = b""
    while True:
        line = conn.line()
        out += line + b"\r\n"
        if line == b"END":
            return out
        head = line.split(b" ")
        if head[0] == b"VALUE":
            out += conn.exact(int(head[3]) + 2)
        elif head[0] == b"LVALUE":
            out += conn.exact(int(head[4]) + 2)


def won_token(reply: bytes, key: bytes) -> int:
    """The token of a won lease on a missing key (an empty `LVALUE`), checked byte for byte."""
    m = LVALUE_EMPTY.fullmatch(reply)
    assert m is not None, f"not a lease miss: {reply!r}"
    assert m.group(1) == key
    token = int(m.group(2))
    assert token > 1, f"a won lease's token is never 0 or the hot-miss 1: {reply!r}"
    return token


def lease_set(conn: Conn, key: bytes, token: int | bytes, value: bytes, flags: int = 0, exptime: int = 0) -> bytes:
    conn.send(b"lease-set %s %s %d %d %d\r\n%s\r\n" % (key, str(token).encode(), flags, exptime, len(value), value))
    return conn.line()


def test_miss_hot_miss_fill_then_hit(memcached_factory, router_factory) -> None:
    mc = memcached_factory()
    router = router_factory(_pool_config(mc.port))
    c, other = Conn(("127.0.0.1", router.port)), Conn(("127.0.0.1", router.port))
    token = won_token(lease_get(c, b"user:1"), b"user:1")
    # while the lease is out, everyone else gets the hot miss: token 1, no value
    assert lease_get(other, b"user:1") == b"LVALUE user:1 1 0 0\r\n\r\nEND\r\n"
    assert lease_get(c, b"user:1") == b"LVALUE user:1 1 0 0\r\n\r\nEND\r\n"
    assert lease_set(c, b"user:1", token, b"row-1", flags=42) == b"STORED"
    assert lease_get(other, b"user:1") == b"VALUE user:1 42 5\r\nrow-1\r\nEND\r\n"
    # the fill reached memcached as an ordinary item (flags kept)
    direct = Conn(("127.0.0.1", mc.port))
    assert direct.call(b"get user:1\r\n") == b"VALUE user:1 42 5\r\nrow-1\r\nEND\r\n"
    # a token is good for one fill: the item's CAS has moved on
    assert lease_set(c, b"user:1", token, b"again") == b"NOT_STORED"
    assert direct.call(b"get user:1\r\n") == b"VALUE user:1 42 5\r\nrow-1\r\nEND\r\n"
    # counted under their own names, the lease-gets in the get hits and misses too
    c.send(b"stats\r\n")
    stats = {}
    while (line := c.line()) != b"END":
        _, name, value = line.split(b" ", 2)
        stats[name] = value
    assert (stats[b"cmd_lease-get"], stats[b"cmd_lease-set"]) == (b"4", b"2")
    assert (stats[b"get_hits"], stats[b"get_misses"]) == (b"1", b"3")


def test_fill_after_invalidation_is_refused(memcached_factory, router_factory) -> None:
    """The stale-set race: the lease holder read the old row, the key was deleted (or rewritten) since."""
    mc = memcached_factory()
    router = router_factory(_pool_config(mc.port))
    c = Conn(("127.0.0.1", router.port))
    direct = Conn(("127.0.0.1", mc.port))
    token = won_token(lease_get(c, b"k"), b"k")
    assert direct.call(b"delete k\r\n") == b"DELETED"
    assert lease_set(c, b"k", token, b"old") == b"NOT_STORED"
    assert direct.call(b"get k\r\n") == b"END"
    # the next reader wins a fresh lease, and its fill is stored
    fresh = won_token(lease_get(c, b"k"), b"k")
    assert fresh != token
    assert direct.call(b"set k 0 0 3\r\nnew\r\n") == b"STORED"  # a writer got there first
    assert lease_set(c, b"k", fresh, b"old") == b"NOT_STORED"
    assert direct.call(b"get k\r\n") == b"VALUE k 0 3\r\nnew\r\nEND\r\n"


def test_stale_value_is_returned_with_the_lease(memcached_factory, router_factory) -> None:
    """An invalidated (`md I`) item: the winner and the hot-missers see its stale value in LVALUE."""
    mc = memcached_factory()
    router = router_factory(_pool_config(mc.port))
    c = Conn(("127.0.0.1", router.port))
    direct = Conn(("127.0.0.1", mc.port))
    assert direct.call(b"set s 7 0 3\r\nold\r\n") == b"STORED"
    assert direct.call(b"md s I\r\n") == b"HD"
    reply = lease_get(c, b"s")
    m = re.fullmatch(rb"LVALUE s (\d+) 7 3\r\nold\r\nEND\r\n", reply)
    assert m is not None and int(m.group(1)) > 1, reply
    assert lease_get(c, b"s") == b"LVALUE s 1 7 3\r\nold\r\nEND\r\n"
    assert lease_set(c, b"s", int(m.group(1)), b"fresh", flags=7) == b"STORED"
    assert lease_get(c, b"s") == b"VALUE s 7 5\r\nfresh\r\nEND\r\n"


def test_several_keys_in_order_and_noreply(memcached_factory, router_factory) -> None:
    mc = memcached_factory()
    router = router_factory(_pool_config(mc.port))
    c = Conn(("127.0.0.1", router.port))
    assert Conn(("127.0.0.1", mc.port)).call(b"set hit 3 0 2\r\nhi\r\n") == b"STORED"
    reply = lease_get(c, b"hit", b"miss", b"hit")
    m = re.fullmatch(rb"VALUE hit 3 2\r\nhi\r\nLVALUE miss (\d+) 0 0\r\n\r\nVALUE hit 3 2\r\nhi\r\nEND\r\n", reply)
    assert m is not None, reply
    # noreply: no answer for the fill, the next command's answer comes first
    c.send(b"lease-set miss %s 0 0 1 noreply\r\nx\r\n" % m.group(1))
    assert lease_get(c, b"miss") == b"VALUE miss 0 1\r\nx\r\nEND\r\n"


@pytest.mark.parametrize("token", [b"0", b"1", b"123456789", b"6794276681860263993"])
def test_forged_tokens_store_nothing(memcached_factory, router_factory, token: bytes) -> None:
    """A token no lease-get gave (0 above all: memcached's `C0` would store unconditionally; the last is
    shaped like a router token but was never issued)."""
    mc = memcached_factory()
    router = router_factory(_pool_config(mc.port))
    c = Conn(("127.0.0.1", router.port))
    won_token(lease_get(c, b"f"), b"f")  # a lease is out on f
    assert lease_set(c, b"f", token.decode(), b"forged") == b"NOT_STORED"
    assert lease_set(c, b"nolease", token.decode(), b"forged") == b"NOT_STORED"
    direct = Conn(("127.0.0.1", mc.port))
    assert direct.call(b"mg f v\r\n").startswith(b"VA 0 "), "f still holds the lease's empty value"
    assert direct.call(b"get nolease\r\n") == b"END"


@pytest.mark.parametrize(
    "line",
    [
        b"lease-set k abc 0 0 1\r\nx\r\n",
        b"lease-set k -3 0 0 1\r\nx\r\n",
        b"lease-set k 99999999999999999999 0 0 1\r\nx\r\n",
        b"lease-set k 5 0 0\r\n",
        b"lease-set k 5 0 0 1 junk\r\nx\r\n",
        b"lease-get\r\n",
    ],
)
def test_malformed_lines_answer_as_mcrouter_and_close(memcached_factory, router_factory, line: bytes) -> None:
    mc = memcached_factory()
    router = router_factory(_pool_config(mc.port))
    c = Conn(("127.0.0.1", router.port))
    c.send(line + b"get k\r\n")
    assert c.line() == b"CLIENT_ERROR malformed request"
    with pytest.raises(ConnectionError):  # nothing after it is read: the connection is closed
        c.line()
    assert Conn(("127.0.0.1", mc.port)).call(b"get k\r\n") == b"END"


def test_lease_pairing_sends_the_fill_to_the_failover_child_that_issued_it(memcached_factory, router_factory) -> None:
    """mcrouter's enable_lease_pairing: the lease-get failed over to the second child (the first one hung);
    the lease-set must go to that second child even though the first is back, with its own token."""
    first, second = memcached_factory(), memcached_factory()
    config = {
        "pools": {
            "first": {"servers": [f"127.0.0.1:{first.port}"], "server_timeout": 300},
            "second": {"servers": [f"127.0.0.1:{second.port}"]},
        },
        "route": {
            "type": "FailoverRoute",
            "name": "pair",
            "enable_lease_pairing": True,
            "children": ["PoolRoute|first", "PoolRoute|second"],
        },
    }
    router = router_factory(config)
    c = Conn(("127.0.0.1", router.port), timeout=10)
    to_first, to_second = Conn(("127.0.0.1", first.port)), Conn(("127.0.0.1", second.port))
    # the first child's own item CAS values run ahead of the second's, so their tokens cannot coincide
    for i in range(5):
        assert to_first.call(b"set pad%d 0 0 1\r\nx\r\n" % i) == b"STORED"
    first.pause()
    try:
        token = won_token(lease_get(c, b"p"), b"p")  # the first times out: the second issues the lease
    finally:
        first.resume()
    assert to_second.call(b"mg p v c\r\n").startswith(b"VA 0 "), "the lease was taken on the second child"
    # (the first child may read the timed-out mg once resumed: then it holds a lease nobody fills)
    assert lease_set(c, b"p", token, b"filled", flags=9) == b"STORED"
    assert to_second.call(b"get p\r\n") == b"VALUE p 9 6\r\nfilled\r\nEND\r\n"
    assert _stat(router.port, b"lease_pairing_redirects") == 1  # counted: a fill pairing sent away from the first
    left_on_first = to_first.call(b"mg p v\r\n")
    assert left_on_first == b"EN" or left_on_first.startswith(b"VA 0 "), left_on_first  # nothing, or the late lease
    # a token is redeemed once; a token the route never issued goes to the first child, not failed over
    assert lease_set(c, b"p", token, b"twice") == b"NOT_STORED"
    assert to_second.call(b"get p\r\n") == b"VALUE p 9 6\r\nfilled\r\nEND\r\n"


def _stat(port: int, name: bytes) -> int:
    return int(PyClient(("127.0.0.1", port), timeout=5).stats()[name])


def test_lease_pairing_needs_a_name(tmp_path) -> None:
    """As in mcrouter, a FailoverRoute that pairs leases must be named (its tokens are the name's)."""
    cfg = tmp_path / "c.json"
    route = {"type": "FailoverRoute", "enable_lease_pairing": True, "children": ["PoolRoute|a", "PoolRoute|a"]}
    cfg.write_text(json.dumps({"pools": {"a": {"servers": [f"127.0.0.1:{free_port()}"]}}, "route": route}))
    out = subprocess.run(
        [str(ROUTER_BIN), "--config-file", str(cfg), "-p", str(free_port())], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 1
    assert "`name` is required when lease pairing is enabled" in out.stdout + out.stderr


def test_routing_prefixes_pick_the_pool_and_are_echoed(memcached_factory, router_factory) -> None:
    """`/region/cluster/` keys: each key of a lease-get goes to its prefix's pool and is answered with the key
    as the client sent it; the lease-set goes by its prefix to the pool that issued the lease."""
    a, b = memcached_factory(), memcached_factory()
    config = {
        "pools": {"A": {"servers": [a.address]}, "B": {"servers": [b.address]}},
        "routes": [{"aliases": ["/r/a/"], "route": "PoolRoute|A"}, {"aliases": ["/r/b/"], "route": "PoolRoute|B"}],
    }
    router = router_factory(config)
    c = Conn(router.address)
    assert Conn(b.address).call(b"set k 1 0 1\r\nB\r\n") == b"STORED"
    reply = lease_get(c, b"/r/a/k", b"/r/b/k")
    m = re.fullmatch(rb"LVALUE /r/a/k (\d+) 0 0\r\n\r\nVALUE /r/b/k 1 1\r\nB\r\nEND\r\n", reply)
    assert m is not None, reply
    assert lease_set(c, b"/r/a/k", int(m.group(1)), b"A", flags=2) == b"STORED"
    assert Conn(a.address).call(b"get k\r\n") == b"VALUE k 2 1\r\nA\r\nEND\r\n"
    assert Conn(b.address).call(b"get k\r\n") == b"VALUE k 1 1\r\nB\r\nEND\r\n"
