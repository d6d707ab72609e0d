"""`squeal run` and `squeal replay`: the invalidation daemon's command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import router_config
from squeal import gtid as g
from squeal.datamarkers import FileDatamarkerStore
from squeal.flows import flow_names

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
Rewinds one flow: its datamarker is rewritten to GTID, so it re-sends every invalidation of the
transactions AFTER GTID (deletes are idempotent; replaying is always safe). If the region's daemon is
running (pid file in the state dir) it is told with SIGHUP and re-reads that flow through a catch-up
reader while the other flows carry on; otherwise the next `squeal run` starts the flow from GTID.

Example: squeal replay examples/local.toml --region east --flow east-b --from 0-1-1200
"""


def _topology(path: str) -> router_config.Topology:
    return router_config.load(path)


def cmd_run(args: argparse.Namespace) -> int:
    from squeal.daemon import run

    topo = _topology(args.topology)
    topo.region(args.region)  # a clear error for a wrong region before anything starts
    port = args.metrics_port
    if port is None:
        port = topo.squeal.metrics_port_base + [r.name for r in topo.regions].index(args.region)
    return run(topo, args.region, state_dir=args.state_dir, metrics_port=port, from_gtid=args.from_gtid,
               reply_timeout=args.reply_timeout, sample_every=args.sample_every)


def cmd_replay(args: argparse.Namespace) -> int:
    from squeal.daemon import state_dir_for

    topo = _topology(args.topology)
    region = topo.region(args.region)
    names = flow_names(region)
    if args.flow not in names:
        raise ValueError(f"region {region.name} has no flow {args.flow!r} (flows: {', '.join(names)})")
    position = g.format_position(g.parse_position(args.from_gtid))
    state = state_dir_for(topo, args.state_dir)
    store = FileDatamarkerStore(state)
    old = store.load(args.flow)
    store.save(args.flow, position)
    store.request_replay(args.flow, position)
    print(f"flow {args.flow}: datamarker {old or '(none)'} -> {position or '(start of the binlog)'}")
    pid_file = state / f"squeal-{region.name}.pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGHUP)
        print(f"told the running daemon (pid {pid}) to replay")
    except (FileNotFoundError, ValueError, ProcessLookupError):
        print("no running daemon found: the next `squeal run` replays from there")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="squeal", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the invalidation daemon for one region's database",
                         description=DESCRIPTION, epilog=RUN_EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("topology", metavar="TOPOLOGY", help="topology TOML file (see examples/local.toml)")
    run.add_argument("--region", required=True, help="the region whose database this daemon reads")
    run.add_argument("--metrics-port", type=int, default=None,
                     help="port for /metrics and /healthz (default: the topology's metrics_port_base + the "
                          "region's index)")
    run.add_argument("--state-dir", default=None,
                     help="where datamarkers live (default: the topology's squeal.datamarker_dir)")
    run.add_argument("--from-gtid", default=None, metavar="GTID",
                     help="flows with no datamarker start after this GTID position instead of now")
    run.add_argument("--sample-every", type=int, default=1000, metavar="N",
                     help="keep 1 in N acknowledged deletes for /sampled-deletes (the prober re-checks them; "
                     "default %(default)s)")
    run.add_argument("--reply-timeout", type=float, default=2.0, metavar="SECONDS",
                     help="a destination that does not answer a batch within this is retried (default 2)")
    run.set_defaults(func=cmd_run)

    rep = sub.add_parser("replay", help="re-send one flow's invalidations from a GTID",
                         description="Re-send one destination's invalidations from a GTID position.",
                         epilog=REPLAY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("topology", metavar="TOPOLOGY", help="topology TOML file")
    rep.add_argument("--region", required=True, help="the region whose daemon owns the flow")
    rep.add_argument("--flow", required=True, help='a cluster name of the region, or "regional"')
    rep.add_argument("--from", dest="from_gtid", required=True, metavar="GTID",
                     help="re-send everything after this GTID position (D-S-N[,D-S-N...])")
    rep.add_argument("--state-dir", default=None, help="where datamarkers live (as for `squeal run`)")
    rep.set_defaults(func=cmd_replay)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from squeal.reader import ReaderConfigError
    from squeal.rules import RuleError

    try:
        return args.func(args)
    except (router_config.TopologyError, RuleError, ReaderConfigError, g.GtidError, ValueError, KeyError,
            ConnectionError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"squeal: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["main", "parser"]
