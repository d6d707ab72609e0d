"""Cold cluster warm-up (paper 4.3): a new empty cluster with and without the warm-up route.

Cluster east-a is warmed by its web servers first. Then web servers of both clusters run while east-b's
memcached is empty, twice: without the warm-up route (east-b's misses go to the database) and with it
(`WarmupController.start`: east-b's router reads its misses from east-a's wildcard pool and adds them to
east-b). Measured per 0.5 s: east-b's own hit rate (its memcached `stats`), east-a's hit rate as its web
servers see it, the database queries east-b's web servers make, and the time until east-b's own hit rate
reaches 90% of east-a's. The web servers use plain look-aside reads here: memcached counts a lease
placeholder (`mg … N` → W/Z) as a get hit, which would hide the cold cluster's real hit rate.

Then the race the paper closes with a two-second delete hold-off, made deterministic: east-a's router is
SIGSTOPped (squeal's deletes cannot reach the warm cluster), a web server in east-b updates a post
(database commit, local delete), squeal's delete reaches east-b, another east-b read misses and is served
from east-a's stale copy, which the route tries to add to east-b. After east-a's router resumes and squeal
catches up, `monitoring.verify` (what `squealctl verify` runs) compares east-b's copy with the database.
Run twice: as deployed (the router's WarmUpRoute turns deletes to cold into a 3 s hold-off: `md K I T3`,
or `ms K 0 ME T3` + `md K I T3` for an absent key), and a control where the experiment erases the
hold-off (a plain `md` on east-b's memcached, what a router without hold-offs leaves) before the read:
the control must end stale, or the check could not see the race at all.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.experiments.common import (
    LocustRun,
    Sampler,
    Stack,
    cluster_series,
    db_selects,
    flow_value,
    memcached_command_all,
    memcached_stats,
    scrape,
    topology_doc,
)
from loadtest.experiments.report import Report, figure, plot_series
from loadtest.webtier import WebServer
from loadtest.workload import seed_posts
from monitoring.verify import verify
from ops.harness import wait_until
from warmup import WarmupController

PAPER = "cold clusters back to full capacity in a few hours instead of a few days; 2 s delete hold-off"
WARM, COLD = "east-a", "east-b"
TARGET = 0.9


def _pool_hits(servers: Any) -> tuple[float, float]:
    hits = misses = 0.0
    for a in servers:
        s = memcached_stats(str(a))
        hits += s.get("get_hits", 0.0)
        misses += s.get("get_misses", 0.0)
    return hits, misses


def _wait_reload(log_path: str, before: int, timeout: float = 10.0) -> None:
    """The router logs `config … reloaded` after it picked up a rewritten config file."""
    what = f"the router to reload its config (see {log_path})"
    wait_until(lambda: _reloads(log_path) > before, timeout, what, interval=0.2, error=RuntimeError)


def _reloads(log_path: str) -> int:
    return Path(log_path).read_text(errors="replace").count(" reloaded (")


def run(short: bool = False, workdir: Path | None = None) -> Report:
    users, warm_s, arm_s = (20, 4.0, 7.0) if short else (50, 20.0, 60.0)
    posts = 400 if short else 3000
    work = Path(workdir or tempfile.mkdtemp(prefix="loadtest-warmup-"))
    doc = topology_doc(2, wildcard=2, gutter=False, regional=False)
    arms: dict[str, dict[str, Any]] = {}
    with Stack(doc, squeal=True, workdir=work / "stack") as stack:
        ids = seed_posts(stack.writer, posts)
        db = stack.sqls()
        cold = stack.topo.cluster(COLD)
        cold_router_log = stack.component(str(cold.routers[0])).log
        # 1. warm east-a with its own traffic
        spec = stack.spec([WARM], family="post", ids=ids, write_ratio=0.02, seed=21, leases=False)
        LocustRun(spec, users, warm_s, work).start().wait()
        controller = WarmupController(stack.state_dir)
        for arm in ("without warm-up route", "with warm-up route"):
            memcached_command_all(cold.wildcard.servers, b"flush_all\r\n")
            if arm.startswith("with "):
                n = _reloads(cold_router_log)
                controller.start(COLD, WARM)
                _wait_reload(cold_router_log, n)
            spec = stack.spec([WARM, COLD], family="post", ids=ids, write_ratio=0.02, seed=22, leases=False)
            probes = {
                "selects": lambda: db_selects(db),
                "cold_hits": lambda: _pool_hits(cold.wildcard.servers)[0],
                "cold_misses": lambda: _pool_hits(cold.wildcard.servers)[1],
            }
            with Sampler(probes, interval=0.5) as sampler:
                lr = LocustRun(spec, users, arm_s, work).start()
                try:
                    timeline = lr.wait()
                finally:
                    lr.stop()
            arms[arm] = _summarise(timeline, sampler)
        # 2. the hold-off race, with the route still on
        race = {
            "as deployed (router hold-off)": _race(stack, ids[-1], erase_holdoff=False),
            "control: hold-off erased": _race(stack, ids[-2], erase_holdoff=True),
        }
        n = _reloads(cold_router_log)
        controller.finish(COLD, force=True)
        _wait_reload(cold_router_log, n)
    return _report(arms, race, short, users)


def _summarise(timeline: list[dict], sampler: Sampler) -> dict[str, Any]:
    t0 = timeline[0]["t"]
    ch, cm = sampler.rates("cold_hits", t0), sampler.rates("cold_misses", t0)
    cold_rate = [(t, h / (h + m)) for (t, h), (_, m) in zip(ch, cm, strict=False) if h + m > 0]
    wh, wm = cluster_series(timeline, WARM, "hits", t0), cluster_series(timeline, WARM, "misses", t0)
    warm_rate = [(t, h / (h + m)) for (t, h), (_, m) in zip(wh, wm, strict=False) if h + m > 0]
    cold_loads = cluster_series(timeline, COLD, "loads", t0)
    cold_requests = cluster_series(timeline, COLD, "requests", t0)
    warm_ref = sum(v for _, v in warm_rate[-6:]) / max(1, len(warm_rate[-6:]))  # the warm cluster's steady rate
    reached = None
    for i in range(1, len(cold_rate)):
        # two consecutive samples at or above the target, so one lucky half second does not count
        if cold_rate[i - 1][1] >= TARGET * warm_ref and cold_rate[i][1] >= TARGET * warm_ref:
            reached = cold_rate[i - 1][0]
            break
    until = reached if reached is not None else float("inf")
    loads_until = sum(v * 0.5 for t, v in cold_loads if t <= until)
    last = timeline[-1]["clusters"]
    return {
        "seconds_to_90pct": reached,
        "warm_hit_rate": warm_ref,
        "cold_own_hit_rate_end": sum(v for _, v in cold_rate[-4:]) / max(1, len(cold_rate[-4:])),
        "cold_db_queries": last.get(COLD, {}).get("loads", 0),
        "cold_db_queries_until_90pct": loads_until,
        "cold_requests": last.get(COLD, {}).get("requests", 0),
        "cold_client_errors": last.get(COLD, {}).get("failures", 0),
        "db_selects_per_s": sum(v for _, v in sampler.rates("selects", t0)) / max(1, len(sampler.rates("selects", t0))),
        "series": {
            "cold_hit_rate": cold_rate,
            "warm_hit_rate": warm_rate,
            "cold_db_queries": cold_loads,
            "cold_requests": cold_requests,
        },
    }


def _race(stack: Stack, post_id: int, *, erase_holdoff: bool) -> dict[str, Any]:
    """One deterministic run of the warm-up race; returns whether east-b ends up stale (per verify)."""
    topo = stack.topo
    warm, cold = topo.cluster(WARM), topo.cluster(COLD)
    key = f"post:{post_id}"
    squeal_port = stack.by_role("squeal")[0].address.rpartition(":")[2]
    a = WebServer(topo, topo.master.name, WARM)
    b_writer = WebServer(topo, topo.master.name, COLD)
    b_reader = WebServer(topo, topo.master.name, COLD)
    warm_router = stack.pid_of(str(warm.routers[0]))
    try:
        a.get_post(post_id)  # east-a caches the current row
        memcached_command_all(cold.wildcard.servers, f"md {key}\r\n".encode())
        before = flow_value(scrape(int(squeal_port)), "squeal_deletes_sent_total", COLD)
        os.kill(warm_router, signal.SIGSTOP)  # squeal's deletes for east-a wait
        try:
            new_body = f"updated during warm-up {time.time():.3f}"
            b_writer.rm_for(post_id).write_with_marker(
                [key], "UPDATE posts SET body = %s WHERE id = %s", (new_body, post_id)
            )
            wait_until(
                lambda: flow_value(scrape(int(squeal_port)), "squeal_deletes_sent_total", COLD) > before,
                10,
                f"squeal's delete of {key} to {COLD}",
                interval=0.1,
                error=RuntimeError,
            )
            if erase_holdoff:
                memcached_command_all(cold.wildcard.servers, f"md {key}\r\n".encode())
            served = b_reader.get_post(post_id)  # cold miss → warm's old copy → added to cold
            time.sleep(0.5)  # the route adds to cold in the background
        finally:
            os.kill(warm_router, signal.SIGCONT)
        wait_until(lambda: _caught_up(int(squeal_port)), 30, "squeal to catch up", interval=0.1, error=RuntimeError)
        report = verify(topo, keys=[key])
        stale = [s for s in report.stale if s.cluster == COLD]
        return {
            "post": post_id,
            "served_stale_during_race": bool(served) and served is not None and served.get("body") != new_body,
            "cold_stale_after": bool(stale),
            "detail": [str(s)[:200] for s in stale],
        }
    finally:
        for ws in (a, b_writer, b_reader):
            ws.close()


def _caught_up(port: int) -> bool:
    m = scrape(port)
    return all(flow_value(m, "squeal_flow_backlog", f) == 0 for f in (WARM, COLD))


def _report(arms: dict[str, dict[str, Any]], race: dict[str, dict[str, Any]], short: bool, users: int) -> Report:
    no, yes = arms["without warm-up route"], arms["with warm-up route"]
    # The warm-up window: until the cold cluster without the route reached 90% of warm (both arms alike).
    # Per request, since the arm with the route serves more requests in the same time.
    window = no["seconds_to_90pct"] or max(t for t, _ in no["series"]["cold_requests"])
    for p in (no, yes):
        loads = sum(v for t, v in p["series"]["cold_db_queries"] if t <= window + 0.5)
        reqs = sum(v for t, v in p["series"]["cold_requests"] if t <= window + 0.5)
        p["warmup_window_s"] = window
        p["cold_db_queries_per_request_in_window"] = loads / reqs if reqs else float("nan")
        p["cold_db_queries_per_request"] = p["cold_db_queries"] / max(1, p["cold_requests"])
    cut = no["cold_db_queries_per_request_in_window"] / max(yes["cold_db_queries_per_request_in_window"], 1e-9)

    def secs(v: float | None) -> str:
        return "not reached" if v is None else f"{v:.1f}s"

    table = [
        [
            "arm",
            "time to 90% of warm",
            "cold DB q/request (warm-up)",
            "cold DB q/request (all)",
            "cold own hit rate (end)",
            "warm hit rate",
            "cold requests",
        ],
        *[
            [
                arm,
                secs(p["seconds_to_90pct"]),
                p["cold_db_queries_per_request_in_window"],
                p["cold_db_queries_per_request"],
                p["cold_own_hit_rate_end"],
                p["warm_hit_rate"],
                p["cold_requests"],
            ]
            for arm, p in arms.items()
        ],
        ["route effect", "", f"{cut:.1f}x fewer", "", "", "", ""],
        ["race check", "served stale during race", "cold stale afterwards", "", "", "", ""],
        *[[name, r["served_stale_during_race"], r["cold_stale_after"], "", "", "", ""] for name, r in race.items()],
    ]
    fig, axes = figure(1, 2, title=f"warm-up: empty {COLD} beside warm {WARM}, {users} web servers")
    for arm, p, color in (("no route", no, "tab:red"), ("warm-up route", yes, "tab:green")):
        plot_series(axes[0][0], p["series"]["cold_hit_rate"], f"{COLD} own, {arm}", color=color)
        plot_series(axes[0][1], p["series"]["cold_db_queries"], arm, color=color)
    plot_series(axes[0][0], yes["series"]["warm_hit_rate"], f"{WARM} (warm)", color="tab:gray", linestyle="--")
    axes[0][0].set_ylabel("hit rate")
    axes[0][0].set_ylim(0, 1.05)
    axes[0][1].set_ylabel(f"DB queries/s by {COLD}'s web servers")
    for ax in axes[0]:
        ax.set_xlabel("seconds")
        ax.legend(fontsize=7)
    fig.tight_layout()
    notes = [
        f"race {name}: cold cluster {'STALE' if r['cold_stale_after'] else 'consistent'} after squeal caught up"
        for name, r in race.items()
    ]
    return Report(
        name="warmup",
        paper=PAPER,
        short=short,
        table=table,
        results={
            "users": users,
            "db_query_cut": cut,
            **{
                arm.replace(" ", "_").replace("-", "_"): {k: v for k, v in p.items() if k != "series"}
                for arm, p in arms.items()
            },
            "race": race,
        },
        series={arm: p["series"] for arm, p in arms.items()},
        notes=notes,
        figure=fig,
    )


def check(report: Report) -> list[str]:
    """Direction: the route cuts the cold cluster's database queries (at least 2x), the cold cluster fills
    (its own hit rate rises), and the race leaves no stale copy with the hold-off while the control does."""
    r = report.results
    no, yes = r["without_warm_up_route"], r["with_warm_up_route"]
    problems = []
    if no["cold_db_queries"] < 50:
        problems.append(f"the cold cluster made too few database queries to judge ({no['cold_db_queries']})")
    elif not r["db_query_cut"] >= 2:
        problems.append(
            f"the warm-up route cut the cold cluster's database queries per request during warm-up "
            f"only {r['db_query_cut']:.1f}x (want >= 2x)"
        )
    if not yes["cold_own_hit_rate_end"] > 0.3:
        problems.append(f"the cold cluster did not fill through the route (hit rate {yes['cold_own_hit_rate_end']})")
    race = r["race"]
    if race["as deployed (router hold-off)"]["cold_stale_after"]:
        problems.append("race: the cold cluster kept a stale copy despite the router's hold-off")
    if not race["control: hold-off erased"]["cold_stale_after"]:
        problems.append("race control: erasing the hold-off left no stale copy (the check cannot see the race)")
    return problems
