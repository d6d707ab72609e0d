"""What `squealctl workers`, `drain WORKER` and `move SHARD --to WORKER` read from and ask of a region's pool
(ops/workers.py): plain znode reads and writes the controller acts on. The caller's thread (a CLI): blocking
kazoo calls."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from squeal.pool.znodes import read_doc
from squeal.pool.zookeeper import pool_path


def workers(client: KazooClient, root: str, region: str) -> list[dict[str, Any]]:
    """Every member of the region's pool: name, region, pid, the shards it owns now (from the shards' `owner`
    znodes: ownership, not the plan), its load and the shards the assignment gives it."""
    base = pool_path(root, region)
    try:
        names = client.get_children(f"{base}/workers")
    except NoNodeError:
        names = []
    try:
        assignment = read_doc(client.get(f"{base}/assignment")[0]).get("assignment") or {}
    except NoNodeError:
        assignment = {}
    try:
        shard_names = client.get_children(f"{base}/shards")
    except NoNodeError:
        shard_names = []
    owners: dict[str, str] = {}
    for shard in shard_names:
        with contextlib.suppress(NoNodeError):
            owners[shard] = str(read_doc(client.get(f"{base}/shards/{shard}/owner")[0]).get("worker"))
    try:
        drains = set(client.get_children(f"{base}/drain"))
    except NoNodeError:
        drains = set()
    out = []
    for name in sorted(names):
        try:
            doc = read_doc(client.get(f"{base}/workers/{name}")[0])
        except NoNodeError:
            continue
        out.append(
            {
                "name": name,
                "region": region,
                "pid": doc.get("pid"),
                "shards": sorted(s for s, w in owners.items() if w == name),
                "load": doc.get("load", 0.0),
                "loads": doc.get("loads", {}),
                "assigned": sorted(s for s, w in assignment.items() if w == name),
                "draining": name in drains,
                "healthy": bool(doc.get("healthy", True)),
            }
        )
    return out


def request_drain(client: KazooClient, root: str, region: str, worker: str, undo: bool = False) -> None:
    """`squealctl drain WORKER`: the controller moves the worker's shards to the others (and gives it none)."""
    path = f"{pool_path(root, region)}/drain/{worker}"
    if undo:
        with contextlib.suppress(NoNodeError):
            client.delete(path)
        return
    with contextlib.suppress(NodeExistsError):
        client.create(path, json.dumps({"requested_at": time.time()}).encode(), makepath=True)


def request_move(client: KazooClient, root: str, region: str, shard: str, to: str) -> None:
    """`squealctl move SHARD --to WORKER`: the controller reassigns the shard at its next plan."""
    path = f"{pool_path(root, region)}/move/{shard}"
    data = json.dumps({"to": to, "requested_at": time.time()}).encode()
    try:
        client.create(path, data, makepath=True)
    except NodeExistsError:
        client.set(path, data)
