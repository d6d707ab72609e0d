"""`squeal run` and `squeal replay`: the invalidation daemon's command line."""

from __future__ import annotations

import argparse
import logging
import sys

import router_config
from squeal.markers.replay import add_replay_options
from squeal.read import gtid as g

DESCRIPTION = """\
squeal tails one region's MariaDB binlog and deletes the memcache keys each committed transaction
invalidates (rule templates from the topology plus /* mcd:k1,k2 */ comments), from every frontend
cluster of the region and its regional pool, at least once, in commit order per destination.
"""

RUN_EPILOG = """\
Each destination (cluster, or "regional") is a flow with its own datamarker file in the state dir:
the last GTID position the destination acknowledged. A flow without one starts from the server's
current position ("now"), or after --from-gtid if given. Positions use MariaDB's GTID list form
(D-S-N[,D-S-N...]) and name the last transaction already DONE: reading resumes with the next one.

Serves /metrics (Prometheus) and /healthz on --metrics-port.
Signals: SIGTERM/SIGINT flush queued deletes, write datamarkers and exit; SIGHUP applies pending
`squeal replay` requests at once (they are also picked up within a second without it).
"""

REPLAY_EPILOG = """\
Rewinds one flow (or, with --flow all, every flow of the region): its datamarker is rewritten to GTID,
so it re-sends every invalidation of the transactions AFTER GTID (deletes are idempotent; replaying is
always safe). The state dir must exist. If the region's daemon is running (pid file in the state dir) it
is told with SIGHUP and re-reads that flow through a catch-up reader while the other flows carry on;
otherwise the next `squeal run` on that state dir starts the flow from GTID. A pid file whose pid is not
`squeal run --region REGION` on this state dir (a stale file, a reused pid) is refused: exit 1, nothing
written or signalled. For a daemon `squealctl up` started, use `squealctl replay`.

Example: squeal replay examples/local.toml --region east --flow east-b --from 0-1-1200
"""


def _topology(path: str) -> router_config.Topology:
    return router_config.load(path)


def cmd_run(args: argparse.Namespace) -> int:
    from prometheus_client import disable_created_metrics

    from squeal.process.shell import Shell
    from squeal.shard.region import RegionDaemon

    # No `*_created` series beside every counter and histogram: nothing reads them, and they were a sixth of the
    # samples each scrape renders (a scrape a second, per shard; bench/squeal_shards.py --only idle).
    disable_created_metrics()
    topo = _topology(args.topology)
    if args.instance is not None:  # a worker of the region's pool (docs/squeal.md, "Worker pool")
        from squeal.pool.worker import PoolWorker

        instance = topo.instance(args.instance)
        if args.region is not None and args.region != instance.region:
            raise ValueError(f"instance {instance.name} belongs to region {instance.region}, not {args.region}")
        worker = PoolWorker(
            topo,
            instance.name,
            state_dir=args.state_dir,
            from_gtid=args.from_gtid,
            reply_timeout=args.reply_timeout,
            sample_every=args.sample_every,
        )
        port = args.metrics_port if args.metrics_port is not None else instance.metrics_port
        return Shell(worker, port, instance.host).run()
    if args.region is None:
        raise ValueError("squeal run needs --region REGION (or --instance NAME for a worker of a region's pool)")
    region = topo.region(args.region)  # a clear error for a wrong region before anything starts
    if region.squeal_instances:
        raise ValueError(
            f"region {region.name} runs a pool of squeal workers: start each with "
            f"--instance NAME ({', '.join(s.name for s in region.squeal_instances)})"
        )
    port = args.metrics_port
    if port is None:
        port = topo.squeal.metrics_port_base + [r.name for r in topo.regions].index(args.region)
    daemon = RegionDaemon(
        topo,
        args.region,
        state_dir=args.state_dir,
        from_gtid=args.from_gtid,
        reply_timeout=args.reply_timeout,
        sample_every=args.sample_every,
    )
    # The pid file `squeal replay` signals (SIGHUP: replay requests now) and checks is `squeal run --region`'s.
    pid_file = daemon.state_dir / f"squeal-{region.name}.pid"
    return Shell(daemon, port, region.squeal_host, pid_file=pid_file).run()


def cmd_replay(args: argparse.Namespace) -> int:
    from squeal.markers.replay import ReplayError, replay
    from squeal.shard.daemon import state_dir_for

    topo = _topology(args.topology)
    try:
        lines = replay(
            topo, args.region, args.flow, args.from_gtid, state_dir_for(topo, args.state_dir), shard=args.shard
        )
    except ReplayError as e:
        print(f"squeal replay: error: {e}", file=sys.stderr)
        return e.code
    print("\n".join(lines))
    return 0


