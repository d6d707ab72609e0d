"""What transparent leases cost the router: the same load through squeal-router with and without a
TransparentLeaseRoute in front of the pool, one memcached behind both routers, in the same run.

Every get is a hit (the keys are set first), the common case: with leases each key goes down as
`mg KEY v f c N<ttl>` and its `VA` is turned back into a `VALUE` block, instead of passing the `get` through.
Reports per cell (keys per request, connections, pipeline depth) the router's CPU per request with leases
over without (target: <= 1.15x) and p50/p99 round trips. Medians over `--rounds`; memcached pinned to one
CPU, generator and router to the other (as router_bench.py does). Not a test: run by hand, record the
table in docs/benchmarks.md.

    .venv/bin/python bench/router_leases.py [--seconds 3] [--depths 1,8,32] [--conns 2,32] [--keys 1,10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from router_bench import KEYS, VALUE, build_examples, cpu_seconds, pin, run_load

from ops.harness import Memcached, Router


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--depths", default="1,8,32")
    ap.add_argument("--conns", default="2,32")
    ap.add_argument("--keys", default="1,10")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("router_leases: pinning needs 2 CPUs")
    build_examples()
    work = Path(tempfile.mkdtemp(prefix="router-leases-"))
    mc = Memcached(workdir=work, memory_mb=256).start()
    plain_cfg, lease_cfg = work / "plain.json", work / "leases.json"
    pools = {"p": {"servers": [mc.address]}}
    plain_cfg.write_text(json.dumps({"pools": pools, "route": "PoolRoute|p"}))
    lease_route = {"type": "TransparentLeaseRoute", "target": "PoolRoute|p", "lease_ttl": 10}
    lease_cfg.write_text(json.dumps({"pools": pools, "route": lease_route}))
    (work / "plain").mkdir()
    (work / "leases").mkdir()
    routers = {
        "plain": Router(plain_cfg, workdir=work / "plain").start(),
        "leases": Router(lease_cfg, workdir=work / "leases").start(),
    }
    server_cpu, client_cpu = sorted(os.sched_getaffinity(0))[:2]
    pin(mc.pid, server_cpu)
    cells = [
        (int(k), int(c), int(d))
        for k in args.keys.split(",")
        for c in args.conns.split(",")
        for d in args.depths.split(",")
    ]
    results: dict[tuple, list[dict]] = {}
    try:
        s = socket.create_connection(("127.0.0.1", mc.port))
        s.sendall(b"".join(b"set %s 0 0 %d noreply\r\n%s\r\n" % (k, len(VALUE), VALUE) for k in KEYS) + b"mn\r\n")
        while not s.recv(100).endswith(b"MN\r\n"):
            pass
        for multi, conns, depth in cells:
            for _ in range(args.rounds):
                for name, router in routers.items():
                    pin(router.pid, client_cpu)
                    before = cpu_seconds(router.pid)
                    r = run_load(router.port, multi, depth, conns, args.seconds, 1, client_cpu)
                    r["cpu_us"] = (cpu_seconds(router.pid) - before) / r["requests"] * 1e6
                    results.setdefault((name, multi, conns, depth), []).append(r)
                    print(
                        f"{name:7s} keys={multi:2d} conns={conns:3d} depth={depth:3d} req/s={r['rps']:9.0f} "
                        f"p99={r['p99_ms']:.3f}ms router_cpu={r['cpu_us']:.2f}us",
                        flush=True,
                    )
    finally:
        for router in routers.values():
            router.stop()
        mc.stop()

    def med(name: str, cell: tuple, field: str) -> float:
        return statistics.median(r[field] for r in results[(name, *cell)])

    print(
        "\n| keys/req | conns | depth | req/s (plain / leases) | router CPU µs/req (plain / leases) | ratio "
        "| p50 ms (plain / leases) | p99 ms (plain / leases) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for cell in cells:
        p, lease = med("plain", cell, "cpu_us"), med("leases", cell, "cpu_us")
        print(
            f"| {cell[0]} | {cell[1]} | {cell[2]} | {med('plain', cell, 'rps'):.0f} / {med('leases', cell, 'rps'):.0f} "
            f"| {p:.2f} / {lease:.2f} | {lease / p:.2f}x "
            f"| {med('plain', cell, 'p50_ms'):.3f} / {med('leases', cell, 'p50_ms'):.3f} "
            f"| {med('plain', cell, 'p99_ms'):.3f} / {med('leases', cell, 'p99_ms'):.3f} |"
        )


if __name__ == "__main__":
    main()
