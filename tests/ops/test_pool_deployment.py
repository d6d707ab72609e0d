"""`squealctl up` of a topology whose east region is a squeal worker pool (`squeal_pool = true`): `up` returns with
every shard running on a worker, `status` shows the workers, `squealctl workers` (on the recorded topology) who owns
what, and a change on the primary is invalidated in both regions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import router_config
from ops.harness import ROUTER_BIN, memcached_command, wait_until
from tests.binaries import require_binary
from tests.ops.deployments import TWO_WORKERS_TWO_REGIONS, run_sql, squealctl, squealctl_up, write_on_stable_ports

WITHIN = 30.0  # a deadline for something that must happen, not a speed check
POOLED = TWO_WORKERS_TWO_REGIONS.replace(
    "[regions.east]\nmaster = true\n", "[regions.east]\nmaster = true\nsqueal_pool = true\n"
)


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, router_config.Topology]]:
    require_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")
    assert POOLED != TWO_WORKERS_TWO_REGIONS, "the test's edit must apply"
    base = tmp_path_factory.mktemp("pool-deployment")
    path = base / "pool.toml"
    write_on_stable_ports(POOLED, path)
    state = base / "state"
    with squealctl_up(state, path):
        yield state, router_config.load(path)


def test_up_runs_the_pool_and_workers_shows_who_owns_the_shard(pooled) -> None:
    state, topo = pooled
    rows = {r["name"]: r for r in json.loads(squealctl(state, "status", "--json").stdout)}
    workers = [r for r in rows.values() if r.get("instance") in ("east-1", "east-2")]
    assert len(workers) == 2 and all(r["state"] == "worker" and r["running"] for r in workers), workers
    listed = json.loads(squealctl(state, "workers", "--json").stdout)
    assert sorted(w["name"] for w in listed) == ["east-1", "east-2"]
    assert sorted(s for w in listed for s in w["shards"]) == ["main"], "one shard, one owner"
    assert all(w["region"] == "east" and w["pid"] for w in listed)

    east = topo.region("east").clusters[0].pools[0].servers[0]
    west = topo.region("west").clusters[0].pools[0].servers[0]
    for a in (east, west):
        assert memcached_command((a.host, a.port), b"set user:4242 0 0 6\r\ncached\r\n") == b"STORED"
    run_sql(
        topo.master.database,
        "INSERT INTO app.users (id, name, email) VALUES (4242, 'n', 'u4242@x') "
        "ON DUPLICATE KEY UPDATE name = CONCAT(name, '+')",
    )
    for a in (east, west):
        wait_until(
            lambda a=a: not memcached_command((a.host, a.port), b"get user:4242\r\n").startswith(b"VALUE"),
            WITHIN,
            f"user:4242 deleted from {a}",
        )
