"""The prober on a sharded topology (three shards, one MariaDB primary each, `squeal run` with one pipeline per shard,
two memcached "clusters"): the canary commits on every shard's primary in turn, each probe's key leaves every
cluster, and the latency series carry the shard."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

import router_config
from monitoring.prober import CANARY_TABLE, Prober
from ops.harness import MariaDB, SquealDaemon
from tests.shard_support import SHARDS, sharded_topology_text


@pytest.fixture
def prober(shard_primaries: dict[str, MariaDB], memcached_factory, processes, tmp_path):
    caches = {"a": memcached_factory(), "b": memcached_factory()}  # each stands in for its cluster's router
    path = tmp_path / "topology.toml"
    path.write_text(
        sharded_topology_text(shard_primaries, "probe_app", {c: m.address for c, m in caches.items()}, canary=True)
    )
    topo = router_config.load(path)
    registry = CollectorRegistry()
    probe = Prober(topo, registry, deadline=20.0)
    probe.ensure_canary_table()  # before squeal starts: its start-up check then finds the ruled table
    processes.add(SquealDaemon(path, "east", workdir=tmp_path / "squeal", state_dir=tmp_path / "state"))
    return topo, probe, registry, shard_primaries


def test_the_canary_is_committed_on_every_shard_in_turn_and_reaches_every_cluster(prober):
    topo, probe, registry, dbs = prober
    results = [probe.probe_once() for _ in range(2 * len(SHARDS))]
    assert [r.shard for r in results] == [*SHARDS, *SHARDS]
    for r in results:
        assert set(r.latencies) == {"a", "b"} and None not in r.latencies.values(), r  # squeal deleted it everywhere
        row_id = int(r.key.rsplit(":", 1)[1])
        assert topo.shard_of(row_id).name == r.shard  # the canary row is one the shard map gives that shard
        seq = {name: db.execute(f"SELECT seq FROM {CANARY_TABLE} WHERE id = {row_id}") for name, db in dbs.items()}
        assert {name for name, rows in seq.items() if rows and rows[0][0] > 0} == {r.shard}, seq
    for shard in SHARDS:
        for cluster in ("a", "b"):
            labels = {"region": "east", "cluster": cluster, "shard": shard}
            assert registry.get_sample_value("squeal_probe_invalidation_seconds_count", labels) == 2, labels
