"""`squealctl`: the operator's command for a squeal deployment.

squealctl up TOPOLOGY            start the whole topology on this machine
squealctl status [--json]        what runs, where, and whether it answers
squealctl down                   stop everything `up` started
squealctl router-config TOPOLOGY --cluster NAME | --all
                                 print the mcrouter-dialect JSON a cluster's routers run
squealctl check TOPOLOGY         validate a topology file and summarise it
squealctl replay --region R --flow F|all --from GTID [TOPOLOGY]
                                 re-send invalidations: rewind the flow(s) of the daemon `up` started
squealctl accept-data-loss --region R [TOPOLOGY]
                                 a region halted on purged binlogs: flush its caches and resume
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import gutter
import router_config
from ops.harness import HarnessError
from ops.local import ALL_ROLES, Deployment
from squeal.replay import ReplayError, add_replay_options, replay
from warmup import WarmupController, WarmupError

DEFAULT_STATE_DIR = os.environ.get("SQUEAL_STATE_DIR", "var/local")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="squealctl",
        description="Operate a squeal deployment: bring a local topology up and down, inspect it, "
        "print router configs, replay invalidations.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: squealctl up examples/local.toml && squealctl status && squealctl down",
    )
    p.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help="where `up` keeps data dirs, logs and the component list (default: %(default)s, or $SQUEAL_STATE_DIR)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every process start and stop")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start every component of a topology on this machine")
    up.add_argument("topology", help="topology TOML file, e.g. examples/local.toml")
    up.add_argument(
        "--demo", action="store_true", help="also run the demo web tier (loadtest/webtier.py) against every cluster"
    )
    up.add_argument("--demo-rate", type=float, default=40.0, help="demo requests per second per cluster")
    up.add_argument(
        "--without",
        default="",
        metavar="ROLES",
        help="comma-separated components not to start: mariadb, memcached, router, squeal",
    )

    st = sub.add_parser("status", help="list the components `up` started and whether they answer")
    st.add_argument(
        "--json",
        action="store_true",
        help="one JSON list, an object per component: role, region, cluster, pool, pid, address",
    )

    sub.add_parser("down", help="stop every component `up` started (SIGTERM, then SIGKILL after 10 s)")

    rc = sub.add_parser("router-config", help="print the mcrouter-dialect JSON config of a cluster's routers")
    rc.add_argument("topology")
    which = rc.add_mutually_exclusive_group(required=True)
    which.add_argument("--cluster", help="cluster name, e.g. east-a")
    which.add_argument("--all", action="store_true", help="one JSON object keyed by cluster name")

    ck = sub.add_parser("check", help="validate a topology file and print a summary")
    ck.add_argument("topology")

    wu = sub.add_parser(
        "warmup",
        help="cold-cluster warm-up: start | status | finish CLUSTER (runbook: docs/runbooks/cold-cluster-warmup.md)",
    )
    wu.add_argument("action", choices=("start", "status", "finish"))
    wu.add_argument("cluster", help="the cold cluster, e.g. east-b")
    wu.add_argument(
        "--warm", help="start: the warm cluster to read misses from (default: another cluster of the same region)"
    )
    wu.add_argument("--exptime", type=int, default=3600, help="start: TTL of items copied into the cold cluster")
    wu.add_argument(
        "--target",
        type=float,
        default=0.9,
        help="finish: required share of the warm cluster's hit rate (default %(default)s)",
    )
    wu.add_argument("--force", action="store_true", help="finish: turn the route off whatever the hit rate")
    wu.add_argument("--sample", type=float, default=2.0, help="seconds of traffic to measure hit rates over")

    gu = sub.add_parser("gutter", help="gutter pools: sizing advice, or live health of a cluster")
    gu.add_argument("topology")
    gu.add_argument("--cluster", help="show which servers answer and the gutter's hit rate for this cluster")

    sub.add_parser("prometheus-config", help="print a Prometheus scrape config for every component `up` started")

    lt = sub.add_parser(
        "loadtest", help="run one of the paper's experiments (see `squealctl loadtest --help`)", add_help=False
    )
    lt.add_argument("args", nargs=argparse.REMAINDER, help="passed to `python -m loadtest` (see its --help)")

    vf = sub.add_parser("verify", help="consistency check: compare each cluster's cached demo rows with the database")
    vf.add_argument("topology")
    vf.add_argument("--sample", type=int, default=200, help="rows per key family to check (default %(default)s)")
    vf.add_argument("--all", action="store_true", help="check every row instead of a sample")
    vf.add_argument("--database", default="app", help="the web tier's database (default %(default)s)")

    rp = sub.add_parser(
        "replay",
        help="rewind a squeal flow of this deployment to a GTID so its invalidations are sent again",
        description="Rewind one flow (or all flows) of a region's squeal daemon, the one `squealctl up` started: "
        "its datamarker in STATE_DIR/squeal/markers-REGION is set to GTID and the daemon, once /proc shows the "
        "recorded pid is that daemon, gets SIGHUP and re-sends every invalidation after GTID. With the "
        "deployment down, the next `squealctl up` does. For a daemon started by hand, use `squeal replay`.",
        epilog="Example: squealctl replay --region east --flow all --from 0-1-1200",
    )
    rp.add_argument(
        "topology",
        nargs="?",
        metavar="TOPOLOGY",
        help="topology file (default: the one `squealctl up` recorded in STATE_DIR/components.json)",
    )
    add_replay_options(rp)
    # `squeal replay` takes --state-dir after the command; here it is squealctl's and goes before it.
    rp.add_argument("--state-dir", dest="misplaced_state_dir", help=argparse.SUPPRESS)

    al = sub.add_parser(
        "accept-data-loss",
        help="a region's squeal halted on purged binlogs: flush the region's caches and resume",
        description="After binlog data loss with on_data_loss = \"halt\" the region's squeal daemon stops "
        "delivering (/healthz 503). This tells the daemon `squealctl up` started to flush every destination of "
        "the region and resume from the oldest binlog the database still has. Runbook: docs/runbooks/data-loss.md.",
    )
    al.add_argument("topology", nargs="?", metavar="TOPOLOGY", help="topology file (default: the recorded one)")
    al.add_argument("--region", required=True, help="the halted region")
    return p


FORWARDED = ("loadtest",)  # subcommands whose arguments belong to another program's parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # argparse's REMAINDER drops a leading option such as --help: hand forwarded commands their words as given.
    split = next((i for i, word in enumerate(argv) if word in FORWARDED), None)
    if split is not None:
        args = _parser().parse_args([*argv[:split], argv[split]])
        args.args = argv[split + 1 :]
    else:
        args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return _dispatch(args)
    except (router_config.TopologyError, HarnessError) as e:
        print(f"squealctl: error: {e}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    deployment = Deployment(args.state_dir)
    if args.command == "up":
        without = frozenset(r.strip() for r in args.without.split(",") if r.strip())
        unknown = without - {"mariadb", "memcached", "router", "squeal", "monitoring"}
        if unknown:
            raise HarnessError(f"--without: unknown component(s) {', '.join(sorted(unknown))}")
        started = deployment.up(args.topology, without, demo=args.demo, demo_rate=args.demo_rate)
        print(
            f"squeal: {len(started)} components up (state in {deployment.state_dir}); "
            "`squealctl status` lists them, `squealctl down` stops them."
        )
        _print_status(deployment.status())
        monitor = next((c for c in started if c.role == "monitoring"), None)
        if monitor:
            print(f"\ndashboard: http://{monitor.address}/   (metrics: http://{monitor.address}/metrics)")
        return 0
    if args.command == "status":
        rows = deployment.status()
        if args.json:
            keys = ("role", "region", "cluster", "pool", "pid", "address", "metrics", "running", "answering", "log")
            print(json.dumps([{k: r[k] for k in keys} for r in rows], indent=2))
        else:
            _print_status(rows)
        return 0 if all(r["running"] for r in rows) else 1
    if args.command == "down":
        n = deployment.down()
        print(f"squeal: stopped {n} components")
        return 0
    if args.command == "router-config":
        topo = router_config.load(args.topology)
        if args.all:
            print(router_config.render(router_config.all_cluster_configs(topo)), end="")
        else:
            print(router_config.render(router_config.cluster_config(topo, args.cluster)), end="")
        return 0
    if args.command == "check":
        topo = router_config.load(args.topology)
        for region in topo.regions:
            role = "master" if region.master else "replica"
            print(
                f"region {region.name} ({role}): database {region.database.address}, "
                f"{len(region.clusters)} clusters: {', '.join(c.name for c in region.clusters)}"
            )
        print(f"{len(topo.rules)} invalidation rules")
        return 0
    if args.command == "warmup":
        return _warmup(deployment.state_dir, args)
    if args.command == "gutter":
        topo = router_config.load(args.topology)
        if args.cluster:
            health = gutter.gutter_health(topo.cluster(args.cluster))
            for server in health.servers:
                print(f"{server.pool:10} {server.address:21} {'up' if server.up else 'DOWN'}")
            rate = "-" if health.gutter_hit_rate is None else f"{health.gutter_hit_rate:.0%}"
            print(f"gutter: {health.gutter_gets_per_second:.0f} gets/s, hit rate {rate}")
            return 1 if health.down else 0
        advice = gutter.check_topology(topo)
        for a in advice:
            print(a)
        return 0 if all(a.ok for a in advice) else 1
    if args.command == "prometheus-config":
        from monitoring.prometheus import render_yaml, scrape_config

        if not deployment.state_file.exists():
            raise HarnessError(f"no deployment in {deployment.state_dir} (run `squealctl up` first)")
        print(render_yaml(scrape_config(deployment.state_file)), end="")
        return 0
    if args.command == "loadtest":
        from loadtest.cli import main as loadtest_main

        return loadtest_main(args.args)
    if args.command == "verify":
        from monitoring.verify import verify

        report = verify(
            router_config.load(args.topology), database=args.database, sample=None if args.all else args.sample
        )
        for stale in report.stale:
            print(stale)
        print(f"verify: {report.checked} cached copies compared, {report.absent} not cached, {len(report.stale)} stale")
        return 0 if report.ok else 1
    if args.command == "replay":
        return _replay(deployment, args)
    if args.command == "accept-data-loss":
        from squeal.cli import main as squeal_main

        topology = args.topology or deployment.recorded_topology()
        if topology is None:
            raise HarnessError(f"accept-data-loss: no TOPOLOGY given and none recorded in {deployment.state_file}")
        return squeal_main(["accept-data-loss", str(topology), "--region", args.region,
                            "--state-dir", str(deployment.squeal_state_dir(args.region))])
    raise AssertionError(args.command)


def _replay(deployment: Deployment, args: argparse.Namespace) -> int:
    """`squeal replay` on the markers and pid of the daemon `up` started for the region."""
    if args.misplaced_state_dir is not None:
        raise HarnessError(
            "replay: --state-dir is squealctl's option and goes before the command (squealctl --state-dir D "
            "replay ...); to replay a daemon started by hand with its own state dir use `squeal replay`"
        )
    topology = args.topology or deployment.recorded_topology()
    if topology is None:
        raise HarnessError(
            f"replay: no TOPOLOGY given and no deployment recorded in {deployment.state_file}: name the topology "
            "file (or the deployment's state dir with squealctl --state-dir)"
        )
    recorded = [
        (c.pid, str(deployment.state_file))
        for c in deployment.components()
        if c.role == "squeal" and c.region == args.region
    ]
    try:
        lines = replay(
            router_config.load(topology),
            args.region,
            args.flow,
            args.from_gtid,
            deployment.squeal_state_dir(args.region),
            pids=recorded,
        )
    except ReplayError as e:
        print(f"squealctl replay: error: {e}", file=sys.stderr)
        return e.code
    print("\n".join(lines))
    return 0


def _warmup(state_dir, args: argparse.Namespace) -> int:
    try:
        controller = WarmupController(state_dir)
        if args.action == "start":
            path = controller.start(args.cluster, args.warm, args.exptime)
            warm = controller.overlay()[args.cluster]["warm"]
            print(f"warm-up on: {args.cluster} reads its misses from {warm}; routers reload {path}")
        elif args.action == "status":
            print(controller.status(args.cluster, args.sample).bar())
        else:
            status = controller.finish(args.cluster, args.target, args.force, args.sample)
            done = status.bar() if status else "forced"
            print(f"warm-up off for {args.cluster} ({done})")
    except WarmupError as e:
        print(f"squealctl warmup: error: {e}", file=sys.stderr)
        return 1
    return 0


def _print_status(rows: list[dict]) -> None:
    if not rows:
        print("nothing is running (no components recorded)")
        return
    order = {role: i for i, role in enumerate(ALL_ROLES)}
    print(f"{'ROLE':16} {'REGION':7} {'CLUSTER':8} {'POOL':9} {'PID':>7}  {'ADDRESS':21} STATE")
    for r in sorted(rows, key=lambda r: (order.get(r["role"], 99), r["region"], r["cluster"] or "", r["address"])):
        state = "up" if r["answering"] else ("running, not answering" if r["running"] else "DOWN")
        print(
            f"{r['role']:16} {r['region']:7} {r['cluster'] or '-':8} {r['pool'] or '-':9} {r['pid']:>7}  "
            f"{r['address']:21} {state}"
        )


if __name__ == "__main__":
    sys.exit(main())
