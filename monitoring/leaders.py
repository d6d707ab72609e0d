"""Who leads each HA region: every squeal instance's /healthz, polled (the dashboard's "leaders" table).

A region with `squeal_instances` has one leader (it delivers) and standbys (connected, reading nothing); each
instance's /healthz says which it is (`state`), who it sees leading (`ha.leader`) and, for the leader, when it
took over (`takeover.since`). Regions with a single daemon have no election and are not listed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from router_config import Topology
from squeal import probe_health

log = logging.getLogger(__name__)


def instance_health(address: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """An instance's /healthz JSON (200 or 503), None when it does not answer."""
    code, body = probe_health(address, timeout)
    return body if code is not None else None


def leaders(topo: Topology, health=instance_health) -> list[dict[str, Any]]:
    """Per HA region: `leader` (instance name, None while nobody leads), `since` (unix time it took over),
    `standbys` (names), and `instances` (name, address, state: leader/standby/taking_over, or "down")."""
    out = []
    for region in topo.regions:
        if not region.squeal_instances:
            continue
        rows = []
        leader, since = None, None
        for inst in region.squeal_instances:
            body = health(str(inst.address))
            state = (body or {}).get("state") or "down"
            rows.append(
                {"name": inst.name, "address": str(inst.address), "database": inst.database.name, "state": state}
            )
            if state == "leader":
                leader, since = inst.name, (body.get("takeover") or {}).get("since")
        standbys = [r["name"] for r in rows if r["state"] == "standby"]
        out.append({"region": region.name, "leader": leader, "since": since, "standbys": standbys, "instances": rows})
    return out


class LeaderWatch:
    """`leaders(topo)` every `interval` seconds on a thread of its own; `snapshot()` is the last answer."""

    def __init__(self, topo: Topology, interval: float = 2.0) -> None:
        self.topo, self.interval = topo, interval
        self._last: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> LeaderWatch:
        if any(r.squeal_instances for r in self.topo.regions):
            threading.Thread(target=self._run, name="leaders", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._last)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                found = leaders(self.topo)
            except Exception:
                log.exception("polling the squeal instances failed")
            else:
                with self._lock:
                    self._last = found
            self._stop.wait(self.interval)
