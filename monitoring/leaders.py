"""Who owns what in each region with squeal instances: every instance's /healthz, polled (the dashboard's
"leaders" table).

An HA region has one leader (it delivers every shard) and standbys (connected, reading nothing); each instance's
/healthz says which it is (`state`), who it sees leading (`ha.leader`) and, for the leader, when it took over
(`takeover.since`). A pooled region has workers (`state` "worker"), each owning some shards (`owns`). Either way
`owners` maps every shard of the topology to the instance delivering it, and `unowned` lists the shards nobody
delivers now. Regions with a single daemon have no election and are not listed.
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


def leaders(topo: Topology, health=instance_health) -> list[dict[str, Any]]:
    """Per region with squeal instances: `pool` (its instances are a pool's workers), `leader` (instance name, None
    while nobody leads, always None in a pool), `since` (unix time it took over), `standbys` (names), `instances`
    (name, address, state: leader/standby/taking_over/worker/starting, or "down"; `owns`: the shards it delivers),
    `owners` (shard -> the instance delivering it) and `unowned` (shards nobody delivers now)."""
    shards = [s.name for s in topo.shards]
    out = []
    for region in topo.regions:
        if not region.squeal_instances:
            continue
        rows = []
        leader, since = None, None
        for inst in region.squeal_instances:
            body = health(str(inst.address)) or {}
            state = body.get("state") or "down"
            if state == "leader":
                leader, since = inst.name, (body.get("takeover") or {}).get("since")
                owns = list(shards)  # one leader delivers every shard of its region
            elif state == "worker":
                owns = sorted(str(s) for s in body.get("owns") or [])
            else:
                owns = []
            rows.append(
                {
                    "name": inst.name,
                    "address": str(inst.address),
                    "database": inst.database.name,
                    "state": state,
                    "owns": owns,
                }
            )
        standbys = [r["name"] for r in rows if r["state"] == "standby"]
        owners = {shard: r["name"] for r in rows for shard in r["owns"]}
        out.append(
            {
                "region": region.name,
                "pool": region.squeal_pool,
                "leader": leader,
                "since": since,
                "standbys": standbys,
                "instances": rows,
                "owners": {s: owners[s] for s in shards if s in owners},
                "unowned": [s for s in shards if s not in owners],
            }
        )
    return out


class LeaderWatch(Poller):
    """`leaders(topo)` every `interval` seconds on a thread of its own; `snapshot()` is the last answer."""

    thread_name = "leaders"
    failure = "polling the squeal instances failed"

    def __init__(self, topo: Topology, interval: float = 2.0) -> None:
        super().__init__(topo, interval)

    def wanted(self) -> bool:
        return any(r.squeal_instances for r in self.topo.regions)

    def look(self) -> list[dict[str, Any]]:
        return leaders(self.topo)
