"""The worker pool's ZooKeeper foundation against a real 3-server ensemble: per-shard ownership with its own epoch
and lease (squeal/pool.py: `Ownership`, `SessionLease`) and one marker znode per (region, shard)
(squeal/zkstore.py: `ShardMarkerStore`), fenced by the shard's epoch."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from squeal_helpers import wait_until
from test_ha_support import SESSION_TIMEOUT, client, ensemble, expire_session, hosts, unique_root

from squeal.pool import Ownership, SessionLease
from squeal.zkstore import FencedError, ShardMarkerStore, pool_path, shard_path


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    with ensemble(tmp_path_factory.mktemp("zk-pool")) as members:
        yield members


@pytest.fixture
def clients(zk) -> Iterator:
    made = []

    def make():
        c = client(hosts(zk), SESSION_TIMEOUT)
        made.append(c)
        return c

    yield make
    for c in made:
        try:
            c.stop()
            c.close()
        except Exception:  # noqa: BLE001
            pass


def member(c, root: str, name: str, lost: list[str]) -> tuple[SessionLease, Ownership]:
    """A pool member `name` on client `c`: its ephemeral member znode, its lease, its ownership."""
    path = f"{pool_path(root, 'east')}/workers/{name}"
    sent = time.monotonic()
    c.create(path, b"{}", ephemeral=True, makepath=True)
    lease = SessionLease(c, path, SESSION_TIMEOUT, on_lost=lost.append)
    lease.start(sent)
    return lease, Ownership(c, root, "east", name, lease)


def test_one_owner_per_shard_and_the_marker_znode_is_fenced_by_the_shard_epoch(clients) -> None:
    root = unique_root()
    a_client, b_client, tool = clients(), clients(), clients()
    lost: list[str] = []
    lease_a, a = member(a_client, root, "w-a", lost)
    lease_b, b = member(b_client, root, "w-b", lost)
    try:
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
        data, stat = tool.get(f"{shard_path(root, 'east', 's0')}/markers")
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
        epoch = json.loads(tool.get(f"{shard_path(root, 'east', 's0')}/epoch")[0])
        assert epoch["owner"] == "w-b" and epoch["epoch"] == 2
        doc = json.loads(tool.get(f"{shard_path(root, 'east', 's0')}/markers")[0])
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
