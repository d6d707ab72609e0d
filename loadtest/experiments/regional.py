"""Regional pools (paper 4.2): one item family replicated in every cluster vs one regional copy.

Three frontend clusters of one region read the same family of large, rarely changed items (posts whose
sizes follow table 3's regional pool: median 5.3 KB, p95 158 KB, capped at the TEXT column's 60 KB),
Zipf-distributed, web servers spread evenly over the clusters. Arm 1 caches them as `post:{id}` in each
cluster's wildcard pool (a copy per cluster); arm 2 as `regional:post:{id}`, which every cluster's router
sends to the region's shared pool (one copy). Both arms start from empty caches. Measured: memcached's
own `bytes` and `curr_items` summed over the servers holding the family, and the web servers' hit rate.
Paper: regionalising item family B (25% of each cluster's wildcard pool) gave "significant storage
efficiencies"; it suits items that are large and rarely accessed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from loadtest.experiments.common import LocustRun, Stack, final_counts, memcached_command_all, memcached_stats
from loadtest.experiments.common import topology_doc as make_doc
from loadtest.experiments.report import Report, figure
from loadtest.workload import seed_posts

PAPER = "one regional copy instead of one per cluster: family B would take 25% of each cluster's wildcard pool"
CLUSTERS = 3


def _memory(servers: list[Any]) -> dict[str, float]:
    total = {"bytes": 0.0, "curr_items": 0.0}
    for a in servers:
        s = memcached_stats(str(a))
        for k in total:
            total[k] += s.get(k, 0.0)
    return total


def run(short: bool = False, workdir: Path | None = None) -> Report:
    users, seconds = (18, 6) if short else (45, 40)
    posts = 300 if short else 1500
    work = Path(workdir or tempfile.mkdtemp(prefix="loadtest-regional-"))
    doc = make_doc(CLUSTERS, wildcard=1, gutter=False, regional=True)
    arms: dict[str, dict[str, Any]] = {}
    with Stack(doc, squeal=False, workdir=work / "stack") as stack:
        ids = seed_posts(stack.writer, posts, pool="regional")
        topo = stack.topo
        clusters = [c.name for c in topo.clusters]
        wildcard = [a for c in topo.clusters for a in c.wildcard.servers]
        regional = list(topo.master.regional_pool.servers) if topo.master.regional_pool else []
        for arm, family, servers in (
            ("replicated per cluster", "post", wildcard),
            ("regional pool", "regional", regional),
        ):
            memcached_command_all(wildcard + regional, b"flush_all\r\n")
            spec = stack.spec(clusters, family=family, ids=ids, value_pool="regional", seed=31)
            timeline = LocustRun(spec, users, seconds, work).start().wait()
            counts = final_counts(timeline)
            mem = _memory(servers)
            gets = counts.get("hits", 0) + counts.get("misses", 0)
            arms[arm] = {
                "servers": len(servers),
                "bytes": mem["bytes"],
                "items": mem["curr_items"],
                "requests": counts.get("requests", 0),
                "hit_rate": counts.get("hits", 0) / gets if gets else float("nan"),
                "db_queries": counts.get("loads", 0),
                "db_queries_per_request": counts.get("loads", 0) / max(1, counts.get("requests", 0)),
                "per_cluster_hit_rate": {c: _rate(final_counts(timeline, c)) for c in clusters},
            }
    rep, reg = arms["replicated per cluster"], arms["regional pool"]
    mem_ratio = rep["bytes"] / max(1.0, reg["bytes"])
    table = [
        ["arm", "servers", "MB cached", "items", "hit rate", "DB q/request", "requests"],
        *[
            [arm, p["servers"], p["bytes"] / 1e6, p["items"], p["hit_rate"], p["db_queries_per_request"], p["requests"]]
            for arm, p in arms.items()
        ],
        ["replicated/regional", "", f"{mem_ratio:.2f}x memory", "", "", "", ""],
    ]
    fig, axes = figure(1, 2, title=f"regional: {CLUSTERS} clusters, {posts} posts of table-3 regional sizes")
    names = ["replicated", "regional"]
    axes[0][0].bar(names, [rep["bytes"] / 1e6, reg["bytes"] / 1e6], color=["tab:orange", "tab:blue"])
    axes[0][0].set_ylabel("MB held by memcached")
    axes[0][1].bar(names, [rep["hit_rate"], reg["hit_rate"]], color=["tab:orange", "tab:blue"])
    axes[0][1].set_ylabel("web servers' hit rate")
    axes[0][1].set_ylim(0, 1.05)
    fig.tight_layout()
    return Report(
        name="regional",
        paper=PAPER,
        short=short,
        table=table,
        results={
            "users": users,
            "seconds": seconds,
            "posts": posts,
            "clusters": CLUSTERS,
            "replicated": rep,
            "regional": reg,
            "memory_ratio": mem_ratio,
        },
        figure=fig,
    )


def _rate(c: dict[str, int]) -> float:
    gets = c.get("hits", 0) + c.get("misses", 0)
    return c.get("hits", 0) / gets if gets else float("nan")


def check(report: Report) -> list[str]:
    """Direction: the regional copy takes much less memory (>= 1.5x less with 3 clusters) at no worse hit rate."""
    r = report.results
    problems = []
    if not r["memory_ratio"] >= 1.5:
        problems.append(f"replicating took only {r['memory_ratio']:.2f}x the regional pool's memory (want >= 1.5x)")
    if not r["regional"]["hit_rate"] >= r["replicated"]["hit_rate"] - 0.02:
        problems.append(
            f"regional hit rate {r['regional']['hit_rate']:.3f} below replicated {r['replicated']['hit_rate']:.3f}"
        )
    return problems
