"""squeal-router on the platform's own configs: replicated pools, gutter failover, delete spool,
warm-up, every emitted config, reload."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from pymemcache.client.base import Client as PyClient

import router_config as rc
from tests.router.conftest import REPO, Conn, furc_hash, wait_for


def _has(address: str, key: bytes) -> bool:
    return Conn(address).call(b"mg " + key + b"\r\n") == b"HD"


def _ttl(address: str, key: bytes) -> int:
    reply = Conn(address).call(b"mg " + key + b" t\r\n")
    assert reply.startswith(b"HD"), (address, key, reply)
    return int(reply.split()[1][1:])


def _keys_on(index: int, n_servers: int, count: int, prefix: str = "k") -> list[bytes]:
    keys, i = [], 0
    while len(keys) < count:
        key = f"{prefix}{i}".encode()
        if furc_hash(key, n_servers) == index:
            keys.append(key)
        i += 1
    return keys


def test_replicated_pool_delete_reaches_every_replica(east_a) -> None:
    r0, r1 = east_a.servers["sessions0"], east_a.servers["sessions1"]
    c = Conn(east_a.router.address)
    assert c.call(b"set session:42 0 0 2\r\nhi\r\n") == b"STORED"
    assert _has(r0.address, b"session:42") and _has(r1.address, b"session:42")
    assert c.call(b"delete session:42\r\n") == b"DELETED"
    assert not _has(r0.address, b"session:42") and not _has(r1.address, b"session:42")
    # squeal's batched meta deletes too
    Conn(r0.address).call(b"set session:7 0 0 1\r\nx\r\n")
    Conn(r1.address).call(b"set session:7 0 0 1\r\nx\r\n")
    assert c.call(b"md session:7 q\r\nmn\r\n") == b"MN"
    assert not _has(r0.address, b"session:7") and not _has(r1.address, b"session:7")
    # a read goes to one replica (chosen by load: docs/router.md, "Load-aware spreading")
    Conn(r0.address).call(b"set session:9 0 0 2\r\nr0\r\n")
    Conn(r1.address).call(b"set session:9 0 0 2\r\nr1\r\n")
    assert c.call(b"get session:9\r\n") in (b"VALUE session:9 0 2\r\n%s\r\nEND\r\n" % r for r in (b"r0", b"r1"))


def test_killing_a_member_under_load_uses_gutter_then_recovers(east_a) -> None:
    w0, w1, gutter = east_a.servers["wildcard0"], east_a.servers["wildcard1"], east_a.servers["gutter"]
    victim_keys = _keys_on(0, 2, 50)
    other_keys = _keys_on(1, 2, 50)
    client = PyClient(("127.0.0.1", east_a.router.port), timeout=5)
    for k in victim_keys + other_keys:
        client.set(k.decode(), b"v", expire=3600, noreply=False)
    assert _has(w0.address, victim_keys[0]) and not _has(w1.address, victim_keys[0])

    errors: list[Exception] = []
    stop = threading.Event()
    done = [0]

    def load() -> None:
        c = PyClient(("127.0.0.1", east_a.router.port), timeout=5)
        try:
            for i in range(200_000):  # bounded; normally stopped much earlier
                if stop.is_set():
                    break
                k = (victim_keys + other_keys)[i % 100].decode()
                if c.get(k) is None:  # a miss (e.g. fresh gutter): fill it, as a client would
                    assert c.set(k, b"v", expire=3600, noreply=False)
                done[0] += 1
        except Exception as e:  # noqa: BLE001 - any client error fails the test
            errors.append(e)

    t = threading.Thread(target=load)
    t.start()
    try:
        wait_for(lambda: done[0] > 200, what="load running")
        w0.kill()
        # the victim's keys are now served from gutter, with their TTL capped
        wait_for(lambda: _has(gutter.address, victim_keys[0]), what="gutter filled")
        at = done[0]
        wait_for(lambda: done[0] > at + 500, what="load continuing while the server is down")
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    ttl = _ttl(gutter.address, victim_keys[0])
    assert 0 < ttl <= east_a.gutter_ttl
    assert not _has(gutter.address, other_keys[0])  # healthy server's keys never went to gutter

    c = Conn(east_a.router.address)
    # while it is down, a delete also reaches gutter (and is spooled for the dead server)
    assert c.call(b"delete " + victim_keys[1] + b"\r\n") in (b"DELETED", b"NOT_FOUND")
    assert not _has(gutter.address, victim_keys[1])

    # bring it back: the router's probe ends the failover, new sets land on the normal server again
    w0.start()
    probe_key = victim_keys[2]

    def back_to_normal() -> bool:
        c.call(b"set " + probe_key + b" 0 0 1\r\nn\r\n")
        return _has(w0.address, probe_key)

    wait_for(back_to_normal, timeout=10, what="failover to end")
    assert c.call(b"get " + probe_key + b"\r\n") == b"VALUE " + probe_key + b" 0 1\r\nn\r\nEND\r\n"
    stats = {line.split()[1]: line.split()[2] for line in _router_stats(east_a.router.address)}
    assert int(stats[b"tko_events"]) >= 1 and int(stats[b"gutter_failovers"]) >= 1
    assert int(stats[b"spooled_deletes"]) >= 1


def _router_stats(address: str) -> list[bytes]:
    return Conn(address).stat_lines()


def test_delete_to_dead_server_is_replayed_when_it_returns(memcached_factory, router_factory, tmp_path) -> None:
    mc = memcached_factory()
    spool = tmp_path / "spool"
    # probe late enough that the restarted server gets its stale value first
    router = router_factory(
        {"pools": {"p": {"servers": [mc.address]}}, "route": "PoolRoute|p"},
        spool_dir=spool,
        extra_args=("--probe-delay-initial-ms", "1500", "--connect-timeout-ms", "300"),
    )
    c = Conn(router.address)
    mc.kill()
    assert c.call(b"delete user:1\r\n") == b"NOT_FOUND"  # spooled, answered as mcrouter does
    assert c.call(b"md user:2 q\r\nmn\r\n") == b"NF"  # quiet meta delete: NF shows, then MN
    assert c.line() == b"MN"
    lines = (spool / f"127.0.0.1_{mc.port}.asynclog").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert [e[0] for e in entries] == ["AS2.0", "AS2.0"] and entries[0][2] == "C"
    assert entries[0][3]["k"] == "user:1" and entries[0][3]["h"] == f"[127.0.0.1]:{mc.port}"
    assert entries[0][3]["p"] == "p"
    mc.start()  # comes back empty; simulate the stale copies a restarted/partitioned server could hold
    Conn(mc.address).call(b"set user:1 0 0 5\r\nstale\r\n")
    Conn(mc.address).call(b"set user:2 0 0 5\r\nstale\r\n")
    wait_for(
        lambda: not _has(mc.address, b"user:1") and not _has(mc.address, b"user:2"), what="spooled deletes replayed"
    )
    stats = {line.split()[1]: line.split()[2] for line in _router_stats(router.address)}
    assert stats[b"replayed_deletes"] == b"2"


def test_warm_up_route_fills_cold_from_warm(memcached_factory, router_factory) -> None:
    cold, warm = memcached_factory(), memcached_factory()
    router = router_factory(
        {
            "pools": {"cold": {"servers": [cold.address]}, "warm": {"servers": [warm.address]}},
            "route": {"type": "WarmUpRoute", "cold": "PoolRoute|cold", "warm": "PoolRoute|warm", "exptime": 120},
        }
    )
    Conn(warm.address).call(b"set user:1 5 0 5\r\nhello\r\n")
    Conn(warm.address).call(b"set user:2 6 0 5\r\nworld\r\n")
    c = Conn(router.address)
    assert c.call(b"get user:1\r\n") == b"VALUE user:1 5 5\r\nhello\r\nEND\r\n"
    wait_for(lambda: _has(cold.address, b"user:1"), what="cold filled")
    assert Conn(cold.address).call(b"mg user:1 v f\r\n") == b"VA 5 f5\r\nhello\r\n"
    assert 0 < _ttl(cold.address, b"user:1") <= 120
    # meta get too
    assert c.call(b"mg user:2 v\r\n") == b"VA 5\r\nworld\r\n"
    wait_for(lambda: _has(cold.address, b"user:2"), what="cold filled by mg")
    # writes go to cold only; a miss on both stays a miss
    assert c.call(b"set user:3 0 0 1\r\nc\r\n") == b"STORED"
    assert _has(cold.address, b"user:3") and not _has(warm.address, b"user:3")
    assert c.call(b"get nobody\r\n") == b"END"


def _cmd_set(address: str) -> int:
    """memcached's own count of set-type commands (an add counts too)."""
    stats = dict(line.split()[1:3] for line in _router_stats(address))
    return int(stats[b"cmd_set"])


