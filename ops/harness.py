"""Start and stop the real processes squeal runs against: MariaDB, memcached, the router, ZooKeeper.

Used by `squealctl up` and by the test fixtures alike, so tests exercise exactly what operators run.
Every process gets a free loopback port, its own work directory (logs kept there) and is stopped by
pid: SIGTERM, then SIGKILL after a grace period. A missing binary is a clear error that says which
Debian package to install.

This module is the front door: each kind of process lives in a module of its own under ops/processes/
(`memcached`, `mariadb`, `router`, `zookeeper`, `squeal_daemon`, `monitoring_server`, `demo_workload`), what
they share in `ops/processes/base.py`; their public names are re-exported here, so callers import `ops.harness`.
"""

from __future__ import annotations

from ops.processes.base import (
    REPO_ROOT,
    HarnessError,
    ManagedProcess,
    Polled,
    _tail,
    child_env,
    free_port,
    require_binary,
    wait_until,
)
from ops.processes.demo_workload import DemoWorkload
from ops.processes.mariadb import MariaDB
from ops.processes.memcached import Memcached, memcached_command, tls_memcached_command
from ops.processes.monitoring_server import MonitoringServer
from ops.processes.router import ROUTER_BIN, Router
from ops.processes.squeal_daemon import SquealDaemon
from ops.processes.zookeeper import (
    ZOOKEEPER_CLASSPATH,
    ZOOKEEPER_LOGGING,
    ZOOKEEPER_MAIN,
    ZooKeeper,
    mode_of,
    zookeeper_config,
    zookeeper_mode,
    zookeeper_srvr,
)

__all__ = [
    "REPO_ROOT",
    "ROUTER_BIN",
    "ZOOKEEPER_CLASSPATH",
    "ZOOKEEPER_LOGGING",
    "ZOOKEEPER_MAIN",
    "DemoWorkload",
    "HarnessError",
    "ManagedProcess",
    "MariaDB",
    "Memcached",
    "MonitoringServer",
    "Polled",
    "Router",
    "SquealDaemon",
    "ZooKeeper",
    "_tail",
    "child_env",
    "free_port",
    "memcached_command",
    "mode_of",
    "require_binary",
    "tls_memcached_command",
    "wait_until",
    "zookeeper_config",
    "zookeeper_mode",
    "zookeeper_srvr",
]
