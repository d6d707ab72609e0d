"""What HA mode did, on the pool's code path (issue 24 item 1): "two instances, one leader" is "one shard, two
workers". Region east without [shards] (its one shard, `main`), `squeal_pool = true`, worker east-1 on the primary
(ranked first) and east-2 on its GTID replica, a 3-server ZooKeeper ensemble, real memcached:

* the preferred worker owns the shard; kill -9 of it under load: east-2 takes the shard over reading its own copy;
  east-1 back and settled (`handback_after_s`): the shard is handed back; 0 lost;
* the owner's copy stops answering (the primary SIGSTOPped): the shard moves to the worker whose copy answers and
  the sick one owns nothing; its copy back: handed back; 0 lost;
* the owner SIGSTOPped past its session: east-2 takes over, no marker ever goes back, the old owner starts over
  owning nothing and gets the shard back only by the hand-back; 0 lost;
* a takeover by a worker whose copy lags the markers waits for it (sending nothing) instead of skipping; 0 lost;
* the primary's host dies (its database and its worker), the replica is promoted: its worker delivers everything;
* each worker checks its copy on one kept connection, not a new login a second;
* ZooKeeper's answers to the owner stalled past its lease: it pauses and resumes in the same epoch, no move;
* a worker that lost its session and replaced itself waits for ZooKeeper at start-up as long as it takes.

"0 lost" is checked key by key against the database. Time-outs only catch hangs.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.exceptions import NoNodeError
from pool_support import Link, Prober, TwoWorkerPool, ensemble
from squeal_helpers import healthz, scrape, wait_until
from test_squeal_faults import Writer, post_keys

from ops.harness import MariaDB
from router_config import loads
from router_config.model import IMPLICIT_SHARD
from squeal.markers.zkstore import ShardMarkerStore, ZooKeeperUnavailable
from squeal.pool.owner import TakeoverError, wait_for_copy
from squeal.pool.worker import PoolWorker
from squeal.pool.zookeeper import shard_path
from squeal.read import gtid as g

DEADLINE = 60.0


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    with ensemble(tmp_path_factory.mktemp("zk-one-shard")) as members:
        yield members


@pytest.fixture
def pool_env(mariadb_pair, zk, memcached_factory, processes, tmp_path) -> Iterator[TwoWorkerPool]:
    primary, replica = mariadb_pair
    env = TwoWorkerPool(tmp_path / "pool", primary, replica, zk, [memcached_factory() for _ in range(2)], processes)
    yield env
    env.close()


def owner(env: TwoWorkerPool) -> str | None:
    """The worker the shard's `owner` znode names (None: nobody owns it now)."""
    with contextlib.suppress(NoNodeError):
        data, _ = env.zk_client.get(f"{shard_path(env.root, 'east', IMPLICIT_SHARD)}/owner")
        return str(json.loads(data)["worker"])
    return None


def delivering(env: TwoWorkerPool, name: str) -> bool:
    """Worker `name` owns the shard and its pipeline runs (its /healthz says so)."""
    try:
        body = env.health(name)
    except OSError:
        return False
    return body.get("owns") == [IMPLICIT_SHARD] and IMPLICIT_SHARD in (body.get("shards") or {})


def start_both(env: TwoWorkerPool) -> None:
    """Both workers at once: the shard goes to east-1 (ranked first), whichever joined first."""
    env.daemons["east-2"].start()
    env.daemons["east-1"].start()
    wait_until(lambda: delivering(env, "east-1"), DEADLINE, "east-1 (on the primary) to own the shard")
    assert owner(env) == "east-1"
    assert env.health("east-2")["owns"] == []


def start_under_load(env: TwoWorkerPool, cached: int, rate: float = 150, written: int = 300) -> Writer:
    """Keys 1..`cached` in both caches, both workers running, a Writer at `rate` rows/s past `written` rows."""
    for c in env.caches:
        c.set_many(post_keys(range(1, cached + 1)))
    start_both(env)
    writer = Writer(env, first=1, rate=rate)
    writer.start()
    wait_until(lambda: writer.next_id > written, 15, "some writes")
    return writer


def check_nothing_lost(env: TwoWorkerPool, written: list[int]) -> None:
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
    pool_env: TwoWorkerPool,
) -> None:
    env = pool_env
    writer = start_under_load(env, 12000, rate=200)
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


