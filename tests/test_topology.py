"""The topology loader: the example loads, and each kind of mistake gives one error naming its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import router_config
from router_config import TopologyError
from tests.topologies import ONE_CLUSTER, assert_listeners_moved, assert_mistake_named, on_new_ports

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local.toml"

GOOD = ONE_CLUSTER + 'pools.gutter = { kind = "gutter", servers = ["127.0.0.1:5002"] }\n'


def test_example_topology_loads():
    topo = router_config.load(EXAMPLE)
    assert [r.name for r in topo.regions] == ["east", "west"]
    assert topo.master.name == "east"
    assert [c.name for c in topo.clusters] == ["east-a", "east-b", "west-a", "west-b"]
    east_a = topo.cluster("east-a")
    assert len(east_a.wildcard.servers) == 2
    assert east_a.gutter is not None and len(east_a.gutter.servers) == 1
    assert [len(p.servers) for p in east_a.pools_of_kind("replicated")] == [2]
    assert topo.region("west").database.role == "replica"
    assert topo.rule_for("app.users").columns == {"id", "email"}


def test_minimal_topology_gets_defaults():
    topo = router_config.loads(GOOD)
    assert topo.squeal.batch_size == 256
    assert topo.cluster("a").gutter.ttl == 10
    assert topo.region("east").database.host == "127.0.0.1"


def test_round_trip_with_new_ports():
    topo = router_config.load(EXAMPLE)
    moved = on_new_ports(topo)
    again = router_config.loads(router_config.dumps(moved))
    assert again.regions == moved.regions and again.rules == moved.rules and again.squeal == moved.squeal
    assert moved.cluster("east-a").wildcard.servers != topo.cluster("east-a").wildcard.servers


def test_listeners_are_exactly_the_ports_reassign_moves():
    # Topology.listeners() and reassign_ports() each walk every listening port; they must agree.
    topo = router_config.load(EXAMPLE)
    moved = on_new_ports(topo)
    assert_listeners_moved(topo, moved)
    before, after = topo.listeners(), moved.listeners()
    # dbs, regional, routers, pool servers, monitoring; HA: extra replicas, squeal instances, ZooKeeper client +
    # quorum + election ports
    assert len(before) == 2 + 2 + 4 + 4 * 5 + 1 + 2 + 4 + 3 * 3
    assert all(41000 <= a.port for _, _, a in after)


# (what to change in GOOD, the key path the error must name, words the error must contain)
MISTAKES = [
    (
        'master = true\ndatabase = { role = "primary"',
        'master = false\ndatabase = { role = "replica"',
        "regions",
        "exactly one region must have master = true (found: none)",
    ),
    (
        'pools.gutter = { kind = "gutter", servers = ["127.0.0.1:5002"] }',
        'pools.gutter = { kind = "gutter", servers = ["127.0.0.1:5001"] }',
        "regions.east.clusters.a.pools.gutter.servers[0]",
        "duplicate port: 127.0.0.1:5001",
    ),
    ('kind = "gutter"', 'kind = "guter"', "regions.east.clusters.a.pools.gutter.kind", "unknown pool kind 'guter'"),
    ('keys = ["user:{id}"]', 'keys = ["user:{user id}"]', "rules[0].keys[0]", "is not a column name"),
    ('keys = ["user:{id}"]', 'keys = ["user:all"]', "rules[0].keys[0]", "names no {column}"),
    ('table = "app.users"', 'table = "users"', "rules[0].table", 'is not a "schema.table" name'),
    (
        'pools.wildcard = { servers = ["127.0.0.1:5001"] }',
        'pools.wildcard = { serverz = ["127.0.0.1:5001"] }',
        "regions.east.clusters.a.pools.wildcard.serverz",
        "unknown key",
    ),
    (
        'routers = ["127.0.0.1:5000"]',
        'routers = ["127.0.0.1"]',
        "regions.east.clusters.a.routers[0]",
        'is not a "host:port" address',
    ),
    ('role = "primary"', 'role = "replica"', "regions.east.database.role", "needs a primary database"),
    (
        'pools.wildcard = { servers = ["127.0.0.1:5001"] }',
        'pools.wildcard = { servers = ["127.0.0.1:5001"] }\npools.more = { servers = ["127.0.0.1:5003"] }',
        "regions.east.clusters.a.pools",
        "exactly one wildcard pool, found 2",
    ),
    (
        'pools.gutter = { kind = "gutter", servers = ["127.0.0.1:5002"] }',
        'pools.gutter = { kind = "app", servers = ["127.0.0.1:5002"] }',
        "regions.east.clusters.a.pools.gutter",
        "needs `prefixes`",
    ),
    ("port = 33306", "port = 70000", "regions.east.database.port", "out of range"),
    (
        'routers = ["127.0.0.1:5000"]',
        'routers = ["127.0.0.1:5000"]\ncold = { warm_cluster = "b" }',
        "regions.east.clusters.a.cold.warm_cluster",
        "unknown cluster 'b'",
    ),
    ("[[rules]]", "[[rules]]\ntable = 'app.users'\nkeys = ['u:{id}']\n[[rules]]", "rules[1].table", "duplicate rule"),
    ("[regions.east]", "[regions.east\n", "", "not valid TOML"),
    (
        'keys = ["user:{id}"]',
        'keys = ["user:{id}"]\nwhen_changed = ["e mail"]',
        "rules[0].when_changed[0]",
        "is not a column name",
    ),
    ('keys = ["user:{id}"]', 'keys = ["user:{id}"]\nwhen_changed = []', "rules[0].when_changed", "must not be empty"),
    (
        'keys = ["user:{id}"]',
        'keys = ["user:{id}"]\nwhere = "status = \'a\' AND"',
        "rules[0].where",
        "expected a column name, found the end (at character 17",
    ),
    (
        'keys = ["user:{id}"]',
        'keys = ["user:{id}"]\nwhere = "status == 1"',
        "rules[0].where",
        "expected a 'string' or a number, found '='",
    ),
    ('keys = ["user:{id}"]', 'keys = ["user:{id}"]\nwhere = "status != NULL"', "rules[0].where", "IS NULL"),
    ('keys = ["user:{id}"]', 'keys = ["user:{id}"]\nwhere = "(a = 1"', "rules[0].where", "expected ')'"),
    ('keys = ["user:{id}"]', 'keys = ["user:{id}"]\nwhere = "a = \'x\' b = 1"', "rules[0].where", "AND/OR missing?"),
    (
        "[[rules]]",
        '[monitoring]\nconsistency_slo = "six nines"\n[[rules]]',
        "monitoring.consistency_slo",
        "does not read",
    ),
    (
        "[[rules]]",
        '[monitoring]\nconsistency_slo = "0 nines within 1s"\n[[rules]]',
        "monitoring.consistency_slo",
        "greater",
    ),
    ("[[rules]]", "[monitoring]\nconsistency_slo = 6\n[[rules]]", "monitoring.consistency_slo", "must be a string"),
    ("[[rules]]", "[monitoring]\nconsistency_sample = 0\n[[rules]]", "monitoring.consistency_sample", "1 or more"),
    (
        'pools.gutter = { kind = "gutter", servers = ["127.0.0.1:5002"] }',
        'pools.gutter = { kind = "gutter", servers = ["127.0.0.1:5002"], leases = true }',
        "regions.east.clusters.a.pools.gutter.leases",
        "a gutter pool takes no leases",
    ),
    (
        'pools.wildcard = { servers = ["127.0.0.1:5001"] }',
        'pools.wildcard = { servers = ["127.0.0.1:5001"], leases = { ttl = 0 } }',
        "regions.east.clusters.a.pools.wildcard.leases.ttl",
        "must be 1 or more",
    ),
    (
        'pools.wildcard = { servers = ["127.0.0.1:5001"] }',
        'pools.wildcard = { servers = ["127.0.0.1:5001"], leases = { wait = 5 } }',
        "regions.east.clusters.a.pools.wildcard.leases.wait",
        "unknown key (expected one of: max_tokens, retries, stale_ttl, ttl, wait_ms)",
    ),
    (
        'pools.wildcard = { servers = ["127.0.0.1:5001"] }',
        'pools.wildcard = { servers = ["127.0.0.1:5001"], leases = { stale_ttl = -1 } }',
        "regions.east.clusters.a.pools.wildcard.leases.stale_ttl",
        "must be 0 or more",
    ),
    (
        "[[rules]]",
        "[monitoring]\nconsistency_check_after = -1\n[[rules]]",
        "monitoring.consistency_check_after",
        "than 0",
    ),
]


def test_the_consistency_settings_parse_and_round_trip():
    topo = router_config.loads(GOOD)
    assert topo.monitoring.consistency_sample == 1 and topo.monitoring.consistency_slo is None
    assert topo.monitoring.consistency_windows == (1.0, 10.0, 60.0)
    text = '[monitoring]\nconsistency_slo = "4.5 nines within 250ms"\nconsistency_sample = 10\n' + GOOD
    topo = router_config.loads(text)
    assert topo.monitoring.consistency_slo == router_config.ConsistencySlo(4.5, 0.25)
    assert str(topo.monitoring.consistency_slo) == "4.5 nines within 250ms"
    assert [router_config.window_label(w) for w in topo.monitoring.consistency_windows] == ["250ms", "1s", "10s", "60s"]
    assert router_config.loads(router_config.dumps(topo)).monitoring == topo.monitoring


def test_rule_filters_parse_and_round_trip():
    text = GOOD.replace(
        'keys = ["user:{id}"]',
        'keys = ["user:{id}", "user:{email}"]\nwhen_changed = ["name"]\n'
        "where = \"NOT (status = 'draft') and `owner id` not in (1, -2.5) or x is not null\"",
    )
    rule = router_config.loads(text).rules[0]
    assert rule.when_changed == ("name",)
    assert rule.watched == ("name", "email", "id")  # templated columns always count
    assert rule.where is not None and rule.where.columns == ("status", "owner id", "x")
    assert rule.where.steps() == [
        ("s=", "status", "draft"),
        ("not", "", ""),
        ("n=", "owner id", "1"),
        ("n=", "owner id", "-2.5"),
        ("or", "", ""),
        ("not", "", ""),
        ("and", "", ""),
        ("null", "x", ""),
        ("not", "", ""),
        ("or", "", ""),
    ]
    assert router_config.loads(router_config.dumps(router_config.loads(text))).rules == (rule,)


@pytest.mark.parametrize(("old", "new", "path", "words"), MISTAKES, ids=[m[3][:30] for m in MISTAKES])
def test_each_mistake_names_file_and_key(old, new, path, words):
    assert_mistake_named(GOOD, old, new, "bad.toml", path, words)


def test_unreadable_file_names_it(tmp_path):
    with pytest.raises(TopologyError, match="missing.toml: cannot read topology file"):
        router_config.load(tmp_path / "missing.toml")


def test_a_written_topology_whose_region_loses_its_instances_still_loads():
    """`to_document` writes no redundant `squeal_pool` (a region's instances are always a pool, and the key beside
    none is refused): the load experiments drop the instances of a written topology to run one daemon."""
    import tomli_w

    doc = router_config.to_document(router_config.load(EXAMPLE))
    assert doc["regions"]["east"]["squeal_instances"]
    doc["regions"]["east"].pop("squeal_instances")
    assert not router_config.loads(tomli_w.dumps(doc)).region("east").squeal_instances


def test_a_pools_leases_parse_round_trip_and_put_the_lease_handle_in_front_of_it():
    text = GOOD.replace(
        'pools.wildcard = { servers = ["127.0.0.1:5001"] }',
        'pools.wildcard = { servers = ["127.0.0.1:5001"], leases = { ttl = 5, wait_ms = 30 } }\n'
        'pools.feeds = { kind = "app", prefixes = ["feed:"], servers = ["127.0.0.1:5003"], leases = true }\n'
        'pools.users = { kind = "app", prefixes = ["user:"], servers = ["127.0.0.1:5004"], '
        "leases = { stale_ttl = 30 } }",
    )
    topo = router_config.loads(text)
    cluster = topo.cluster("a")
    assert cluster.wildcard.leases == router_config.Leases(ttl=5, wait_ms=30, retries=10, max_tokens=100_000)
    assert cluster.pool("feeds").leases == router_config.Leases()
    assert cluster.pool("users").leases == router_config.Leases(stale_ttl=30)
    assert cluster.gutter.leases is None
    assert router_config.loads(router_config.dumps(topo)).regions == topo.regions
    route = router_config.cluster_config(topo, "a")["route"]
    wildcard = route["wildcard"]
    assert (
        wildcard["type"] == "TransparentLeaseRoute" and wildcard["lease_ttl"] == 5 and wildcard["lease_wait_ms"] == 30
    )
    assert wildcard["target"]["type"] == "FailoverWithExptimeRoute", (
        "outside the gutter failover: fills there are guarded"
    )
    assert route["policies"]["feed:"] == {
        "type": "TransparentLeaseRoute",
        "target": "PoolRoute|feeds",
        "lease_ttl": 10,
        "lease_wait_ms": 20,
        "lease_retries": 10,
        "max_tokens": 100_000,
    }
    assert "stale_ttl" not in json.dumps(route["policies"]["feed:"])  # off unless asked for
    assert route["policies"]["user:"]["stale_ttl"] == 30
    assert "TransparentLeaseRoute" not in json.dumps(router_config.cluster_config(router_config.loads(GOOD), "a"))
