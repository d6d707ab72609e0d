"""Read latency of a replicated pool with one slow replica: load-aware reads against today's fixed choice.

Three memcached replicas; the first sits behind a second squeal-router whose LatencyInjectionRoute
holds every request for --slow-ms (a slow replica: to the routers measured it is one server that
answers late). Three routers, one per frontend cluster of the pool, each run the route a variant
gives its replicated pool:

- `fixed`: the route router_config emitted before issue 26 — a FailoverRoute over the replicas,
  each cluster's router starting at another one (the rotation), so one cluster reads everything
  from the slow replica;
- `hash`: a PoolRoute over the replicas, the key's Ch3 replica — what LoadBalancerRoute did before,
  and what a real mcrouter does with the emitted config (memcached reports no load);
- `load-aware`: `router_config.replicated_route`, the emitted LoadBalancerRoute, which the router
  steers by the load it measures.

Client threads (--clients, spread evenly over the three routers) send single-key gets for random
keys of the pool, one at a time at a fixed pace (--rate, so that every router is asked as often
however slowly it answers), and time each round trip; the pool's percentiles are over every
read of every router. Reads per replica come from each memcached's `cmd_get`. Ratios are against
`fixed` measured in the same run. Not a test: nothing asserts. Run from the repository root:

    .venv/bin/python bench/router_slow_replica.py [--slow-ms 5] [--seconds 5] [--clients 6] [--rate 200]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import router_config as rc
from ops.harness import Memcached, Router, memcached_command

KEYS = [f"session:{i}".encode() for i in range(1000)]
VALUE = b"v" * 100


def address(text: str) -> rc.Address:
    host, port = text.rsplit(":", 1)
    return rc.Address(host, int(port))


def fixed_route(pool: rc.Pool, rotate: int) -> dict:
    """router_config's replicated-pool route before issue 26: reads fail over in a rotated order."""
    writes = {"type": "AllSyncRoute", "children": f"Pool|{pool.name}"}
    n = len(pool.servers)
    order = [f"PoolRoute|{pool.name}__r{(i + rotate) % n}" for i in range(n)]
    ops = ("set", "add", "replace", "append", "prepend", "cas", "delete", "incr", "decr", "touch")
    return {
        "type": "OperationSelectorRoute",
        "operation_policies": {op: writes for op in ops},
        "default_policy": {"type": "FailoverRoute", "children": order},
    }


def config(variant: str, pool: rc.Pool, rotate: int) -> dict:
    pools = {pool.name: {"servers": [str(s) for s in pool.servers]}}
    for i, s in enumerate(pool.servers):
        pools[f"{pool.name}__r{i}"] = {"servers": [str(s)]}
    if variant == "fixed":
        route = fixed_route(pool, rotate)
    elif variant == "hash":
        route = dict(rc.replicated_route(pool), default_policy=f"PoolRoute|{pool.name}")
    else:
        route = rc.replicated_route(pool)
    return {"pools": pools, "route": route}


def stat(address: str, name: str) -> int:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"stats\r\n")
        out = b""
        while not out.endswith(b"END\r\n"):
            out += s.recv(1 << 16)
    for line in out.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == name:
            return int(parts[2])
    raise KeyError(name)


def reader(port: int, seconds: float, rate: float, seed: int, out: list[float]) -> None:
    """Paced gets (`rate` a second, or right after the last reply when that came later): every
    router is asked as often, however slowly it answers."""
    rng = random.Random(seed)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.monotonic()
        for n in range(int(seconds * rate)):
            pause = start + n / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # a pacer, not a wait for an event
            key = rng.choice(KEYS)
            t0 = time.perf_counter()
            s.sendall(b"get %s\r\n" % key)
            buf = b""
            while not buf.endswith(b"END\r\n"):
                buf += s.recv(4096)
            out.append(time.perf_counter() - t0)
            assert buf.startswith(b"VALUE %s " % key), buf[:80]


def run_variant(variant: str, pool: rc.Pool, replicas: list[Memcached], work: Path, args) -> dict:
    routers = []
    try:
        for rotate in range(3):
            path = work / f"{variant}-{rotate}.json"
            path.write_text(json.dumps(config(variant, pool, rotate)))
            router = Router(path, workdir=work / f"{variant}-{rotate}")
            routers.append(router)
            router.start()
        before = [stat(m.address, "cmd_get") for m in replicas]
        samples: list[list[float]] = [[] for _ in range(args.clients)]
        threads = [
            threading.Thread(target=reader, args=(routers[i % 3].port, args.seconds, args.rate, i, samples[i]))
            for i in range(args.clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reads = [stat(m.address, "cmd_get") - b for m, b in zip(replicas, before, strict=True)]
    finally:
        for r in routers:
            r.stop()
    every = sorted(x for s in samples for x in s)
    q = statistics.quantiles(every, n=1000, method="inclusive")
    return {
        "variant": variant,
        "reads": len(every),
        "reads_per_s": len(every) / args.seconds,
        "p50_ms": q[499] * 1e3,
        "p99_ms": q[989] * 1e3,
        "p999_ms": q[998] * 1e3,
        "slow_replica_share": reads[0] / max(1, sum(reads)),
        "reads_per_replica": reads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slow-ms", type=int, default=5, help="delay of the slow replica")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each variant's run")
    ap.add_argument("--clients", type=int, default=6, help="client threads, spread over the three routers")
    ap.add_argument("--rate", type=float, default=200.0, help="gets a second per client")
    ap.add_argument("--variants", default="fixed,hash,load-aware")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="slow-replica-") as tmp:
        work = Path(tmp)
        replicas = [Memcached(workdir=work / f"mc{i}") for i in range(3)]
        for m in replicas:
            m.start()
        slow_config = work / "slow.json"
        slow_config.write_text(
            json.dumps(
                {
                    "pools": {"m": {"servers": [replicas[0].address]}},
                    "route": {
                        "type": "LatencyInjectionRoute",
                        "child": "PoolRoute|m",
                        "before_latency_ms": args.slow_ms,
                    },
                }
            )
        )
        relay = Router(slow_config, workdir=work / "relay")
        relay.start()
        try:
            pool = rc.Pool(
                "sessions",
                "replicated",
                tuple(address(a) for a in (relay.address, replicas[1].address, replicas[2].address)),
            )
            for m in replicas:  # every replica holds every key, as AllSyncRoute's writes leave them
                memcached_command(
                    ("127.0.0.1", m.port),
                    b"".join(b"set %s 0 0 %d noreply\r\n%s\r\n" % (k, len(VALUE), VALUE) for k in KEYS) + b"mn\r\n",
                )
            results = [run_variant(v, pool, replicas, work, args) for v in args.variants.split(",")]
        finally:
            relay.stop()
            for m in replicas:
                m.stop()
    base = next((r for r in results if r["variant"] == "fixed"), results[0])
    print(
        f"load average {os.getloadavg()[0]:.2f}; slow replica +{args.slow_ms} ms; "
        f"{args.clients} clients x {args.rate:.0f} gets/s"
    )
    heads = ("reads/s", 8), ("p50 ms", 7), ("p99 ms", 7), ("p99.9 ms", 8), ("p99 ratio", 9), ("slow share", 10)
    print(f"{'variant':<11} " + " ".join(f"{h:>{w}}" for h, w in heads))
    for r in results:
        print(
            f"{r['variant']:<11} {r['reads_per_s']:>8.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['p999_ms']:>8.2f} "
            f"{r['p99_ms'] / base['p99_ms']:>9.2f} {r['slow_replica_share']:>10.3f}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