def test_a_worker_restarted_at_once_after_kill_9_does_not_win_the_vacancy_its_crash_made(
    pool_env: TwoWorkerPool,
) -> None:
    """Issue 37: the supervisor restarts a killed worker within a second. The new process must not take the shard
    its previous process held: the other worker takes it and keeps it until the hand-back (handback_after_s after
    the new process is back and healthy). Read from the workers' own logs, which record every take in order."""
    env = pool_env
    east1, east2 = env.daemons["east-1"], env.daemons["east-2"]
    # east-1 the controller too, as in the drills: its crash also ends the controller's term, and the next
    # controller's first plan finds the restarted east-1 already back
    east1.start()
    wait_until(lambda: env.health("east-1").get("controller"), DEADLINE, "east-1 to be the controller")
    east2.start()
    wait_until(lambda: delivering(env, "east-1"), DEADLINE, "east-1 to own the shard")
    before = {d: d.log_file.read_text().count("\n") for d in (east1, east2)}
    east1.kill()
    east1.start()  # at once, as the supervisor does

    def takes(daemon) -> list[tuple[str, int]]:
        lines = daemon.log_file.read_text().splitlines()[before[daemon] :]
        return [
            (m[1], int(m[2])) for line in lines if (m := re.search(r"worker (\S+) owns shard main \(epoch (\d+)", line))
        ]

    wait_until(lambda: takes(east1), DEADLINE, "east-1's new process to get the shard back by hand-back")
    assert takes(east2), "east-2 took the shard after the kill"
    first_after_kill = min(takes(east1) + takes(east2), key=lambda t: t[1])
    assert first_after_kill[0] == "east-2", f"the restarted east-1 took its own vacancy first: {first_after_kill}"
    assert takes(east1)[0][1] > takes(east2)[0][1], (takes(east1), takes(east2))
    handbacks = sum(
        scrape(d.port).get('squeal_pool_moves_total{reason="handback"}', 0) for d in (east1, east2) if d.proc
    )
    assert handbacks >= 1, "east-1 got it back by a hand-back, after it had settled"


def test_a_worker_whose_copy_stops_answering_owns_nothing_and_gets_the_shard_back_when_it_answers(
    pool_env: TwoWorkerPool,
) -> None:
    env = pool_env
    writer = start_under_load(env, 12000)

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


def test_an_owner_stopped_past_its_session_never_moves_a_marker_back_and_gets_the_shard_back_by_hand_back(
    pool_env: TwoWorkerPool,
) -> None:
    env = pool_env
    start_both(env)
    markers = ShardMarkerStore(env.zk_client, env.root, "east", IMPLICIT_SHARD)
    seen: dict[str, list[str]] = {}
    failed: list[BaseException] = []  # what the watcher could not read past (a slow ZooKeeper read is retried)
    stop = threading.Event()

    def watch_markers() -> None:  # every marker value ZooKeeper shows, in order
        while not stop.is_set():
            fresh = ShardMarkerStore(env.zk_client, env.root, "east", IMPLICIT_SHARD)
            try:
                for flow, position in fresh.positions().items():
                    if not seen.get(flow) or seen[flow][-1] != position:
                        seen.setdefault(flow, []).append(position)
            except ZooKeeperUnavailable:
                pass  # the test's own session timed a read out on a loaded box: read again
            except BaseException as e:  # noqa: BLE001 - reported by the test
                failed.append(e)
                return
            stop.wait(0.02)

    watcher = threading.Thread(target=watch_markers, daemon=True)
    watcher.start()
    for c in env.caches:
        c.set_many(post_keys(range(1, 6001)))
    writer = Writer(env, first=1, rate=150)
    writer.start()
    wait_until(lambda: writer.next_id > 200, 15, "some writes")
    env.daemons["east-1"].pause()  # SIGSTOP: it keeps its connections, session and queue, and answers nothing
    try:
        wait_until(lambda: delivering(env, "east-2"), DEADLINE, "east-2 to own the shard")
        at = writer.next_id
        wait_until(lambda: writer.next_id > at + 150, 30, "east-2 to deliver a while (its markers move on)")
    finally:
        env.daemons["east-1"].resume()  # SIGCONT: its lease is long gone: it must send and write nothing
    wait_until(lambda: delivering(env, "east-1"), DEADLINE, "east-1 to start over and get the shard handed back")
    at = writer.next_id
    wait_until(lambda: writer.next_id > at + 300, 30, "writes after the hand-back")
    written = writer.stop()
    check_nothing_lost(env, written)
    # The watcher watched to the end: it saw every flow's marker reach the last commit, as ZooKeeper holds it.
    final = markers.positions()
    wait_until(
        lambda: failed or all(seen.get(flow, [None])[-1] == p for flow, p in final.items()),
        DEADLINE,
        "the watcher to see the final markers",
    )
    stop.set()
    watcher.join(5)
    assert not failed, failed
    assert final and set(seen) == set(final), (seen, final)
    assert all(len(values) > 1 for values in seen.values()), seen  # it saw markers move, not one read
    for flow, values in seen.items():  # no marker ever went back (a resumed old owner would write its older one)
        positions = [g.parse_position(v) for v in values]
        for before, after in zip(positions, positions[1:], strict=False):
            assert g.covers_position(after, before), (flow, values)
    assert "lost its ZooKeeper session" in env.daemons["east-1"].log_file.read_text()
    assert markers.positions(), "the markers exist"


