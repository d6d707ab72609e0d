"""Shared fixtures: real MariaDB, memcached, router and ZooKeeper processes on free loopback ports.

Work dirs live under pytest's tmp_path (pytest keeps the last runs), so logs survive a failure.
Every process is stopped by pid at teardown, whatever the test did to it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ops.harness import REPO_ROOT, ManagedProcess, MariaDB, Memcached, Router, ZooKeeper
from tests.binaries import pytest_runtest_setup, require_binary  # noqa: F401 - the needs_binary marks' hook

# The processes the tests start (`squeal run`, ...) run from the virtualenv, whose editable install may point
# at another checkout (a git worktree shares main's .venv): put this checkout first on their import path so
# they run the code under test.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))


def run_threads(target: Callable[[], object], n: int, timeout: float | None = None) -> None:
    """`target` in `n` threads started together; returns once each has ended (or its join's `timeout` passed)."""
    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


class _Processes:
    """Starts processes for one test (or session) and stops them all at the end."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: list[ManagedProcess] = []

    def add(self, proc: ManagedProcess) -> ManagedProcess:
        self.started.append(proc)
        return proc.start()

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            if proc.proc is not None and proc.proc.poll() is None:
                try:
                    proc.resume()  # a test may have left it SIGSTOPped
                except (OSError, AssertionError):
                    pass
            proc.stop(grace=5)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[_Processes]:
    procs = _Processes(tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
def memcached_factory(processes: _Processes) -> Callable[..., Memcached]:
    """`memcached_factory()` starts one memcached on a free port."""

    def make(**kwargs) -> Memcached:
        return processes.add(Memcached(workdir=processes.base / "memcached", **kwargs))

    return make


@pytest.fixture
def mariadb_factory(processes: _Processes) -> Callable[..., MariaDB]:
    """`mariadb_factory(server_id, replica=False)` starts a MariaDB with squeal's binlog settings."""

    def make(server_id: int = 1, **kwargs) -> MariaDB:
        return processes.add(MariaDB(server_id, workdir=processes.base / f"mariadb{server_id}", **kwargs))

    return make


@pytest.fixture(scope="session")
def mariadb_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MariaDB, MariaDB]]:
    """A primary and a GTID replica (log_slave_updates) shared by the session: use your own database names."""
    procs = _Processes(tmp_path_factory.mktemp("mariadb-pair"))
    primary = procs.add(MariaDB(1, workdir=procs.base / "primary"))
    replica = procs.add(MariaDB(2, workdir=procs.base / "replica", replica=True))
    replica.replicate_from(primary)
    yield primary, replica
    procs.stop_all()


@pytest.fixture(scope="session")
def shard_primaries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, MariaDB]]:
    """One MariaDB primary per shard of tests/shard_support.py (s0..s2, each in its own GTID domain), shared by the
    session: use your own database names."""
    from tests.shard_support import DOMAINS, SERVER_IDS, SHARDS

    procs = _Processes(tmp_path_factory.mktemp("shard-primaries"))
    try:
        yield {s: procs.add(MariaDB(SERVER_IDS[s], workdir=procs.base / s, gtid_domain_id=DOMAINS[s])) for s in SHARDS}
    finally:
        procs.stop_all()


@pytest.fixture
def router_factory(processes: _Processes) -> Callable[..., Router]:
    """`router_factory(config)` writes `config` (a dict, or a path) and starts squeal-router on it."""
    count = 0

    def make(config: dict | str | Path, **kwargs) -> Router:
        nonlocal count
        count += 1
        workdir = processes.base / f"router{count}"
        workdir.mkdir(parents=True, exist_ok=True)
        if isinstance(config, dict):
            path = workdir / "config.json"
            path.write_text(json.dumps(config, indent=2))
        else:
            path = Path(config)
        return processes.add(Router(path, workdir=workdir, **kwargs))

    return make


@pytest.fixture
def zookeeper(processes: _Processes) -> ZooKeeper:
    return processes.add(ZooKeeper(workdir=processes.base / "zookeeper"))


@pytest.fixture(scope="module")
def two_worker_deployment(tmp_path_factory: pytest.TempPathFactory):
    """`squealctl up` of a small topology with two workers (tests/ops/deployments.py TWO_WORKERS_TWO_REGIONS: a
    3-server ZooKeeper ensemble, east's workers east-1 on the primary and east-2 on a replica, west's single daemon),
    shared by the tests of one module; `squealctl down` after it. (Per module, not per session: ~20 processes
    left running through the rest of the suite would load the timing-sensitive pool and router tests.)"""
    from ops.harness import ROUTER_BIN
    from tests.ops.deployments import two_worker_deployment_up

    require_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")
    with two_worker_deployment_up(tmp_path_factory.mktemp("two-worker-deployment")) as deployment:
        yield deployment
