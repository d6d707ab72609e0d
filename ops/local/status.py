"""`squealctl status`: every recorded component as it is now — running, answering, healthy and why not.

A squeal daemon says what is wrong on its own /healthz (and a pool's worker which shards it owns); ZooKeeper
answers `srvr`; every other component is judged by what can be seen from outside: its pid and its port.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import asdict
from pathlib import Path

import router_config
from ops.harness import mode_of, zookeeper_srvr
from ops.local import pids
from ops.local.state import StateDir
from squeal import probe_health


def status(state: StateDir) -> list[dict]:
    """Every recorded component with its current `pid`, `running` (alive), `answering` (port accepts),
    `uptime` (seconds, None when not running), `restarts` and `stopped` (held down by `squealctl stop`); a
    squeal daemon also `healthy` (its /healthz: True on 200, False on 503, None when it did not answer) and
    `problems` (what its /healthz names), a pool's worker `state` (`worker`, `starting`; None when it did not
    answer) and `owns` (the shards it owns now); a ZooKeeper server `serving` (it has a quorum and serves
    clients) and `mode` (`leader`, `follower`, `standalone`; None when not serving)."""
    out = []
    components = state.components()
    zk_tls = _zookeeper_tls(state) if any(c.role == "zookeeper" for c in components) else None
    for c, pid in zip(components, pids.locate(components), strict=True):
        running = pid is not None
        srvr = zookeeper_srvr(c.address, zk_tls) if running and c.role == "zookeeper" else None
        row = {
            **asdict(c),
            "pid": pid if running else c.pid,
            "running": running,
            # ZooKeeper: its `srvr` answer (a bare connect would put a stack trace in its log each time)
            "answering": srvr is not None if c.role == "zookeeper" else running and _port_open(c.address),
            "uptime": pids.uptime(pid) if running and pid is not None else None,
        }
        if c.role == "squeal":
            code, body = probe_health(c.address) if row["answering"] else (None, {})
            row["healthy"] = None if code is None else code == 200
            problems = body.get("problems") or {}
            row["problems"] = problems if isinstance(problems, dict) else {"healthz": str(problems)}
            if c.instance:
                row["state"] = body.get("state")
                row["owns"] = sorted(str(s) for s in body.get("owns") or [])
            if isinstance(body.get("shards"), dict):  # [shards]: the shards this daemon reads now, and which copy
                row["shards"] = sorted(body["shards"])
                row["copies"] = {
                    shard: (st.get("reads") or {}).get("name") for shard, st in sorted(body["shards"].items())
                }
        if c.role == "zookeeper":
            row["mode"] = mode_of(srvr)
            row["serving"] = row["mode"] is not None
        if c.role != "squeal":  # squeal's come from its /healthz; the others' from what we can see
            row["problems"] = _visible_problems(row)
            row["healthy"] = not row["problems"]
        out.append(row)
    return out


def supervisor_status(state: StateDir) -> dict | None:
    """The supervisor's record with `running` and `uptime`, or None when the deployment has none."""
    sup = state.supervisor()
    if sup is None:
        return None
    running = pids.is_running(sup)
    return {**asdict(sup), "running": running, "uptime": pids.uptime(sup.pid) if running else None}


def _visible_problems(row: dict) -> dict[str, str]:
    """Why a component without a /healthz of its own is not healthy, as `status` sees it (empty: healthy)."""
    if row.get("stopped"):
        return {"stopped": "held down by `squealctl stop` (`squealctl start NAME`)"}
    if not row["running"]:
        return {"process": f"pid {row['pid']} is not running"}
    if not row["answering"]:
        return {"port": f"{row['address']} does not accept connections"}
    if row["role"] == "zookeeper" and not row.get("serving"):
        return {"quorum": "the server answers but does not serve (no quorum?)"}
    return {}


def _zookeeper_tls(state: StateDir) -> ssl.SSLContext | None:
    """With the recorded topology's [tls], ZooKeeper's client ports are TLS: `srvr` is asked over TLS,
    verifying the servers against the topology's CA (status presents no certificate of its own)."""
    path = state.recorded_topology()
    if path is None or not Path(path).exists():
        return None
    tls = router_config.load(path).tls
    return router_config.verifying_context(tls.ca) if tls is not None else None


def _port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False
