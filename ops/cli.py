"""`squealctl`: the operator's command for a squeal deployment.

squealctl up TOPOLOGY [--tls]    start the whole topology on this machine, supervised (restarted on exit);
                                 --tls: a local CA and TLS on every link (docs/deploy.md)
squealctl status [--json]        what runs, where, whether it answers, uptime and restarts
squealctl down                   stop everything `up` started, whatever its pid now, and the supervisor
squealctl stop|start|restart NAME
                                 one component, named as `status` lists it (router/east-a/0, squeal/east)
squealctl drill [TOPOLOGY]       chaos drill: kill, pause and restart components, then verify
squealctl router-config TOPOLOGY --cluster NAME | --all
                                 print the mcrouter-dialect JSON a cluster's routers run
squealctl check TOPOLOGY         validate a topology file and summarise it
squealctl verify [TOPOLOGY]      cached rows vs the database (exit 0 clean, 1 stale, 2 cannot check, 3 partial)
squealctl flush CLUSTER|REGION [--pool P] [--yes]
                                 empty a cluster's or a region's caches through its routers
squealctl replay --region R [--shard S] --flow F|all --from GTID [TOPOLOGY]
                                 re-send invalidations: rewind the flow(s) of the daemon `up` started
squealctl accept-data-loss --region R [--shard S] [TOPOLOGY]
                                 a region halted on purged binlogs: flush its caches and resume
squealctl render systemd TOPOLOGY --host H --out DIR
                                 the systemd units and configs one host of a real deployment runs
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys

import gutter
import router_config
from ops import workers
from ops.harness import HarnessError
from ops.local import ALL_ROLES, Deployment
from squeal.markers.replay import ReplayError, add_replay_options, replay
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

    up = sub.add_parser(
        "up", help="start every component of a topology on this machine, supervised (restarted when it exits)"
    )
    up.add_argument("topology", help="topology TOML file, e.g. examples/local.toml")
    up.add_argument(
        "--demo", action="store_true", help="also run the demo web tier (loadtest/webtier.py) against every cluster"
    )
    up.add_argument("--demo-rate", type=float, default=40.0, help="demo requests per second per cluster")
    up.add_argument(
        "--tls",
        action="store_true",
        help="TLS on every link: a topology without [tls] gets a local CA and certificates in STATE_DIR/tls and "
        "runs as STATE_DIR/topology-tls.toml (its [tls] section added; every server refuses plaintext)",
    )
    up.add_argument(
        "--without",
        default="",
        metavar="ROLES",
        help="comma-separated components not to start: mariadb, memcached, router, squeal, monitoring, zookeeper",
    )

    st = sub.add_parser(
        "status", help="list the components `up` started: name, pid, uptime, restarts, whether they answer"
    )
    st.add_argument(
        "--json",
        action="store_true",
        help="one JSON list, an object per component: name, role, region, cluster, pool, pid, address, uptime, "
        "restarts, stopped, ...",
    )

    sub.add_parser(
        "down", help="stop the supervisor and every component `up` started (SIGTERM, then SIGKILL after 10 s)"
    )

    for action, what in (
        ("stop", "stop a component and keep it stopped (the supervisor does not restart it) until `start`"),
        ("start", "start a stopped component again; returns once it answers"),
        ("restart", "stop, then start a component"),
    ):
        cp = sub.add_parser(action, help=what, description=f"{what[0].upper()}{what[1:]}.")
        cp.add_argument("component", metavar="NAME", help="as `squealctl status` lists it, e.g. router/east-a/0")

    dr = sub.add_parser(
        "drill",
        help="chaos drill against the running deployment: kill -9, pause and restart components, then verify",
        description="Against the deployment `up` started: kill -9 a squeal daemon, a router and a memcached and "
        "check each comes back (and how fast); pause a router with SIGSTOP; restart the replica MariaDB and stall "
        "it with SIGSTOP; then `squealctl verify`. Runbook: docs/runbooks/chaos-drill.md.",
        epilog="Exit status: 0 every component came back and verify found nothing stale; 1 a step failed or "
        "verify found stale copies; 2 no deployment, or verify could not check.",
    )
    dr.add_argument("topology", nargs="?", metavar="TOPOLOGY", help="topology file (default: the recorded one)")
    dr.add_argument("--pause", type=float, default=3.0, help="seconds a paused process stays stopped (%(default)s)")
    dr.add_argument(
        "--back-within", type=float, default=30.0, help="seconds a killed component gets to answer again (%(default)s)"
    )
    dr.add_argument("--no-verify", action="store_true", help="skip the final `squealctl verify`")

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

    vf = sub.add_parser(
        "verify",
        help="consistency check: compare each cluster's cached rows with the master database",
        description="For a sample of the rows of every table a rule names, read the keys the rule renders from "
        "every cluster (through its routers) and compare what each cached value holds (read with the rule's "
        "`codec`) with the master database. Lease placeholders and absent keys are fine; a mismatch is re-read "
        "after a grace period and reported only if the same copy still disagrees. Docs: docs/runbooks/verify.md.",
        epilog="Exit status: 0 every cluster checked, nothing stale; 1 stale copies found; 2 could not check at "
        "all (database or every router down); 3 some clusters could not be checked, the others hold nothing stale.",
    )
    vf.add_argument(
        "topology", nargs="?", metavar="TOPOLOGY", help="topology file (default: the one `squealctl up` recorded)"
    )
    vf.add_argument("--sample", type=int, default=200, help="rows per key family to check (default %(default)s)")
    vf.add_argument("--all", action="store_true", help="check every row instead of a sample")
    vf.add_argument("--database", help="only rules of tables in this schema (default: every rule)")
    vf.add_argument(
        "--codec", metavar="MODULE:FUNCTION", help="read every cached value with this codec instead of each rule's"
    )
    vf.add_argument(
        "--grace",
        type=float,
        help="seconds a mismatch gets before it is re-read (default: 3 x the p99 invalidation latency the squeal "
        "daemons measure, 2 s when none answers)",
    )

    cs = sub.add_parser(
        "consistency",
        help="how many nines of committed changes every cache holds consistently (the inspector's figures)",
        description="The monitoring server's consistency inspector reads every shard's binlog itself, samples 1 in "
        "[monitoring] consistency_sample committed row changes and reads their keys in every cluster T (consistency_"
        "check_after), 10 and 60 seconds after the commit. This prints, per region, cluster and shard, the share "
        "found consistent within each window and its nines (-log10 of the inconsistent share), and the last "
        "inconsistencies. Docs: docs/monitoring.md, 'Consistency in nines'.",
        epilog="Exit status: 0; 1 a region is under the topology's consistency_slo; 2 the monitoring server did not "
        "answer, or --since is not a duration.",
    )
    cs.add_argument(
        "topology", nargs="?", metavar="TOPOLOGY", help="topology file (default: the one `squealctl up` recorded)"
    )
    cs.add_argument("--since", default="10m", help="the span to report: 90s, 10m, 2h, 1d (default %(default)s)")
    cs.add_argument(
        "--json", action="store_true", help="JSON keyed by region: checked, inconsistent, ratio, nines per window"
    )

    fl = sub.add_parser(
        "flush",
        help="empty a cluster's or a region's caches through its routers (asks first)",
        description="Send flush_all to one router of the cluster (of each cluster of the region); the router sends "
        "it to every server of every pool in its config - the cluster's pools and the region's regional pool - and "
        "answers OK only if all did. Routers take it only when started with --enable-flush-cmd, as `squealctl up` "
        "starts them. Runbook: docs/runbooks/data-loss.md.",
        epilog="Exit status: 0 flushed; 1 a router or server refused or failed (named), or not confirmed; 2 unknown "
        "cluster/region/pool, or no terminal to confirm on and no --yes.",
    )
    fl.add_argument("target", metavar="CLUSTER|REGION", help="a cluster (e.g. east-a) or a region (e.g. east)")
    fl.add_argument(
        "--pool",
        metavar="P",
        help="flush only pool P (of the cluster, or of every cluster of the region; `regional`: the region's "
        "regional pool). The router has no per-pool flush: this sends flush_all to the pool's memcached servers "
        "directly, as the topology lists them",
    )
    fl.add_argument("--yes", action="store_true", help="flush without asking (required when stdin is not a terminal)")
    fl.add_argument("--topology", help="topology file (default: the one `squealctl up` recorded)")

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
        description='After binlog data loss with on_data_loss = "halt" the region\'s squeal daemon stops '
        "delivering (/healthz 503). This tells the daemon `squealctl up` started to flush every destination of "
        "the region and resume from the oldest binlog the database still has. Runbook: docs/runbooks/data-loss.md.",
    )
    al.add_argument("topology", nargs="?", metavar="TOPOLOGY", help="topology file (default: the recorded one)")
    al.add_argument("--region", required=True, help="the halted region")
    al.add_argument("--shard", default=None, help="with [shards]: the halted shard (each halts alone)")

    wk = sub.add_parser(
        "workers",
        help="a pooled region's squeal workers: who owns which shard, each worker's load",
        description="For every region with squeal instances (or --region): each worker of its pool, the shards "
        "it owns now (ZooKeeper's per-shard owner znodes), the shards the controller assigns it, its measured load "
        "(rows/s equivalents, smoothed) and whether it drains. Runbook: docs/runbooks/workers.md.",
        epilog="Exit status: 0 listed; 2 no pooled region, or ZooKeeper does not answer.",
    )
    wk.add_argument("--topology", help="topology file (default: the one `squealctl up` recorded)")
    wk.add_argument("--region", help="only this region")
    wk.add_argument("--json", action="store_true", help="one object per worker: name, region, pid, shards, load, ...")
    dn = sub.add_parser(
        "drain",
        help="move every shard of a pool worker to the others (before stopping it, say)",
        description="Ask the pool's controller to move WORKER's shards to the other workers and give it none: each "
        "shard's old owner stops reading it, waits for its deletes to be acknowledged, writes its markers and "
        "releases it; the new owner starts from them. `--undo` makes the worker eligible again. Runbook: "
        "docs/runbooks/workers.md.",
    )
    dn.add_argument("worker", metavar="WORKER", help="a squeal instance of a pooled region")
    dn.add_argument("--undo", action="store_true", help="end the drain: the worker may be given shards again")
    dn.add_argument("--topology", help="topology file (default: the one `squealctl up` recorded)")
    mv = sub.add_parser(
        "move",
        help="move one shard of a pooled region to a given worker",
        description="Ask the pool's controller to move SHARD to WORKER at its next plan (within a second), the same "
        "planned hand-over as a rebalance; a rebalance leaves the shard there for the cooldown (300 s).",
    )
    mv.add_argument("shard", metavar="SHARD")
    mv.add_argument("--to", required=True, metavar="WORKER", help="a worker of the shard's pooled region")
    mv.add_argument("--topology", help="topology file (default: the one `squealctl up` recorded)")

    from ops import systemd  # `render systemd`: one host of a multi-host deployment (docs/deploy.md)

    systemd.add_parser(sub)
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
        unknown = without - {"mariadb", "memcached", "router", "squeal", "monitoring", "zookeeper"}
        if unknown:
            raise HarnessError(f"--without: unknown component(s) {', '.join(sorted(unknown))}")
        started = deployment.up(args.topology, without, demo=args.demo, demo_rate=args.demo_rate, tls=args.tls)
        print(
            f"squeal: {len(started)} components up (state in {deployment.state_dir}); "
            "`squealctl status` lists them, `squealctl down` stops them."
        )
        _print_status(deployment.status(), deployment.supervisor_status())
        monitor = next((c for c in started if c.role == "monitoring"), None)
        if monitor:
            print(f"\ndashboard: http://{monitor.address}/   (metrics: http://{monitor.address}/metrics)")
        return 0
    if args.command == "status":
        rows = deployment.status()
        supervisor = deployment.supervisor_status()
        if args.json:
            keys = (
                "name", "role", "region", "cluster", "pool", "pid", "address", "metrics", "running", "answering",
                "healthy", "problems", "uptime", "restarts", "stopped", "log",
            )  # fmt: skip
            # pools only: a squeal worker's name, state and the shards it owns; a ZooKeeper server's quorum
            # ... and with [shards], the shard of every MariaDB copy, and which copy of each shard a squeal reads
            optional = ("instance", "shard", "shards", "copies", "state", "owns", "serving", "mode")
            rows_out = [
                {k: r[k] for k in keys}
                | {k: r[k] for k in optional if k in r and (k not in ("instance", "shard", "shards", "copies") or r[k])}
                for r in rows
            ]
            print(json.dumps(rows_out, indent=2))
        else:
            _print_status(rows, supervisor)
        supervised = supervisor is None or supervisor["running"]
        return 0 if all(r["running"] for r in rows) and supervised else 1
    if args.command == "down":
        n = deployment.down()
        print(f"squeal: stopped {n} components")
        return 0
    if args.command in ("stop", "start", "restart"):
        print(deployment.control(args.command, args.component))
        return 0
    if args.command == "drill":
        from ops.drills import run_drill

        return run_drill(deployment, args.topology, pause=args.pause, back_within=args.back_within,
                         verify=not args.no_verify)  # fmt: skip
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
            where = f"{len(topo.shards)} shards" if topo.sharded else f"database {region.database.address}"
            print(
                f"region {region.name} ({role}): {where}, "
                f"{len(region.clusters)} clusters: {', '.join(c.name for c in region.clusters)}"
            )
        for shard in topo.shards if topo.sharded else ():
            copies = ", ".join(f"{d.region} {d.address} (server_id {d.server_id})" for d in shard.copies)
            extra = "".join(
                f", extra copy {d.name} in {d.region} {d.address} (server_id {d.server_id}, from {d.replicates_from})"
                for d in shard.replicas
            )
            print(f"shard {shard.name} (GTID domain {shard.gtid_domain_id}): {copies}{extra}")
        print(f"{len(topo.rules)} invalidation rules")
        return 0
    if args.command == "warmup":
        return _warmup(deployment.state_dir, args)
    if args.command in ("workers", "drain", "move"):
        return workers.command(deployment, args)
    if args.command == "gutter":
        path = deployment.topology(args.topology)  # `up --tls`'s file: the TLS copy the deployment runs
        assert path is not None  # TOPOLOGY is required here
        topo = router_config.load(path)
        if args.cluster:
            tls = router_config.tls_context(topo.tls, "monitoring")
            health = gutter.gutter_health(topo.cluster(args.cluster), tls=tls)
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
        # A process of its own: loadtest drives deployments through ops, so ops must not import loadtest
        # (the layering contract in pyproject.toml).
        return subprocess.run([sys.executable, "-m", "loadtest", *args.args]).returncode
    if args.command == "verify":
        from monitoring.verify import run as verify_run

        topology = deployment.topology(args.topology)
        if topology is None:
            raise HarnessError(f"verify: no TOPOLOGY given and no deployment recorded in {deployment.state_file}")
        return verify_run(
            router_config.load(topology),
            database=args.database,
            sample=None if args.all else args.sample,
            codec=args.codec,
            grace=args.grace,
        )
    if args.command == "consistency":
        from monitoring import consistency_main

        topology = deployment.topology(args.topology)
        if topology is None:
            raise HarnessError(f"consistency: no TOPOLOGY given and no deployment recorded in {deployment.state_file}")
        return consistency_main(router_config.load(topology), args.since, args.json)
    if args.command == "flush":
        from ops.flush import main as flush_main

        topology = deployment.topology(args.topology)
        if topology is None:
            raise HarnessError(f"flush: no --topology given and no deployment recorded in {deployment.state_file}")
        configs = deployment.state_dir / "routers" if args.topology is None else None
        return flush_main(router_config.load(topology), args.target, args.pool, yes=args.yes, configs=configs)
    if args.command == "replay":
        return _replay(deployment, args)
    if args.command == "accept-data-loss":
        from squeal.cli import main as squeal_main

        topology = deployment.topology(args.topology)
        if topology is None:
            raise HarnessError(f"accept-data-loss: no TOPOLOGY given and none recorded in {deployment.state_file}")
        return squeal_main(
            [
                "accept-data-loss",
                str(topology),
                "--region",
                args.region,
                "--state-dir",
                str(deployment.squeal_state_dir(args.region)),
                *(("--shard", args.shard) if args.shard else ()),
            ]
        )
    if args.command == "render":
        from ops import systemd

        return systemd.run(args)
    raise AssertionError(args.command)


def _replay(deployment: Deployment, args: argparse.Namespace) -> int:
    """`squeal replay` on the markers and pid of the daemon `up` started for the region."""
    if args.misplaced_state_dir is not None:
        raise HarnessError(
            "replay: --state-dir is squealctl's option and goes before the command (squealctl --state-dir D "
            "replay ...); to replay a daemon started by hand with its own state dir use `squeal replay`"
        )
    topology = deployment.topology(args.topology)
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
            shard=args.shard,
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


def _print_status(rows: list[dict], supervisor: dict | None = None) -> None:
    if not rows:
        print("nothing is running (no components recorded)")
        return
    if supervisor is not None:
        if supervisor["running"]:
            print(
                f"supervisor pid {supervisor['pid']}, up {_duration(supervisor['uptime'])}, "
                f"metrics http://{supervisor['metrics']}/metrics, log {supervisor['log']}"
            )
        else:
            print(f"supervisor (pid {supervisor['pid']}) is NOT RUNNING: nothing restarts a component that exits")
    order = {role: i for i, role in enumerate(ALL_ROLES)}
    width = max(len("NAME"), *(len(r["name"]) for r in rows))
    print(f"{'NAME':{width}} {'ROLE':16} {'REGION':7} {'PID':>7} {'UPTIME':>7} {'RESTARTS':>8}  {'ADDRESS':21} STATE")
    for r in sorted(rows, key=lambda r: (order.get(r["role"], 99), r["region"], r["cluster"] or "", r["address"])):
        if r["answering"] and r.get("healthy") is False:
            problems = "; ".join(f"{k}: {v}" for k, v in (r.get("problems") or {}).items())
            state = "UNHEALTHY (/healthz 503)" + (f": {problems}" if problems else "")
        elif r["answering"] and r["role"] == "zookeeper":
            state = f"up, serving ({r['mode']})" if r.get("serving") else "up, NOT SERVING (no quorum yet?)"
        elif r["answering"]:
            state = "up"
        elif r["running"]:
            state = "running, not answering"
        else:
            state = "stopped (squealctl start NAME)" if r.get("stopped") else "DOWN"
        if r["answering"] and r.get("state"):  # a pool's worker: what it owns
            owns = r.get("owns") or []
            state = f"{r['state'].upper()} (owns {', '.join(owns) or 'nothing'}), {state}"
        if r.get("shards"):  # a sharded region's reader: which shards it runs
            state = f"{state}; reads {len(r['shards'])} shards ({', '.join(r['shards'])})"
        pid = r["pid"] if r["running"] else "-"
        print(
            f"{r['name']:{width}} {r['role']:16} {r['region']:7} {pid:>7} {_duration(r['uptime']):>7} "
            f"{r['restarts']:>8}  {r['address']:21} {state}"
        )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


if __name__ == "__main__":
    sys.exit(main())
