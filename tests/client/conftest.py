"""Fixtures for the web-tier client tests: the demo schema on the session's MariaDB pair, caches reached
directly or through squeal-router, and a two-region topology on free ports."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from client_support import (
    ROUTER_AVAILABLE,
    ROUTER_SKIP,
    Regions,
    next_name,
    one_cluster_topology,
    sql_for,
)

import router_config
from leases import LeaseCache, WaitPolicy, connect
from loadtest import install_schema
from ops.harness import MariaDB, Memcached, free_port
from tests.binaries import needs_binary, require_binary


@pytest.fixture(scope="session")
def client_db(mariadb_pair: tuple[MariaDB, MariaDB]) -> str:
    """The demo schema in a database of its own on the session primary, replicated to the replica."""
    primary, replica = mariadb_pair
    name = f"client_app_{os.getpid()}"
    admin = sql_for(primary, None)
    install_schema(admin, name)
    admin.close()
    replica.wait_for_gtid(primary.gtid_binlog_pos())
    return name


@pytest.fixture
def master_sql(mariadb_pair: tuple[MariaDB, MariaDB], client_db: str):
    sql = sql_for(mariadb_pair[0], client_db, "master")
    yield sql
    sql.close()


@pytest.fixture(params=["direct", pytest.param("router", marks=needs_binary(ROUTER_AVAILABLE, ROUTER_SKIP))])
def cache_servers(request, memcached_factory, router_factory) -> list[str]:
    """Where a LeaseCache connects: memcached itself, or squeal-router in front of it."""
    mc: Memcached = memcached_factory()
    if request.param == "direct":
        return [mc.address]
    router_port = free_port()
    topo = one_cluster_topology([mc.address], router_port)
    router = router_factory(router_config.cluster_config(topo, "c1"), port=router_port)
    return [router.address]


@pytest.fixture
def make_cache(cache_servers: list[str]) -> Callable[..., LeaseCache]:
    """`make_cache(leases=True, ...)`: a LeaseCache with a name of its own (counters stay apart)."""

    def make(**kwargs) -> LeaseCache:
        kwargs.setdefault("wait", WaitPolicy(budget=5.0))
        # A generous connect timeout: on a loaded 2-core machine 200 threads' first connects can take longer
        # than the 0.5 s default, and one failed connect marks the only server (the router) down for 2 s,
        # which would measure the fallback path, not leases.
        client = connect(
            cache_servers,
            connect_timeout=kwargs.pop("connect_timeout", 5.0),
            recv_timeout=kwargs.pop("recv_timeout", 2.0),
            max_pool_size=kwargs.pop("max_pool_size", 64),
        )
        return LeaseCache(client, name=f"test-{next_name()}", **kwargs)

    return make


@pytest.fixture
def regions(tmp_path, mariadb_pair, client_db, memcached_factory) -> Regions:
    primary, replica = mariadb_pair
    return Regions(tmp_path, primary, replica, client_db, memcached_factory)


@pytest.fixture
def routed_regions(tmp_path, mariadb_pair, client_db, memcached_factory, router_factory) -> Regions:
    """Like `regions`, with a real squeal-router per cluster (skips if the router is not built)."""
    require_binary(ROUTER_AVAILABLE, ROUTER_SKIP)
    primary, replica = mariadb_pair
    return Regions(tmp_path, primary, replica, client_db, memcached_factory, router_factory)