@pytest.fixture
def pool_env_own_replica(
    mariadb_pair, mariadb_factory, zk, memcached_factory, processes, tmp_path
) -> Iterator[TwoWorkerPool]:
    """As pool_env, with a replica of its own (the test stops its SQL thread)."""
    primary = mariadb_pair[0]
    replica = mariadb_factory(23, replica=True)
    replica.replicate_from(primary)
    replica.wait_for_gtid(primary.gtid_binlog_pos(), timeout=120)
    env = TwoWorkerPool(tmp_path / "pool", primary, replica, zk, [memcached_factory() for _ in range(2)], processes)
    yield env
    env.close()


def test_a_takeover_waits_for_a_lagging_copy_instead_of_skipping(pool_env_own_replica: TwoWorkerPool) -> None:
    env = pool_env_own_replica
    writer = start_under_load(env, 4000, written=150)
    env.replica.execute("STOP SLAVE SQL_THREAD")  # east-2's copy stops applying: it falls behind the markers
    try:
        wait_until(lambda: writer.next_id > 450, 15, "writes the replica has not applied")
        env.all_gone(list(range(1, 400)), DEADLINE)  # east-1 delivered them (and its markers say so)
        env.daemons["east-1"].kill()
        wait_until(
            lambda: scrape(env.daemons["east-2"].port).get(
                f'squeal_pool_takeover_wait_seconds{{shard="{IMPLICIT_SHARD}"}}', 0
            )
            >= 0.9,
            DEADLINE,
            "east-2 to own the shard and wait for its copy a while",
        )
        body = env.health("east-2")
        assert body["owns"] == [IMPLICIT_SHARD] and body["starting"] == [IMPLICIT_SHARD], body
        assert not any(k.startswith("squeal_deletes_sent_total") for k in scrape(env.daemons["east-2"].port))
    finally:
        env.replica.execute("START SLAVE SQL_THREAD")
    wait_until(lambda: delivering(env, "east-2"), DEADLINE, "east-2 to deliver once its copy caught up")
    written = writer.stop()
    check_nothing_lost(env, written)