ACCEPT_EPILOG = """\
After binlog data loss (the binlog a datamarker needs was purged: MariaDB error 1236) with
on_data_loss = "halt", the region's daemon stops delivering, /healthz answers 503 and it logs an ERROR
every minute. This command tells it to go on: it flushes every destination of the region (each cluster
through its routers, and the regional pool), so nothing cached from the lost changes survives, and
resumes from the oldest binlog the database still has. The daemon applies it within a second.
Runbook: docs/runbooks/data-loss.md.
"""


def cmd_accept_data_loss(args: argparse.Namespace) -> int:
    from squeal.markers.replay import ReplayError, check_shard
    from squeal.shard.daemon import state_dir_for
    from squeal.shard.data_loss import accept_path

    topo = _topology(args.topology)
    region = topo.region(args.region)
    try:
        shard = check_shard(topo, args.shard)
    except ReplayError as e:
        print(f"squeal accept-data-loss: error: {e}", file=sys.stderr)
        return e.code
    of = f" shard {shard} of" if shard else ""
    if region.squeal_instances:  # a pool: the request goes where every worker can see it, beside the shard's markers
        from squeal.markers.replay import zookeeper_owner, zookeeper_store

        try:
            with zookeeper_store(topo, region.name, shard=shard) as store:
                store.request_loss_acceptance()
                owner = zookeeper_owner(store)
        except ReplayError as e:
            print(f"squeal accept-data-loss: error: {e}", file=sys.stderr)
            return e.code
        who = f"its owner, worker {owner}," if owner else "its next owner"
        print(
            f"data loss accepted for{of} region {region.name} ({store.dir}/accept-data-loss): {who} flushes the "
            "region's destinations and resumes within a second or two; watch its /healthz"
        )
        return 0
    state = state_dir_for(topo, args.state_dir)
    if not state.is_dir():
        raise ValueError(f"state dir {state} does not exist (is --state-dir the daemon's?)")
    path = accept_path(state, region.name, shard)
    path.write_text("accepted\n")
    print(
        f"data loss accepted for{of} region {region.name} ({path}): the running daemon flushes the region's "
        "destinations and resumes within a second; watch /healthz"
    )
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="squeal", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run the invalidation daemon for one region's database",
        description=DESCRIPTION,
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("topology", metavar="TOPOLOGY", help="topology TOML file (see examples/local.toml)")
    run.add_argument("--region", default=None, help="the region whose database this daemon reads")
    run.add_argument(
        "--instance",
        default=None,
        metavar="NAME",
        help="run the topology's squeal instance NAME (one of its region's [[squeal_instances]]) as a worker of "
        "the region's pool: it owns the shards the pool's controller gives it (docs/squeal.md, \"Worker pool\")",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="port for /metrics and /healthz (default: the topology's metrics_port_base + the "
        "region's index; with --instance, the instance's metrics_port)",
    )
    run.add_argument(
        "--state-dir", default=None, help="where datamarkers live (default: the topology's squeal.datamarker_dir)"
    )
    run.add_argument(
        "--from-gtid",
        default=None,
        metavar="GTID",
        help="flows with no datamarker start after this GTID position instead of now",
    )
    run.add_argument(
        "--sample-every",
        type=int,
        default=1000,
        metavar="N",
        help="keep 1 in N acknowledged deletes for /sampled-deletes (the prober re-checks them; default %(default)s)",
    )
    run.add_argument(
        "--reply-timeout",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="a destination that does not answer a batch within this is retried (default 2)",
    )
    run.set_defaults(func=cmd_run)

    rep = sub.add_parser(
        "replay",
        help="re-send one flow's invalidations from a GTID",
        description="Re-send one destination's invalidations from a GTID position.",
        epilog=REPLAY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument("topology", metavar="TOPOLOGY", help="topology TOML file")
    add_replay_options(rep)
    rep.add_argument("--state-dir", default=None, help="where datamarkers live (as for `squeal run`); must exist")
    rep.set_defaults(func=cmd_replay)

    acc = sub.add_parser(
        "accept-data-loss",
        help="after purged binlogs (halt policy): flush the region, resume",
        description="Accept binlog data loss for a halted region.",
        epilog=ACCEPT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    acc.add_argument("topology", metavar="TOPOLOGY", help="topology TOML file")
    acc.add_argument("--region", required=True, help="the halted region")
    acc.add_argument("--shard", default=None, help="with [shards]: the halted shard (each halts alone)")
    acc.add_argument("--state-dir", default=None, help="the daemon's state dir (as for `squeal run`)")
    acc.set_defaults(func=cmd_accept_data_loss)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from squeal.keys.rules import RuleError
    from squeal.markers.datamarkers import DatamarkerDirError
    from squeal.read.reader import ReaderConfigError

    try:
        return args.func(args)
    except (
        router_config.TopologyError,
        RuleError,
        ReaderConfigError,
        g.GtidError,
        ValueError,
        KeyError,
        ConnectionError,
        DatamarkerDirError,
    ) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"squeal: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["main", "parser"]
