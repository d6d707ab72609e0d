"""A real network partition of a pool worker (issue 24): worker w1 runs in a network namespace of its own, joined
to everything else (the ZooKeeper ensemble, each shard's MariaDB, the memcacheds, worker w2) by a veth pair the
test takes down. Its shards must move to w2 once its session expires; after healing, w1 comes back owning
nothing until placed again, and no shard ever has two senders: every shard's marker writes, read from ZooKeeper,
show fencing tokens that only rise, each written by one worker. Key by key against the databases: 0 lost.

Time-outs only catch hangs (`DEADLINE`); nothing here asserts a speed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pool_support import NetnsLink, ensemble, netns_unavailable
from squeal_helpers import all_started, wait_until
from test_pool_workers import (
    DEADLINE,
    FAST_PLACEMENT,
    SHARDS,
    MarkerWatch,
    Pool,
    Writer,
    assert_nothing_lost,
    owned,
    prime,
)

from ops.harness import MariaDB, ZooKeeper


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
    with ensemble(tmp_path_factory.mktemp("zk-pool-far"), host=link.root_ip) as members:
        yield members


@pytest.fixture(scope="module")
def far_dbs(link: NetnsLink, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MariaDB]]:
    """One primary per shard on the root-side address, GTID domains 40..43."""
    base = tmp_path_factory.mktemp("pool-far-shards")
    dbs = [
        MariaDB(server_id=400 + i, workdir=base / f"s{i}", gtid_domain_id=40 + i, host=link.root_ip)
        for i in range(len(SHARDS))
    ]
    with all_started(dbs):
        yield dbs


def test_a_partitioned_worker_loses_its_shards_and_after_healing_no_shard_has_two_senders(
    link: NetnsLink, zk_far: list[ZooKeeper], far_dbs: list[MariaDB], tmp_path
) -> None:
    # Seconds of cooldown, not minutes: every shard moved at the cut, and the healed w1 is filled once it is over.
    env = Pool(
        tmp_path / "pool",
        far_dbs,
        zk_far,
        host=link.root_ip,
        netns={"w1": (link.ns, link.ns_ip)},
        placement=FAST_PLACEMENT,
    )
    try:
        prime(env, range(1, 20001))
        env.workers["w1"].start()
        wait_until(lambda: env.placed(("w1",)), DEADLINE, "all 4 shards running on w1 (inside the namespace)")
        pid = env.workers["w1"].pid
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")  # really elsewhere
        env.workers["w2"].start()  # joins empty: the controller fills it at once
        placed = wait_until(
            lambda: (p := env.placed(("w1", "w2"))) and all(p.values()) and p, DEADLINE, "shards on both workers"
        )
        cut_off = placed["w1"]
        watch = MarkerWatch(env)
        watch.start()
        writer = Writer(env, rate=60)
        writer.start()
        wait_until(lambda: len(writer.written) > 100, DEADLINE, "writes before the cut")
        wait_until(
            lambda: all(any(by == "w1" for *_, by, _ in watch.writes[s]) for s in cut_off),
            DEADLINE,
            "w1 writing its shards' markers from inside the namespace",
        )

        link.cut()
        try:
            wait_until(lambda: env.placed(("w2",)), DEADLINE, f"w1's shards {sorted(cut_off)} running on w2")
            assert owned(env)["w2"] == set(SHARDS) and "w1" not in owned(env)  # w1's member znode expired
            at = len(writer.written)
            wait_until(lambda: len(writer.written) > at + 100, DEADLINE, "writes while w1 is cut off")
            wait_until(lambda: "lease ran out" in env.log("w1"), DEADLINE, "w1 to stop by its lease")
            assert env.workers["w1"].proc.poll() is None
        finally:
            link.heal()
        wait_until(lambda: "starting over" in env.log("w1"), DEADLINE, "w1 to notice its session is gone")
        placed = wait_until(
            lambda: (p := env.placed(("w1", "w2"))) and all(p.values()) and p,
            DEADLINE,
            "w1 back in the pool, placed again (an empty worker is filled)",
        )
        at = len(writer.written)
        wait_until(lambda: len(writer.written) > at + 100, DEADLINE, "writes after the heal")
        written = writer.stop()
        assert_nothing_lost(env, written)
        back = placed["w1"]
        wait_until(
            lambda: all(any(by == "w1" for *_, by, _ in watch.writes[s][-3:]) for s in back),
            DEADLINE,
            "w1 writing the markers of the shards it was given back",
        )
        watch.stop()
        assert not watch.went_back, watch.went_back
        runs = watch.one_sender_per_token()
        for shard in cut_off:  # w1 (inside), then w2 (the cut), [then w1 again]: each with a newer token
            assert [by for _, by in runs[shard]][:2] == ["w1", "w2"], runs[shard]
        for shard in back:
            assert runs[shard][-1][1] == "w1", runs[shard]
    finally:
        env.stop()
