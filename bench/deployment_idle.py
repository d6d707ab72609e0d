"""What a running `squealctl up` deployment costs at rest (not a test: prints a table for docs/benchmarks.md).

    .venv/bin/squealctl --state-dir DIR up examples/sharded.toml        # no --demo: idle
    .venv/bin/python bench/deployment_idle.py --state-dir DIR [--seconds 30]

Samples every component `squealctl status` lists (and the supervisor) over `--seconds`: CPU (all threads, user +
system) as a share of one core, and RSS at the end, summed by role, with the totals and the box's core count.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import psutil

from ops.local import Deployment


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", required=True, help="the deployment's state dir (squealctl --state-dir)")
    p.add_argument("--seconds", type=float, default=30.0, help="sampling window (default %(default)s)")
    args = p.parse_args()
    deployment = Deployment(args.state_dir)
    rows = [r for r in deployment.status() if r["running"]]
    supervisor = deployment.supervisor_status()
    procs: dict[str, tuple[str, psutil.Process]] = {}
    for r in rows:
        procs[r["name"]] = (r["role"], psutil.Process(r["pid"]))
    if supervisor and supervisor.get("running"):
        procs["supervisor"] = ("supervisor", psutil.Process(supervisor["pid"]))
    start = {name: sum(proc.cpu_times()[:2]) for name, (_, proc) in procs.items()}
    t0 = time.monotonic()
    time.sleep(args.seconds)
    wall = time.monotonic() - t0
    cpu: dict[str, float] = defaultdict(float)
    rss: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for name, (role, proc) in procs.items():
        try:
            cpu[role] += (sum(proc.cpu_times()[:2]) - start[name]) / wall
            rss[role] += proc.memory_info().rss / 2**20
            count[role] += 1
        except psutil.NoSuchProcess:
            print(f"{name} exited during the window", file=sys.stderr)
    print(f"# {len(procs)} processes, {wall:.0f} s window, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}\n")
    print("| role | processes | CPU (share of one core) | RSS MB |")
    print("|---|---:|---:|---:|")
    for role in sorted(cpu, key=lambda r: -cpu[r]):
        print(f"| {role} | {count[role]} | {cpu[role]:.3f} | {rss[role]:.0f} |")
    print(f"| **total** | {sum(count.values())} | {sum(cpu.values()):.3f} | {sum(rss.values()):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
