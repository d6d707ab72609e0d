"""The demo web tier on real MariaDB + memcached: behaviour, invalidation keys vs. the example rules, failures."""

from __future__ import annotations

import os

from client_support import next_name

import router_config
from loadtest import WebServer, schema_statements
from ops.harness import REPO_ROOT


def _email() -> str:
    return f"wt{next_name()}-{os.getpid()}@example.com"


def _web(regions, region: str, **kwargs) -> WebServer:
    return WebServer(regions.topology, region, database=regions.database, regional_direct=True, **kwargs)


def test_example_rules_match_the_schema_and_the_web_tier_keys(regions):
    """examples/local.toml's rules name columns that exist in schema.sql, with the keys the web tier caches."""
    topo = router_config.load(REPO_ROOT / "examples/local.toml")
    rules = {r.table: set(r.keys) for r in topo.rules if r.table.startswith("app.")}
    assert rules == {
        "app.users": {"user:{id}", "user:email:{email}"},
        "app.posts": {"post:{id}", "feed:{author_id}"},
        "app.follows": {"followers:{followee_id}", "following:{follower_id}"},
    }
    assert schema_statements()[0] == "CREATE DATABASE IF NOT EXISTS app"
    for rule in topo.rules:
        if not rule.table.startswith("app."):
            continue
        table = rule.table.split(".")[1]
        cols = {
            r[0]
            for r in regions.primary.execute(
                "SELECT column_name FROM information_schema.columns "
                f"WHERE table_schema = '{regions.database}' AND table_name = '{table}'"
            )
        }
        assert rule.columns <= cols, (rule.table, rule.columns - cols)


def test_users_posts_follows_in_the_master_region(regions):
    web = _web(regions, "east")
    old_email, new_email = _email(), _email()
    ann = web.create_user("ann", old_email)
    bob = web.create_user("bob", _email())
    assert web.get_user(ann) == {"id": ann, "name": "ann", "email": old_email}
    assert web.get_user_by_email(old_email)["id"] == ann
    assert web.get_user_by_email(new_email) is None  # negative result cached...

    assert web.update_user(ann, email=new_email)  # ...and invalidated by the write, as are the old keys
    assert web.get_user(ann)["email"] == new_email
    assert web.get_user_by_email(old_email) is None
    assert web.get_user_by_email(new_email)["id"] == ann
    assert web.update_user(10**12, name="nobody") is False

    assert web.get_feed(ann) == []
    p1 = web.create_post(ann, "hello")
    p2 = web.create_post(ann, "again")
    assert [p["id"] for p in web.get_feed(ann)] == [p2, p1]
    assert web.get_post(p1)["body"] == "hello"

    assert web.get_followers(ann) == [] and web.get_following(bob) == []
    web.follow(bob, ann)
    assert web.get_followers(ann) == [bob] and web.get_following(bob) == [ann]
    assert [p["id"] for p in web.get_timeline(bob)] == [p2, p1]
    web.unfollow(bob, ann)
    assert web.get_followers(ann) == [] and web.get_timeline(bob) == []

    hits = web.stats.hits
    web.get_user(ann)
    assert web.stats.hits == hits + 1


def test_west_creator_reads_its_new_post_while_replica_lags(regions):
    """AUTO_INCREMENT ids are known only after the insert: their markers are set right after it."""
    east, west = _web(regions, "east"), _web(regions, "west")
    ann = east.create_user("ann", _email())
    regions.caught_up()
    assert west.get_feed(ann) == []
    regions.replica.execute("STOP SLAVE")
    try:
        pid = west.create_post(ann, "from west")
        assert west.get_post(pid)["body"] == "from west"
        assert [p["id"] for p in west.get_feed(ann)] == [pid]
    finally:
        regions.replica.execute("START SLAVE")
    regions.caught_up()


def test_memcached_down_web_server_keeps_serving(regions, caplog):
    web = _web(regions, "east", recv_timeout=0.3)
    ann = web.create_user("ann", _email())
    assert web.get_user(ann)["name"] == "ann"
    regions.east_mc.kill()
    with caplog.at_level("WARNING"):
        assert web.get_user(ann)["name"] == "ann"
        assert web.update_user(ann, name="ann2")  # the write's cache delete fails: logged, not raised
        assert web.get_user(ann)["name"] == "ann2"
        assert web.get_feed(ann) == []
    assert web.stats.errors >= 3
    assert any("memcache" in r.getMessage() for r in caplog.records)