def test_the_primary_host_dies_the_promoted_replicas_worker_delivers_everything(
    zk, mariadb_factory, memcached_factory, processes, tmp_path
) -> None:
    primary: MariaDB = mariadb_factory(43)
    replica: MariaDB = mariadb_factory(44, replica=True)
    replica.replicate_from(primary)
    assert replica.execute("SELECT @@log_slave_updates")[0][0] == 1  # east-2 reads what its copy applies
    env = TwoWorkerPool(tmp_path / "pool", primary, replica, zk, [memcached_factory() for _ in range(2)], processes)
    try:
        writer = start_under_load(env, 6000)
        env.all_gone(list(range(1, 150)), DEADLINE)

        env.daemons["east-1"].kill()  # the host dies: its database and its worker at once, mid-load
        primary.kill()
        writer.join(15)
        assert writer.error is not None  # the writer's connection died with the primary
        wait_until(lambda: delivering(env, "east-2"), DEADLINE, "east-2 to own the shard")
        replica.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF")  # the operator promotes it
        env.primary = replica
        first = env.sql("SELECT COALESCE(MAX(id), 0) FROM posts")[0][0] + 1
        writer = Writer(env, first=first, rate=150)
        writer.start()
        env.probe(10_000_001, DEADLINE)  # committed on the promoted copy: east-2 reads its own binlog
        wait_until(lambda: writer.next_id > first + 300, 30, "writes to the promoted copy")
        writer.stop()
        in_db = [r[0] for r in env.sql("SELECT id FROM posts ORDER BY id")]
        assert set(range(first, writer.next_id)) <= set(in_db)
        env.all_gone(in_db, DEADLINE)  # every row the surviving copy has: its key gone from every cluster
        last = replica.gtid_binlog_pos()
        assert f"-{replica.server_id}-" in last, last
        markers = ShardMarkerStore(env.zk_client, env.root, "east", IMPLICIT_SHARD)
        wait_until(
            lambda: all(
                g.covers_position(g.parse_position(p), g.parse_position(last)) for p in markers.positions().values()
            ),
            DEADLINE,
            "markers to reach the last commit",
        )
        body = env.health("east-2")
        assert body["healthy"] is True and body["shards"][IMPLICIT_SHARD]["database"]["name"] == "east-r1", body
    finally:
        env.close()


def connections_opened(db: MariaDB, seconds: float) -> int:
    """How many connections MariaDB `db` accepted over `seconds` (its `Connections` counter), on one connection."""
    conn = db.connect()
    try:
        with conn.cursor() as cur:

            def count() -> int:
                cur.execute("SHOW GLOBAL STATUS LIKE 'Connections'")
                return int(cur.fetchone()[1])

            before = count()
            time.sleep(seconds)
            return count() - before
    finally:
        conn.close()


def test_a_worker_checks_its_copy_on_one_connection_not_a_new_one_a_second(pool_env: TwoWorkerPool) -> None:
    """A new connection per check is a MariaDB login a second per worker (a TLS handshake too, under [tls])."""
    env = pool_env
    start_both(env)
    wait_until(lambda: healthz(env.daemons["east-2"].port)[1].get("healthy") is True, 15, "east-2 healthy")
    time.sleep(2)  # past start-up's own connections
    opened = {
        "primary (east-1, the owner)": connections_opened(env.primary, 6),
        "replica (east-2, owning nothing)": connections_opened(env.replica, 6),
    }
    # One reconnection would be allowed (a check that failed); a connection a second is 6.
    assert all(n <= 1 for n in opened.values()), opened


def test_wait_for_copy_is_bounded(mariadb_pair) -> None:
    primary = mariadb_pair[0]
    have = g.parse_position(primary.gtid_binlog_pos())
    assert wait_for_copy(primary.connect, have, timeout=5) < 5
    ahead = {d: (s, n + 1000) for d, (s, n) in have.items()} or {0: (1, 1000)}
    seen: list[float] = []
    with pytest.raises(TakeoverError, match=f"markers need {g.format_position(ahead)}"):
        wait_for_copy(primary.connect, ahead, timeout=0.3, progress=seen.append)
    assert seen and seen[-1] >= 0.3


