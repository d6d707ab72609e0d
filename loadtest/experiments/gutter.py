"""Gutter (paper 3.3): kill one wildcard memcached under load, with and without the gutter route.

Web servers read Zipf-distributed posts (table-3 sizes) through their cluster's router. After a warm
period one of the wildcard pool's memcached processes is SIGKILLed. Without a gutter route the router
answers every request for that server's keys with an error: the web server falls back to the database
and the request counts as a client-visible error (what locust reports as a failure). With the gutter
route (FailoverWithExptimeRoute, TTL capped at the gutter pool's `ttl`) those requests go to the gutter
pool, miss once, are filled there, and then hit. The web servers use plain look-aside reads here (leases
off in both arms) because memcached counts a lease placeholder (`mg … N` → W/Z) as a get hit, which
would make the gutter's own hit rate meaningless. Measured per 0.5 s: client-visible errors, database
queries (MariaDB's Com_select) and the gutter's own hit rate (its `stats`).
Paper: client-visible failures -99%; gutter hit rate > 35% within 4 minutes, often near 50%.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import router_config
from loadtest.experiments.common import (
    LocustRun,
    Sampler,
    Stack,
    cluster_series,
    db_selects,
    memcached_command_all,
    memcached_stats,
    replace_cluster,
    topology_doc,
)
from loadtest.experiments.report import Report, figure, plot_series
from loadtest.workload import seed_posts
from ops.harness import Router, free_port, wait_until
from router_config import Address

PAPER = "client-visible failures -99%; gutter hit rate > 35% within 4 minutes (often ~50%)"


def _gutter_probe(address: str) -> dict[str, float]:
    s = memcached_stats(address)
    return {"hits": s.get("get_hits", 0.0), "misses": s.get("get_misses", 0.0)}


def run(short: bool = False, workdir: Path | None = None) -> Report:
    users, warm, after = (24, 3.0, 6.0) if short else (60, 15.0, 90.0)
    posts = 600 if short else 3000
    work = Path(workdir or tempfile.mkdtemp(prefix="loadtest-gutter-"))
    doc = topology_doc(1, wildcard=3, gutter=True, regional=False)
    phases: dict[str, dict[str, Any]] = {}
    extra: list[Any] = []  # processes this experiment starts beside the stack
    with Stack(doc, squeal=False, workdir=work / "stack") as stack:
        try:
            ids = seed_posts(stack.writer, posts)
            db = stack.sqls()
            cluster = stack.topo.clusters[0]
            victim = cluster.wildcard.servers[0]
            gutter_addr = str(cluster.gutter.servers[0]) if cluster.gutter else ""
            # The no-gutter arm: the same pools behind a second router whose config has no gutter route.
            plain_router_addr = Address("127.0.0.1", free_port())
            plain = replace_cluster(
                stack.topo,
                cluster.name,
                routers=(plain_router_addr,),
                pools=tuple(p for p in cluster.pools if p.kind != "gutter"),
            )
            plain_path = work / "topology-no-gutter.toml"
            plain_path.write_text(router_config.dumps(plain))
            config = work / "router-no-gutter.json"
            config.write_text(router_config.render(router_config.cluster_config(plain, cluster.name)))
            router = Router(config, port=plain_router_addr.port, workdir=work / "router-no-gutter")
            extra.append(router.start())
            # `squealctl stop` kills it (memcached's stop signal is SIGKILL) and keeps the supervisor from
            # restarting it; `start` brings it back, empty, for the next arm.
            victim_name = stack.component(str(victim)).name
            killed = False
            for arm, topo_path in (("without gutter", plain_path), ("with gutter", stack.topology_path)):
                if killed:
                    stack.deployment.control("start", victim_name)
                    _wait_tko_cleared(str(cluster.routers[0]))
                # both arms start from empty caches
                memcached_command_all([a for p in cluster.pools for a in p.servers], b"flush_all\r\n")
                # Plain look-aside (no leases), as in the paper's 3.3: memcached counts a lease get that
                # creates a placeholder as a hit, which would hide the gutter's real hit rate.
                spec = stack.spec([cluster.name], family="post", ids=ids, write_ratio=0.01, seed=9, leases=False)
                spec.topology = str(topo_path)
                probes = {"selects": lambda: db_selects(db)}
                if arm == "with gutter":
                    probes["gutter_hits"] = lambda: _gutter_probe(gutter_addr)["hits"]
                    probes["gutter_misses"] = lambda: _gutter_probe(gutter_addr)["misses"]
                with Sampler(probes, interval=0.5) as sampler:
                    lr = LocustRun(spec, users, warm + after, work).start()
                    try:
                        t0 = lr.wait_first_sample()
                        time.sleep(max(0.0, t0 + warm - time.time()))
                        stack.deployment.control("stop", victim_name)
                        killed = True
                        killed_at = time.time() - t0
                        timeline = lr.wait()
                    finally:
                        lr.stop()
                phases[arm] = _summarise(timeline, sampler, cluster.name, t0, killed_at)
        finally:
            for proc in reversed(extra):
                proc.stop()
    return _report(phases, short, users)


def _wait_tko_cleared(router: str, timeout: float = 20.0) -> None:
    """Gutter arm starts only when the router serves the revived server again (its probe clears TKO): the
    router's `stats` say `servers_tko 0`. At most `timeout` s, then the arm starts anyway."""
    what = f"router {router} to clear TKO"
    wait_until(lambda: memcached_stats(router).get("servers_tko") == 0, timeout, what, interval=0.3, error=None)


