"""Delete batching (paper 4.1): squeal's deletes per packet and the destination's CPU, batched vs unbatched.

Web servers in cluster east-a write posts as fast as they can (each UPDATE invalidates `post:{id}` and
`feed:{author}` through the rules and the embedded mcd comment); squeal follows the binlog and sends the
deletes to every cluster's router. Cluster east-b takes no web traffic, so everything its router does is
squeal's deletes: its CPU time per delete is the per-destination cost. The same load runs twice, with the
topology's `batch_size` (256) and with `batch_size = 1` (one delete per write: no batching).
Deletes per packet = squeal_deletes_sent_total / squeal_delete_writes_total of the flow (one socket write
per batch), and the median from the squeal_deletes_per_write histogram.
Paper: batching gave an 18x improvement in the median number of deletes per packet.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

import router_config
from loadtest.experiments.common import LocustRun, Stack, flow_value, scrape, topology_doc
from loadtest.experiments.report import Report, figure
from loadtest.workload import seed_posts
from ops.harness import SquealDaemon, free_port, wait_until

PAPER = "18x more deletes per packet (median) with batching"
DESTINATION = "east-b"  # the cluster without web traffic


def histogram_median(metrics: dict[str, float], flow: str) -> float:
    """Median deletes per write from the cumulative buckets of squeal_deletes_per_write (upper bound)."""
    buckets = []
    for k, v in metrics.items():
        if k.startswith("squeal_deletes_per_write_bucket{") and f'flow="{flow}"' in k:
            le = k.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), v))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    half = buckets[-1][1] / 2
    return next(le for le, count in buckets if count >= half)


def _delta_histogram(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if k.startswith("squeal_deletes_per_write_bucket")}


def _wait_caught_up(port: int, flows: list[str], timeout: float) -> None:
    """Until every flow's backlog is 0 three scrapes in a row (the binlog may still be arriving); at most
    `timeout` s, then the run goes on (its counters say how far squeal got)."""
    zero = 0

    def settled() -> bool:
        nonlocal zero
        m = scrape(port)
        zero = zero + 1 if all(flow_value(m, "squeal_flow_backlog", f) == 0 for f in flows) else 0
        return zero >= 3

    wait_until(settled, timeout, "every flow's backlog at 0", interval=0.3, ignore=(), error=None)


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def run(short: bool = False, workdir: Path | None = None) -> Report:
    users, seconds = (16, 5) if short else (40, 30)
    work = Path(workdir or tempfile.mkdtemp(prefix="loadtest-batching-"))
    doc = topology_doc(2, wildcard=2, gutter=False, regional=False)
    phases: dict[str, dict[str, Any]] = {}
    with Stack(doc, squeal=False, workdir=work / "stack") as stack:
        ids = seed_posts(stack.writer, 300 if short else 2000)
        dest = stack.topo.cluster(DESTINATION)
        router_pids = [stack.pid_of(str(a)) for a in dest.routers]
        memcached_pids = [stack.pid_of(str(a)) for p in dest.pools for a in p.servers]
        flows = [c.name for c in stack.topo.clusters]
        for label, batch_size in (("batched", stack.topo.squeal.batch_size), ("unbatched", 1)):
            topo = replace(stack.topo, squeal=replace(stack.topo.squeal, batch_size=batch_size))
            path = work / f"topology-{label}.toml"
            path.write_text(router_config.dumps(topo))
            daemon = SquealDaemon(path, topo.master.name, port=free_port(), workdir=work / f"squeal-{label}").start()
            try:
                before = scrape(daemon.port)
                cpu0, mc0 = _cpu(router_pids), _cpu(memcached_pids)
                spec = stack.spec(["east-a"], family="post", ids=ids, write_ratio=1.0, seed=5)
                run_ = LocustRun(spec, users, seconds, work).start()
                try:
                    timeline = run_.wait()
                finally:
                    run_.stop()
                _wait_caught_up(daemon.port, flows, timeout=60)
                after = scrape(daemon.port)
                cpu1, mc1 = _cpu(router_pids), _cpu(memcached_pids)
            finally:
                daemon.stop()
            deletes = flow_value(after, "squeal_deletes_sent_total", DESTINATION) - flow_value(
                before, "squeal_deletes_sent_total", DESTINATION
            )
            writes = flow_value(after, "squeal_delete_writes_total", DESTINATION) - flow_value(
                before, "squeal_delete_writes_total", DESTINATION
            )
            hist = _delta_histogram(after, before)
            phases[label] = {
                "batch_size": batch_size,
                "transactions": timeline[-1]["clusters"].get("east-a", {}).get("op_write", 0),
                "deletes": deletes,
                "packets": writes,
                "deletes_per_packet": deletes / writes if writes else float("nan"),
                "median_deletes_per_packet": histogram_median(hist, DESTINATION),
                "router_cpu_us_per_delete": (cpu1 - cpu0) / deletes * 1e6 if deletes else float("nan"),
                "memcached_cpu_us_per_delete": (mc1 - mc0) / deletes * 1e6 if deletes else float("nan"),
                "histogram": {
                    k.split('le="', 1)[1].split('"', 1)[0]: v for k, v in hist.items() if f'flow="{DESTINATION}"' in k
                },
            }
    b, u = phases["batched"], phases["unbatched"]
    ratio = b["deletes_per_packet"] / u["deletes_per_packet"] if u["deletes_per_packet"] else float("nan")
    cpu_ratio = u["router_cpu_us_per_delete"] / b["router_cpu_us_per_delete"] if b["deletes"] else float("nan")
    table = [
        [
            "squeal",
            "writes (tx)",
            "deletes",
            "packets",
            "deletes/packet",
            "median",
            "router µs/delete",
            "memcached µs/delete",
        ],
        *[
            [
                name,
                p["transactions"],
                p["deletes"],
                p["packets"],
                p["deletes_per_packet"],
                p["median_deletes_per_packet"],
                p["router_cpu_us_per_delete"],
                p["memcached_cpu_us_per_delete"],
            ]
            for name, p in (("batched (256)", b), ("unbatched (1)", u))
        ],
        ["batched/unbatched", "", "", "", ratio, "", f"{cpu_ratio:.1f}x less", ""],
    ]
    fig, axes = figure(1, 2, title=f"batching: squeal → {DESTINATION}'s router, {users} writers")
    ax = axes[0][0]
    ax.bar(["batched", "unbatched"], [b["deletes_per_packet"], u["deletes_per_packet"]], color=["tab:green", "tab:red"])
    ax.set_ylabel("deletes per packet (mean)")
    ax2 = axes[0][1]
    ax2.bar(
        ["batched", "unbatched"],
        [b["router_cpu_us_per_delete"], u["router_cpu_us_per_delete"]],
        color=["tab:green", "tab:red"],
    )
    ax2.set_ylabel("router CPU µs per delete")
    fig.tight_layout()
    return Report(
        name="batching",
        paper=PAPER,
        short=short,
        table=table,
        results={
            "users": users,
            "seconds": seconds,
            "batched": b,
            "unbatched": u,
            "ratio": ratio,
            "router_cpu_ratio": cpu_ratio,
        },
        figure=fig,
    )


def check(report: Report) -> list[str]:
    """Direction: batching packs several times more deletes per packet and costs the router less per delete."""
    r = report.results
    problems = []
    if r["unbatched"]["deletes"] < 50 or r["batched"]["deletes"] < 50:
        problems.append(f"too few deletes to judge ({r['batched']['deletes']:.0f}, {r['unbatched']['deletes']:.0f})")
    if not r["ratio"] >= 4:
        problems.append(f"batching packed only {r['ratio']:.1f}x more deletes per packet (want >= 4x)")
    if not r["router_cpu_ratio"] > 1:
        problems.append(f"the router spent no less CPU per delete with batching ({r['router_cpu_ratio']:.2f}x)")
    return problems
