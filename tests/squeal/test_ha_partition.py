"""A real network partition: the leading squeal instance runs in a network namespace of its own, joined to the
rest (ZooKeeper ensemble, its MariaDB primary, the memcacheds, the standby on the replica) by a veth pair
that the test takes down. Nothing of the leader's gets through from then on: it must stop by its lease, the
standby must take over with nothing lost, and after healing the old leader must come back as a standby and
never write a marker behind its successor. Key by key against the database.

Time-outs only catch hangs; the measured times are printed (run with -s).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from squeal_helpers import wait_until
from test_ha_support import SESSION_TIMEOUT, HaEnv, MarkerWatch, NetnsLink, ensemble, netns_unavailable, start_pair
from test_squeal_faults import Writer, post_keys

from ops.harness import ZooKeeper
from squeal.zkstore import region_path


@pytest.fixture(scope="module")
def link() -> Iterator[NetnsLink]:
    why = netns_unavailable()
    if why:
        pytest.skip(why)
    made = NetnsLink()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="module")
def zk_far(link: NetnsLink, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ZooKeeper]]:
    """The ensemble on the link's root-side address: reachable from the namespace until the cut."""
    with ensemble(tmp_path_factory.mktemp("zk-far"), host=link.root_ip) as members:
        yield members


def test_a_partitioned_leader_stops_the_standby_takes_over_and_the_old_leader_rejoins_as_standby(
    link: NetnsLink, zk_far: list[ZooKeeper], mariadb_factory, memcached_factory, processes, tmp_path
) -> None:
    primary = mariadb_factory(31, host=link.root_ip)
    replica = mariadb_factory(32, replica=True)
    replica.replicate_from(primary)
    env = HaEnv(
        tmp_path / "ha",
        primary,
        replica,
        zk_far,
        [memcached_factory(host=link.root_ip) for _ in range(2)],
        processes,
        instance_hosts={"east-1": link.ns_ip},
        netns={"east-1": link.ns},
    )
    try:
        for c in env.caches:
            c.set_many(post_keys(range(1, 6001)))
        start_pair(env)
        pid = env.daemons["east-1"].pid
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")  # really elsewhere
        watch = MarkerWatch(env.zk_client, region_path(env.root, "east")).start()
        writer = Writer(env, first=1, rate=150)
        writer.start()
        wait_until(lambda: writer.next_id > 200, 15, "some writes")
        env.all_gone(list(range(1, 150)), 15)  # east-1 delivers from inside its namespace

        link.cut()
        t_cut = time.monotonic()
        try:
            wait_until(lambda: env.state("east-2") == "leader", 20, "east-2 to lead")
            took = time.monotonic() - t_cut
            gap = env.probe(10_000_001, 30)  # committed after the cut: gone once east-2 delivers
            at = writer.next_id
            wait_until(lambda: writer.next_id > at + 300, 30, "writes while east-1 is cut off")
            # East-1 saw no ZooKeeper answer for its lease (0.6 x the session) and stopped by itself.
            log = env.daemons["east-1"].log_file
            wait_until(lambda: "lease ran out" in log.read_text(), 10, "east-1 to depose itself")
            assert env.daemons["east-1"].proc.poll() is None  # it replaced itself: a standby, once it can connect
            partitioned = time.monotonic() - t_cut
        finally:
            link.heal()
        t_heal = time.monotonic()
        wait_until(lambda: env.state("east-1") == "standby", 40, "east-1 to come back as a standby")
        rejoined = time.monotonic() - t_heal
        # east-1 is the preferred instance (on the primary): east-2 hands the region back once it is healthy.
        wait_until(lambda: env.state("east-1") == "leader", 30, "east-1 to take the region back")
        wait_until(lambda: env.state("east-2") == "standby", 30, "east-2 to stand by again")
        at = writer.next_id
        wait_until(lambda: writer.next_id > at + 200, 30, "writes after the hand-back")
        written = writer.stop()

        # Key by key against the database: every committed row's key is gone from every cluster.
        in_db = [r[0] for r in env.sql("SELECT id FROM posts ORDER BY id")]
        assert in_db == written
        env.all_gone(in_db, 30)
        later = post_keys(range(written[-1] + 1, written[-1] + 50))
        for c in env.caches:  # rows never written were not invalidated
            assert c.present(later) == set(later)
        watch.wait_covering(env.position())  # a checkpoint after the last writes, seen by the watcher
        watch.stop()
        # From ZooKeeper's (and so the destinations') point of view: east-1, then east-2, then east-1 again,
        # epochs growing, no marker back, no marker written by an instance out of its turn.
        assert [name for _, name in watch.leaders] == ["east-1", "east-2", "east-1"], watch.leaders
        watch.check_one_leader_at_a_time()
        assert "rejoining as a standby (lease)" in log.read_text()
        print(
            f"\nveth partition of the leader (session timeout {SESSION_TIMEOUT * 1000:.0f} ms): east-2 leads "
            f"{took * 1000:.0f} ms after the cut; a change committed then was invalidated in {gap * 1000:.0f} ms; "
            f"partition held {partitioned:.1f} s; east-1 back as a standby {rejoined * 1000:.0f} ms after the "
            f"heal; leaders {watch.leaders}; marker values seen "
            f"{ {f: len(v) for f, v in watch.markers.items()} }; {len(in_db)} rows checked key by key"
        )
    finally:
        env.close()
