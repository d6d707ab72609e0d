"""What HA mode did, on the pool's code path (issue 24 item 1): "two instances, one leader" is "one shard, two
workers". Region east without [shards] (its one shard, `main`), `squeal_pool = true`, worker east-1 on the primary
(ranked first) and east-2 on its GTID replica, a 3-server ZooKeeper ensemble, real memcached:

* the preferred worker owns the shard; kill -9 of it under load: east-2 takes the shard over reading its own copy;
  east-1 back and settled (`handback_after_s`): the shard is handed back; 0 lost;
* the owner's copy stops answering (the primary SIGSTOPped): the shard moves to the worker whose copy answers and
  the sick one owns nothing; its copy back: handed back; 0 lost.

"0 lost" is checked key by key against the database. Time-outs only catch hangs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
from kazoo.exceptions import NoNodeError
from squeal_helpers import scrape, wait_until
from test_ha_support import HaEnv, ensemble
from test_squeal_faults import Writer, post_keys

from router_config.model import IMPLICIT_SHARD
from squeal import gtid as g
from squeal.zkstore import ShardMarkerStore, shard_path

DEADLINE = 60.0


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    with ensemble(tmp_path_factory.mktemp("zk-one-shard")) as members:
        yield members


@pytest.fixture
def pool_env(mariadb_pair, zk, memcached_factory, processes, tmp_path) -> Iterator[HaEnv]:
    primary, replica = mariadb_pair
    env = HaEnv(tmp_path / "pool", primary, replica, zk, [memcached_factory() for _ in range(2)], processes, pool=True)
    yield env
    env.close()


def owner(env: HaEnv) -> str | None:
    """The worker the shard's `owner` znode names (None: nobody owns it now)."""
    with contextlib.suppress(NoNodeError):
        data, _ = env.zk_client.get(f"{shard_path(env.root, 'east', IMPLICIT_SHARD)}/owner")
        return str(json.loads(data)["worker"])
    return None


def delivering(env: HaEnv, name: str) -> bool:
    """Worker `name` owns the shard and its pipeline runs (its /healthz says so)."""
    try:
        body = env.health(name)
    except OSError:
        return False
    return body.get("owns") == [IMPLICIT_SHARD] and IMPLICIT_SHARD in (body.get("shards") or {})


def start_both(env: HaEnv) -> None:
    """Both workers at once: the shard goes to east-1 (ranked first), whichever joined first."""
    env.daemons["east-2"].start()
    env.daemons["east-1"].start()
    wait_until(lambda: delivering(env, "east-1"), DEADLINE, "east-1 (on the primary) to own the shard")
    assert owner(env) == "east-1"
    assert env.health("east-2")["owns"] == []


def check_nothing_lost(env: HaEnv, written: list[int]) -> None:
    in_db = [r[0] for r in env.sql("SELECT id FROM posts ORDER BY id")]
    assert in_db == written
    env.all_gone(in_db, DEADLINE)
    markers = ShardMarkerStore(env.zk_client, env.root, "east", IMPLICIT_SHARD)
    last = g.parse_position(env.primary.gtid_binlog_pos())
    wait_until(
        lambda: all(g.covers_position(g.parse_position(p), last) for p in markers.positions().values()),
        DEADLINE,
        "the shard's markers to reach the last commit",
    )


def test_kill_9_of_the_owner_fails_over_to_the_other_copy_and_the_preferred_worker_gets_it_back_nothing_lost(
    pool_env: HaEnv,
) -> None:
    env = pool_env
    for c in env.caches:
        c.set_many(post_keys(range(1, 12001)))
    start_both(env)
    writer = Writer(env, first=1, rate=200)
    writer.start()
    wait_until(lambda: writer.next_id > 300, 15, "some writes")
    env.all_gone(list(range(1, 200)), DEADLINE)
    assert not any(k.startswith("squeal_deletes_sent_total") for k in scrape(env.daemons["east-2"].port))

    env.daemons["east-1"].kill()  # SIGKILL: no flush, no release; its session must expire first
    gap = env.probe(10_000_001, DEADLINE)  # committed after the kill: gone once east-2 delivers
    wait_until(lambda: delivering(env, "east-2"), DEADLINE, "east-2 to own the shard")
    body = env.health("east-2")
    assert body["shards"][IMPLICIT_SHARD]["database"]["name"] == "east-r1", "east-2 reads its own copy"
    at = writer.next_id
    wait_until(lambda: writer.next_id > at + 300, 30, "writes after the takeover")

    env.daemons["east-1"].start()  # back: owns nothing until it has been back handback_after_s (2 s)
    wait_until(lambda: delivering(env, "east-1"), DEADLINE, "east-1 to get the shard handed back")
    wait_until(lambda: env.health("east-2")["owns"] == [], DEADLINE, "east-2 to own nothing again")
    back_gap = env.probe(10_000_002, DEADLINE)
    at = writer.next_id
    wait_until(lambda: writer.next_id > at + 300, 30, "writes after the hand-back")
    written = writer.stop()
    check_nothing_lost(env, written)
    moves = scrape(env.daemons["east-1"].port).get('squeal_pool_moves_total{reason="handback"}', 0) + scrape(
        env.daemons["east-2"].port
    ).get('squeal_pool_moves_total{reason="handback"}', 0)
    assert moves >= 1, "the shard came back by a hand-back (the controller's move), not by chance"
    print(
        f"\nkill -9 of the owner: a change committed after it gone in {gap * 1000:.0f} ms; after the hand-back in "
        f"{back_gap * 1000:.0f} ms; {len(written)} rows checked key by key"
    )


def test_a_worker_whose_copy_stops_answering_owns_nothing_and_gets_the_shard_back_when_it_answers(
    pool_env: HaEnv,
) -> None:
    env = pool_env
    for c in env.caches:
        c.set_many(post_keys(range(1, 12001)))
    start_both(env)
    writer = Writer(env, first=1, rate=150)
    writer.start()
    wait_until(lambda: writer.next_id > 300, 15, "some writes")

    env.primary.pause()  # east-1's copy stops answering (the writer waits on it too); east-2's replica answers
    try:
        wait_until(lambda: delivering(env, "east-2"), DEADLINE, "the shard to move to east-2, whose copy answers")
        sick = env.health("east-1")
        assert sick["owns"] == [] and sick["healthy"] is False, sick
        assert "database" in sick["problems"], sick
        assert scrape(env.daemons["east-1"].port)["squeal_pool_worker_healthy"] == 0
    finally:
        env.primary.resume()
    at = writer.next_id
    wait_until(lambda: writer.next_id > at + 300, 30, "writes after the primary answers again")
    wait_until(lambda: delivering(env, "east-1"), DEADLINE, "east-1 to get the shard back once its copy answers")
    at = writer.next_id
    wait_until(lambda: writer.next_id > at + 300, 30, "writes after the hand-back")
    written = writer.stop()
    check_nothing_lost(env, written)
