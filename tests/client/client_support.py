"""Helpers for the web-tier client tests (imported by conftest.py and the tests)."""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import router_config
from ops.harness import REPO_ROOT, ROUTER_BIN, MariaDB, free_port
from remote_markers import SqlClient


def router_available() -> bool:
    """Whether a real squeal-router is built (a placeholder binary does not know `--config-file`)."""
    if not ROUTER_BIN.exists():
        return False
    try:
        done = subprocess.run([str(ROUTER_BIN), "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and b"--config-file" in done.stdout + done.stderr


ROUTER_AVAILABLE = router_available()
ROUTER_SKIP = f"squeal-router not built yet ({ROUTER_BIN} missing or a placeholder without --config-file)"

_names = itertools.count(1)


def next_name() -> int:
    return next(_names)


def squeal_available() -> bool:
    """Whether `squeal run` exists (the daemon is being written in parallel)."""
    exe = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "squeal"
    if not exe.exists():
        return False
    try:
        done = subprocess.run([str(exe), "run", "--help"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


SQUEAL_AVAILABLE = squeal_available()
SQUEAL_SKIP = "`squeal run` is not runnable yet (squeal.cli missing); the daemon is being written in parallel"


def sql_for(db: MariaDB, database: str | None, role: str = "") -> SqlClient:
    return SqlClient(db.host, db.port, db.user, db.password, database, role=role)


def new_user(sql: SqlClient, name: str) -> int:
    n = next(_names)
    _, uid = sql.execute("INSERT INTO users (name, email) VALUES (%s, %s)", (name, f"u{n}-{os.getpid()}@example.com"))
    return uid


def one_cluster_topology(wildcard: list[str], router_port: int) -> router_config.Topology:
    """A one-region topology whose only cluster's wildcard pool is `wildcard` (for the router's config)."""
    servers = ", ".join(f'"{s}"' for s in wildcard)
    text = f"""
[regions.east]
master = true
database = {{ role = "primary", host = "127.0.0.1", port = {free_port()}, server_id = 1 }}
regional_pool = {{ servers = ["127.0.0.1:{free_port()}"], prefixes = ["regional:", "rmk:"] }}
[regions.east.clusters.c1]
routers = ["127.0.0.1:{router_port}"]
pools.wildcard = {{ kind = "wildcard", servers = [{servers}] }}
"""
    return router_config.loads(text, source="<client test>")


def two_region_topology_text(
    primary: MariaDB,
    replica: MariaDB,
    database: str,
    *,
    east_router: str,
    west_router: str,
    east_wildcard: str,
    west_wildcard: str,
    east_regional: str,
    west_regional: str,
) -> str:
    """east = master (primary), west = replica; one cluster each; rules for the demo schema in `database`."""

    def db(m: MariaDB, role: str) -> str:
        return (
            f'{{ role = "{role}", host = "{m.host}", port = {m.port}, server_id = {m.server_id}, '
            f'user = "{m.user}", password = "{m.password}" }}'
        )

    return f"""
[squeal]
datamarker_dir = "var/client-dm"
metrics_port_base = {free_port()}

[[rules]]
table = "{database}.users"
keys = ["user:{{id}}", "user:email:{{email}}"]
[[rules]]
table = "{database}.posts"
keys = ["post:{{id}}", "feed:{{author_id}}"]
[[rules]]
table = "{database}.follows"
keys = ["followers:{{followee_id}}", "following:{{follower_id}}"]

[regions.east]
master = true
database = {db(primary, "primary")}
regional_pool = {{ servers = ["{east_regional}"], prefixes = ["regional:", "rmk:"] }}
[regions.east.clusters.east-a]
routers = ["{east_router}"]
pools.wildcard = {{ kind = "wildcard", servers = ["{east_wildcard}"] }}

[regions.west]
database = {db(replica, "replica")}
regional_pool = {{ servers = ["{west_regional}"], prefixes = ["regional:", "rmk:"] }}
[regions.west.clusters.west-a]
routers = ["{west_router}"]
pools.wildcard = {{ kind = "wildcard", servers = ["{west_wildcard}"] }}
"""


class Regions:
    """Two regions (east master, west replica), one cluster each, on free ports.

    Without `router_factory` a memcached stands in for each cluster's router (as in squeal's tests: no
    prefix routing, so clients write markers to the regional pool directly). With it, each cluster gets a
    real squeal-router running `router_config.cluster_config` in front of its own memcached.
    """

    def __init__(
        self, base: Path, primary: MariaDB, replica: MariaDB, database: str, memcached_factory, router_factory=None
    ) -> None:
        self.primary, self.replica, self.database = primary, replica, database
        self.east_mc, self.west_mc = memcached_factory(), memcached_factory()
        self.east_regional, self.west_regional = memcached_factory(), memcached_factory()
        self.with_routers = router_factory is not None
        if self.with_routers:
            routers = {"east": f"127.0.0.1:{free_port()}", "west": f"127.0.0.1:{free_port()}"}
            wildcard = {"east": self.east_mc.address, "west": self.west_mc.address}
        else:
            routers = {"east": self.east_mc.address, "west": self.west_mc.address}
            wildcard = {"east": f"127.0.0.1:{free_port()}", "west": f"127.0.0.1:{free_port()}"}
        self.text = two_region_topology_text(
            primary,
            replica,
            database,
            east_router=routers["east"],
            west_router=routers["west"],
            east_wildcard=wildcard["east"],
            west_wildcard=wildcard["west"],
            east_regional=self.east_regional.address,
            west_regional=self.west_regional.address,
        )
        self.path = base / "topology.toml"
        self.path.write_text(self.text)
        self.topology = router_config.load(self.path)
        self.routers = {}
        if router_factory is not None:
            for cluster in self.topology.clusters:
                config = router_config.cluster_config(self.topology, cluster.name)
                self.routers[cluster.name] = router_factory(config, port=cluster.routers[0].port)

    def caught_up(self) -> None:
        """Wait until the replica has applied everything the primary committed."""
        self.replica.wait_for_gtid(self.primary.gtid_binlog_pos(), timeout=20)
