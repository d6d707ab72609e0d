"""`squealctl up examples/sharded.toml` (ports moved to free ones): four shards in two regions, HA squeal.

A write on each shard's primary must delete its keys in every cluster of both regions (checked key by key,
through the routers), `status --json` names the shard of every MariaDB copy, and `squealctl verify` finds
nothing stale after the demo web tier has run against it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import router_config
from ops.harness import REPO_ROOT, ROUTER_BIN, memcached_command, wait_until
from squeal import fetch_health
from tests.binaries import require_binary
from tests.ops.deployments import run_sql, squealctl, stable_port

WITHIN = 60.0  # a deadline for something that must happen, not a speed check


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, router_config.Topology, Path]]:
    require_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")
    base = tmp_path_factory.mktemp("sharded-deployment")
    topo = router_config.reassign_ports(router_config.load(REPO_ROOT / "examples" / "sharded.toml"), stable_port)
    path = base / "sharded.toml"
    path.write_text(router_config.dumps(topo))
    state = base / "state"
    try:
        squealctl(state, "up", str(path), "--demo", "--demo-rate", "10")
        yield path, router_config.load(path), state
    finally:
        squealctl(state, "down", check=False)


def _router(topo: router_config.Topology, cluster: router_config.Cluster) -> tuple[str, int]:
    a = cluster.routers[0]
    return a.host, a.port


def test_status_names_the_shard_of_every_database_copy(sharded) -> None:
    _, topo, state = sharded
    rows = json.loads(squealctl(state, "status", "--json").stdout)
    copies = {(r["shard"], r["region"], r.get("instance")): r["role"] for r in rows if r["role"].startswith("mariadb")}
    assert copies == {(s.name, d.region, None): f"mariadb-{d.role}" for s in topo.shards for d in s.copies} | {
        (s.name, "east", "east-r"): "mariadb-replica"
        for s in topo.shards  # each shard's extra copy in east
    }
    assert len(copies) == 12 and all(r["running"] for r in rows)

    def leaders() -> list[str]:  # one per region, each owning every shard of its region
        rows = json.loads(squealctl(state, "status", "--json").stdout)
        found = [r["instance"] for r in rows if r.get("state") == "leader"]
        return found if len(found) == 2 else []

    leaders = wait_until(leaders, WITHIN, "a leader in each region", interval=0.5)
    rows = json.loads(squealctl(state, "status", "--json").stdout)
    shards = sorted(s.name for s in topo.shards)
    assert all(r["shards"] == shards for r in rows if r.get("instance") in leaders)  # who reads each shard
    # ... from which copy: east-2 names the extra copies east-r, the others read their region's copy
    for r in rows:
        if r.get("instance") in leaders:
            copy = "east-r" if r["instance"] == "east-2" else r["region"]
            assert r["copies"] == {s: f"{s}@{copy}" for s in shards}, r
    assert all("shards" not in r for r in rows if r.get("state") == "standby")
    text = squealctl(state, "status").stdout
    assert text.count(f"reads 4 shards ({', '.join(shards)})") == 2, text
    for leader in (s for r in topo.regions for s in r.squeal_instances if s.name in leaders):
        health = fetch_health(str(leader.address), timeout=5)[1]
        assert set(health["shards"]) == {s.name for s in topo.shards} and health["ok"], health["problems"]


def test_a_write_on_each_shard_deletes_its_keys_in_every_cluster_of_both_regions(sharded) -> None:
    _, topo, _ = sharded
    routers = [_router(topo, c) for c in topo.clusters]
    for i, shard in enumerate(topo.shards):
        keys = [f"user:{990_000 + 10 * i + k}" for k in range(3)]
        for router in routers:
            for key in keys:
                assert memcached_command(router, f"set {key} 0 0 6\r\ncached\r\n".encode()) == b"STORED"
        run_sql(
            shard.primary,
            *(
                f"INSERT INTO app.users (id, name, email) VALUES ({k.split(':')[1]}, 'n', "
                f"'{k}@{shard.name}') ON DUPLICATE KEY UPDATE name = 'm'"
                for k in keys
            ),
        )
        for router in routers:
            for key in keys:
                wait_until(
                    lambda r=router, k=key: not memcached_command(r, f"get {k}\r\n".encode()).startswith(b"VALUE"),
                    WITHIN,
                    f"{key} (shard {shard.name}) gone from {router}",
                )


def test_verify_finds_nothing_stale_after_the_demo_load(sharded) -> None:
    path, _, state = sharded
    result = squealctl(state, "verify", str(path), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 stale" in result.stdout + result.stderr
