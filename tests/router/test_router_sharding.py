"""mcrouter's shard routing through the real router to real memcached: ShardSelectionRoute,
EagerShardSelectionShadowRoute (a new shard layout warmed by shadow copies) and DistributionRoute;
and L1L2SizeSplitRoute, whose sentinels are memcached items with a client flag.

One router and its memcacheds serve every test of the module; each test uses its own key prefix."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.harness import Memcached, Router, free_port, wait_until
from tests.binaries import require_binary
from tests.router.conftest import ROUTER_BIN, Conn
from tests.router.test_router_admin import admin, holders


def config(pools: dict[str, list[str]], dead: str) -> dict:
    return {
        "pools": {
            # the shard map kept in the pool, as mcrouter allows
            "sharded": {"servers": pools["sharded"], "shards": [[1, 2], "3", [4, 5]]},
        },
        "route": {
            "type": "PrefixSelectorRoute",
            "policies": {
                "ss:": {"type": "ShardSelectionRoute", "pool": "sharded"},
                "ess:": {
                    "type": "EagerShardSelectionShadowRoute",
                    "children_type": "LatestRoute",
                    "children_settings": {"failover_count": 1},
                    "shadow_children_type": "LoadBalancerRoute",
                    "shadow_children_settings": {},
                    # one normal and one shadow server per shard, weight 2: every request is copied
                    "shadow_weights": 2.0,
                    "pools": [
                        {
                            "pool": {"type": "Pool", "name": "old", "servers": pools["old"]},
                            "shards": [[1], [2]],
                            "shadow_shards": [[], []],
                        },
                        {
                            "pool": {"type": "Pool", "name": "new", "servers": [*pools["new"], dead]},
                            "shards": [[], []],
                            "shadow_shards": [[1], [2]],
                        },
                    ],
                    "out_of_range": "NullRoute",
                },
                "sz:": {
                    "type": "L1L2SizeSplitRoute",
                    "l1": {"type": "Pool", "name": "l1", "servers": pools["l1"]},
                    "l2": {"type": "Pool", "name": "l2", "servers": pools["l2"]},
                    "threshold": 64,
                },
                "dist:": {
                    "type": "DistributionRoute",
                    "distribution_source_region": "east",
                    "child": {"type": "PoolRoute", "pool": {"type": "Pool", "name": "dist", "servers": pools["dist"]}},
                },
            },
            "wildcard": "ErrorRoute|no such prefix",
        },
    }


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Router, dict[str, list[Memcached]]]]:
    require_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")
    base = tmp_path_factory.mktemp("sharding")
    with contextlib.ExitStack() as stack:

        def started(proc):
            stack.callback(proc.stop)
            return proc.start()

        sizes = {"sharded": 3, "old": 2, "new": 1, "dist": 2, "l1": 1, "l2": 1}
        mcs = {name: [started(Memcached(workdir=base / f"{name}{i}")) for i in range(n)] for name, n in sizes.items()}
        path = Path(base, "config.json")
        dead = f"127.0.0.1:{free_port()}"  # a shadow server that is down
        path.write_text(json.dumps(config({k: [m.address for m in v] for k, v in mcs.items()}, dead)))
        yield started(Router(path, workdir=base / "router")), mcs


def test_shard_selection_puts_each_key_on_the_server_of_its_shard(sharded) -> None:
    router, mcs = sharded
    servers = mcs["sharded"]
    c = Conn(router.address)
    expected = {"ss:1:a": 0, "ss:2:a": 0, "ss:3:a": 1, "ss:4:a": 2, "ss:5:b": 2}
    for key, server in expected.items():
        assert admin(c, f"route(set,{key})") == servers[server].address, key
        assert c.call(f"set {key} 0 0 1\r\nv\r\n".encode()) == b"STORED"
        assert holders(servers, key.encode()) == [server], key
        assert c.call(f"get {key}\r\n".encode()) == f"VALUE {key} 0 1\r\nv\r\nEND\r\n".encode()
    # a delete reaches the shard's server: what squeal's invalidations rely on
    assert c.call(b"delete ss:3:a\r\n") == b"DELETED"
    assert holders(servers, b"ss:3:a") == []
    # no shard id, or a shard no server lists: mcrouter's out-of-range error, nothing stored
    for key in ("ss:9:a", "ss:x:a", "ss:12"):
        assert c.call(f"set {key} 0 0 1\r\nv\r\n".encode()) == b"SERVER_ERROR Invalid destination index."
        assert holders(servers, key.encode()) == []
    c.close()


def test_eager_shadow_copies_a_shards_requests_to_its_new_servers_and_answers_from_the_old(sharded) -> None:
    router, mcs = sharded
    old, new = mcs["old"], mcs["new"]
    c = Conn(router.address)
    assert c.call(b"set ess:1:k 0 0 2\r\nv1\r\n") == b"STORED"
    assert holders(old, b"ess:1:k") == [0]
    # the shadow copy lands on shard 1's new server in the background
    wait_until(lambda: holders(new, b"ess:1:k") == [0], timeout=10, what="shadow copy of ess:1:k")
    # an invalidation reaches both layouts, and the client's answer is the old layout's
    assert c.call(b"delete ess:1:k\r\n") == b"DELETED"
    assert holders(old, b"ess:1:k") == []
    wait_until(lambda: holders(new, b"ess:1:k") == [], timeout=10, what="shadow delete of ess:1:k")
    # shard 2's shadow server is down: its errors never reach the client
    for i in range(5):
        assert c.call(f"set ess:2:k{i} 0 0 1\r\nv\r\n".encode()) == b"STORED"
        assert c.call(f"get ess:2:k{i}\r\n".encode()) == f"VALUE ess:2:k{i} 0 1\r\nv\r\nEND\r\n".encode()
        assert holders(old, f"ess:2:k{i}".encode()) == [1]
    # shards outside both maps go to out_of_range (a NullRoute here)
    assert c.call(b"set ess:7:k 0 0 1\r\nv\r\n") == b"NOT_STORED"
    c.close()


def test_distribution_route_passes_every_request_to_its_child(sharded) -> None:
    router, mcs = sharded
    servers = mcs["dist"]
    c = Conn(router.address)
    name = admin(c, "route_handles(delete,dist:k)").splitlines()[1].strip()
    assert name.startswith("distribution|distributed_delete_rpc_enabled=true|replay=false"), name
    assert "distribution_source_region=east" in name
    for i in range(6):
        key = f"dist:{i}"
        assert c.call(f"set {key} 0 0 1\r\nv\r\n".encode()) == b"STORED"
        assert len(holders(servers, key.encode())) == 1
        assert c.call(f"delete {key}\r\n".encode()) == b"DELETED"
        assert holders(servers, key.encode()) == []
    c.close()


def test_size_split_keeps_large_values_in_l2_behind_a_sentinel_in_l1(sharded) -> None:
    router, mcs = sharded
    (l1,), (l2,) = mcs["l1"], mcs["l2"]
    c = Conn(router.address)
    big = b"b" * 100
    assert c.call(b"set sz:small 3 0 5\r\nsmall\r\n") == b"STORED"
    assert c.call(b"set sz:big 3 0 100\r\n" + big + b"\r\n") == b"STORED"
    assert (holders([l1], b"sz:small"), holders([l2], b"sz:small")) == ([0], [])
    # l2 holds the value with the client's flags; l1 an empty sentinel with flag 0x20 added
    direct1, direct2 = Conn(l1.address), Conn(l2.address)
    assert direct2.call(b"get sz:big\r\n") == b"VALUE sz:big 3 100\r\n" + big + b"\r\nEND\r\n"
    assert direct1.call(b"get sz:big\r\n") == b"VALUE sz:big 35 0\r\n\r\nEND\r\n"
    # reads through the router see the value wherever it lives; gets carries l1's cas
    assert c.call(b"get sz:big\r\n") == b"VALUE sz:big 3 100\r\n" + big + b"\r\nEND\r\n"
    l1_cas = direct1.call(b"gets sz:big\r\n").split(b"\r\n")[0].split(b" ")[4]
    assert c.call(b"gets sz:big\r\n").split(b"\r\n")[0] == b"VALUE sz:big 3 100 " + l1_cas
    assert c.call(b"get sz:small\r\n") == b"VALUE sz:small 3 5\r\nsmall\r\nEND\r\n"
    # an invalidation removes the sentinel: the big value can no longer be read
    assert c.call(b"delete sz:big\r\n") == b"DELETED"
    assert holders([l1], b"sz:big") == []
    assert c.call(b"get sz:big\r\n") == b"END"
    # a sentinel whose l2 value was evicted is removed, and gets answers a miss
    assert c.call(b"set sz:gone 0 0 100\r\n" + big + b"\r\n") == b"STORED"
    assert direct2.call(b"delete sz:gone\r\n") == b"DELETED"
    assert c.call(b"gets sz:gone\r\n") == b"END"
    assert holders([l1], b"sz:gone") == []
    for conn in (c, direct1, direct2):
        conn.close()
