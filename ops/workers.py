"""`squealctl workers`, `drain WORKER`, `move SHARD --to WORKER`: a pooled region's workers, read and asked
through ZooKeeper (squeal/pool/squealctl.py keeps the requests; each region's controller acts on them)."""

from __future__ import annotations

import argparse
import json

import router_config
from ops.harness import HarnessError
from ops.local import Deployment


def command(deployment: Deployment, args: argparse.Namespace) -> int:
    """`squealctl workers`, `drain WORKER`, `move SHARD --to WORKER` for pooled regions (squeal/pool/)."""
    from kazoo.client import KazooClient

    from squeal import zookeeper_client_options
    from squeal.pool import squealctl as pool

    path = deployment.topology(args.topology)
    if path is None:
        raise HarnessError(f"{args.command}: no --topology given and no deployment recorded in {deployment.state_file}")
    topo = router_config.load(path)
    pooled = [r for r in topo.regions if r.squeal_pool]
    if args.command == "workers":
        if args.region is not None:
            pooled = [r for r in pooled if r.name == topo.region(args.region).name]
    else:
        name = args.worker if args.command == "drain" else args.to
        try:
            instance = topo.instance(name)
        except KeyError as e:
            raise HarnessError(str(e).strip('"')) from e
        pooled = [r for r in pooled if r.name == instance.region]
        if args.command == "move" and args.shard not in {s.name for s in topo.shards}:
            raise HarnessError(
                f"no shard {args.shard!r} in {topo.source} (have: {', '.join(s.name for s in topo.shards)})"
            )
    if not pooled or topo.zookeeper is None:
        raise HarnessError(
            f"{topo.source}: no pooled region{'' if args.command == 'workers' else ' for ' + name} "
            "(a region with [[regions.R.squeal_instances]])"
        )
    zk = topo.zookeeper
    client = KazooClient(
        hosts=zk.hosts,
        timeout=zk.session_timeout_s,
        connection_retry={"max_tries": 0},
        **zookeeper_client_options(topo),
    )
    try:
        client.start(timeout=5)
    except Exception as e:
        client.close()
        raise HarnessError(
            f"cannot reach ZooKeeper {zk.hosts} (zookeeper.servers in {topo.source}) within 5s: {e or type(e).__name__}"
        ) from e
    try:
        if args.command == "drain":
            pool.request_drain(client, zk.root, pooled[0].name, args.worker, undo=args.undo)
            print(
                f"worker {args.worker} (region {pooled[0].name}): "
                + (
                    "drain ended: it may be given shards again"
                    if args.undo
                    else "draining: the controller moves its shards to the other workers; `squealctl workers` shows "
                    "them go"
                )
            )
            return 0
        if args.command == "move":
            pool.request_move(client, zk.root, pooled[0].name, args.shard, args.to)
            print(
                f"shard {args.shard}: move to worker {args.to} requested (region {pooled[0].name}); "
                "`squealctl workers` shows it arrive"
            )
            return 0
        rows = [w for r in pooled for w in pool.workers(client, zk.root, r.name)]
    finally:
        client.stop()
        client.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'WORKER':<14} {'REGION':<8} {'PID':>7} {'LOAD':>9}  SHARDS (owned now)")
    for w in rows:
        extra = " [draining]" if w["draining"] else ""
        if not w.get("healthy", True):
            extra += " [its copy does not answer: given nothing]"
        if sorted(w["assigned"]) != sorted(w["shards"]):
            extra += f" (assigned: {', '.join(w['assigned']) or 'none'})"
        print(
            f"{w['name']:<14} {w['region']:<8} {w['pid'] or '-':>7} {w['load']:>9.1f}  "
            f"{', '.join(w['shards']) or '-'}{extra}"
        )
    return 0
