"""Several squeal instances per region (the workers of its pool), each on its own copy of the region's data, and
the [zookeeper] ensemble they need.

Same style as tests/test_topology.py: a good file loads, round-trips with new ports, and each impossible
layout is one error naming the file and the key.
"""

from __future__ import annotations

import pytest

import router_config
from tests.topologies import ONE_CLUSTER, assert_listeners_moved, assert_mistake_named, on_new_ports

# ONE_CLUSTER (rule, region east, cluster a) with a ZooKeeper ensemble, a second copy of east's data and a worker
# on each copy, and a region west of two workers on two copies.
WORKERS_GOOD = (
    """
[zookeeper]
servers = ["127.0.0.1:2181", "127.0.0.1:2182", "127.0.0.1:2183"]
session_timeout_s = 4
"""
    + ONE_CLUSTER
    + """
[regions.east.replicas.east-r1]
port = 33307
server_id = 3

[[regions.east.squeal_instances]]
name = "east-1"
metrics_port = 19110

[[regions.east.squeal_instances]]
name = "east-2"
database = "east-r1"
metrics_port = 19111

[regions.west]
database = { role = "replica", port = 33308, server_id = 2 }
replicas.west-r1 = { port = 33309, server_id = 4, replicates_from = "west" }

[[regions.west.squeal_instances]]
name = "west-1"
metrics_port = 19120

[[regions.west.squeal_instances]]
name = "west-2"
database = "west-r1"
metrics_port = 19121
host = "127.0.0.2"

[regions.west.clusters.b]
routers = ["127.0.0.1:6000"]
pools.wildcard = { servers = ["127.0.0.1:6001"] }
"""
)


def test_a_topology_with_workers_loads():
    topo = router_config.loads(WORKERS_GOOD)
    zk = topo.zookeeper
    assert zk is not None and zk.hosts == "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183"
    assert (zk.session_timeout_s, zk.root, zk.takeover_wait_s, zk.handback_after_s) == (4.0, "/squeal", 30.0, 10.0)
    east, west = topo.region("east"), topo.region("west")
    assert [d.name for d in east.copies] == ["east", "east-r1"]
    assert east.replicas[0].role == "replica" and east.replicas[0].replicates_from == "east"
    assert [(s.name, s.database.name, s.metrics_port) for s in east.squeal_instances] == [
        ("east-1", "east", 19110),
        ("east-2", "east-r1", 19111),
    ]
    assert topo.instance("west-2").database.port == 33309 and topo.instance("west-2").host == "127.0.0.2"
    assert topo.instance("west-2").region == "west"
    assert west.squeal_instances[0].database == west.database
    with pytest.raises(KeyError, match="no squeal instance 'east-9' \\(have: east-1, east-2, west-1, west-2\\)"):
        topo.instance("east-9")
    assert "127.0.0.2" in topo.hosts()
    roles = [(role, where) for role, where, _ in topo.listeners()]
    assert ("zookeeper", "zookeeper.servers[2]") in roles
    assert ("mariadb", "regions.east.replicas.east-r1.port") in roles
    assert ("squeal", "regions.west.squeal_instances[1].metrics_port") in roles
    # A pooled region's daemons are its workers: the single daemon's port (metrics_port_base + i) is not listed.
    assert [w for r, w in roles if r == "squeal"] == [
        "regions.east.squeal_instances[0].metrics_port",
        "regions.east.squeal_instances[1].metrics_port",
        "regions.west.squeal_instances[0].metrics_port",
        "regions.west.squeal_instances[1].metrics_port",
    ]


def test_a_topology_without_workers_is_unchanged():
    from tests.ops.deployments import TWO_REGIONS  # examples/local.toml has squeal instances

    topo = router_config.loads(TWO_REGIONS)
    assert topo.zookeeper is None
    assert all(not r.replicas and not r.squeal_instances for r in topo.regions)
    assert [d.name for d in topo.region("west").copies] == ["west"]
    with pytest.raises(KeyError, match="no squeal instance"):
        topo.instance("east-1")


def test_workers_round_trip_with_new_ports():
    topo = router_config.loads(WORKERS_GOOD)
    moved = on_new_ports(topo)
    again = router_config.loads(router_config.dumps(moved))
    assert again.regions == moved.regions and again.zookeeper == moved.zookeeper
    assert_listeners_moved(topo, moved)
    # An instance still reads the same copy, on that copy's new port.
    assert moved.instance("east-2").database == moved.region("east").replicas[0]
    assert moved.instance("east-2").database.port != topo.instance("east-2").database.port