def test_warm_up_delete_leaves_a_hold_off_in_cold(memcached_factory, router_factory) -> None:
    """A delete through WarmUpRoute marks the key stale in cold for ~3 s, so a get racing with warm's
    late delete is served from warm but cannot copy the old value back into cold."""
    cold, warm = memcached_factory(), memcached_factory()
    router = router_factory(
        {
            "pools": {"cold": {"servers": [cold.address]}, "warm": {"servers": [warm.address]}},
            "route": {"type": "WarmUpRoute", "cold": "PoolRoute|cold", "warm": "PoolRoute|warm", "exptime": 120},
        }
    )
    for mc in (cold, warm):
        assert Conn(mc.address).call(b"set user:1 5 0 2\r\nv1\r\n") == b"STORED"
    c = Conn(router.address)
    assert c.call(b"delete user:1\r\n") == b"DELETED"
    # cold keeps a stale hold-off item (memcached would still hand it to a classic get)
    assert Conn(cold.address).call(b"mg user:1 v\r\n").split(b"\r\n")[0].split()[-2:] in ([b"X", b"W"], [b"W", b"X"])
    # warm's delete is late: the get is answered from warm, and the fill into cold must fail
    sets = _cmd_set(cold.address)
    assert c.call(b"get user:1\r\n") == b"VALUE user:1 5 2\r\nv1\r\nEND\r\n"
    wait_for(lambda: _cmd_set(cold.address) > sets, what="the fill's add reached cold")
    fills = lambda: dict(line.split()[1:3] for line in _router_stats(router.address))[b"warmup_fills"]  # noqa: E731
    head = Conn(cold.address).call(b"mg user:1 v\r\n").split(b"\r\n")[0]
    assert b"X" in head.split(), head  # still the hold-off, not a fresh v1
    assert fills() == b"0"
    assert Conn(warm.address).call(b"delete user:1\r\n") == b"DELETED"
    assert c.call(b"get user:1\r\n") == b"END"
    assert c.call(b"gets user:1\r\n") == b"END"
    # a key cold never had: the delete answers NOT_FOUND and still leaves a hold-off
    assert Conn(warm.address).call(b"set user:2 0 0 2\r\nv1\r\n") == b"STORED"
    assert c.call(b"delete user:2\r\n") == b"NOT_FOUND"
    assert c.call(b"md user:2 q\r\nmn\r\n") == b"MN"  # HD hidden by q, as memcached does
    assert c.call(b"get user:2\r\n") == b"VALUE user:2 0 2\r\nv1\r\nEND\r\n"
    head = Conn(cold.address).call(b"mg user:2 v\r\n").split(b"\r\n")[0]
    assert head.startswith(b"VA 0 ") and b"X" in head.split(), head
    # after the hold-off the warm-up fills again (a bound, not a timing assertion)
    wait_for(lambda: Conn(cold.address).call(b"mg user:2\r\n") == b"EN", timeout=10, what="hold-off expired")
    assert c.call(b"get user:2\r\n") == b"VALUE user:2 0 2\r\nv1\r\nEND\r\n"
    wait_for(lambda: Conn(cold.address).call(b"mg user:2 v\r\n") == b"VA 2\r\nv1\r\n", what="cold filled")


