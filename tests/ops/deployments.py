"""What the ops tests share: a small two-region topology, stable ports, and `squealctl` as a process."""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pymysql
import pytest

import router_config
from ops import cli
from ops.harness import REPO_ROOT
from tests.topologies import CANARY_RULE, USERS_RULE, east_region

# Ports here are placeholders (the loader wants them distinct); every one is reassigned to a free port.
TWO_REGIONS = (
    USERS_RULE
    + east_region(1, {"east-a": ("127.0.0.1:2", "127.0.0.1:3")})
    + """
[regions.west]
database = { role = "replica", port = 4, server_id = 2 }

[regions.west.clusters.west-a]
routers = ["127.0.0.1:5"]
pools.wildcard = { kind = "wildcard", servers = ["127.0.0.1:6"] }
"""
)

# east's second copy of its data (a GTID replica of the primary) and a squeal worker on each. Placeholder ports 10-12.
EAST_TWO_WORKERS = """
[regions.east.replicas.east-r1]
port = 10
server_id = 3

[[regions.east.squeal_instances]]
name = "east-1"
database = "east"
metrics_port = 11

[[regions.east.squeal_instances]]
name = "east-2"
database = "east-r1"
metrics_port = 12
"""

_handed_out: set[int] = set()


def stable_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999): a second `up` binds every port again, and
    no outgoing connection of the first run (or of anything else) can be holding one as its source port."""
    while True:
        port = random.randint(20000, 32000)
        if port not in _handed_out and router_config.can_listen(router_config.Address("127.0.0.1", port)):
            _handed_out.add(port)
            return port


def squealctl(state: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`squealctl --state-dir STATE ARGS...` in a process of its own; raises with its output if it fails."""
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"squealctl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def squealctl_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`squealctl ARGS` run in this process (ops.cli.main), its output taken from `capsys`: (exit status, stdout,
    stderr)."""
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def write_on_stable_ports(text: str, path: Path) -> router_config.Topology:
    """The topology `text` (placeholder ports) with every port moved to a stable free one, written to `path`."""
    topo = router_config.reassign_ports(router_config.loads(text, source=path.name), stable_port)
    path.write_text(router_config.dumps(topo))
    return topo


@contextlib.contextmanager
def squealctl_up(state: Path, topology: Path, *up_args: str) -> Iterator[None]:
    """`squealctl up TOPOLOGY UP_ARGS` (state in `state`) for the block; `down` after it, whatever happened."""
    try:
        squealctl(state, "up", str(topology), *up_args)
        yield
    finally:
        squealctl(state, "down", check=False)


# east runs two squeal workers (on the primary, on a GTID replica of it) behind a 3-server ZooKeeper
# ensemble; west keeps its single daemon (a topology may mix both). Placeholder ports, as above.
TWO_WORKERS_TWO_REGIONS = (
    """
[zookeeper]
servers = ["127.0.0.1:7", "127.0.0.1:8", "127.0.0.1:9"]
session_timeout_s = 2
handback_after_s = 2

"""
    + CANARY_RULE
    + EAST_TWO_WORKERS
    + TWO_REGIONS
)


@dataclass
class TwoWorkerDeployment:
    """`squealctl up` of TWO_WORKERS_TWO_REGIONS (east: two workers on two copies) on stable free ports
    (tests/conftest.py's `two_worker_deployment`)."""

    topology: Path
    topo: router_config.Topology
    state: Path

    def status(self) -> dict[str, dict]:
        """`squealctl status --json`, by component name."""
        return {r["name"]: r for r in json.loads(squealctl(self.state, "status", "--json", check=False).stdout)}

    def owner(self, region: str = "east") -> str | None:
        """The worker that owns the region's (one) shard now, None while none or several say they do."""
        rows = self.status().values()
        owners = [r["instance"] for r in rows if r.get("owns") and r["region"] == region]
        return owners[0] if len(owners) == 1 else None


@contextlib.contextmanager
def two_worker_deployment_up(base: Path) -> Iterator[TwoWorkerDeployment]:
    path = base / "workers.toml"
    write_on_stable_ports(TWO_WORKERS_TWO_REGIONS, path)
    state = base / "state"
    with squealctl_up(state, path):
        yield TwoWorkerDeployment(path, router_config.load(path), state)


def run_sql(db: router_config.Database, *statements: str) -> list[tuple]:
    """Run `statements` on one database of a deployed topology (autocommit); the last one's rows."""
    with (
        pymysql.connect(host=db.host, port=db.port, user=db.user, password=db.password, autocommit=True) as conn,
        conn.cursor() as cur,
    ):
        for statement in statements:
            cur.execute(statement)
        return list(cur.fetchall())
