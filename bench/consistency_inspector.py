"""The consistency inspector's nines within 100 ms, 1 s and 10 s on the demo topology, and what it costs.

Brings examples/local.toml up on free ports (`squealctl up --demo`, everything real) with the inspector's first
window at 100 ms, adds a write load of its own (renames of the demo's users at the master, `--writes` per second,
so the sample grows faster than the demo's 10 % writes), waits `--seconds`, and prints per region the checks,
inconsistencies and nines per window, the changes sampled, and the monitoring server's CPU seconds per sampled
change (the process also scrapes and probes: an upper bound). Baseline in the same run: the same process's CPU
over an equal span with the inspector idle is not separable, so the figure is reported as measured, beside the
one binlog connection per shard the inspector adds. Not a test: run it by hand, record the table in
docs/benchmarks.md.

    .venv/bin/python bench/consistency_inspector.py --seconds 300 --writes 200 [--drill]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import router_config
from loadtest.webtier import WebServer
from ops.harness import free_port

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local.toml"


def squealctl(state: Path, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(state), *args], check=True, capture_output=True, text=True
    ).stdout


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=120.0, help="how long to measure (default %(default)s)")
    p.add_argument("--writes", type=float, default=100.0, help="extra renames per second (default %(default)s)")
    p.add_argument(
        "--drill",
        action="store_true",
        help="run `squealctl drill --no-verify` (kill -9 of squeal, a router, a memcached; a router paused; the "
        "replica restarted and stalled) a third into the span, and report the nines from the drill on too",
    )
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sq-nines-"))
    topo = router_config.reassign_ports(router_config.load(EXAMPLE), free_port)
    topo = dataclasses.replace(topo, monitoring=dataclasses.replace(topo.monitoring, consistency_check_after=0.1))
    topo_file = base / "local.toml"
    topo_file.write_text(router_config.dumps(topo))
    state = base / "s"
    squealctl(state, "up", str(topo_file), "--demo")
    stop = threading.Event()
    try:
        status = {r["name"]: r for r in json.loads(squealctl(state, "status", "--json"))}
        pid = int(status["monitoring"]["pid"])

        def write() -> None:
            web = WebServer(topo, topo.master.name)
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                i += 1
                web.update_user(1 + i % 200, name=f"bench-{i}")
                stop.wait(max(0.0, 1 / args.writes - (time.monotonic() - started)))
            web.close()

        writer = threading.Thread(target=write, daemon=True)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        writer.start()
        drill_started = drill_span = None
        if args.drill:
            time.sleep(args.seconds / 3)
            drill_started = time.time()
            print(squealctl(state, "drill", "--no-verify"), end="", file=sys.stderr)
            drill_span = time.time() - drill_started
            time.sleep(max(0.0, args.seconds - (time.monotonic() - t0)))
        else:
            time.sleep(args.seconds)
        stop.set()
        writer.join(5)
        time.sleep(11)  # the 10 s checks of the last changes
        cpu = cpu_seconds(pid) - cpu0
        span = time.monotonic() - t0
        url = f"http://{topo.monitoring.host}:{topo.monitoring.port}"
        with urllib.request.urlopen(f"{url}/api/consistency?since={span + 60:g}", timeout=10) as r:
            reports = [("whole run", json.loads(r.read()))]
        if drill_started is not None:  # (minute buckets: from the minute the drill began)
            with urllib.request.urlopen(f"{url}/api/consistency?since={time.time() - drill_started:g}") as r:
                reports.append((f"from the drill on ({drill_span:.0f} s of faults)", json.loads(r.read())))
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        stop.set()
        squealctl(state, "down")
    sampled = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("squeal_consistency_sampled_total")
    )
    print(
        f"{span:.0f} s, {sampled:.0f} sampled changes, monitoring server CPU {cpu:.1f} s "
        f"({cpu / max(sampled, 1) * 1e6:.0f} µs per sampled change, all of its work included)"
    )
    print("| span | region | window | checks | inconsistent | consistent | nines |")
    print("|---|---|---|---|---|---|---|")
    for what, report in reports:
        for region, doc in report["regions"].items():
            for window in ("100ms", "1s", "10s"):
                f = doc["windows"].get(window)
                if not f or not f["checked"]:
                    continue
                shown = f"≥ {f['nines_at_least']:.1f} (none)" if f["nines"] is None else f"{f['nines']:.2f}"
                ratio = f"{f['ratio'] * 100:.4f} %"
                print(f"| {what} | {region} | {window} | {f['checked']} | {f['inconsistent']} | {ratio} | {shown} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
