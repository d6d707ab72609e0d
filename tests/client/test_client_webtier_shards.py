"""The demo web tier on a sharded topology (three shards, one MariaDB primary each, one region): every row lands on
the shard the topology's shard map (`Topology.shard_of`) names, and reads — one shard or every shard — come back
right through the cache."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pymysql
import pytest

import router_config
from loadtest import WebServer, install_schema_on_shards
from ops.harness import MariaDB
from tests.shard_support import SHARDS, sharded_topology_text


@pytest.fixture
def sharded(shard_primaries: dict[str, MariaDB], memcached_factory, tmp_path) -> Iterator[tuple]:
    database = f"webshard_{os.getpid()}"
    for db in shard_primaries.values():
        db.execute(f"DROP DATABASE IF EXISTS {database}")
    cache = memcached_factory()  # stands in for the cluster's router
    path = tmp_path / "topology.toml"
    path.write_text(sharded_topology_text(shard_primaries, database, {"east-a": cache.address}))
    topo = router_config.load(path)
    install_schema_on_shards(topo, database)
    web = WebServer(topo, "east", database=database)
    yield topo, web, shard_primaries, database
    web.close()


def where(dbs: dict[str, MariaDB], database: str, sql: str) -> set[str]:
    """The shards whose primary holds rows for `sql`."""
    return {name for name, db in dbs.items() if db.execute(f"USE {database}", sql)}


def test_rows_land_on_the_shard_the_shard_map_names_and_reads_come_back(sharded):
    topo, web, dbs, database = sharded
    assert [s.name for s in topo.shards] == list(SHARDS)

    # users: by the email's hash, or on a shard the caller names; the new id maps back to its shard either way
    users = {}
    for i in range(9):
        email = f"u{i}@shards.example"
        users[web.create_user(f"u{i}", email)] = email
    for shard in SHARDS:
        email = f"on-{shard}@shards.example"
        user_id = web.create_user(f"on-{shard}", email, shard=shard)
        users[user_id] = email
        assert topo.shard_of(user_id).name == shard
    assert len(users) == 12  # ids are unique fleet-wide
    for user_id, email in users.items():
        assert where(dbs, database, f"SELECT id FROM users WHERE id = {user_id}") == {topo.shard_of(user_id).name}
        assert web.get_user(user_id) == {"id": user_id, "name": email.split("@")[0], "email": email}
        assert web.get_user_by_email(email)["id"] == user_id  # read from every shard
    assert {topo.shard_of(u).name for u in users} == set(SHARDS)
    assert web.get_user_by_email("nobody@shards.example") is None
    with pytest.raises(pymysql.err.IntegrityError):  # one email, one shard: its unique key refuses a second
        web.create_user("again", next(iter(users.values())))

    by_shard = {s: [u for u in users if topo.shard_of(u).name == s] for s in SHARDS}
    author, fan0, fan2 = by_shard["s1"][0], by_shard["s0"][0], by_shard["s2"][0]

    # posts live with their author: the post id is allocated on the author's shard and maps back to it
    posts = [web.create_post(author, f"post {i}") for i in range(3)]
    for post_id in posts:
        assert topo.shard_of(post_id).name == "s1"
        assert where(dbs, database, f"SELECT id FROM posts WHERE id = {post_id}") == {"s1"}
        assert web.get_post(post_id)["author_id"] == author
    assert [p["id"] for p in web.get_feed(author)] == sorted(posts, reverse=True)

    # follows live with the follower; a followee's followers are gathered from every shard, in order
    web.follow(fan2, author)
    web.follow(fan0, author)
    web.follow(fan2, fan0)
    assert where(dbs, database, f"SELECT 1 FROM follows WHERE follower_id = {fan2}") == {"s2"}
    assert where(dbs, database, f"SELECT 1 FROM follows WHERE followee_id = {author}") == {"s0", "s2"}
    assert web.get_followers(author) == sorted([fan0, fan2])
    assert web.get_following(fan2) == sorted([author, fan0])
    assert [p["id"] for p in web.get_timeline(fan2)] == sorted(posts, reverse=True)

    # writes on the owner's shard invalidate what the cache holds (this cluster's own deletes)
    new_email = "moved@shards.example"
    assert web.update_user(fan2, name="renamed", email=new_email)
    assert web.get_user(fan2)["name"] == "renamed"
    assert web.get_user_by_email(new_email)["id"] == fan2 and web.get_user_by_email(users[fan2]) is None
    web.unfollow(fan0, author)
    assert web.get_followers(author) == [fan2]
    hits = web.stats.hits
    assert web.get_followers(author) == [fan2]
    assert web.stats.hits == hits + 1


def test_the_demo_seeds_user_i_on_the_shard_of_i_and_runs_on_every_shard(sharded):
    from loadtest.demo import run_one, seed

    topo, web, dbs, database = sharded
    assert seed(web, users=7) == list(range(1, 8))  # fresh shards: ids 1..7, as without shards
    assert seed(web, users=7) == list(range(1, 8))  # idempotent
    for user_id in range(1, 8):
        assert where(dbs, database, f"SELECT id FROM users WHERE id = {user_id}") == {topo.shard_of(user_id).name}
    rng = __import__("random").Random(3)
    ops = {run_one(web, rng, list(range(1, 8))) for _ in range(60)}
    assert {"get_user", "get_feed"} <= ops