def _summarise(timeline: list[dict], sampler: Sampler, cluster: str, t0: float, killed_at: float) -> dict[str, Any]:
    errors = cluster_series(timeline, cluster, "failures", t0)
    requests = cluster_series(timeline, cluster, "requests", t0)
    selects = sampler.rates("selects", t0)
    gh, gm = sampler.rates("gutter_hits", t0), sampler.rates("gutter_misses", t0)
    gutter_rate = [(t, h / (h + m)) for (t, h), (_, m) in zip(gh, gm, strict=False) if h + m > 0]
    after = [v for t, v in errors if t > killed_at]
    req_after = [v for t, v in requests if t > killed_at]
    last = timeline[-1]["clusters"].get(cluster, {})
    before_sel = [v for t, v in selects if t <= killed_at and t > 1.0]
    after_sel = [v for t, v in selects if t > killed_at]
    late = [v for t, v in gutter_rate if t > killed_at + (timeline[-1]["t"] - t0 - killed_at) / 2]
    return {
        "killed_at": killed_at,
        "requests": last.get("requests", 0),
        "failures": last.get("failures", 0),
        "error_rate_after_kill": sum(after) / sum(req_after) if sum(req_after) else 0.0,
        "errors_per_s_after_kill": sum(after) / max(1, len(after)),
        "db_queries_per_s_before": sum(before_sel) / max(1, len(before_sel)),
        "db_queries_per_s_after": sum(after_sel) / max(1, len(after_sel)),
        "peak_db_queries_per_s_after": max(after_sel, default=0.0),
        "gutter_hit_rate_late": sum(late) / len(late) if late else None,
        "series": {"errors": errors, "requests": requests, "db": selects, "gutter_hit_rate": gutter_rate},
    }


def _report(phases: dict[str, dict[str, Any]], short: bool, users: int) -> Report:
    no, yes = phases["without gutter"], phases["with gutter"]
    cut = 1 - yes["failures"] / no["failures"] if no["failures"] else float("nan")
    table = [
        [
            "arm",
            "requests",
            "client errors",
            "error rate after kill",
            "DB q/s before",
            "DB q/s after",
            "gutter hit rate (2nd half)",
        ],
        *[
            [
                arm,
                p["requests"],
                p["failures"],
                p["error_rate_after_kill"],
                p["db_queries_per_s_before"],
                p["db_queries_per_s_after"],
                "-" if p["gutter_hit_rate_late"] is None else p["gutter_hit_rate_late"],
            ]
            for arm, p in phases.items()
        ],
        ["gutter effect", "", f"{cut:.1%} fewer", "", "", "", ""],
    ]
    fig, axes = figure(1, 3, title=f"gutter: one of 3 wildcard memcached killed, {users} web servers")
    for arm, p, color in (("without gutter", no, "tab:red"), ("with gutter", yes, "tab:green")):
        err = [
            (t, e / r if r else 0.0)
            for (t, e), (_, r) in zip(p["series"]["errors"], p["series"]["requests"], strict=False)
        ]
        plot_series(axes[0][0], err, arm, color=color)
        plot_series(axes[0][1], p["series"]["db"], arm, color=color)
        axes[0][0].axvline(p["killed_at"], color=color, linestyle=":", linewidth=1)
    plot_series(axes[0][2], yes["series"]["gutter_hit_rate"], "with gutter", color="tab:green")
    axes[0][0].set_ylabel("client-visible error rate")
    axes[0][1].set_ylabel("database queries / s")
    axes[0][2].set_ylabel("gutter hit rate")
    axes[0][2].set_ylim(0, 1.05)
    for ax in axes[0]:
        ax.set_xlabel("seconds")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return Report(
        name="gutter",
        paper=PAPER,
        short=short,
        table=table,
        results={
            "users": users,
            "failures_cut": cut,
            **{arm.replace(" ", "_"): {k: v for k, v in p.items() if k != "series"} for arm, p in phases.items()},
        },
        series={arm: p["series"] for arm, p in phases.items()},
        figure=fig,
    )


def check(report: Report) -> list[str]:
    """Direction: the gutter cuts client-visible errors (by at least 80%) and its hits climb above zero."""
    r = report.results
    problems = []
    if r["without_gutter"]["failures"] < 20:
        problems.append(f"the kill caused too few errors to judge ({r['without_gutter']['failures']})")
    elif not r["failures_cut"] >= 0.8:
        problems.append(f"the gutter cut client-visible errors by only {r['failures_cut']:.0%} (want >= 80%)")
    if not (r["with_gutter"]["gutter_hit_rate_late"] or 0) > 0.1:
        problems.append(f"gutter hit rate stayed at {r['with_gutter']['gutter_hit_rate_late']}")
    return problems
