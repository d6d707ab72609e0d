"""The pool's decisions driven by a clock of the test's own (twisted's `task.Clock`) and an in-memory ZooKeeper
(`fake_zookeeper`): the lease a worker acts within (`SessionLease`: renewal from the request's send time, a lapse's
confirmation), what `Ownership` allows with it (take, send, fence, release), and the controller's plans (`Controller.
plan_once`: placement, drains, compare-and-set, who has settled). No servers, no sleeps: test_pool_zk.py and
test_pool_workers.py run the same code against real ZooKeeper and MariaDB."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fake_zookeeper import FakeZooKeeper
from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock

import router_config
from squeal.pool import placement
from squeal.pool.controller import Controller
from squeal.pool.metrics import PoolMetrics
from squeal.pool.owner import LEASE_FRACTION, SessionLease
from squeal.pool.ownership import Ownership
from squeal.pool.zookeeper import pool_path, shard_path

ROOT = "/squeal"
SESSION_TIMEOUT = 4.0
LEASE = LEASE_FRACTION * SESSION_TIMEOUT  # how long a round trip keeps the lease, from its send time
SHARDED = Path(__file__).resolve().parents[2] / "examples" / "sharded.toml"  # east: users-0..3, east-1, east-2


# -- the lease and what Ownership does with it -------------------------------------------------------------------


def _member(zk: FakeZooKeeper, clock: Clock, name: str) -> tuple[SessionLease, Ownership, list[str]]:
    """A worker's member znode (ephemeral, of `zk`'s session), its lease (threads not started: the test renews
    it by hand, as the renewal thread would) and its `Ownership`."""
    path = f"{pool_path(ROOT, 'east')}/workers/{name}"
    zk.put(path, b"{}", ephemeral_of=zk.client_id[0])
    lost: list[str] = []
    lease = SessionLease(zk, path, SESSION_TIMEOUT, on_lost=lost.append, clock=clock.seconds, who=name)
    return lease, Ownership(zk, ROOT, "east", name, lease), lost


def _renew(lease: SessionLease, clock: Clock, sent: float) -> None:
    """One round trip of the renewal thread: sent at `sent`, answered now (`clock`)."""
    assert sent <= clock.seconds()
    lease._renew(sent)


def test_the_lease_runs_from_the_renewals_send_time_and_ownership_ends_with_it() -> None:
    """A round trip proves the session alive only from when it was sent, so the lease ends LEASE after the send,
    however late the answer came; at that instant `may_send` and `fence` say no (nothing sent, no marker written)
    and `acquire` takes nothing, while the shard stays this worker's (no new epoch: a renewal resumes it)."""
    zk, clock = FakeZooKeeper(), Clock()
    clock.advance(100.0)
    lease, ownership, lost = _member(zk, clock, "w1")
    assert not lease.valid()  # never renewed: not a moment of ownership yet
    assert ownership.acquire("s0") is None and zk.data(f"{shard_path(ROOT, 'east', 's0')}/owner") is None

    sent = clock.seconds()
    clock.advance(1.0)  # a slow answer
    _renew(lease, clock, sent)
    token = ownership.acquire("s0")
    assert token is not None and ownership.may_send("s0") and ownership.fence("s0") == token
    assert not ownership.may_send("s1")  # (a shard it does not own)

    clock.advance(sent + LEASE - clock.seconds() - 0.001)  # just before the end: still valid
    assert lease.valid() and ownership.may_send("s0")
    clock.advance(0.001)  # the end: send time + LEASE, not answer time + LEASE
    assert not lease.valid()
    assert not ownership.may_send("s0") and ownership.fence("s0") is None
    assert ownership.acquire("s1") is None  # no lease, no new shard
    assert "s0" in ownership.tokens and lost == []  # lapsed, not lost: the shard is kept

    _renew(lease, clock, clock.seconds())  # (the watchdog has not marked it lapsed: a plain renewal)
    assert ownership.may_send("s0") and ownership.fence("s0") == token  # the same epoch


def test_a_lapsed_lease_resumes_only_on_a_confirmation_it_can_still_send_on() -> None:
    """After the watchdog marked the lease lapsed, an answer alone proves nothing: the renewal confirms the session
    with a multi-operation, and resumes only if send time + LEASE is still ahead when the confirmation arrives."""
    zk, clock = FakeZooKeeper(), Clock()
    lease, ownership, lost = _member(zk, clock, "w1")
    resumed: list[bool] = []
    lease.on_resume = lambda: resumed.append(True)
    _renew(lease, clock, clock.seconds())
    token = ownership.acquire("s0")
    clock.advance(LEASE)
    lease.lapsed = True  # what the watchdog thread decides at the lease's end (it waits on real time)

    sent = clock.seconds()
    clock.advance(LEASE + 0.5)  # confirmed, but after send time + LEASE: too late to send on
    _renew(lease, clock, sent)
    assert lease.lapsed and not lease.valid() and resumed == []

    _renew(lease, clock, clock.seconds() - 0.5)  # confirmed in time
    assert not lease.lapsed and lease.valid() and resumed == [True]
    assert ownership.fence("s0") == token and lost == []  # the same shard, the same epoch


