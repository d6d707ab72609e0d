"""`squealctl verify` against real MariaDB and memcached: clean caches pass, planted stale values are found."""

from __future__ import annotations

import json

import pytest
from pymemcache.client.base import Client

import router_config
from loadtest.webtier import WebServer, schema_statements
from monitoring.verify import verify

TOPOLOGY = """
[[rules]]
table = "{db}.users"
keys = ["user:{{id}}", "user:email:{{email}}"]

[regions.east]
master = true
database = {{ role = "primary", port = {port}, server_id = 1 }}
[regions.east.clusters.a]
routers = ["{a}"]
pools.wildcard = {{ servers = ["127.0.0.1:1"] }}
[regions.east.clusters.b]
routers = ["{b}"]
pools.wildcard = {{ servers = ["127.0.0.1:2"] }}
"""


@pytest.fixture
def world(mariadb_pair, memcached_factory):
    """Two clusters whose 'router' is a memcached (verify only needs the memcached protocol)."""
    primary, _ = mariadb_pair
    a, b = memcached_factory(), memcached_factory()
    topo = router_config.loads(TOPOLOGY.format(db="verify_app", port=primary.port, a=a.address, b=b.address))
    primary.execute("DROP DATABASE IF EXISTS verify_app", *schema_statements("verify_app"))
    web = WebServer(topo, "east", "a", database="verify_app")
    ids = [web.create_user(f"u{i}", f"u{i}@verify.example") for i in range(5)]
    for user_id in ids:
        web.get_user(user_id)  # fill cluster a through the real read path
    return topo, web, ids, Client((b.host, b.port))


def test_clean_caches_pass(world):
    topo, _, ids, _ = world
    report = verify(topo, database="verify_app", sample=None)
    assert report.ok, report.stale
    assert report.checked == len(ids)  # user:N in cluster a; cluster b holds nothing yet


def test_planted_stale_values_are_reported(world):
    topo, web, ids, cluster_b = world
    row = web.master.query_one("SELECT id, name, email FROM users WHERE id = %s", (ids[0],))
    cluster_b.set(f"user:{ids[0]}", json.dumps({**row, "name": "old name"}).encode(), expire=300, flags=64)
    web.master.execute("UPDATE users SET name = 'renamed' WHERE id = %s", (ids[1],))  # no squeal: a stays stale
    report = verify(topo, database="verify_app", sample=None)
    found = {(s.cluster, s.key) for s in report.stale}
    assert found == {("b", f"user:{ids[0]}"), ("a", f"user:{ids[1]}")}
    stale_b = next(s for s in report.stale if s.cluster == "b")
    assert stale_b.cached["name"] == "old name" and stale_b.expected["name"] == f"u{0}"
    assert 0 < stale_b.ttl_left <= 300
    assert "is stale (expires in" in str(stale_b)
