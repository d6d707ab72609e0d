"""squeal's HA foundation against a real 3-server ZooKeeper ensemble (the harness's, Debian's ZooKeeper 3.8):
the datamarker store (squeal/zkstore.py) and the leader election with its fencing (squeal/ha.py).

Time-outs below only catch hangs; measured times are printed (run with -s to see them).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.exceptions import NoNodeError
from squeal_helpers import wait_until
from test_ha_support import SESSION_TIMEOUT, Link, MarkerWatch, client, ensemble, expire_session, hosts, unique_root

from ops.harness import ZooKeeper
from squeal.ha import LEADER, STANDBY, ElectionMetrics, Elector
from squeal.zkstore import FencedError, ZooKeeperDatamarkerStore, ZooKeeperUnavailable, region_path


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    with ensemble(tmp_path_factory.mktemp("zk-ensemble")) as members:
        yield members


@pytest.fixture
def clients(zk) -> Iterator:
    """`clients(connect=None)`: a started kazoo client on the ensemble (or `connect`), closed afterwards."""
    made = []

    def make(connect: str | None = None, timeout: float = SESSION_TIMEOUT):
        c = client(connect or hosts(zk), timeout)
        made.append(c)
        return c

    yield make
    for c in made:
        try:
            c.stop()
            c.close()
        except Exception:  # noqa: BLE001
            pass


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
    store = ZooKeeperDatamarkerStore(clients(), root, "east", owner="east-1")
    store.check_writable()
    assert store.load("c0") is None
    store.save("c0", "0-1-5")
    store.save("c0", "0-1-9,1-3-2")
    assert store.load("c0") == "0-1-9,1-3-2"
    assert store.load("regional") is None
    store.save("regional", "0-1-7")
    # Another instance (another session) reads the same positions: they outlive the writer.
    other = ZooKeeperDatamarkerStore(clients(), root, "east")
    assert other.positions() == {"c0": "0-1-9,1-3-2", "regional": "0-1-7"}
    assert other.load("c0") == "0-1-9,1-3-2"
    data, stat = other.client.get(f"{root}/regions/east/markers/c0")
    assert json.loads(data)["by"] == "east-1" and stat.version == 1
    # Regions are apart.
    assert ZooKeeperDatamarkerStore(other.client, root, "west").positions() == {}
    # A marker that does not parse is an error naming the znode, never "now".
    other.client.set(f"{root}/regions/east/markers/regional", b'{"position": "0-1"}')
    with pytest.raises(ValueError, match=f"{root}/regions/east/markers/regional"):
        other.load("regional")


def test_the_marker_watch_fails_on_its_own_errors_and_never_passes_on_nothing(clients) -> None:
    """The HA tests' fencing observer (test_ha_support.MarkerWatch): "no marker went back" must rest on markers
    it saw move, and an error of its own fails the test instead of leaving it blind."""
    root = unique_root()
    base = region_path(root, "east")
    blind = MarkerWatch(clients(), base).start()
    blind.stop()
    with pytest.raises(AssertionError, match="saw no marker"):
        blind.check_one_leader_at_a_time()

    watch = MarkerWatch(clients(), base).start()
    store = ZooKeeperDatamarkerStore(clients(), root, "east", owner="east-1")
    store.check_writable()
    assert store.load("c0") is None
    store.save("c0", "0-1-5")
    wait_until(lambda: len(watch.markers.get("c0", [])) == 1, 10, "the watch to see the first marker")
    with pytest.raises(AssertionError, match="never saw move"):
        watch.check_markers_moved()
    store.save("c0", "0-1-9")
    wait_until(lambda: len(watch.markers.get("c0", [])) == 2, 10, "the watch to see the marker move")
    watch.check_markers_moved()
    store.client.set(f"{base}/markers/c0", b"not json")  # the watch cannot read it: that is the test's failure
    wait_until(lambda: watch.error is not None, 10, "the watch to fail")
    with pytest.raises(AssertionError, match="the marker watch failed"):
        watch.stop()


def test_a_stale_writer_cannot_overwrite_a_newer_marker(clients) -> None:
    root = unique_root()
    a = ZooKeeperDatamarkerStore(clients(), root, "east", owner="a")
    b = ZooKeeperDatamarkerStore(clients(), root, "east", owner="b")
    a.ensure_paths()
    assert a.load("c0") is None and b.load("c0") is None
    a.save("c0", "0-1-10")
    with pytest.raises(FencedError, match="created by someone else"):
        b.save("c0", "0-1-3")  # b found no marker: its create fails now that a wrote one
    a.save("c0", "0-1-20")
    assert b.load("c0") == "0-1-20"
    b.save("c0", "0-1-25")  # b read the newest marker: its write goes through ...
    with pytest.raises(FencedError, match="changed since this daemon read it"):
        a.save("c0", "0-1-21")  # ... and a, which has not read it since, can no longer move it
    assert b.load("c0") == "0-1-25"
    with pytest.raises(FencedError, match="before it was read"):
        ZooKeeperDatamarkerStore(a.client, root, "east").save("c0", "0-1-1")


def test_marker_writes_are_fenced_by_the_election_epoch(clients) -> None:
    """A leader's store checks the epoch version it won with: once another leader bumps it, nothing it writes
    (markers, replay requests taken) goes through, even with a marker version that is still current."""
    root = unique_root()
    zk = clients()
    epoch = f"{root}/regions/east/epoch"
    zk.create(epoch, b'{"epoch": 1}', makepath=True)
    token = {"value": zk.exists(epoch).version}
    old = ZooKeeperDatamarkerStore(zk, root, "east", fence=lambda: token["value"])
    old.ensure_paths()
    assert old.load("c0") is None
    old.save("c0", "0-1-4")
    old.request_replay("c1", "0-1-2")
    zk.set(epoch, b'{"epoch": 2}')  # another leader won
    with pytest.raises(FencedError, match="another leader has been elected"):
        old.save("c0", "0-1-5")
    with pytest.raises(FencedError, match="another leader has been elected"):
        old.take_replay_requests()
    assert ZooKeeperDatamarkerStore(zk, root, "east").positions() == {"c0": "0-1-4"}
    assert zk.exists(f"{root}/regions/east/replay/c1") is not None  # the request waits for the new leader
    token["value"] = None  # not the leader at all: refused before anything is sent
    with pytest.raises(FencedError, match="not the leader"):
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
    store = ZooKeeperDatamarkerStore(clients(connect), root, "east", timeout=1.0)
    store.ensure_paths()
    assert store.load("c0") is None
    store.save("c0", "0-1-1")
    for link in cut_links:
        link.cut()
    t0 = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match="write"):
        store.save("c0", "0-1-2")
    failed_after = time.monotonic() - t0
    assert failed_after < 10, failed_after  # (a hang detector, not a speed requirement)
    time.sleep(SESSION_TIMEOUT * 1.5)  # the session expires on the servers
    observer = ZooKeeperDatamarkerStore(clients(), root, "east")
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


# -- the election ----------------------------------------------------------------------------------------------------


class Candidate:
    """An Elector with a timeline of its callbacks, and a thread sampling `may_send()` (when it last said yes)."""

    def __init__(
        self, zk_client, root: str, name: str, rank: int, session_timeout: float = SESSION_TIMEOUT, **kwargs
    ) -> None:
        self.events: list[tuple[float, str, object]] = []
        self.last_send_ok = 0.0
        self.elector = Elector(
            zk_client,
            root,
            "east",
            name,
            rank,
            session_timeout=session_timeout,
            on_elected=lambda token: self.events.append((time.monotonic(), "elected", token)),
            on_deposed=lambda why: self.events.append((time.monotonic(), "deposed", why)),
            on_pause=lambda paused: self.events.append((time.monotonic(), "paused", paused)),
            metrics=ElectionMetrics(),
            **kwargs,
        )
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> Candidate:
        self.elector.start()
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            if self.elector.may_send():
                self.last_send_ok = time.monotonic()
            time.sleep(0.002)

    def when(self, kind: str) -> list[float]:
        return [t for t, k, _ in self.events if k == kind]

    def metric(self, name: str, **labels) -> float:
        return self.elector.metrics.registry.get_sample_value(name, labels or None) or 0.0

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        self.elector.stop(release=release)


@pytest.fixture
def candidates() -> Iterator:
    made: list[Candidate] = []

    def make(*args, **kwargs) -> Candidate:
        c = Candidate(*args, **kwargs)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        try:
            c.stop()
        except Exception:  # noqa: BLE001
            pass


def test_one_leader_then_the_other_leads_when_its_session_dies(zk, clients, candidates) -> None:
    root = unique_root()
    a = candidates(clients(), root, "east-1", 0)
    wait_until(lambda: a.elector.is_leader, 15, "east-1 to lead")
    b = candidates(clients(), root, "east-2", 1)
    wait_until(lambda: b.elector.leader_name == "east-1", 10, "east-2 to see east-1 lead")
    assert b.elector.state == STANDBY and not b.elector.may_send() and b.elector.fence_token() is None
    token_a = a.elector.fence_token()
    assert token_a is not None and a.elector.may_send()
    store_a = ZooKeeperDatamarkerStore(a.elector.client, root, "east", fence=a.elector.fence_token)
    store_a.ensure_paths()
    store_a.load("c0")
    store_a.save("c0", "0-1-10")

    t_kill = time.monotonic()
    expire_session(a.elector.client, hosts(zk))  # ZooKeeper ends east-1's session
    wait_until(lambda: b.elector.is_leader, 15, "east-2 to take over")
    took = b.when("elected")[0] - t_kill
    wait_until(lambda: a.when("deposed"), 10, "east-1 to learn it was deposed")
    assert a.events[-1][2] == "session" and not a.elector.may_send()
    token_b = b.elector.fence_token()
    assert token_b is not None and token_b > token_a
    with pytest.raises(FencedError):
        store_a.save("c0", "0-1-11")  # east-1's store is fenced for good
    store_b = ZooKeeperDatamarkerStore(b.elector.client, root, "east", fence=b.elector.fence_token)
    assert store_b.load("c0") == "0-1-10"
    store_b.save("c0", "0-1-12")
    # east-1 rejoins as a standby (it has a new session) and does not take the lead back by itself.
    wait_until(lambda: a.elector.client.connected and a.elector.leader_name == "east-2", 15, "east-1 to stand by")
    time.sleep(SESSION_TIMEOUT)
    assert a.elector.state == STANDBY and b.elector.is_leader
    assert b.metric("squeal_ha_elections_total") == 1 and b.metric("squeal_ha_takeovers_total") == 1
    assert a.metric("squeal_ha_depositions_total", reason="session") == 1
    assert b.metric("squeal_ha_leaderless_seconds_count") == 1
    print(f"\nsession ended -> the standby leads: {took * 1000:.0f} ms")

    # A graceful stop releases the leadership at once: east-1 leads without waiting for a session timeout.
    t_stop = time.monotonic()
    b.stop(release=True)
    wait_until(lambda: a.elector.is_leader, 10, "east-1 to lead again")
    print(f"leader stopped (released) -> the standby leads: {(a.when('elected')[-1] - t_stop) * 1000:.0f} ms")


def test_a_partitioned_leader_stops_before_the_other_leads_and_rejoins_as_standby(
    zk, clients, links, candidates
) -> None:
    root = unique_root()
    connect, cut_links = links()
    a = candidates(clients(connect), root, "east-1", 0)
    wait_until(lambda: a.elector.is_leader, 15, "east-1 to lead")
    b = candidates(clients(), root, "east-2", 1)
    wait_until(lambda: b.elector.leader_name == "east-1", 10, "east-2 to see east-1 lead")
    store_a = ZooKeeperDatamarkerStore(a.elector.client, root, "east", fence=a.elector.fence_token, timeout=0.5)
    store_a.ensure_paths()
    store_a.load("c0")
    store_a.save("c0", "0-1-1")

    t_cut = time.monotonic()
    for link in cut_links:
        link.cut()
    wait_until(lambda: b.elector.is_leader, 20, "east-2 to take over")
    t_b = b.when("elected")[0]
    wait_until(lambda: a.when("deposed"), 10, "east-1 deposed")
    stopped = a.last_send_ok  # the last instant east-1 would still have sent anything
    # East-1 stopped (paused at SUSPENDED, deposed when its lease ran out) before east-2 was elected.
    assert stopped < t_b, (stopped - t_cut, t_b - t_cut)
    # Deposed by its lease (1.2 s after its last answer) or, had kazoo noticed first (2/3 of the session
    # timeout without an answer), paused at SUSPENDED before that.
    first_stop = min(a.when("paused")[:1] + a.when("deposed")[:1])
    assert first_stop < t_b
    assert a.events[[k for _, k, _ in a.events].index("deposed")][2] in ("lease", "session")
    with pytest.raises((FencedError, ZooKeeperUnavailable)):
        store_a.save("c0", "0-1-2")
    print(
        f"\ncut at 0: east-1 last could send at "
        f"{(stopped - t_cut) * 1000:.0f} ms, deposed at {(a.when('deposed')[0] - t_cut) * 1000:.0f} ms; east-2 "
        f"elected at {(t_b - t_cut) * 1000:.0f} ms (session timeout {SESSION_TIMEOUT * 1000:.0f} ms): "
        f"{(t_b - stopped) * 1000:.0f} ms with nobody sending"
    )

    for link in cut_links:
        link.heal()
    wait_until(
        lambda: a.elector.client.connected and a.elector.leader_name == "east-2", 20, "east-1 to rejoin as standby"
    )
    assert a.elector.state == STANDBY and a.elector.fence_token() is None
    store_a.load("c0")
    with pytest.raises(FencedError):
        store_a.save("c0", "0-1-0")  # even with the newest marker version, the epoch says no
    assert ZooKeeperDatamarkerStore(b.elector.client, root, "east").positions() == {"c0": "0-1-1"}


def test_a_short_suspension_within_the_lease_changes_nothing(zk, clients, candidates) -> None:
    """One of the three servers dies under the leader: kazoo reconnects to another within the lease;
    the same leader goes on (same term, same token)."""
    root = unique_root()
    a = candidates(clients(), root, "east-1", 0)
    wait_until(lambda: a.elector.is_leader, 15, "east-1 to lead")
    b = candidates(clients(), root, "east-2", 1)
    wait_until(lambda: b.elector.leader_name == "east-1", 10, "east-2 to see east-1 lead")
    token = a.elector.fence_token()
    connected_to = a.elector.client._connection._socket.getpeername()[1]
    server = next(m for m in zk if m.port == connected_to)
    server.kill()
    try:
        wait_until(
            lambda: a.elector.client.connected
            and a.elector.client._connection._socket is not None
            and a.elector.client._connection._socket.getpeername()[1] != connected_to,
            15,
            "east-1 to reconnect to another server",
            interval=0.01,
        )
        time.sleep(SESSION_TIMEOUT)
        assert a.elector.is_leader and a.elector.term == 1 and a.elector.fence_token() == token
        assert not a.when("deposed") and b.elector.state == STANDBY
        store = ZooKeeperDatamarkerStore(a.elector.client, root, "east", fence=a.elector.fence_token)
        store.ensure_paths()
        store.load("c0")
        store.save("c0", "0-1-1")  # two of three servers: a quorum, writes go on
    finally:
        server.start()
        ZooKeeper.wait_serving(zk)


def test_preference_unhealthy_candidates_and_hand_back(zk, clients, candidates) -> None:
    root = unique_root()
    b = candidates(clients(), root, "east-2", 1, handback_after=1.0)
    b.elector.on_handback = lambda: b.elector.resign()
    wait_until(lambda: b.elector.is_leader, 15, "east-2 to lead alone")
    # An unhealthy preferred candidate neither leads nor gets the region handed back.
    a = candidates(clients(), root, "east-1", 0, healthy=False)
    wait_until(lambda: a.elector.leader_name == "east-2", 10, "east-1 to see east-2 lead")
    time.sleep(2.0)
    assert b.elector.is_leader and b.elector.term == 1 and a.elector.state == STANDBY
    # Healthy again: after handback_after, east-2 resigns and east-1 (rank 0) leads.
    t0 = time.monotonic()
    a.elector.set_healthy(True)
    wait_until(lambda: a.elector.is_leader, 15, "east-1 to lead after the hand-back")
    # resign deletes the leader znode before it tells on_deposed: east-1 may lead before east-2 records it
    wait_until(lambda: b.when("deposed"), 5, "east-2's deposition recorded")
    assert b.events[-1][2] == "handback"
    gap = a.when("elected")[0] - b.when("deposed")[0]
    time.sleep(1.0)
    assert b.elector.state == STANDBY and a.elector.is_leader  # east-2 does not grab it back
    assert a.metric("squeal_ha_takeovers_total") == 1
    print(
        f"\nhealthy again -> handed back after {(a.when('elected')[0] - t0) * 1000:.0f} ms "
        f"(handback_after 1000 ms); resign -> new leader {gap * 1000:.0f} ms"
    )


def test_a_rejoining_preferred_instance_stands_by_and_gets_the_region_back_only_by_hand_back(
    zk, clients, candidates
) -> None:
    """The race behind a flaky CI run: a preferred (rank 0) instance whose session expired reconnects and
    republishes its candidate before the standby acts on the vacancy; the standby used to defer to it, so the
    deposed instance won straight back. Here the vacancy is made while both candidates are published: an
    outside session holds the leader znode until then."""
    root = unique_root()
    base = region_path(root, "east")
    hold = clients()
    hold.create(f"{base}/epoch", json.dumps({"epoch": 0}).encode(), makepath=True)
    hold.create(f"{base}/leader", json.dumps({"name": "test-hold", "epoch": 0}).encode(), ephemeral=True)
    a = candidates(clients(), root, "east-1", 0, rejoining=True, handback_after=1.5)  # it replaced a deposed one
    b = candidates(clients(), root, "east-2", 1, handback_after=1.0)
    b.elector.on_handback = lambda: b.elector.resign()
    for c in (a, b):
        wait_until(lambda c=c: c.elector.leader_name == "test-hold", 10, f"{c.elector.name} to stand by")
    wait_until(lambda: len(hold.get_children(f"{base}/candidates")) == 2, 10, "both candidates published")
    data, _ = hold.get(f"{base}/candidates/east-1")
    assert json.loads(data)["rejoining"] is True
    t_free = time.monotonic()
    hold.delete(f"{base}/leader")
    wait_until(lambda: a.elector.is_leader or b.elector.is_leader, 10, "a leader")
    assert b.elector.is_leader and a.elector.state == STANDBY, "the rejoining instance must not win the vacancy"
    # Once back for handback_after, east-1 is an ordinary preferred candidate: east-2 hands the region back.
    wait_until(lambda: a.elector.is_leader, 15, "east-1 to lead after the hand-back")
    assert b.events[-1][2] == "handback" and not b.elector.is_leader
    waited = a.when("elected")[0] - t_free
    assert waited >= 1.5  # not before its rejoining window ended
    data, _ = hold.get(f"{base}/candidates/east-1")
    assert json.loads(data)["rejoining"] is False
    print(f"\nrejoining instance: the standby led; handed back {waited * 1000:.0f} ms after the vacancy")


def test_simultaneous_candidates_elect_exactly_one(zk, clients, candidates) -> None:
    root = unique_root()
    many = [candidates(clients(), root, f"east-{i}", i, handback_after=0.5) for i in range(4)]
    for c in many:
        c.elector.on_handback = c.elector.resign
    wait_until(lambda: any(c.elector.is_leader for c in many), 15, "a leader")
    # Never two leaders; and, whoever registered first, the preferred one leads in the end (a candidate that
    # started before east-0 had registered may win first and then hand the region back).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leading = [c.elector.name for c in many if c.elector.may_send()]
        assert len(leading) <= 1, leading
        if leading == ["east-0"] and all(c.elector.leader_name == "east-0" for c in many):
            break
        time.sleep(0.005)
    assert [c.elector.name for c in many if c.elector.is_leader] == ["east-0"]
    assert {c.elector.snapshot()["state"] for c in many} == {LEADER, STANDBY}


def candidate_doc(zk_client, base: str, name: str) -> tuple[dict, int] | None:
    """The candidate znode `name` as published (its JSON, its owner session), None while there is none."""
    try:
        data, stat = zk_client.get(f"{base}/candidates/{name}")
    except NoNodeError:
        return None
    return json.loads(data), stat.ephemeralOwner


def published_by(zk_client, base: str, c: Candidate) -> bool:
    """Whether `c` (its own session, not an earlier one of the same instance) has published its candidate."""
    doc = candidate_doc(zk_client, base, c.elector.name)
    return doc is not None and doc[1] == c.elector.client.client_id[0]


def test_an_instance_restarted_while_its_old_session_holds_the_leader_znode_rejoins_whoever_restarted_it(
    zk, clients, candidates
) -> None:
    """Issue 27, item 2: the race of a supervisor restarting a killed preferred leader (1.5 s later, within its
    session timeout) and the standby deferring to the restarted process, which then won the vacancy its own crash
    made. The new process is a plain one (no `rejoining=True`, no SQUEAL_HA_REJOINED): what makes it rejoin is
    ZooKeeper's record of the last term. Deterministic: the restarted instance's candidate is published before the
    old session expires (the test removes the old session's candidate znode, as if the restart had won the race)."""
    root = unique_root()
    base = region_path(root, "east")
    hold = clients()
    old = candidates(clients(), root, "east-1", 0)
    wait_until(lambda: old.elector.is_leader, 15, "east-1 to lead")
    b = candidates(clients(), root, "east-2", 1, handback_after=1.0)
    b.elector.on_handback = lambda: b.elector.resign()
    wait_until(lambda: b.elector.leader_name == "east-1", 10, "east-2 to see east-1 lead")
    epoch_before = json.loads(hold.get(f"{base}/epoch")[0])

    # kill -9: the process stops (here: its elector's threads), its session lives on until ZooKeeper expires it.
    old.stop(release=False)
    hold.delete(f"{base}/candidates/east-1")  # (the restart wins the race: its candidate is out before the vacancy)
    restarted = candidates(clients(), root, "east-1", 0, handback_after=1.5)  # a plain process, no rejoin flag
    wait_until(lambda: published_by(hold, base, restarted), 10, "the restarted east-1 to publish its candidate")
    doc, _ = candidate_doc(hold, base, "east-1")
    assert doc["rejoining"] is True, doc
    assert restarted.elector.snapshot()["rejoining"] is True
    wait_until(
        lambda: b.elector.leader_name == "east-1" and restarted.elector.leader_name == "east-1",
        10,
        "both to see the old term's leader znode",
    )

    t_vacant = time.monotonic()
    expire_session(old.elector.client, hosts(zk))  # the old process's session ends: the vacancy its crash made
    wait_until(lambda: restarted.elector.is_leader or b.elector.is_leader, 10, "a leader")
    assert b.elector.is_leader and restarted.elector.state == STANDBY, "the restarted east-1 won its own vacancy"
    assert json.loads(hold.get(f"{base}/epoch")[0]) == {"epoch": epoch_before["epoch"] + 1, "leader": "east-2"}
    # It is an ordinary preferred candidate again handback_after (1.5 s) after the old term's znode went: the
    # region comes back to it by hand-back.
    wait_until(lambda: restarted.elector.is_leader, 15, "east-1 to lead after the hand-back")
    assert b.events[-1][2] == "handback"
    waited = restarted.when("elected")[0] - t_vacant
    assert waited >= 1.5
    assert not restarted.elector.snapshot()["rejoining"]
    print(f"\nrestarted within the session: the standby led; handed back {waited * 1000:.0f} ms after the vacancy")


def test_an_instance_restarted_after_its_session_expired_rejoins_until_someone_else_led(
    zk, clients, candidates
) -> None:
    """The same, restarted by anyone after its old session expired but before another instance filled the
    vacancy (the standby was slow to act): the `epoch` record still names it and was never marked released."""
    root = unique_root()
    base = region_path(root, "east")
    hold = clients()
    old = candidates(clients(), root, "east-1", 0)
    wait_until(lambda: old.elector.is_leader, 15, "east-1 to lead alone")
    old.stop(release=False)
    expire_session(old.elector.client, hosts(zk))
    wait_until(lambda: hold.exists(f"{base}/leader") is None, 10, "the old session's leader znode to go")
    # Nobody has taken the vacancy yet: an outside session holds the leader znode while both candidates start.
    hold.create(f"{base}/leader", json.dumps({"name": "test-hold", "epoch": 0}).encode(), ephemeral=True)
    restarted = candidates(clients(), root, "east-1", 0, handback_after=3.0)  # a plain process, no rejoin flag
    b = candidates(clients(), root, "east-2", 1, handback_after=1.0)
    b.elector.on_handback = lambda: b.elector.resign()
    wait_until(
        lambda: published_by(hold, base, restarted) and published_by(hold, base, b), 10, "both candidates published"
    )
    assert candidate_doc(hold, base, "east-1")[0]["rejoining"] is True
    hold.delete(f"{base}/leader")
    wait_until(lambda: restarted.elector.is_leader or b.elector.is_leader, 10, "a leader")
    assert b.elector.is_leader and restarted.elector.state == STANDBY, "the restarted east-1 won its own vacancy"
    wait_until(lambda: restarted.elector.is_leader, 15, "east-1 to lead after the hand-back")
    assert b.events[-1][2] == "handback"


def test_an_instance_that_gave_its_term_up_is_not_rejoining_when_it_restarts(zk, clients, candidates) -> None:
    """A term given up (a stop, a hand-back) is marked released in the `epoch` record, in the multi-operation that
    deletes the leader znode: the instance's next process is an ordinary candidate and the standby defers to it."""
    root = unique_root()
    base = region_path(root, "east")
    hold = clients()
    old = candidates(clients(), root, "east-1", 0)
    wait_until(lambda: old.elector.is_leader, 15, "east-1 to lead alone")
    token = old.elector.fence_token()
    old.stop(release=True)
    data, stat = hold.get(f"{base}/epoch")
    assert json.loads(data)["released"] == "stopped" and json.loads(data)["leader"] == "east-1"
    assert stat.version == token + 1  # the release moved the fencing token on: the old term can write nothing
    hold.create(f"{base}/leader", json.dumps({"name": "test-hold", "epoch": 0}).encode(), ephemeral=True)
    restarted = candidates(clients(), root, "east-1", 0)
    b = candidates(clients(), root, "east-2", 1)
    wait_until(
        lambda: published_by(hold, base, restarted) and published_by(hold, base, b), 10, "both candidates published"
    )
    assert candidate_doc(hold, base, "east-1")[0]["rejoining"] is False
    hold.delete(f"{base}/leader")
    wait_until(lambda: restarted.elector.is_leader, 10, "east-1 (preferred, not rejoining) to lead")
    assert b.elector.state == STANDBY and not b.when("elected")


def test_a_lease_that_lapsed_waiting_for_a_slow_answer_resumes_in_the_same_term(zk, clients, links, candidates) -> None:
    """Issue 27, item 3: ZooKeeper's answers to the leader stalled for 2 s (every byte between it and the ensemble
    held, then delivered: a server starved of CPU), longer than its lease (0.6 x 3 s). The lease lapses - sending
    pauses at once - but the session lives, so its leader znode is still its own: the first round trip that gets
    through resumes the same term. No deposition, no election, the epoch record untouched. (Before: deposed by the
    lease, and the region waited for a new election.)"""
    root = unique_root()
    base = region_path(root, "east")
    observer = clients()
    connect, a_links = links()
    a = candidates(clients(connect, timeout=3.0), root, "east-1", 0, session_timeout=3.0)
    wait_until(lambda: a.elector.is_leader, 15, "east-1 to lead")
    b = candidates(clients(), root, "east-2", 1)
    wait_until(lambda: b.elector.leader_name == "east-1", 10, "east-2 to see east-1 lead")
    token = a.elector.fence_token()
    epoch_before = observer.get(f"{base}/epoch")

    t_stall = time.monotonic()
    for link in a_links:
        link.stall()
    try:
        wait_until(lambda: not a.elector.may_send(), 10, "east-1 to stop sending")
        assert a.elector.fence_token() is None
        time.sleep(max(0.0, 2.0 - (time.monotonic() - t_stall)))  # (the fault lasts 2 s)
    finally:
        for link in a_links:
            link.unstall()
    wait_until(lambda: a.elector.may_send() or a.when("deposed"), 10, "east-1 to resume (or be deposed)")
    t_resumed = time.monotonic()
    assert not a.when("deposed"), a.events
    assert a.metric("squeal_ha_lease_lapses_total") == 1  # the lease did lapse: the path under test ran
    assert a.elector.is_leader and a.elector.term == 1 and a.elector.fence_token() == token
    assert not a.when("deposed") and a.metric("squeal_ha_lease_resumptions_total") == 1
    assert [p for _, k, p in a.events if k == "paused"][:1] == [True] and a.events[-1][1:] == ("paused", False)
    assert not b.when("elected") and b.elector.state == STANDBY
    assert observer.get(f"{base}/epoch") == epoch_before  # no election: same record, same version
    store = ZooKeeperDatamarkerStore(a.elector.client, root, "east", fence=a.elector.fence_token)
    store.ensure_paths()
    store.load("c0")
    store.save("c0", "0-1-1")  # its fencing token is still good
    lapsed_at = a.when("paused")[0]
    print(
        f"\nanswers stalled 2 s: east-1's lease lapsed at {(lapsed_at - t_stall) * 1000:.0f} ms, resumed at "
        f"{(t_resumed - t_stall) * 1000:.0f} ms "
        f"(same term, epoch version {epoch_before[1].version})"
    )


def test_a_lapsed_leader_whose_term_ended_meanwhile_does_not_resume(zk, clients, links, candidates) -> None:
    """The other side of item 3: what resumes a lapsed term is ZooKeeper confirming it, never the answer alone.
    While east-1's answers are stalled, its epoch moves (as a new election would move it): once answers flow,
    east-1's session and leader znode are still there, but the check of the epoch fails and it is deposed."""
    root = unique_root()
    base = region_path(root, "east")
    observer = clients()
    connect, a_links = links()
    a = candidates(clients(connect, timeout=3.0), root, "east-1", 0, session_timeout=3.0)
    wait_until(lambda: a.elector.is_leader, 15, "east-1 to lead")
    for link in a_links:
        link.stall()
    try:
        wait_until(lambda: a.metric("squeal_ha_lease_lapses_total") >= 1, 10, "east-1's lease to lapse")
        assert a.elector.snapshot()["lease"] == "lapsed" and not a.elector.may_send()
        data, stat = observer.get(f"{base}/epoch")
        observer.set(f"{base}/epoch", data, version=stat.version)  # the epoch moves on
    finally:
        for link in a_links:
            link.unstall()
    wait_until(lambda: a.when("deposed"), 10, "east-1 to be deposed")
    assert a.events[-1][2] == "znode" and not a.elector.may_send()
    assert a.metric("squeal_ha_lease_resumptions_total") == 0
    assert a.last_send_ok < a.when("deposed")[0]


def recorded_requests(c) -> list[tuple[str, str]]:
    """(request type, path) of every request client `c` sends from now on (kazoo's calls all go through `_call`)."""
    sent: list[tuple[str, str]] = []
    call = c._call

    def recording(request, async_object):
        sent.append((type(request).__name__, getattr(request, "path", "")))
        return call(request, async_object)

    c._call = recording
    return sent


def test_a_steady_election_asks_zookeeper_nothing_but_the_leaders_lease(zk, clients, candidates) -> None:
    """Nothing changes: a leader, a standby. The standby's step reads the leader znode, and the leader's step the
    candidates (for a hand-back), again only after their watches fired - before, every tick the standby sent an
    `exists` and a `get` (and left kazoo one more watch callback each time) and the leader listed and read every
    candidate. What remains is the leader's lease (an `exists` of its leader znode every tick)."""
    root = unique_root()
    base = region_path(root, "east")
    a = candidates(clients(), root, "east-1", 0)
    wait_until(lambda: a.elector.is_leader, 15, "east-1 to lead")
    b = candidates(clients(), root, "east-2", 1)
    wait_until(lambda: b.elector.leader_name == "east-1", 10, "east-2 to see east-1 lead")
    steps = {"east-1": 0, "east-2": 0}
    for c in (a, b):
        step = c.elector._step

        def counted(step=step, name=c.elector.name) -> None:
            steps[name] += 1
            step()

        c.elector._step = counted
    wait_until(lambda: min(steps.values()) >= 3, 15, "a few steps (east-1 has read east-2's candidate)")
    sent_a, sent_b = recorded_requests(a.elector.client), recorded_requests(b.elector.client)
    seen = dict(steps)
    wait_until(lambda: all(steps[n] >= seen[n] + 20 for n in steps), 30, "twenty more steps each")
    assert a.elector.is_leader and b.elector.state == STANDBY
    assert sent_b == [], f"the standby asked {len(sent_b)} times in 20 steps: {sent_b[:4]}"
    assert set(sent_a) <= {("Exists", f"{base}/leader")}, f"the leader asked more than its lease: {sent_a[:6]}"
    assert len(b.elector.client._data_watchers[f"{base}/leader"]) <= 1, "one watch callback, not one per step"