def test_a_renewal_that_finds_the_member_znode_in_another_session_loses_the_lease() -> None:
    """The member znode gone or owned by another session (this one expired, a new process joined): lost for good,
    whatever the clock says; nothing more is sent."""
    zk, clock = FakeZooKeeper(), Clock()
    lease, ownership, _ = _member(zk, clock, "w1")
    _renew(lease, clock, clock.seconds())
    ownership.acquire("s0")
    zk.nodes[lease.path].owner = 99  # another session's znode now
    _renew(lease, clock, clock.seconds())
    assert lease.lost == "znode" and not lease.valid() and not ownership.may_send("s0")
    _renew(lease, clock, clock.seconds())
    assert not lease.valid()  # no way back


def test_one_owner_per_shard_and_each_owner_a_new_fencing_token() -> None:
    """Taking a shard creates its ephemeral `owner` and bumps `epoch` in one multi-operation, so while w1 owns it
    w2 cannot take it; released (owner deleted, epoch marked and bumped again), w2 takes it with a newer token,
    and w1's old token no longer fences anything."""
    zk, clock = FakeZooKeeper(), Clock()
    lease1, w1, _ = _member(zk, clock, "w1")
    lease2, w2, _ = _member(zk.as_session(2), clock, "w2")
    for lease in (lease1, lease2):
        _renew(lease, clock, clock.seconds())
    owner, epoch = w1.paths("s0")

    first = w1.acquire("s0")
    assert first == zk.version(epoch) and w1.owner_of("s0") == "w1"
    assert zk.nodes[owner].owner == 1 and json.loads(zk.data(owner) or b"")["worker"] == "w1"
    assert w2.acquire("s0") is None and "s0" not in w2.tokens  # owned: refused as a whole
    assert zk.version(epoch) == first  # (the refused multi-operation bumped nothing)

    w1.release("s0", "moved")
    assert w1.owner_of("s0") is None and w1.fence("s0") is None
    assert json.loads(zk.data(epoch) or b"")["released"] == "moved"
    second = w2.acquire("s0")
    assert second is not None and second > first + 1 and w2.fence("s0") == second


def test_a_release_leaves_an_owner_znode_of_another_session_alone() -> None:
    """w1's session expired and w2 took the shard meanwhile: w1's late release must not delete w2's owner znode."""
    zk, clock = FakeZooKeeper(), Clock()
    lease1, w1, _ = _member(zk, clock, "w1")
    _renew(lease1, clock, clock.seconds())
    w1.acquire("s0")
    owner, _ = w1.paths("s0")
    zk.nodes[owner].owner = 2  # (as if ZooKeeper had expired w1 and w2 had taken it)
    w1.release("s0", "moved")
    assert zk.data(owner) is not None and zk.nodes[owner].owner == 2


# -- the controller ----------------------------------------------------------------------------------------------


class Pool:
    """Region east of examples/sharded.toml on a fake ensemble, with a controller that plans when told to."""

    def __init__(self, settings: placement.Settings | None = None) -> None:
        self.topology = router_config.load(SHARDED)
        self.zk, self.clock = FakeZooKeeper(), Clock()
        self.clock.advance(1000.0)
        self.base = pool_path(self.topology.zookeeper.root, "east")  # type: ignore[union-attr]
        for sub in ("workers", "drain", "move", "shards"):
            self.zk.put(f"{self.base}/{sub}")
        region = self.topology.region("east")
        self.worker: Any = SimpleNamespace(
            client=self.zk,
            base=self.base,
            name="east-1",
            region=region,
            topology=self.topology,
            zk=self.topology.zookeeper,
            call_timeout=1.0,
            metrics=PoolMetrics(CollectorRegistry()),
        )
        self.controller = Controller(
            self.worker, settings, clock=self.clock.seconds, wall=lambda: 1_700_000_000 + self.clock.seconds()
        )
        self.controller.watch_pool()  # what taking the lead does, without the election

    def join(self, name: str, pid: int, healthy: bool = True, **extra: Any) -> None:
        doc = {"name": name, "region": "east", "pid": pid, "shards": [], "loads": {}, "healthy": healthy, **extra}
        self.zk.put(f"{self.base}/workers/{name}", json.dumps(doc).encode(), ephemeral_of=pid)

    def assignment(self) -> dict[str, Any]:
        return json.loads(self.zk.data(f"{self.base}/assignment") or b"{}")

    def held(self, worker: str) -> list[str]:
        return sorted(s for s, w in self.assignment().get("assignment", {}).items() if w == worker)


SHARDS = ["users-0", "users-1", "users-2", "users-3"]


