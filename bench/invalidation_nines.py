"""How many nines of invalidations land within 1 s, per region (paper 7.3: four nines in the master region).

Brings the example topology up on free ports (`squealctl up`, everything real), runs the canary prober
back to back for `--probes` probes with an optional background write load (the demo web tier), and prints
per cluster: probes, p50/p99/max latency, and the share under 1 s. Not a test: run it by hand and record
the table in docs/benchmarks.md.

    .venv/bin/python bench/invalidation_nines.py --probes 2000 --demo
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import router_config
from monitoring.prober import Prober
from ops.harness import free_port

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local.toml"


def squealctl(state: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(state), *args], check=True, stdout=subprocess.DEVNULL
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", type=int, default=1000)
    p.add_argument("--demo", action="store_true", help="run the demo web tier as background load")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="squeal-nines-"))
    topo = router_config.reassign_ports(router_config.load(EXAMPLE), free_port)
    topo_file = base / "local.toml"
    topo_file.write_text(router_config.dumps(topo))
    state = base / "state"
    # The dashboard's own prober would share the canary rows; this script runs the only one.
    squealctl(state, "up", str(topo_file), "--without", "monitoring", *(["--demo"] if args.demo else []))
    try:
        prober = Prober(topo, deadline=10.0)
        prober.ensure_canary_table()
        samples: dict[str, list[float]] = {c.name: [] for c in topo.clusters}
        missed = {c.name: 0 for c in topo.clusters}
        for i in range(args.probes):
            for cluster, latency in prober.probe_once().latencies.items():
                if latency is None:
                    missed[cluster] += 1
                else:
                    samples[cluster].append(latency)
            if (i + 1) % 250 == 0:
                print(f"  {i + 1} probes", file=sys.stderr)
    finally:
        squealctl(state, "down")
    print("| cluster | region | probes | p50 | p99 | max | under 1 s | missed (>10 s) |")
    print("|---|---|---|---|---|---|---|---|")
    for cluster in topo.clusters:
        xs = sorted(samples[cluster.name])
        n = len(xs) + missed[cluster.name]
        under = sum(1 for x in xs if x < 1.0)
        p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))]
        role = "master" if cluster.region == topo.master.name else "replica"
        print(
            f"| {cluster.name} | {cluster.region} ({role}) | {n} | {statistics.median(xs) * 1000:.1f} ms | "
            f"{p99 * 1000:.1f} ms | {xs[-1] * 1000:.1f} ms | {under / n:.4%} | {missed[cluster.name]} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
