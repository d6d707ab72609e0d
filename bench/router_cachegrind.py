"""User-space instructions per request of squeal-router builds, under valgrind's cachegrind.

Wall-clock ratios (bench/router_bench.py) swing by +-30% when other work loads this 2-core box;
instruction counts do not depend on load, so they compare two builds of the router where the
wall clock cannot. For each build (NAME=BINARY, e.g. the build before a change and after it) this
starts the router under `valgrind --tool=cachegrind --cache-sim=no` in front of one memcached
holding the bench's 1,000 keys, drives it with router/examples/loadgen.rs for each cell, stops it
with SIGTERM and reads the process's total instructions (Ir). One idle run per build (start, one
`version`, stop) is subtracted, so start-up and shutdown do not count:

    Ir/request = (Ir of the loaded run - Ir of the idle run) / requests answered

Only user space is counted (the kernel's share of the router's CPU, ~89% at depth 1, is not), and
at depth > 1 the figure still moves by a percent or two with how replies happen to batch. Not a
test: nothing asserts. Run from the repository root:

    .venv/bin/python bench/router_cachegrind.py before=/path/to/old/squeal-router \\
        after=router/target/release/squeal-router [--seconds 4] [--routes plain,leases] [--cells 10x32x32]

`--routes leases` puts a TransparentLeaseRoute in front of the pool (issue 34's "leases on"): with
`--routes plain,leases` each build is measured both ways, so the ratio leases/plain is per build.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.router_bench import KEYS, LOADGEN, VALUE, build_examples, loadgen_command
from ops.harness import Memcached, free_port, memcached_command, wait_until

# (keys per get, connections, pipeline depth): the cells docs/benchmarks.md reports
CELLS = [(1, 2, 1), (1, 2, 8), (1, 32, 32), (10, 32, 8)]


def total_ir(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary line in {path}")


# the route in front of the pool, by --routes name
ROUTES = {
    "plain": "PoolRoute|p",
    "leases": {"type": "TransparentLeaseRoute", "target": "PoolRoute|p", "lease_ttl": 10},
}


def measure(
    binary: str, backend: str, work: Path, cell: tuple[int, int, int] | None, seconds: float, route: str = "plain"
) -> tuple[int, int]:
    """(Ir of one router run, requests answered in it); `cell` None: the idle run."""
    port = free_port()
    config = work / "router.json"
    config.write_text(json.dumps({"pools": {"p": {"servers": [backend]}}, "route": ROUTES[route]}))
    out = work / f"cachegrind.out.{port}"
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            f"--cachegrind-out-file={out}",
            binary,
            "--config-file",
            str(config),
            "-p",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: memcached_command(("127.0.0.1", port), b"version\r\n").startswith(b"VERSION"),
            60,
            "router under valgrind",
            proc,
        )
        requests = 0
        if cell is not None:
            keys, conns, depth = cell
            done = subprocess.run(
                loadgen_command(port, keys, depth, conns, seconds),
                check=True,
                capture_output=True,
                text=True,
            )
            requests = json.loads(done.stdout)["requests"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return total_ir(out), requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", metavar="NAME=BINARY", help="router builds to measure, in this order")
    ap.add_argument("--seconds", type=float, default=4.0, help="load per cell (under valgrind: ~50x slower)")
    ap.add_argument("--routes", default="plain", help=f"comma-separated, of {', '.join(ROUTES)} (default: plain)")
    ap.add_argument(
        "--cells",
        help="comma-separated KEYSxCONNSxDEPTH cells (default: " + ",".join("x".join(map(str, c)) for c in CELLS) + ")",
    )
    args = ap.parse_args()
    routes = args.routes.split(",")
    if unknown := [r for r in routes if r not in ROUTES]:
        ap.error(f"unknown route {unknown[0]!r}: one of {', '.join(ROUTES)}")
    try:
        cells = [tuple(int(n) for n in c.split("x")) for c in args.cells.split(",")] if args.cells else CELLS
    except ValueError:
        ap.error(f"--cells {args.cells!r}: each cell is KEYSxCONNSxDEPTH, e.g. 10x32x32")
    if any(len(c) != 3 for c in cells):
        ap.error(f"--cells {args.cells!r}: each cell is KEYSxCONNSxDEPTH, e.g. 10x32x32")
    builds = [b.split("=", 1) for b in args.builds]
    if any(len(b) != 2 for b in builds):
        ap.error("builds are NAME=BINARY")
    if not LOADGEN.exists():
        build_examples()
    work = Path(tempfile.mkdtemp(prefix="router-cachegrind-"))
    mc = Memcached(workdir=work).start()
    try:
        with socket.create_connection(("127.0.0.1", mc.port)) as s:
            for key in KEYS:
                s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(VALUE), VALUE))
                assert s.recv(100) == b"STORED\r\n"
        rows = {}
        columns = [(name, binary, route) for name, binary in builds for route in routes]
        for name, binary, route in columns:
            label = name if len(routes) == 1 else f"{name} {route}"
            idle, _ = measure(binary, mc.address, work, None, args.seconds, route)
            print(f"{label}: idle run (start, one version, stop) {idle:,} Ir", flush=True)
            for cell in cells:
                ir, n = measure(binary, mc.address, work, cell, args.seconds, route)
                rows[(cell, label)] = (ir - idle) / n
                print(
                    f"{label}: keys {cell[0]}, {cell[1]} conns, depth {cell[2]}: {n} requests, "
                    f"{rows[(cell, label)]:,.0f} Ir/request",
                    flush=True,
                )
        labels = [name if len(routes) == 1 else f"{name} {route}" for name, _, route in columns]
        print("\n| keys/req | conns | depth | " + " | ".join(f"{n} Ir/req" for n in labels) + " |")
        print("|---|---|---|" + "---|" * len(labels))
        for cell in cells:
            print(
                f"| {cell[0]} | {cell[1]} | {cell[2]} | " + " | ".join(f"{rows[(cell, n)]:,.0f}" for n in labels) + " |"
            )
    finally:
        mc.stop()


if __name__ == "__main__":
    main()
