"""mcrouter configs as users write them: comments, trailing commas, Pool|X in lists, and the
route handles added for issue 14 item 9, against real memcached through the release binary."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from ops.harness import Memcached
from tests.router.conftest import ROUTER_BIN, Conn, furc_hash, wait_for


def mc_get(mc: Memcached, key: str) -> bytes | None:
    """The value `mc` itself holds for `key` (None: a miss)."""
    c = Conn(mc.address)
    try:
        reply = c.call(f"get {key}\r\n".encode())
    finally:
        c.close()
    if reply == b"END":
        return None
    return reply.split(b"\r\n")[1]


def mc_set(mc: Memcached, key: str, value: bytes) -> None:
    c = Conn(mc.address)
    try:
        assert c.call(f"set {key} 0 0 {len(value)}\r\n".encode() + value + b"\r\n") == b"STORED"
    finally:
        c.close()


CONFIG = """
// written the way mcrouter's wiki writes configs: comments and trailing commas
{
  "pools": {
    /* two servers; weights only matter to the WeightedCh3 route below */
    "main": {"servers": ["MAIN0", "MAIN1",], "weights": [1.0, 0.0]},
    "shadow": {"servers": ["SHADOW"]},
    "l1": {"servers": ["L1"]}, "l2": {"servers": ["L2"]},
    "old": {"servers": ["OLD"]}, "new": {"servers": ["NEW"]},
    "relay": {"servers": ["OLD"], "keep_routing_prefix": true}, // warned about: not supported
  },
  "route": {
    "type": "PrefixSelectorRoute",
    "policies": {
      "sh:": {"type": "ShadowRoute", "children": ["PoolRoute|main"],
              "shadows": [{"target": "PoolRoute|shadow", "key_fraction_range": [0, 1]}]},
      // the wiki's Shadowing setup: a PoolRoute's shadows copy what its first server gets
      // (index_range [0, 1]: the end is excluded, as in mcrouter)
      "ps:": {"type": "PoolRoute", "pool": "main",
              "shadows": [{"target": "PoolRoute|shadow", "index_range": [0, 1], "key_fraction_range": [0, 1]}]},
      "mk:": {"type": "ModifyKeyRoute", "target": "PoolRoute|old", "ensure_key_prefix": "v2:"},
      "l:": {"type": "L1L2CacheRoute", "l1": "PoolRoute|l1", "l2": "PoolRoute|l2", "upgradingL1Exptime": 60},
      "af:": {"type": "AllFastestRoute", "children": ["Pool|main"]},  // a pool inside a list
      "m:": {"type": "MigrateRoute", "from": "PoolRoute|old", "to": "PoolRoute|new",
             "start_time": START, "interval": 3600},
      "w:": {"type": "PoolRoute", "pool": "main", "hash": {"hash_func": "WeightedCh3"}},
      "dn:": "DevNullRoute",
      "li:": {"type": "LatencyInjectionRoute", "child": "PoolRoute|relay", "before_latency_ms": 300},
    },
    "wildcard": "PoolRoute|main",
  },
}
"""


@pytest.fixture
def dialect(memcached_factory, router_factory, tmp_path: Path):
    mcs = {name: memcached_factory() for name in ("MAIN0", "MAIN1", "SHADOW", "L1", "L2", "OLD", "NEW")}
    text = CONFIG.replace("START", str(int(time.time()) - 10))
    for name, mc in mcs.items():
        text = text.replace(f'"{name}"', f'"{mc.address}"')
    path = tmp_path / "dialect.json"
    path.write_text(text)
    router = router_factory(path)
    return router, mcs


def test_the_commented_config_loads_and_warns_about_what_it_cannot_honour(dialect) -> None:
    router, _ = dialect
    log = router.log_file.read_text()
    assert "config" in log and "loaded" in log, log
    assert "pool `relay`: `keep_routing_prefix: true` is not supported" in log, log
    assert "pool `main`: `weights` ignored" not in log, log  # the WeightedCh3 route reads them


def test_shadow_gets_a_copy_and_the_child_keeps_the_answer(dialect) -> None:
    router, mcs = dialect
    c = Conn(router.address)
    home = [mcs["MAIN0"], mcs["MAIN1"]][furc_hash(b"sh:k", 2)]
    assert c.call(b"set sh:k 0 0 2\r\nv1\r\n") == b"STORED"
    assert mc_get(home, "sh:k") == b"v1"
    wait_for(lambda: mc_get(mcs["SHADOW"], "sh:k") == b"v1", what="the shadow's copy")
    # the shadow having the key never answers for the child: a miss on the child is a miss
    c.call(b"delete sh:k\r\n")
    mc_set(mcs["SHADOW"], "sh:k", b"shadow-only")
    assert c.call(b"get sh:k\r\n") == b"END"


def test_a_pool_routes_shadows_copy_only_its_servers_in_index_range(dialect) -> None:
    router, mcs = dialect
    c = Conn(router.address)
    keys = [f"ps:{i}" for i in range(40)]
    for key in keys:
        assert c.call(f"set {key} 0 0 1\r\nv\r\n".encode()) == b"STORED"
    first = [k for k in keys if furc_hash(k.encode(), 2) == 0]  # MAIN0's keys: shadowed
    second = [k for k in keys if furc_hash(k.encode(), 2) == 1]
    assert first and second
    wait_for(lambda: all(mc_get(mcs["SHADOW"], k) == b"v" for k in first), what="MAIN0's keys shadowed")
    assert [k for k in second if mc_get(mcs["SHADOW"], k) is not None] == []
    # the client's answers are the pool's: a miss there is a miss, whatever the shadow holds
    assert c.call(f"delete {first[0]}\r\n".encode()) == b"DELETED"
    mc_set(mcs["SHADOW"], first[0], b"shadow-only")
    assert c.call(f"get {first[0]}\r\n".encode()) == b"END"


def test_modify_key_stores_under_the_new_key_and_answers_with_the_old(dialect) -> None:
    router, mcs = dialect
    c = Conn(router.address)
    assert c.call(b"set mk:x 5 0 3\r\nabc\r\n") == b"STORED"
    assert mc_get(mcs["OLD"], "v2:mk:x") == b"abc"
    assert mc_get(mcs["OLD"], "mk:x") is None
    assert c.call(b"get mk:x\r\n") == b"VALUE mk:x 5 3\r\nabc\r\nEND\r\n"


def test_l1l2_fills_l1_from_l2_and_deletes_reach_both(dialect) -> None:
    router, mcs = dialect
    c = Conn(router.address)
    mc_set(mcs["L2"], "l:k", b"warm")
    assert c.call(b"get l:k\r\n") == b"VALUE l:k 0 4\r\nwarm\r\nEND\r\n"
    wait_for(lambda: mc_get(mcs["L1"], "l:k") == b"warm", what="l1 filled from l2")
    assert c.call(b"delete l:k\r\n") == b"DELETED"
    assert mc_get(mcs["L1"], "l:k") is None
    assert mc_get(mcs["L2"], "l:k") is None  # mcrouter would leave it: squeal's deletes must reach l2


def test_all_fastest_delete_reaches_every_replica(dialect) -> None:
    router, mcs = dialect
    c = Conn(router.address)
    for name in ("MAIN0", "MAIN1"):
        mc_set(mcs[name], "af:k", b"v")
    assert c.call(b"delete af:k\r\n") == b"DELETED"
    assert mc_get(mcs["MAIN0"], "af:k") is None
    assert mc_get(mcs["MAIN1"], "af:k") is None


def test_migrate_reads_from_old_and_deletes_from_both(dialect) -> None:
    router, mcs = dialect
    c = Conn(router.address)
    mc_set(mcs["OLD"], "m:k", b"old")
    mc_set(mcs["NEW"], "m:k", b"new")
    assert c.call(b"get m:k\r\n") == b"VALUE m:k 0 3\r\nold\r\nEND\r\n"
    assert c.call(b"delete m:k\r\n") == b"DELETED"
    assert mc_get(mcs["OLD"], "m:k") is None
    assert mc_get(mcs["NEW"], "m:k") is None


def test_weighted_ch3_keeps_keys_off_a_zero_weight_server(dialect) -> None:
    router, mcs = dialect
    c = Conn(router.address)
    keys = [f"w:{i}" for i in range(40)]
    for k in keys:
        assert c.call(f"set {k} 0 0 1\r\nv\r\n".encode()) == b"STORED"
    assert all(mc_get(mcs["MAIN0"], k) == b"v" for k in keys)
    assert not any(mc_get(mcs["MAIN1"], k) for k in keys)
    # Ch3 over the same pool does use the second server
    assert any(furc_hash(k.encode(), 2) == 1 for k in keys)


def test_dev_null_and_latency_injection(dialect) -> None:
    router, mcs = dialect
    c = Conn(router.address)
    assert c.call(b"set dn:k 0 0 1\r\nv\r\n") == b"NOT_STORED"
    assert c.call(b"delete dn:k\r\n") == b"NOT_FOUND"  # as mcrouter's DevNullRoute answers
    assert not any(mc_get(mc, "dn:k") for mc in mcs.values())
    start = time.monotonic()
    assert c.call(b"get li:k\r\n") == b"END"
    assert time.monotonic() - start >= 0.3


def test_a_parse_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{\n  // a comment\n  "route": @\n}\n')
    done = subprocess.run(
        [str(ROUTER_BIN), "--config-file", str(path), "-p", "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert str(path) in done.stderr, done.stderr
    assert "line 3 column 12" in done.stderr, done.stderr
