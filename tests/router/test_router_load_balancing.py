"""Load-aware spreading (issue 26 item 5): reads of a replicated pool, through the route the emitter
writes for it (`router_config.replicated_route`: a LoadBalancerRoute over the replicas), go less to
a replica that answers slowly, and every read still gets the value written.

The slow replica is a real memcached behind a second squeal-router whose LatencyInjectionRoute holds
every request for SLOW_MS: to the router under test it is one server that answers late, which is
what the router measures (docs/router.md, "Load-aware spreading"). Reads per replica are counted by
each memcached itself (`cmd_get`); nothing here is timed (what the choice saves in latency is
measured by bench/router_slow_replica.py)."""

from __future__ import annotations

import threading

import router_config as rc
from tests.router.conftest import Conn

SLOW_MS = 50
KEYS = [b"session:%d" % i for i in range(300)]
READERS = 4
ROUNDS = 120  # per reader: ROUNDS pipelined batches of BATCH gets
BATCH = 5


def stat(address: str, name: str) -> int:
    c = Conn(address)
    c.send(b"stats\r\n")
    found = None
    while (line := c.line()) != b"END":
        parts = line.split()
        if parts[1] == name.encode():
            found = int(parts[2])
    c.close()
    assert found is not None, (address, name)
    return found


def value(key: bytes) -> bytes:
    return b"v-" + key


def address(text: str) -> rc.Address:
    host, port = text.rsplit(":", 1)
    return rc.Address(host, int(port))


def test_a_slow_replica_gets_fewer_reads_and_nothing_is_lost(memcached_factory, router_factory) -> None:
    slow, fast1, fast2 = (memcached_factory() for _ in range(3))
    relay = router_factory(
        {
            "pools": {"slow": {"servers": [slow.address]}},
            "route": {"type": "LatencyInjectionRoute", "child": "PoolRoute|slow", "before_latency_ms": SLOW_MS},
        }
    )
    pool = rc.Pool("replicas", "replicated", tuple(address(a) for a in (relay.address, fast1.address, fast2.address)))
    router = router_factory(
        {"pools": {"replicas": {"servers": [str(s) for s in pool.servers]}}, "route": rc.replicated_route(pool)}
    )

    # writes reach every replica (AllSyncRoute), the slow one too
    c = Conn(router.address)
    c.send(b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (k, len(value(k)), value(k)) for k in KEYS))
    assert [c.line() for _ in KEYS] == [b"STORED"] * len(KEYS)
    replicas = {"slow": slow, "fast1": fast1, "fast2": fast2}
    before = {name: stat(mc.address, "cmd_get") for name, mc in replicas.items()}

    wrong: list[tuple[bytes, bytes]] = []
    asked = [0] * READERS

    def read(n: int) -> None:
        conn = Conn(router.address)
        for r in range(ROUNDS):
            keys = [KEYS[(n * 7919 + r * BATCH + i) % len(KEYS)] for i in range(BATCH)]
            if n == 0:  # one multi-key get: batched per replica by the router
                replies = [conn.call(b"get " + b" ".join(keys) + b"\r\n")]
                wanted = [
                    b"".join(b"VALUE %s 0 %d\r\n%s\r\n" % (k, len(value(k)), value(k)) for k in keys) + b"END\r\n"
                ]
            else:  # pipelined single-key gets
                conn.send(b"".join(b"get %s\r\n" % k for k in keys))
                replies = [conn.reply() for _ in keys]
                wanted = [b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (k, len(value(k)), value(k)) for k in keys]
            asked[n] += len(keys)
            wrong.extend((got, want) for got, want in zip(replies, wanted, strict=True) if got != want)
        conn.close()

    threads = [threading.Thread(target=read, args=(n,)) for n in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []

    reads = {name: stat(mc.address, "cmd_get") - before[name] for name, mc in replicas.items()}
    total = sum(asked)
    # every key was read once from exactly one replica (no error, so no failover)
    assert sum(reads.values()) == total, (reads, total)
    # by the key alone each replica would get about a third; the slow one gets far fewer
    assert reads["slow"] * 5 < min(reads["fast1"], reads["fast2"]), reads
    assert min(reads["fast1"], reads["fast2"]) > total // 4, reads

    # deletes still reach every replica, the slow one too
    c.send(b"".join(b"delete %s\r\n" % k for k in KEYS))
    assert [c.line() for _ in KEYS] == [b"DELETED"] * len(KEYS)
    for mc in replicas.values():
        direct = Conn(mc.address)
        assert [direct.call(b"mg %s v\r\n" % k) for k in KEYS[::37]] == [b"EN"] * len(KEYS[::37]), mc.address
