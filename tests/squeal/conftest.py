"""Fixtures for squeal's integration tests: the session's MariaDB primary, memcached per cluster, a daemon."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from squeal_helpers import SquealEnv, made_then_stopped

from ops.harness import MariaDB


@pytest.fixture(scope="session")
def primary(mariadb_pair: tuple[MariaDB, MariaDB]) -> MariaDB:
    return mariadb_pair[0]


@pytest.fixture
def squeal_env(primary: MariaDB, tmp_path: Path) -> Iterator:
    """`squeal_env(**kwargs)` builds a SquealEnv (not started); everything is stopped afterwards."""
    yield from made_then_stopped(lambda n, **kwargs: SquealEnv(tmp_path / f"env{n}", primary, **kwargs))


@pytest.fixture
def clients(zk) -> Iterator:
    """`clients(connect=None)`: a started kazoo client on the module's ZooKeeper ensemble (its `zk` fixture) or on
    `connect`, stopped and closed afterwards."""
    from pool_support import SESSION_TIMEOUT, client, hosts

    made = []

    def make(connect: str | None = None, timeout: float = SESSION_TIMEOUT):
        c = client(connect or hosts(zk), timeout)
        made.append(c)
        return c

    yield make
    for c in made:
        try:
            c.stop()
            c.close()
        except Exception:  # noqa: BLE001 - a client a test already closed or whose ensemble is gone
            pass
