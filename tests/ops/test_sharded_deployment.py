"""`squealctl up examples/sharded.toml` (ports moved to free ones): four shards in two regions, each region's shards
divided among its two squeal workers.

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

    shards = sorted(s.name for s in topo.shards)

    def placed() -> dict[str, list[dict]] | None:  # every region's shards each on exactly one of its workers
        rows = json.loads(squealctl(state, "status", "--json").stdout)
        by_region = {r.name: [row for row in rows if row.get("state") == "worker" and row["region"] == r.name]
                     for r in topo.regions}  # fmt: skip
        for workers in by_region.values():
            running = sorted(s for row in workers for s in row.get("shards") or [])
            if running != shards:
                return None
        return by_region

    by_region = wait_until(placed, WITHIN, "every shard running on one worker of each region", interval=0.5)
    for workers in by_region.values():
        for r in workers:  # who reads each shard, from which copy: east-2 names the extra copies east-r
            copy = "east-r" if r["instance"] == "east-2" else r["region"]
            assert r["copies"] == {s: f"{s}@{copy}" for s in r["shards"]}, r
            assert r["owns"] == r["shards"], r
    text = squealctl(state, "status").stdout
    for workers in by_region.values():
        for r in workers:
            if r.get("shards"):
                assert f"reads {len(r['shards'])} shards ({', '.join(r['shards'])})" in text, text
    for region in topo.regions:
        for worker in region.squeal_instances:
            health = fetch_health(str(worker.address), timeout=5)[1]
            assert health["ok"], health["problems"]


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
