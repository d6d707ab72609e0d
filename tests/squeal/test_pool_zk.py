"""The worker pool's ZooKeeper foundation against a real 3-server ensemble: per-shard ownership with its own epoch
and lease (squeal/pool/ownership.py: `Ownership`, `SessionLease`) and one marker znode per (region, shard)
(squeal/markers/zkstore.py: `ShardMarkerStore`), fenced by the shard's epoch."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pool_support import (
    SESSION_TIMEOUT,
    Link,
    client,
    ensemble,
    expire_session,
    hosts,
    unique_root,
    write_ha_markers,
)
from squeal_helpers import wait_until

from squeal.markers.zkstore import FencedError, ShardMarkerStore
from squeal.pool.owner import SessionLease
from squeal.pool.ownership import Ownership
from squeal.pool.zookeeper import Watched, ha_marker_dir, pool_path, shard_path


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    with ensemble(tmp_path_factory.mktemp("zk-pool")) as members:
        yield members


def member(
    c, root: str, name: str, lost: list[str], session_timeout: float = SESSION_TIMEOUT, **kwargs
) -> tuple[SessionLease, Ownership]:
    """A pool member `name` on client `c`: its ephemeral member znode, its lease, its ownership."""
    path = f"{pool_path(root, 'east')}/workers/{name}"
    sent = time.monotonic()
    c.create(path, b"{}", ephemeral=True, makepath=True)
    lease = SessionLease(c, path, session_timeout, on_lost=lost.append, **kwargs)
    lease.start(sent)
    return lease, Ownership(c, root, "east", name, lease)


def test_one_owner_per_shard_and_the_marker_znode_is_fenced_by_the_shard_epoch(clients) -> None:
    root = unique_root()
    a_client, b_client, tool = clients(), clients(), clients()
    lost: list[str] = []
    lease_a, a = member(a_client, root, "w-a", lost)
    lease_b, b = member(b_client, root, "w-b", lost)

    def fresh(path: str) -> tuple[bytes, Any]:
        """`tool` reads what the members wrote: another session, maybe on another server of the ensemble, so
        first `sync` (ZooKeeper orders reads only within a session)."""
        tool.sync(path)
        return tool.get(path)

    try:
        # (A member's first lease runs from before its znode was created: on a loaded box that can be over by the
        # time it returns, and a lapsed lease takes nothing until a renewal confirms it.)
        wait_until(lambda: lease_a.valid() and lease_b.valid(), 10, "both members' leases")
        token_a = a.acquire("s0")
        assert token_a is not None and a.may_send("s0")
        assert b.acquire("s0") is None, "a shard has one owner at a time"
        assert b.owner_of("s0") == "w-a"
        assert b.acquire("s1") is not None, "each shard has its own owner and epoch"

        store_a = ShardMarkerStore(a_client, root, "east", "s0", owner="w-a", fence=lambda: a.fence("s0"))
        store_a.ensure_paths()
        assert store_a.load("c0") is None and store_a.load("c1") is None
        store_a.save_many({"c0": "20-1-5", "c1": "20-1-4", "regional": "20-1-5"})
        store_a.save_many({"c0": "20-1-9"})
        # One znode per (region, shard) with every destination's GTID, written once per checkpoint.
        data, stat = fresh(f"{shard_path(root, 'east', 's0')}/markers")
        doc = json.loads(data)
        assert doc["positions"] == {"c0": "20-1-9", "c1": "20-1-4", "regional": "20-1-5"} and doc["by"] == "w-a"
        assert stat.version == 1, "two checkpoints, two writes, whatever the number of destinations"
        assert sorted(tool.get_children(shard_path(root, "east", "s0"))) == ["epoch", "markers", "owner", "replay"]
        assert tool.get_children(f"{shard_path(root, 'east', 's0')}/markers") == [], "one znode, not one per flow"

        # A planned hand-over: a releases (its token dies), b takes the shard and starts from a's markers.
        a.release("s0", "moved")
        assert not a.may_send("s0") and a.fence("s0") is None
        with pytest.raises(FencedError, match="does not own shard s0"):
            store_a.save_many({"c0": "20-1-3"})
        token_b = b.acquire("s0")
        assert token_b is not None and token_b > token_a
        store_b = ShardMarkerStore(b_client, root, "east", "s0", owner="w-b", fence=lambda: b.fence("s0"))
        assert store_b.load("c0") == "20-1-9" and store_b.load("c1") == "20-1-4"
        store_b.save_many({"c1": "20-1-12"})
        # The old owner, paused in the middle of a write with its token still in hand, is refused by the epoch.
        stale = ShardMarkerStore(a_client, root, "east", "s0", owner="w-a", fence=lambda: token_a)
        stale.load("c0")
        with pytest.raises(FencedError, match="another owner"):
            stale.save_many({"c0": "20-1-2"})
        epoch = json.loads(fresh(f"{shard_path(root, 'east', 's0')}/epoch")[0])
        assert epoch["owner"] == "w-b" and epoch["epoch"] == 2
        doc = json.loads(fresh(f"{shard_path(root, 'east', 's0')}/markers")[0])
        assert doc["positions"] == {"c0": "20-1-9", "c1": "20-1-12", "regional": "20-1-5"}, "no marker went back"
    finally:
        lease_a.stop()
        lease_b.stop()


def test_a_crashed_owners_shards_free_only_after_its_session_expires(clients, zk) -> None:
    root = unique_root()
    a_client, b_client = clients(), clients()
    lost: list[str] = []
    lease_a, a = member(a_client, root, "w-a", lost)
    lease_b, b = member(b_client, root, "w-b", lost)
    try:
        assert a.acquire("s0") is not None and a.acquire("s1") is not None
        wait_until(lambda: lease_a.left() > 0, 10, "a's lease")
        assert b.acquire("s0") is None
        expire_session(a_client, hosts(zk))
        # a's lease is gone (it sends nothing) and its owner znodes went with its session: b takes both shards.
        wait_until(lambda: b.acquire("s0") is not None, 20, "s0 free after a's session expired")
        wait_until(lambda: b.acquire("s1") is not None, 20, "s1 free after a's session expired")
        wait_until(lambda: not a.may_send("s0") and lost, 20, "a's lease to be lost")
        assert lost[0] in ("session", "znode")
    finally:
        lease_a.stop()
        lease_b.stop()


def count_requests(c) -> list[int]:
    """How many requests client `c` sends from now on (every kazoo call goes through `KazooClient._call`)."""
    sent = [0]
    call = c._call

    def counting(request, async_object):
        sent[0] += 1
        return call(request, async_object)

    c._call = counting
    return sent


def test_an_owner_looks_for_operator_requests_only_after_their_watch_fired(clients) -> None:
    """A periodic look for replay and accept-data-loss requests (`if_changed`) costs no request while nothing
    changed - it was a sync, a list and a read per shard every second - and still takes every request an operator
    leaves, through another client; a look without `if_changed` (start-up, SIGHUP) is made at once."""
    root = unique_root()
    owner_client, operator_client = clients(), clients()
    store = ShardMarkerStore(owner_client, root, "east", "s0", owner="w-a")
    store.ensure_paths()
    operator = ShardMarkerStore(operator_client, root, "east", "s0")
    sent = count_requests(owner_client)
    assert store.take_replay_requests(if_changed=True) == {}  # the first look is made (and leaves the watches)
    assert not store.take_loss_acceptance(if_changed=True)
    assert sent[0] > 0
    quiet = sent[0]
    for _ in range(20):  # twenty checkpoints with nothing requested
        assert store.take_replay_requests(if_changed=True) == {}
        assert not store.take_loss_acceptance(if_changed=True)
    assert sent[0] == quiet, "looks while nothing changed must not ask ZooKeeper"

    operator.request_replay("c0", "0-1-5")
    operator.request_loss_acceptance()
    taken: dict[str, str] = {}
    wait_until(lambda: taken.update(store.take_replay_requests(if_changed=True)) or taken, 10, "the replay taken")
    assert taken == {"c0": "0-1-5"}
    wait_until(lambda: store.take_loss_acceptance(if_changed=True), 10, "the accepted data loss taken")
    assert not operator_client.exists(f"{shard_path(root, 'east', 's0')}/accept-data-loss"), "taken means removed"
    assert store.take_replay_requests(if_changed=True) == {} and not store.take_loss_acceptance(if_changed=True)
    assert store.take_replay_requests(if_changed=True) == {}, "taken once"

    # A synchronous look sees a request at once, watch or not (the operator's server may be ahead of ours).
    operator.request_replay("c1", "0-1-7")
    assert store.take_replay_requests() == {"c1": "0-1-7"}


def test_a_watched_znode_is_read_again_only_after_it_changed(clients) -> None:
    """`Watched` (the pool controller's and workers' view of their znodes): one read per change, not per look; a
    znode created later is seen; the change wakes its owner (`on_change`)."""
    root = unique_root()
    reader_client, writer = clients(), clients()
    path = f"{pool_path(root, 'east')}/assignment"
    changed: list[int] = []
    view = Watched(reader_client, path, on_change=lambda: changed.append(1))
    sent = count_requests(reader_client)
    assert view.value() is None and view.version is None
    looked = sent[0]
    assert view.value() is None and sent[0] == looked, "a missing znode is watched for, not asked again"
    writer.create(path, b"one", makepath=True)
    wait_until(lambda: view.value() == b"one", 10, "the created znode read")
    assert view.version == 0 and changed
    looked = sent[0]
    for _ in range(20):
        assert view.value() == b"one"
    assert sent[0] == looked, "an unchanged znode is not read again"
    writer.set(path, b"two")
    wait_until(lambda: view.value() == b"two", 10, "the new data read")
    assert view.version == 1


def test_a_shard_without_pool_markers_starts_from_the_ha_layouts_markers(clients) -> None:
    """A region whose markers were written by an HA leader (one znode per destination: `<region>/markers/<flow>`,
    or `<region>/shards/<shard>/markers/<flow>` with [shards]) and that now runs on the pool: each shard's first
    owner reads those, so nothing committed since is skipped; its first write makes the shard's own znode, which
    is what counts from then on (the old znodes are left as they were)."""
    root = unique_root()
    ha_client, pool_client = clients(), clients()
    for shard, ha_shard in (("main", None), ("s1", "s1")):
        write_ha_markers(ha_client, root, "east", ha_shard, {"c0": "0-1-7", "regional": "0-1-5"}, by="east-1")
        store = ShardMarkerStore(
            pool_client, root, "east", shard, owner="w1", legacy=ha_marker_dir(root, "east", ha_shard)
        )
        store.ensure_paths()
        assert store.read() == {"c0": "0-1-7", "regional": "0-1-5"}, "the HA layout's markers are the start"
        assert store.positions() == {"c0": "0-1-7", "regional": "0-1-5"}  # (what `squeal replay` shows)
        store.save_many({"c0": "0-1-9"})
        doc = json.loads(pool_client.get(f"{shard_path(root, 'east', shard)}/markers")[0])
        assert doc["positions"] == {"c0": "0-1-9", "regional": "0-1-5"}, "nothing of the old layout dropped"
        # (an old leader still writing: the shard's own znode wins from now on)
        write_ha_markers(ha_client, root, "east", ha_shard, {"regional": "0-1-6"}, by="east-1")
        fresh = ShardMarkerStore(
            pool_client, root, "east", shard, owner="w2", legacy=ha_marker_dir(root, "east", ha_shard)
        )
        assert fresh.read() == {"c0": "0-1-9", "regional": "0-1-5"}
    corrupt = ha_marker_dir(root, "east", "s2")
    ha_client.create(f"{corrupt}/c0", b"not json", makepath=True)
    with pytest.raises(ValueError, match=f"{corrupt}/c0"):
        ShardMarkerStore(pool_client, root, "east", "s2", legacy=corrupt).read()


def test_a_workers_lease_lapsed_on_slow_answers_resumes_and_its_shards_keep_their_epochs(zk, clients) -> None:
    """Issue 27 item 3 for a pool worker (the lease an HA leader holds too, `squeal.pool.owner.SessionLease`): every
    byte between the worker and the ensemble held for 2 s, longer than its lease (0.6 x 3 s). The lease lapses - the
    shard is not sent for, its marker not written - but the session lives, so its member and owner znodes are its
    own still: the first confirmed round trip resumes it. Same token, same epoch record, no loss, no new owner."""
    root = unique_root()
    links = [Link(("127.0.0.1", m.port)) for m in zk]
    tool = clients()
    try:
        a_client = client(hosts(links), 3.0)
        lost: list[str] = []
        pauses: list[bool] = []
        lease, own = member(a_client, root, "w-a", lost, 3.0, on_pause=pauses.append)
        try:
            wait_until(lease.valid, 10, "w-a's lease")
            token = own.acquire("s0")
            assert token is not None
            store = ShardMarkerStore(a_client, root, "east", "s0", owner="w-a", fence=lambda: own.fence("s0"))
            store.ensure_paths()
            store.load("c0")
            store.save_many({"c0": "0-1-1"})
            epoch_path = f"{shard_path(root, 'east', 's0')}/epoch"
            epoch_before = tool.get(epoch_path)
            t_stall = time.monotonic()
            for link in links:
                link.stall()
            try:
                wait_until(lambda: not own.may_send("s0"), 10, "w-a to stop sending for s0")
                assert own.fence("s0") is None
                with pytest.raises(FencedError):
                    store.save_many({"c0": "0-1-2"})  # (refused before it is sent: no valid lease)
                time.sleep(max(0.0, 2.0 - (time.monotonic() - t_stall)))  # (the fault lasts 2 s)
            finally:
                for link in links:
                    link.unstall()
            wait_until(lambda: own.may_send("s0") or lost, 10, "w-a to resume (or lose its lease)")
            assert not lost, lost
            assert pauses[:1] == [True] and pauses[-1] is False, pauses
            assert own.fence("s0") == token and tool.get(epoch_path) == epoch_before, "the same term, no new epoch"
            store.save_many({"c0": "0-1-3"})  # its token is still good
            markers = f"{shard_path(root, 'east', 's0')}/markers"
            tool.sync(markers)  # (the tool's server may not have applied the write yet)
            assert json.loads(tool.get(markers)[0])["positions"] == {"c0": "0-1-3"}
        finally:
            lease.stop()
            a_client.stop()
            a_client.close()
    finally:
        for link in links:
            link.close()


class _AnswerLost:
    """A kazoo client whose next transaction reaches ZooKeeper and is applied, but whose answer is lost on the
    way back (the connection dropped after the server took the write: what a quorum loss mid-write does)."""

    def __init__(self, real) -> None:
        self._real = real
        self.lose_next = False

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def transaction(self):
        t = self._real.transaction()
        if not self.lose_next:
            return t
        self.lose_next = False
        commit = t.commit_async

        def applied_then_lost():
            from kazoo.exceptions import ConnectionLoss
            from kazoo.handlers.threading import AsyncResult

            commit().get(timeout=10)  # ZooKeeper applied it ...
            lost = AsyncResult(self._real.handler)
            lost.set_exception(ConnectionLoss())  # ... and the owner never heard
            return lost

        t.commit_async = applied_then_lost
        return t


def test_a_marker_write_whose_answer_was_lost_does_not_wedge_the_shards_markers(clients) -> None:
    """A checkpoint's write that ZooKeeper applied but whose answer never came (the quorum went away mid-write)
    moved the znode's version without the owner knowing: every later compare-and-set was refused as if another
    owner had written, and the shard's markers stopped for good while its deletes kept flowing."""
    root = unique_root()
    real, tool = clients(), clients()
    lost: list[str] = []
    lease, own = member(real, root, "w-a", lost)
    try:
        wait_until(lease.valid, 10, "the member's lease")
        assert own.acquire("s0") is not None
        c = _AnswerLost(real)
        store = ShardMarkerStore(c, root, "east", "s0", owner="w-a", fence=lambda: own.fence("s0"))
        store.ensure_paths()
        store.read()
        store.save_many({"c0": "20-1-5"})
        c.lose_next = True
        with pytest.raises(OSError, match="ConnectionLoss"):
            store.save_many({"c0": "20-1-9"})
        store.save_many({"c0": "20-1-12"})  # the next checkpoint
        path = f"{shard_path(root, 'east', 's0')}/markers"
        tool.sync(path)
        assert json.loads(tool.get(path)[0])["positions"] == {"c0": "20-1-12"}

        # Another owner's write in between is still refused: the lost write is adopted only when the znode holds
        # exactly what this owner sent.
        c.lose_next = True
        with pytest.raises(OSError, match="ConnectionLoss"):
            store.save_many({"c0": "20-1-20"})
        data, stat = tool.get(path)
        tool.set(path, data.replace(b"20-1-20", b"20-1-21"), version=stat.version)
        with pytest.raises(FencedError, match="changed since"):
            store.save_many({"c0": "20-1-25"})
    finally:
        lease.stop()
