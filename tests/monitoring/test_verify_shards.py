"""`squealctl verify` on a sharded topology (three shards, one MariaDB primary each; memcacheds stand in for the
clusters' routers): each cached key is compared with the shard that owns its rows — or with every shard for a
family whose rows are anywhere — so a clean cache passes and a stale copy of a row on a non-first shard is found."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from pymemcache.client.base import Client

import router_config
from loadtest import WebServer, install_schema_on_shards
from monitoring.verify import EXIT_CANNOT_CHECK, EXIT_CLEAN, EXIT_STALE, verify
from ops.harness import MariaDB
from tests.ops.deployments import squealctl_in_process
from tests.shard_support import sharded_topology_text

GRACE = 0.3  # nothing measures squeal latency here


@pytest.fixture
def sharded(shard_primaries: dict[str, MariaDB], memcached_factory, tmp_path) -> Iterator[tuple]:
    """Users on every shard (and a feed, follower lists) cached in cluster a; cluster b holds nothing yet."""
    database = f"verifyshard_{os.getpid()}"
    for db in shard_primaries.values():
        db.execute(f"DROP DATABASE IF EXISTS {database}")
    caches = {"a": memcached_factory(), "b": memcached_factory()}
    path = tmp_path / "topology.toml"
    path.write_text(sharded_topology_text(shard_primaries, database, {c: m.address for c, m in caches.items()}))
    topo = router_config.load(path)
    install_schema_on_shards(topo, database)
    web = WebServer(topo, "east", "a", database=database)
    users = {s.name: web.create_user(f"u-{s.name}", f"u-{s.name}@verify.example", shard=s.name) for s in topo.shards}
    web.create_post(users["s2"], "on s2")
    web.follow(users["s0"], users["s2"])
    web.follow(users["s1"], users["s2"])
    for user_id in users.values():
        web.get_user(user_id)
    web.get_feed(users["s2"]), web.get_followers(users["s2"]), web.get_user_by_email("u-s1@verify.example")
    clients = {c: Client((m.host, m.port)) for c, m in caches.items()}
    yield topo, web, users, clients
    web.close()


def test_a_consistent_sharded_cache_passes(sharded):
    topo, _, users, _ = sharded
    report = verify(topo, sample=None, grace=GRACE)
    assert report.stale == () and report.exit_code == EXIT_CLEAN, report
    # three users, a feed, a post? (not read), the followers list gathered from two shards, an email key
    assert report.checked == len(users) + 3, report


def test_a_stale_copy_of_a_row_on_a_non_first_shard_is_found(sharded, capsys):
    topo, web, users, clients = sharded
    on_s1 = users["s1"]
    shard = web.shard_for(on_s1)
    assert shard.name == "s1"
    row = shard.master.query_one("SELECT id, name, email FROM users WHERE id = %s", (on_s1,))
    clients["b"].set(f"user:{on_s1}", json.dumps({**row, "name": "old name"}).encode(), expire=300, flags=64)
    # a change squeal never delivered (none runs here): cluster a's copies of the s2 user's followers go stale
    web.shard_for(users["s1"]).master.execute(
        "DELETE FROM follows WHERE follower_id = %s AND followee_id = %s", (users["s1"], users["s2"])
    )
    report = verify(topo, sample=None, grace=GRACE)
    stale = {(s.cluster, s.key): s for s in report.stale}
    assert set(stale) == {("b", f"user:{on_s1}"), ("a", f"followers:{users['s2']}")}, report
    planted = stale[("b", f"user:{on_s1}")]
    assert planted.cached["name"] == "old name" and planted.expected == row and planted.shards == ("s1",)
    followers = stale[("a", f"followers:{users['s2']}")]
    assert followers.shards == ("s0", "s1", "s2") and followers.expected == [{"follower_id": users["s0"]}]
    assert report.exit_code == EXIT_STALE

    code, out, _ = squealctl_in_process(capsys, "verify", topo.source, "--all", "--grace", str(GRACE))
    assert code == 1 and f"b: user:{on_s1} is stale" in out and " 2 stale;" in out, out
    assert "(shard s1)" in out


def test_a_shard_primary_down_is_one_line_naming_it_and_exit_2(sharded, shard_primaries, tmp_path, capsys):
    topo, _, _, _ = sharded
    doc = router_config.to_document(topo)
    doc["shards"]["s2"]["east"]["port"] = 1  # nothing listens there
    path = tmp_path / "down.toml"
    path.write_text(router_config.dumps(router_config.loads(__import__("tomli_w").dumps(doc))))
    code, out, err = squealctl_in_process(capsys, "--state-dir", str(tmp_path / "state"), "verify", str(path))
    assert code == EXIT_CANNOT_CHECK and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("squealctl verify: cannot check: the primary of shard s2 (127.0.0.1:1)"), err