def test_the_controller_places_every_shard_once_and_writes_nothing_while_nothing_changes() -> None:
    pool = Pool()
    pool.join("east-1", 101)
    pool.join("east-2", 102)
    plan = pool.controller.plan_once()
    assert plan is not None and {m.reason for m in plan.moves} == {placement.UNASSIGNED}
    assert sorted(pool.held("east-1") + pool.held("east-2")) == SHARDS
    assert len(pool.held("east-1")) == len(pool.held("east-2")) == 2  # alike shards: two each
    doc = pool.assignment()
    assert doc["pids"] == {"east-1": 101, "east-2": 102} and doc["by"] == "east-1"
    version = pool.zk.version(f"{pool.base}/assignment")
    pool.clock.advance(1.0)
    assert pool.controller.plan_once() is not None
    assert pool.zk.version(f"{pool.base}/assignment") == version  # a plan a second writes nothing unchanged


def test_a_drain_request_moves_every_shard_off_its_worker() -> None:
    pool = Pool()
    pool.join("east-1", 101)
    pool.join("east-2", 102)
    pool.controller.plan_once()
    pool.zk.put(f"{pool.base}/drain/east-1", b"{}")
    pool.clock.advance(1.0)
    plan = pool.controller.plan_once()
    assert plan is not None and {m.reason for m in plan.moves} == {placement.DRAIN}
    assert pool.held("east-1") == [] and pool.held("east-2") == SHARDS
    assert pool.assignment()["moves"] == 4 + 2  # the first placements, then east-1's two


def test_a_plan_on_an_assignment_changed_meanwhile_is_refused_and_made_again() -> None:
    """Compare-and-set on the assignment's version: a plan made from an older assignment (another controller's
    write whose watch has not fired here yet) writes nothing; the next plan starts from the newer one."""
    pool = Pool()
    pool.join("east-1", 101)
    pool.join("east-2", 102)
    pool.controller.plan_once()
    pool.controller.plan_once()  # (reads back its own write: its view now waits for a watch to fire)
    other = {**pool.assignment(), "assignment": dict.fromkeys(SHARDS, "east-2"), "by": "east-2"}
    pool.zk.put(f"{pool.base}/assignment", json.dumps(other).encode(), fire=False)
    pool.zk.put(f"{pool.base}/drain/east-2", b"{}")  # something to plan: every shard off east-2
    assert pool.controller.plan_once() is None
    assert pool.assignment()["by"] == "east-2"  # the other write stands
    plan = pool.controller.plan_once()  # (the refused write marked the view stale: read afresh)
    assert plan is not None and pool.held("east-1") == SHARDS and pool.assignment()["by"] == "east-1"


def test_a_worker_is_settled_after_handback_after_s_of_health_and_a_restart_starts_it_over() -> None:
    """Only a member healthy for `handback_after_s` (10 s in the example) is given a shard back (`_settled`); a new
    process of it (another pid) or a lost copy starts the count again."""
    pool = Pool()
    wait = pool.topology.zookeeper.handback_after_s  # type: ignore[union-attr]
    members = {
        "east-1": {"pid": 101, "healthy": True},
        "east-2": {"pid": 102, "healthy": True},
    }
    assert pool.controller._settled(members) == set()
    pool.clock.advance(wait - 0.001)
    assert pool.controller._settled(members) == set()
    pool.clock.advance(0.001)
    assert pool.controller._settled(members) == {"east-1", "east-2"}
    members["east-1"]["pid"] = 201  # restarted
    members["east-2"]["healthy"] = False  # its copy stopped answering
    assert pool.controller._settled(members) == set()
    members["east-2"]["healthy"] = True
    pool.clock.advance(wait / 2)
    assert pool.controller._settled(members) == set()
    pool.clock.advance(wait / 2)
    assert pool.controller._settled(members) == {"east-1"}  # east-2 counts from when it was healthy again
    pool.clock.advance(wait / 2)
    assert pool.controller._settled(members) == {"east-1", "east-2"}


def test_a_restarted_worker_does_not_win_back_the_shards_its_crash_orphaned() -> None:
    """Issue 37: a worker killed and restarted within a second (another pid, same name) finds its shards
    assigned elsewhere; it takes none until it has settled."""
    pool = Pool()
    pool.join("east-1", 101)
    pool.join("east-2", 102)
    pool.controller.plan_once()
    lost = pool.held("east-1")
    assert lost
    pool.join("east-1", 201)  # (the fake's put overwrites the member znode: a new process, a new pid)
    pool.clock.advance(1.0)
    plan = pool.controller.plan_once()
    assert plan is not None and "east-1" in pool.controller.restarted
    assert pool.held("east-1") == [] and pool.held("east-2") == SHARDS
    assert pool.assignment()["pids"] == {"east-2": 102}


def test_a_worker_whose_copy_does_not_answer_is_given_nothing() -> None:
    pool = Pool()
    pool.join("east-1", 101, healthy=False)
    pool.join("east-2", 102)
    pool.controller.plan_once()
    assert pool.held("east-1") == [] and pool.held("east-2") == SHARDS