def test_every_emitted_config_loads(router_factory, tmp_path) -> None:
    topo = rc.load(REPO / "examples/local.toml")
    configs = rc.all_cluster_configs(topo)
    used: set[str] = set()
    for name, config in configs.items():
        path = tmp_path / f"{name}.json"
        path.write_text(rc.render(config))
        router = router_factory(path)  # start-up fails on a rejected config
        assert Conn(router.address).call(b"version\r\n").startswith(b"VERSION")
        used |= rc.handle_types(config)
        router.stop()
        # the emitter writes only fields the router reads (ignored ones are logged as warnings)
        assert "warning" not in router.log_file.read_text(), name
    # every handle the emitter may produce is accepted, including ones local.toml does not use
    synthetic = {
        "pools": {"p": {"servers": ["127.0.0.1:1"]}},
        "route": {
            "type": "PrefixSelectorRoute",
            "policies": {f"{h}:": _minimal(h) for h in sorted(rc.EMITTED_HANDLES)},
            "wildcard": "PoolRoute|p",
        },
    }
    router = router_factory(synthetic)
    assert Conn(router.address).call(b"version\r\n").startswith(b"VERSION")
    log = router.log_file.read_text()
    for h in rc.EMITTED_HANDLES:
        assert h in log, h
    assert used <= rc.EMITTED_HANDLES


