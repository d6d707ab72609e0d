"""Who owns what in each region with squeal instances (the workers of its pool): every worker's /healthz, polled
(the dashboard's owners table, `/api/owners`).

A worker's /healthz says its `state` ("worker"; "starting" while it waits for ZooKeeper) and the shards it owns
(`owns`); `owners` maps every shard of the topology to the worker delivering it, and `unowned` lists the shards
nobody delivers now (a move or a takeover in progress, or no healthy worker). Regions with a single daemon have no
pool and are not listed.
"""

from __future__ import annotations

from typing import Any

from monitoring.polling import Poller
from router_config import Topology
from squeal import probe_health


def instance_health(address: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """An instance's /healthz JSON (200 or 503), None when it does not answer."""
    code, body = probe_health(address, timeout)
    return body if code is not None else None


def ownership(topo: Topology, health=instance_health) -> list[dict[str, Any]]:
    """Per region with squeal instances: `instances` (name, address, database, state: worker/starting, or "down";
    `owns`: the shards it delivers), `idle` (the workers that answer and own nothing: a standby in the region's
    "one shard, two workers"), `owners` (shard -> the worker delivering it) and `unowned` (shards nobody delivers
    now)."""
    shards = [s.name for s in topo.shards]
    out = []
    for region in topo.regions:
        if not region.squeal_instances:
            continue
        rows = []
        for inst in region.squeal_instances:
            body = health(str(inst.address)) or {}
            rows.append(
                {
                    "name": inst.name,
                    "address": str(inst.address),
                    "database": inst.database.name,
                    "state": body.get("state") or "down",
                    "owns": sorted(str(s) for s in body.get("owns") or []),
                }
            )
        owners = {shard: r["name"] for r in rows for shard in r["owns"]}
        out.append(
            {
                "region": region.name,
                "instances": rows,
                "idle": [r["name"] for r in rows if r["state"] == "worker" and not r["owns"]],
                "owners": {s: owners[s] for s in shards if s in owners},
                "unowned": [s for s in shards if s not in owners],
            }
        )
    return out


class OwnershipWatch(Poller):
    """`ownership(topo)` every `interval` seconds on a thread of its own; `snapshot()` is the last answer."""

    thread_name = "owners"
    failure = "polling the squeal instances failed"

    def __init__(self, topo: Topology, interval: float = 2.0) -> None:
        super().__init__(topo, interval)

    def wanted(self) -> bool:
        return any(r.squeal_instances for r in self.topo.regions)

    def look(self) -> list[dict[str, Any]]:
        return ownership(self.topo)
