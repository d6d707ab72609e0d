"""The ZooKeeper datamarker store (squeal/markers/zkstore.py: `ShardMarkerStore`, a shard's markers in one znode, the
only writer of markers; its base `ZooKeeperDatamarkerStore`, which holds the replay requests' code) against a real
3-server ZooKeeper ensemble (the harness's, Debian's ZooKeeper 3.8): compare-and-set, fencing by the shard's epoch
znode, replay requests, a cut link and an expired session.

Time-outs below only catch hangs; measured times are printed (run with -s to see them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from pool_support import SESSION_TIMEOUT, Link, ensemble, expire_session, hosts, unique_root
from squeal_helpers import wait_until

from squeal.markers.zkstore import FencedError, ShardMarkerStore, ZooKeeperDatamarkerStore, ZooKeeperUnavailable
from squeal.pool.zookeeper import shard_path


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    with ensemble(tmp_path_factory.mktemp("zk-ensemble")) as members:
        yield members


@pytest.fixture
def links(zk) -> Iterator:
    """`links()`: one cuttable proxy per ensemble member; returns (connect string, [Link])."""
    made: list[Link] = []

    def make():
        new = [Link(("127.0.0.1", m.port)) for m in zk]
        made.extend(new)
        return hosts(new), new

    yield make
    for link in made:
        link.close()


# -- the datamarker store ------------------------------------------------------------------------------------------


def test_marker_round_trip(clients) -> None:
    root = unique_root()
    store = ShardMarkerStore(clients(), root, "east", "main", owner="east-1")
    store.check_writable()
    assert store.load("c0") is None
    store.save("c0", "0-1-5")
    store.save("c0", "0-1-9,1-3-2")
    assert store.load("c0") == "0-1-9,1-3-2"
    assert store.load("regional") is None
    store.save("regional", "0-1-7")
    # Another instance (another session) reads the same positions: they outlive the writer.
    other = ShardMarkerStore(clients(), root, "east", "main")
    assert other.positions() == {"c0": "0-1-9,1-3-2", "regional": "0-1-7"}
    assert other.load("c0") == "0-1-9,1-3-2"
    data, stat = other.client.get(store.markers_path)  # one znode for every flow of the shard
    assert json.loads(data)["by"] == "east-1" and stat.version == 2
    # Regions and shards are apart.
    assert ShardMarkerStore(other.client, root, "west", "main").positions() == {}
    assert ShardMarkerStore(other.client, root, "east", "s1").positions() == {}
    # A marker that does not parse is an error naming the znode, never "now".
    other.client.set(store.markers_path, b'{"positions": {"regional": "0-1"}}')
    with pytest.raises(ValueError, match=store.markers_path):
        ShardMarkerStore(other.client, root, "east", "main").load("regional")


def test_a_stale_writer_cannot_overwrite_a_newer_marker(clients) -> None:
    root = unique_root()
    a = ShardMarkerStore(clients(), root, "east", "main", owner="a")
    b = ShardMarkerStore(clients(), root, "east", "main", owner="b")
    a.ensure_paths()
    assert a.load("c0") is None and b.load("c0") is None
    a.save("c0", "0-1-10")
    with pytest.raises(FencedError, match="created by someone else"):
        b.save("c0", "0-1-3")  # b found no marker: its create fails now that a wrote one
    a.save("c0", "0-1-20")
    b.client.sync(b.markers_path)  # b's session may be on another server: ZooKeeper orders reads per session
    assert b.read()["c0"] == "0-1-20"
    b.save("c0", "0-1-25")  # b read the newest marker: its write goes through ...
    with pytest.raises(FencedError, match="changed since this owner read them"):
        a.save("c0", "0-1-21")  # ... and a, which has not read it since, can no longer move it
    assert b.load("c0") == "0-1-25"
    with pytest.raises(FencedError, match="before it was read"):
        ShardMarkerStore(a.client, root, "east", "main").save("c0", "0-1-1")


def test_marker_writes_are_fenced_by_the_shards_epoch(clients) -> None:
    """An owner's store checks the epoch version it took the shard with: once another owner bumps it, nothing it
    writes (markers, replay requests taken) goes through, even with a markers version that is still current."""
    root = unique_root()
    zk = clients()
    epoch = f"{shard_path(root, 'east', 'main')}/epoch"
    zk.create(epoch, b'{"epoch": 1}', makepath=True)
    token = {"value": zk.exists(epoch).version}
    old = ShardMarkerStore(zk, root, "east", "main", fence=lambda: token["value"])
    old.ensure_paths()
    assert old.load("c0") is None
    old.save("c0", "0-1-4")
    old.request_replay("c1", "0-1-2")
    zk.set(epoch, b'{"epoch": 2}')  # another owner took the shard
    with pytest.raises(FencedError, match="has had another owner since"):
        old.save("c0", "0-1-5")
    with pytest.raises(FencedError, match="another owner has taken over since"):
        old.take_replay_requests()
    assert ShardMarkerStore(zk, root, "east", "main").positions() == {"c0": "0-1-4"}
    assert zk.exists(f"{shard_path(root, 'east', 'main')}/replay/c1") is not None  # waits for the new owner
    token["value"] = None  # not the owner at all: refused before anything is sent
    with pytest.raises(FencedError, match="does not own shard main"):
        old.save("c0", "0-1-6")


def test_replay_requests(clients) -> None:
    root = unique_root()
    store = ZooKeeperDatamarkerStore(clients(), root, "east")
    assert store.take_replay_requests() == {}
    store.ensure_paths()
    operator = ZooKeeperDatamarkerStore(clients(), root, "east")
    operator.request_replay("c0", "0-1-100")
    operator.request_replay("c0", "0-1-50")  # the newer request wins
    operator.request_replay("regional", "")  # from the start
    with pytest.raises(ValueError):
        operator.request_replay("c1", "not-a-gtid")
    assert store.take_replay_requests() == {"c0": "0-1-50", "regional": ""}
    assert store.take_replay_requests() == {}  # taken once
    store.client.create(f"{root}/regions/east/replay/c1", b"garbage")
    assert store.take_replay_requests() == {}  # a corrupt request is logged and removed, never applied
    assert store.client.get_children(f"{root}/regions/east/replay") == []
    # Requests and markers are apart: taking a request leaves the marker alone.
    assert store.load("c0") is None


def test_session_loss_and_partition(clients, links) -> None:
    """Through a link the test cuts: writes fail with ZooKeeperUnavailable (bounded), nothing half-written;
    after the heal (the session expired meanwhile: a new one) the markers are intact and writable."""
    root = unique_root()
    connect, cut_links = links()
    store = ShardMarkerStore(clients(connect), root, "east", "main", timeout=1.0)
    store.ensure_paths()
    assert store.load("c0") is None
    store.save("c0", "0-1-1")
    witness = f"{root}/session-witness"  # an ephemeral znode of the store's session: gone when it expired
    store.client.create(witness, ephemeral=True)
    for link in cut_links:
        link.cut()
    t0 = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match="write"):
        store.save("c0", "0-1-2")
    failed_after = time.monotonic() - t0
    assert failed_after < 10, failed_after  # (a hang detector, not a speed requirement)
    observer = ShardMarkerStore(clients(), root, "east", "main")
    wait_until(lambda: observer.client.exists(witness) is None, SESSION_TIMEOUT * 4, "the session to expire")
    assert observer.positions() == {"c0": "0-1-1"}
    old_session = store.client.client_id
    for link in cut_links:
        link.heal()
    # kazoo finds its session expired, starts a new one; the marker (persistent) is still there.
    wait_until(
        lambda: store.client.connected and store.client.client_id != old_session, 20, "a new session", interval=0.1
    )
    store.save("c0", "0-1-2")
    assert observer.positions() == {"c0": "0-1-2"}
    # An expired session (ZooKeeper closed it) is the same: the next write works on the new session.
    old_session = store.client.client_id
    expire_session(store.client, connect)
    wait_until(
        lambda: store.client.connected and store.client.client_id != old_session, 20, "a new session", interval=0.1
    )
    store.save("c0", "0-1-3")
    assert observer.positions() == {"c0": "0-1-3"}
    print(f"\nwrite through a cut link failed after {failed_after:.2f}s (timeout 1.0s)")


def test_a_write_the_acl_refuses_is_named_as_such_not_as_fencing(clients) -> None:
    """A marker znode made read-only (squeal's digest ACL lost, an operator's mistake): the write fails with NoAuth,
    and the error names NoAuth and the znode; it is not a FencedError (nobody else owns the shard)."""
    from kazoo.security import make_acl

    from squeal.markers.datamarkers import describe_error
    from squeal.markers.zkstore import ShardMarkerStore, ZooKeeperRefused

    root = unique_root()
    zk = clients()
    store = ShardMarkerStore(zk, root, "east", "main")
    store.ensure_paths()
    store.read()
    store.save("c0", "0-1-1")
    zk.set_acls(store.markers_path, [make_acl("world", "anyone", read=True, admin=True)])  # no write
    with pytest.raises(ZooKeeperRefused) as refused:
        store.save("c0", "0-1-2")
    text = describe_error(refused.value)  # what /healthz and the log say
    assert text.startswith("ZooKeeperRefused: ") and "NoAuth" in text and store.markers_path in text, text
    assert not isinstance(refused.value, FencedError)
    assert "changed since this owner read them" not in text
    zk.set_acls(store.markers_path, [make_acl("world", "anyone", all=True)])
    store.save("c0", "0-1-2")  # the next checkpoint's retry goes through once the ACL is fixed
    assert ShardMarkerStore(zk, root, "east", "main").read() == {"c0": "0-1-2"}