def test_zookeeper_answers_stalled_past_the_lease_the_owner_resumes_in_the_same_epoch(
    zk, mariadb_pair, memcached_factory, processes, tmp_path
) -> None:
    """Issue 27, item 3, on the pool: under CPU pressure an owner's lease ran out with no fault injected. Here every
    byte between east-1 and the ensemble is held for 2 s (then delivered: a slow ZooKeeper, not a dead one), under
    load, with a 3 s session (a 1.8 s lease). east-1's lease lapses and it pauses, then the first round trip that
    gets through confirms its session and it resumes: the same owner, the same epoch, no move, no restart."""
    primary, replica = mariadb_pair
    links = [Link((m.host, m.port)) for m in zk]
    env = TwoWorkerPool(
        tmp_path / "pool",
        primary,
        replica,
        zk,
        [memcached_factory() for _ in range(2)],
        processes,
        session_timeout=3.0,
        zk_servers={"east-1": links},
    )
    epoch = f"{shard_path(env.root, 'east', IMPLICIT_SHARD)}/epoch"
    prober: Prober | None = None
    try:
        writer = start_under_load(env, 6000)
        epoch_before = env.zk_client.get(epoch)
        prober = Prober(env, first=20_000_001, every=0.1).start()
        wait_until(lambda: len(prober.gone) >= 5, DEADLINE, "the prober's first changes to be invalidated")
        owner_pid = env.daemons["east-1"].pid

        t_stall = time.monotonic()
        for link in links:
            link.stall()
        try:
            wait_until(
                lambda: scrape(env.daemons["east-1"].port).get("squeal_pool_lease_lapses_total", 0) >= 1,
                10,
                "east-1's lease to run out",
            )
            time.sleep(max(0.0, 2.0 - (time.monotonic() - t_stall)))  # (the fault lasts 2 s)
        finally:
            for link in links:
                link.unstall()
        at = prober.next_id
        wait_until(lambda: prober.next_id > at + 20, 15, "probes after the stall")
        prober.stop()
        at = writer.next_id
        wait_until(lambda: writer.next_id > at + 150, 15, "writes after the stall")
        written = writer.stop()

        # No move: the same epoch record, the same process owns the shard; its lease lapsed and resumed once.
        assert env.zk_client.get(epoch) == epoch_before
        assert env.daemons["east-1"].pid == owner_pid and owner(env) == "east-1"
        m1 = scrape(env.daemons["east-1"].port)
        assert m1["squeal_pool_lease_lapses_total"] == 1 and m1["squeal_pool_lease_resumptions_total"] == 1, m1
        assert "lost its ZooKeeper session" not in env.daemons["east-1"].log_file.read_text()
        check_nothing_lost(env, written)
        latencies = prober.latencies()
        assert len(latencies) == len(prober.committed), "some probes were never invalidated"
        print(
            f"\nZooKeeper answers to east-1 stalled 2 s (session 3 s, lease 1.8 s): lapsed, resumed in the same "
            f"epoch; {len(latencies)} probes every 100 ms, longest commit -> invalidated {max(latencies) * 1000:.0f} ms"
        )
    finally:
        if prober is not None:
            prober.stop(timeout=1)
        for link in links:
            link.close()
        env.close()


def test_a_worker_that_replaced_itself_waits_for_zookeeper_as_long_as_it_takes(
    zk, mariadb_pair, memcached_factory, processes, tmp_path, monkeypatch
) -> None:
    """A worker that lost its session because ZooKeeper lost its quorum (or its host was cut off) replaces itself
    with a fresh process, which must wait until ZooKeeper answers again, however long the outage: giving up after
    the start-up's connect time-out would end the worker in the middle of the outage for no reason."""
    primary, replica = mariadb_pair
    env = TwoWorkerPool(tmp_path / "pool", primary, replica, zk, [memcached_factory() for _ in range(2)], processes)
    links = [Link((m.host, m.port)) for m in zk]
    worker: PoolWorker | None = None
    try:
        text = env.topology.read_text()
        for m, link in zip(zk, links, strict=True):
            text = text.replace(f'"{m.host}:{m.port}"', f'"127.0.0.1:{link.port}"')
        for link in links:
            link.cut()  # ZooKeeper unreachable
        monkeypatch.setenv("SQUEAL_REJOINED", "lease")  # as rejoin_owning_nothing sets it for the new process
        worker = PoolWorker(loads(text), "east-1", state_dir=tmp_path / "state", connect_timeout=0.5)
        failed: list[BaseException] = []

        def prepare() -> None:
            try:
                worker.prepare()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                failed.append(e)

        t = threading.Thread(target=prepare, daemon=True)
        t.start()
        t.join(2.5)  # five times the connect time-out
        assert not failed, failed
        assert t.is_alive()  # still waiting for ZooKeeper
        for link in links:
            link.heal()
        t.join(30)
        assert not failed and not t.is_alive()
        assert worker.client is not None and worker.client.connected
    finally:
        if worker is not None and worker.client is not None:
            worker.client.stop()
            worker.client.close()
        for link in links:
            link.close()
        env.close()
