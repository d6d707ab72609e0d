"""Thundering herd (paper 3.2.1): hot keys under write churn, leases off vs on → peak database query rate.

A few hot authors' feeds (`feed:{author}`, 20 posts of table-3 sizes each) are read by every web server
while one writer posts to them at a fixed rate; each post deletes the feed (the web tier's local delete).
Without leases every reader that misses between a delete and the refill queries the database; with
leases one reader per delete does and the others wait for its fill. Database load is read from MariaDB's
own `Com_select` counter (the read path's only queries), the peak over 0.5 s windows.
Paper: 17K/s peak without leases, 1.3K/s with (13x).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from loadtest.experiments.common import Sampler, Stack, db_selects, final_counts, memcached_command_all, run_locust
from loadtest.experiments.common import topology_doc as make_doc
from loadtest.experiments.report import Report, figure, plot_series
from loadtest.workload import ValueSizes, body

PAPER = "peak DB query rate 17K/s without leases, 1.3K/s with (13x lower)"
HOT_AUTHORS = 4
POSTS_PER_AUTHOR = 20


def run(short: bool = False, workdir: Path | None = None) -> Report:
    users, seconds, churn = (50, 6, 20.0) if short else (100, 30, 40.0)
    work = Path(workdir or tempfile.mkdtemp(prefix="loadtest-herd-"))
    doc = make_doc(1, wildcard=1, gutter=False, regional=False)
    with Stack(doc, squeal=False, workdir=work / "stack") as stack:
        db = stack.sqls()
        sizes = ValueSizes("wildcard")
        rng = random.Random(3)
        authors = list(range(1, HOT_AUTHORS + 1))
        for a in authors:
            for _ in range(POSTS_PER_AUTHOR):
                stack.writer(a).execute(
                    "INSERT INTO posts (author_id, body) VALUES (%s, %s)", (a, body(sizes.size(rng), a))
                )
        cluster = stack.topo.clusters[0]
        runs: dict[str, dict[str, Any]] = {}
        for leases in (False, True):
            memcached_command_all(cluster.wildcard.servers, b"flush_all\r\n")
            spec = stack.spec(
                [cluster.name],
                family="feed",
                ids=authors,
                zipf_s=0.0,
                writer_rate=churn,
                writer_ids=authors,
                leases=leases,
                seed=11,
            )
            with Sampler({"selects": lambda: db_selects(db)}, interval=0.5) as sampler:
                timeline = run_locust(spec, users, seconds, work)
            rates = sampler.rates("selects", timeline[0]["t"])
            counts = final_counts(timeline)
            selects = [r for _, r in rates]
            first, last = sampler.rows[0]["selects"], sampler.rows[-1]["selects"]
            runs["on" if leases else "off"] = {
                "peak_db_queries_per_s": max(selects) if selects else 0.0,
                "db_queries": (last or 0) - (first or 0),
                "loads": counts.get("loads", 0),
                "reads": counts.get("op_read", 0),
                "writes": counts.get("op_churn", 0),
                "hits": counts.get("hits", 0),
                "misses": counts.get("misses", 0),
                "waits": counts.get("waits", 0),
                "wait_exhausted": counts.get("wait_exhausted", 0),
                "errors": counts.get("errors", 0),
                "series": rates,
            }
    off, on = runs["off"], runs["on"]
    for r in (off, on):
        r["loads_per_write"] = r["loads"] / r["writes"] if r["writes"] else float("nan")
    ratio_peak = off["peak_db_queries_per_s"] / max(on["peak_db_queries_per_s"], 1e-9)
    ratio_total = off["db_queries"] / max(on["db_queries"], 1)
    # The writer keeps its rate only while the locust process has CPU to spare; per write is the fair ratio.
    ratio_per_write = off["loads_per_write"] / max(on["loads_per_write"], 1e-9)
    table = [
        ["leases", "peak DB q/s", "DB queries", "loads/write", "requests", "hit rate", "waits"],
        *[
            [
                name,
                r["peak_db_queries_per_s"],
                r["db_queries"],
                r["loads_per_write"],
                r["hits"] + r["misses"],
                r["hits"] / max(1, r["hits"] + r["misses"]),
                r["waits"],
            ]
            for name, r in (("off", off), ("on", on))
        ],
        ["off/on", ratio_peak, ratio_total, ratio_per_write, "", "", ""],
    ]
    fig, axes = figure(title=f"herd: {users} web servers, {HOT_AUTHORS} hot keys, {churn:.0f} writes/s")
    ax = axes[0][0]
    plot_series(ax, off["series"], "leases off", color="tab:red")
    plot_series(ax, on["series"], "leases on", color="tab:green")
    ax.set_xlabel("seconds")
    ax.set_ylabel("database queries / s")
    ax.set_yscale("symlog", linthresh=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return Report(
        name="herd",
        paper=PAPER,
        short=short,
        table=table,
        results={
            "users": users,
            "seconds": seconds,
            "writes_per_s": churn,
            "hot_keys": HOT_AUTHORS,
            "off": {k: v for k, v in off.items() if k != "series"},
            "on": {k: v for k, v in on.items() if k != "series"},
            "peak_ratio": ratio_peak,
            "total_ratio": ratio_total,
            "per_write_ratio": ratio_per_write,
        },
        series={"off": off["series"], "on": on["series"]},
        figure=fig,
    )


def check(report: Report) -> list[str]:
    """The effect's direction: leases cut the hot keys' database queries per write at least 3x, and the peak.

    With leases it is about one query per write whatever the machine; without, the herd is however many
    readers miss between a delete and the refill, which on this 2-core box swings with what else runs
    (6.3 loads per write in docs/experiments.md, 4.0-4.6 in later runs once squeal's reader took less CPU):
    3x is the floor the effect has always cleared, 5x was not."""
    r = report.results
    problems = []
    if r["on"]["writes"] < 5:
        problems.append(f"too few churn writes to judge ({r['on']['writes']})")
    if r["per_write_ratio"] < 3:
        problems.append(f"leases cut database queries per write only {r['per_write_ratio']:.1f}x (want >= 3x)")
    if r["peak_ratio"] < 3:
        problems.append(f"leases cut the peak query rate only {r['peak_ratio']:.1f}x (want >= 3x)")
    return problems