# (what to change in WORKERS_GOOD, the key path the error must name, words the error must contain)
MISTAKES = [
    (
        '[zookeeper]\nservers = ["127.0.0.1:2181", "127.0.0.1:2182", "127.0.0.1:2183"]\nsession_timeout_s = 4\n',
        "",
        "regions.east.squeal_instances",
        "squeal instances need a [zookeeper] section",
    ),
    (
        'name = "east-2"\ndatabase = "east-r1"',
        'name = "east-2"\ndatabase = "east"',
        "regions.east.squeal_instances[1].database",
        "instances 'east-1' and 'east-2' both read database 'east': each instance needs a copy of its own",
    ),
    (
        'name = "east-2"\ndatabase = "east-r1"',
        'name = "east-2"\ndatabase = "east-r2"',
        "regions.east.squeal_instances[1].database",
        "unknown database 'east-r2': an instance reads a copy of its region's data (region east has: east, east-r1)",
    ),
    (
        'name = "east-2"\ndatabase = "east-r1"',
        'name = "east-2"\ndatabase = "west-r1"',
        "regions.east.squeal_instances[1].database",
        "unknown database 'west-r1'",
    ),
    (
        'name = "west-1"',
        'name = "east-1"',
        "regions.west.squeal_instances[0].name",
        "instance name 'east-1' is already used by regions.east.squeal_instances[0].name",
    ),
    (
        'replicates_from = "west"',
        'replicates_from = "nowhere"',
        "regions.west.replicas.west-r1.replicates_from",
        "unknown database 'nowhere' (have: east, west, east-r1, west-r1)",
    ),
    (
        'replicates_from = "west"',
        'replicates_from = "west-r1"',
        "regions.west.replicas.west-r1.replicates_from",
        "replication loop: west-r1 -> west-r1",
    ),
    (
        "replicas.west-r1 = { port = 33309, server_id = 4",
        "replicas.west-r1 = { port = 33309, server_id = 3",
        "regions.west.replicas.west-r1.server_id",
        "server_id 3 is already used by regions.east.replicas.east-r1",
    ),
    (
        "replicas.west-r1 = {",
        "replicas.east-r1 = { port = 33310, server_id = 5 }\nreplicas.west-r1 = {",
        "regions.west.replicas.east-r1",
        "database name 'east-r1' is already used by regions.east.replicas.east-r1",
    ),
    (
        "replicas.west-r1 = {",
        "replicas.west = {",
        "regions.west.replicas.west",
        "names the region's own database",
    ),
    (
        "metrics_port = 19111",
        "metrics_port = 19110",
        "regions.east.squeal_instances[1].metrics_port",
        "duplicate port: 127.0.0.1:19110 is already used by regions.east.squeal_instances[0].metrics_port",
    ),
    (
        "metrics_port = 19110",
        "metrics_port = 2182",
        "regions.east.squeal_instances[0].metrics_port",
        "duplicate port: 127.0.0.1:2182 is already used by zookeeper.servers[1]",
    ),
    (
        'name = "east-1"\nmetrics_port = 19110',
        'name = "east-1"',
        "regions.east.squeal_instances[0]",
        "missing required key 'metrics_port'",
    ),
    ('name = "east-1"', 'name = "east 1"', "regions.east.squeal_instances[0].name", "may use only letters"),
    ("metrics_port = 19110", "metrics-port = 19110", "regions.east.squeal_instances[0].metrics-port", "unknown key"),
    ('"127.0.0.1:2183"]', '"127.0.0.1:2183"]\nroot = "squeal"', "zookeeper.root", "is not a znode path"),
    ("session_timeout_s = 4", "session_timeout_s = 0", "zookeeper.session_timeout_s", "must be greater than 0"),
    (
        'servers = ["127.0.0.1:2181", "127.0.0.1:2182", "127.0.0.1:2183"]',
        "servers = []",
        "zookeeper.servers",
        "must not be empty",
    ),
]


@pytest.mark.parametrize(("old", "new", "path", "words"), MISTAKES, ids=[m[3][:40] for m in MISTAKES])
def test_each_impossible_layout_names_file_and_key(old, new, path, words):
    assert_mistake_named(WORKERS_GOOD, old, new, "workers.toml", path, words)


def test_squeal_run_in_a_region_with_instances_needs_an_instance(tmp_path, capsys):
    from squeal.cli import main

    path = tmp_path / "workers.toml"
    path.write_text(WORKERS_GOOD)
    assert main(["run", str(path), "--region", "east"]) == 2
    assert (
        "region east runs a pool of squeal workers: start each with --instance NAME (east-1, east-2)"
        in capsys.readouterr().err
    )
    assert main(["run", str(path), "--instance", "east-9"]) == 2
    assert "no squeal instance 'east-9' (have: east-1, east-2, west-1, west-2)" in capsys.readouterr().err
    assert main(["run", str(path), "--instance", "east-1", "--region", "west"]) == 2
    assert "instance east-1 belongs to region east, not west" in capsys.readouterr().err
    assert main(["run", str(path)]) == 2
    assert "needs --region REGION (or --instance NAME" in capsys.readouterr().err