def _minimal(handle: str) -> dict:
    leaf = "PoolRoute|p"
    return {
        "PoolRoute": {"type": "PoolRoute", "pool": "p"},
        "PrefixSelectorRoute": {"type": "PrefixSelectorRoute", "policies": {"a": leaf}, "wildcard": leaf},
        "OperationSelectorRoute": {
            "type": "OperationSelectorRoute",
            "operation_policies": {"delete": leaf},
            "default_policy": leaf,
        },
        "AllSyncRoute": {"type": "AllSyncRoute", "children": "Pool|p"},
        "LoadBalancerRoute": {"type": "LoadBalancerRoute", "children": [leaf, leaf], "failover_count": 2},
        "FailoverWithExptimeRoute": {
            "type": "FailoverWithExptimeRoute",
            "normal": leaf,
            "failover": leaf,
            "failover_exptime": 10,
        },
        "WarmUpRoute": {"type": "WarmUpRoute", "cold": leaf, "warm": leaf, "exptime": 60},
        "TransparentLeaseRoute": {"type": "TransparentLeaseRoute", "target": leaf, "lease_ttl": 10, "max_tokens": 5},
    }[handle]


def test_a_server_on_port_0_loads_warned_and_its_requests_fail(memcached_factory, router_factory) -> None:
    # mcrouter's test_probe_timeout reloads to a pool whose only server is localhost:0
    live = memcached_factory()
    router = router_factory(
        {
            "pools": {"zero": {"servers": ["127.0.0.1:0"]}, "live": {"servers": [live.address]}},
            "route": {
                "type": "PrefixSelectorRoute",
                "policies": {"z:": "PoolRoute|zero"},
                "wildcard": "PoolRoute|live",
            },
        }
    )
    assert "server `127.0.0.1:0` has port 0" in router.log_file.read_text()
    c = Conn(router.address)
    assert c.call(b"get z:k\r\n").startswith(b"SERVER_ERROR")
    assert c.call(b"set k 0 0 1\r\nv\r\n") == b"STORED"  # the rest of the config serves


def test_reload_rejects_bad_config_and_applies_good_one(memcached_factory, router_factory) -> None:
    a, b = memcached_factory(), memcached_factory()
    router = router_factory({"pools": {"p": {"servers": [a.address]}}, "route": "PoolRoute|p"})
    path: Path = router.config_path
    c = Conn(router.address)
    assert c.call(b"set k 0 0 1\r\na\r\n") == b"STORED"
    path.write_text('{"pools": {"p": {"servers": ["nonsense"]}}, "route": "PoolRoute|p"}')
    wait_for(lambda: "rejected" in router.log_file.read_text(), what="bad config rejected")
    assert "bad server address" in router.log_file.read_text()
    assert c.call(b"get k\r\n") == b"VALUE k 0 1\r\na\r\nEND\r\n"  # old config still serving
    time.sleep(0.01)
    path.write_text(json.dumps({"pools": {"p": {"servers": [b.address]}}, "route": "PoolRoute|p"}))
    wait_for(lambda: c.call(b"get k\r\n") == b"END", what="new config applied on the same connection")
    assert c.call(b"set k 0 0 1\r\nb\r\n") == b"STORED" and _has(b.address, b"k")


@pytest.mark.parametrize("sig", ["TERM"])
def test_sigterm_exits_cleanly(router_factory, memcached_factory, sig) -> None:
    mc = memcached_factory()
    router = router_factory({"pools": {"p": {"servers": [mc.address]}}, "route": "PoolRoute|p"})
    router.stop(grace=5)
    assert router.proc.returncode == 0
    assert "shutting down" in router.log_file.read_text()
