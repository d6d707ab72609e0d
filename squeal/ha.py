"""High availability: several squeal instances per region, one leader, fenced (Wormhole's MCRD, §3.3.2).

Each instance of a region reads its own copy of the region's data (the primary, a GTID replica). Through
ZooKeeper they elect one leader, which owns every flow of the region: it reads its copy's binlog, sends
the deletes and moves the flows' datamarkers (squeal/zkstore.py). The others stand by, connected and
reading nothing. Znodes under `<root>/regions/<region>/`:

    leader             ephemeral, JSON {"name", "epoch", "since"}: who leads; it vanishes with its session
    epoch              persistent, JSON {"epoch", "leader"[, "released"]}: the record of the last term: bumped (its
                       version + 1) in the same multi-operation that creates `leader`, so its version is the
                       leader's fencing token; a leader that gives its term up (a hand-back, a stop) marks it
                       "released" in the multi-operation that deletes `leader` (which bumps the version once more)
    candidates/<name>  ephemeral, JSON {"name", "rank", "healthy"}: who could lead, for the preference

Election. A standby watches `leader`; when it vanishes (the leader resigned, or its session expired) every
healthy standby tries to create it. Preference: an instance defers for `defer` seconds to a healthy
candidate of better rank (earlier in the topology's `squeal_instances`: the one on the primary first), which
wins at once if it is alive. A leader that sees a better-ranked healthy candidate for `handback_after`
seconds hands the region back: `on_handback` (the daemon flushes and writes its markers), then `resign()`.
An instance that just lost a term (lease, session) comes back as a standby: for `handback_after` seconds it
is *rejoining* — published so, nobody defers to it and it defers to any other healthy candidate — so a
preferred instance whose session expired cannot win the vacancy its own expiry made; it gets the region
back only through the hand-back, once it has been back that long. Whether a *process* rejoins does not depend
on who started it (itself after a deposition, a supervisor, systemd, an operator): before it publishes its
candidate it reads the `epoch` record, and if that names this instance and was not marked released, its
last term was lost (killed, crashed, deposed) and it starts as rejoining — until the `leader` znode of that
term (its old session's, alive until ZooKeeper expires it) is gone, and `handback_after` seconds from then.

Fencing. A leader may act only while it holds a *lease* (`squeal.owner.SessionLease`, the same lease a pool
worker holds, here tied to the term's `leader` znode and started when the term is won): each round trip to
ZooKeeper (every `tick`, a fraction of the session timeout T) proves the server heard from this session at
the time the request was sent, so the session cannot expire before that time + T; the lease runs until that
time + `lease_fraction` x T. `may_send()` and `fence_token()` answer only within the lease and while the
connection is up (kazoo SUSPENDED pauses the leader at once; CONNECTED within the lease resumes it). A LOST
session or a `leader` znode that is no longer this session's depose the leader (`on_deposed`), which then
stands by again. Since a new leader can only be elected once the old session has expired (or the old leader
resigned), the old one has stopped before the new one starts; and its marker writes, checked against the
epoch, fail even if it was paused in the middle of one.

A lease that runs out only *lapses*: the leader stops sending (`on_pause(True)`) but keeps its term. An answer
that was merely slow (both cores busy) is no reason for a failover: as soon as a round trip succeeds again -
a multi-operation that checks the `epoch` version is still this term's token and the `leader` znode still
exists, which ZooKeeper's leader refuses for an expired session - the same term resumes (`on_pause(False)`),
no election, no new epoch. Safe by the lease argument: the session was alive when ZooKeeper checked, so its
ephemeral `leader` znode had never gone, so nobody else can have been elected (a new leader creates that znode
and bumps the epoch in one operation), so nobody else sent in between; and this leader sent nothing while
lapsed. Only when no answer comes within `resume_within` (default T) after the lapse - by then the session has
most likely expired and a standby is being elected - is the leader deposed ("lease").

Everything blocking runs on the election thread; the term's lease renews itself and has its own watchdog (a
hung ZooKeeper call must not keep a leader leading past its lease). Callbacks run on those threads (or kazoo's):
they must not block for long.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pymysql
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from twisted.internet import threads

from router_config import Topology
from squeal import gtid as g
from squeal.daemon import (
    connect_with_retry,
    source_for,
    state_dir_for,
)
from squeal.owner import (
    SessionLease,
    TakeoverError,
    connect_zookeeper,
    rejoin_as_standby,
    rejoined,
    serve_status,
    serve_while_preparing,
    startup_timeout,
    wait_for_copy,
)
from squeal.reader import check_server
from squeal.region import RegionDaemon
from squeal.zkstore import UNAVAILABLE, Watched, ZooKeeperDatamarkerStore, region_path

log = logging.getLogger(__name__)

LEADER, STANDBY = "leader", "standby"
GIVEN_UP = ("resign", "handback")  # deposition reasons of a term given up (not lost: not rejoining after it)
STATES = (LEADER, STANDBY)
STARTING = "starting"  # /healthz `state` while `prepare` waits for the copy or ZooKeeper (not a candidate yet)
GAP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 7.5, 10, 15, 30, 60, 120)


class ElectionMetrics:
    """The election's Prometheus series (one instance's view), in `registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.leader = Gauge("squeal_ha_leader", "1 while this instance leads its region (owns every flow)", registry=r)
        self.state = Gauge(
            "squeal_ha_state", "1 for this instance's HA state (leader or standby)", ["state"], registry=r
        )
        self.elections = Counter("squeal_ha_elections", "Elections this instance won", registry=r)
        self.takeovers = Counter(
            "squeal_ha_takeovers",
            "Elections this instance won after another instance had led the region (a failover or a hand-back)",
            registry=r,
        )
        self.lease_lapses = Counter(
            "squeal_ha_lease_lapses",
            "Times this leader's lease ran out waiting for an answer from ZooKeeper (sending paused, term kept)",
            registry=r,
        )
        self.lease_resumptions = Counter(
            "squeal_ha_lease_resumptions",
            "Lapsed leases whose term ZooKeeper confirmed: sending resumed in the same term, no election",
            registry=r,
        )
        self.depositions = Counter(
            "squeal_ha_depositions",
            "Times this instance stopped leading, by reason (lease, session, znode, handback, resign)",
            ["reason"],
            registry=r,
        )
        self.leaderless = Histogram(
            "squeal_ha_leaderless_seconds",
            "Times without a leader this instance saw: "
            "from the leader znode vanishing to a new leader's (a crashed leader's "
            "session timeout comes before that)",
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.leader_present = Gauge(
            "squeal_ha_leader_present", "1 while this instance sees a leader of its region in ZooKeeper", registry=r
        )
        self.zk_connected = Gauge(
            "squeal_ha_zookeeper_connected", "1 while the ZooKeeper session is connected", registry=r
        )
        # set by the daemon's HA wiring (squeal/ha.py HaInstance) and the marker store
        self.takeover_wait = Gauge(
            "squeal_ha_takeover_wait_seconds",
            "How long the last takeover waited for "
            "this instance's copy to apply the flows' datamarkers (while waiting: so far)",
            registry=r,
        )
        self.takeover_waiting = Gauge(
            "squeal_ha_takeover_waiting",
            "1 while a new leader waits for its copy to apply the datamarkers' GTIDs",
            registry=r,
        )
        self.marker_write = Histogram(
            "squeal_ha_marker_write_seconds",
            "Datamarker writes to ZooKeeper (a compare-and-set multi-operation)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        for s in STATES:
            self.state.labels(state=s).set(1 if s == STANDBY else 0)

    def set_state(self, state: str) -> None:
        self.leader.set(1 if state == LEADER else 0)
        for s in STATES:
            self.state.labels(state=s).set(1 if s == state else 0)


class Elector:
    """One instance's part in its region's leader election; see the module docstring.

    `on_elected(token)`: this instance leads from now on (`token`: the epoch version, for the marker store).
    `on_deposed(reason)`: it no longer does (lease ran out, session lost, resigned ...); called once per term.
    `on_handback()`: a better-ranked healthy candidate is back: finish up, then call `resign()`.
    `on_pause(paused)`: the ZooKeeper connection is suspended (True) / back within the lease (False).
    """

    def __init__(
        self,
        client: KazooClient,
        root: str,
        region: str,
        name: str,
        rank: int,
        *,
        session_timeout: float,
        on_elected: Callable[[int], None] = lambda token: None,
        on_deposed: Callable[[str], None] = lambda reason: None,
        on_handback: Callable[[], None] | None = None,
        on_pause: Callable[[bool], None] = lambda paused: None,
        metrics: ElectionMetrics | None = None,
        tick: float | None = None,
        lease_fraction: float = 0.6,
        defer: float = 0.5,
        handback_after: float = 2.0,
        healthy: bool = True,
        rejoining: bool = False,
        resume_within: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < lease_fraction < 1:
            raise ValueError("lease_fraction must be between 0 and 1: the lease must end before the session can")
        self.lease_fraction = lease_fraction
        self.client = client
        self.region = region
        self.name = name
        self.rank = rank
        self.session_timeout = session_timeout
        self.tick = tick if tick is not None else session_timeout / 6
        self.resume_within = resume_within if resume_within is not None else session_timeout
        self.defer = defer
        self.handback_after = handback_after
        self.on_elected, self.on_deposed, self.on_handback, self.on_pause = (
            on_elected,
            on_deposed,
            on_handback,
            on_pause,
        )
        self.metrics = metrics or ElectionMetrics()
        self.clock = clock
        base = region_path(root, region)
        self.leader_path = f"{base}/leader"
        self.epoch_path = f"{base}/epoch"
        self.candidates_path = f"{base}/candidates"
        self.candidate_path = f"{self.candidates_path}/{name}"
        self.call_timeout = max(0.5, session_timeout / 3)

        self._lock = threading.Condition()
        self.state = STANDBY
        self._token: int | None = None
        self._epoch: int | None = None  # (leader) the epoch number of this term, for the record of its release
        self._lease: SessionLease | None = None  # (leader) this term's lease, tied to the leader znode
        self._suspended = False
        self._healthy = healthy
        self._published: tuple[int, bool, bool] | None = None  # (rank, healthy, rejoining) in our candidate znode
        # Until then this instance is rejoining after a lost term (`rejoining`: it replaced a deposed process).
        self._rejoining_until = clock() + handback_after if rejoining else 0.0
        self._recalled = False  # ZooKeeper's record of the last term has been read (at the first step)
        # The session that still holds the leader znode of this instance's own lost term (a process killed a
        # moment ago): rejoining lasts until that znode is gone, and handback_after from then.
        self._old_term_session: int | None = None
        self._vacant_since: float | None = None  # when this instance first saw the region without a leader
        self._better_since: float | None = None  # (leader) when a better-ranked healthy candidate appeared
        self._handing_back = False
        self.leader_name: str | None = None  # who leads, as last seen (None: nobody)
        self.term = 0
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._retry_in: float | None = None
        self._threads: list[threading.Thread] = []
        # What the election step reads, each znode again only after its watch fired (which wakes the step).
        self._leader_view = self._watched(self.leader_path)
        self._candidates_view = self._watched(self.candidates_path, children=True)
        self._candidate_views: dict[str, Watched] = {}

    def _watched(self, path: str, children: bool = False) -> Watched:
        return Watched(self.client, path, children=children, timeout=self.call_timeout, on_change=self._wake.set)

    # -- life cycle ---------------------------------------------------------------------------------------------

    def start(self) -> Elector:
        self.client.add_listener(self._on_connection)
        self.metrics.zk_connected.set(1 if self.client.connected else 0)
        t = threading.Thread(target=self._run, name=f"ha-election-{self.name}", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self, release: bool = True) -> None:
        """Stop taking part. `release`: if leading, give the leadership up now (delete the leader znode) so
        that a standby takes over at once instead of after the session timeout."""
        self._stopping.set()
        self._wake.set()
        with self._lock:
            self._lock.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(self.call_timeout * 2 + 1)
        self.client.remove_listener(self._on_connection)
        if release:
            term = self._term_held()
            deposed = self._depose("resign", "stopping", notify=False)
            self._release(term, "stopped")
            self._delete_own(self.candidate_path)
            if deposed:
                self.on_deposed("resign")

    # -- what the daemon asks ---------------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.state == LEADER

    def lease_left(self) -> float:
        lease = self._lease
        return lease.left() if self.state == LEADER and lease is not None else 0.0

    def may_send(self) -> bool:
        """True while this instance leads, within its lease, with its ZooKeeper connection up."""
        lease = self._lease
        return self.state == LEADER and lease is not None and lease.valid()

    def fence_token(self) -> int | None:
        """The epoch version this leader set (for compare-and-set marker writes), None unless `may_send()`."""
        token = self._token
        return token if self.may_send() else None

    def set_healthy(self, healthy: bool) -> None:
        """Whether this instance's copy can serve (published to the other candidates at the next tick)."""
        if healthy != self._healthy:
            self._healthy = healthy
            self._wake.set()

    def resign(self, reason: str = "handback") -> None:
        """Stop leading now and give the leadership up (after `on_handback`, or when a takeover cannot finish):
        the leader znode is deleted before `on_deposed` is told, so the next leader need not wait for anything."""
        term = self._term_held() if reason in GIVEN_UP else None  # a failed takeover is a lost term, not given up
        deposed = self._depose(reason, f"resigned ({reason})", notify=False)
        self._release(term, reason)
        self._handing_back = False
        with self._lock:
            self._vacant_since = None
        self._wake.set()
        if deposed:
            self.on_deposed(reason)

    def snapshot(self) -> dict[str, Any]:
        return {
            "instance": self.name,
            "region": self.region,
            "rank": self.rank,
            "state": self.state,
            "leader": self.leader_name,
            "term": self.term,
            "lease_left_s": round(self.lease_left(), 3),
            "zookeeper": "suspended" if self._suspended else ("connected" if self.client.connected else "lost"),
            "healthy": self._healthy,
            "rejoining": self._rejoining(),
            "lease": ("lapsed" if self._lease and self._lease.lapsed else "held") if self.state == LEADER else None,
        }

    # -- threads --------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._step()
            except UNAVAILABLE as e:
                log.debug("election step: ZooKeeper unavailable: %s", e)
            except KazooException as e:
                log.warning("election step failed (retried): %s: %s", type(e).__name__, e)
            except Exception:
                log.exception("election step failed (retried)")
            wait, self._retry_in = min(self.tick, self._retry_in or self.tick), None
            self._wake.wait(wait)
            self._wake.clear()

    def _on_connection(self, state: str) -> None:
        """kazoo's connection thread: never block here."""
        # (A leader's pause and resumption are its term's lease's business: `SessionLease`.)
        self.metrics.zk_connected.set(1 if state == KazooState.CONNECTED else 0)
        if state == KazooState.SUSPENDED:
            self._suspended = True
        elif state == KazooState.LOST:
            self._suspended = True
            self._published = None  # ephemeral znodes died with the session
            self._depose("session", "ZooKeeper session lost (expired or closed)")
        else:  # CONNECTED
            self._suspended = False
        self._wake.set()

    # -- one step of the election ---------------------------------------------------------------------------------

    def _call(self, async_result: Any) -> Any:
        return async_result.get(timeout=self.call_timeout)

    def _session(self) -> int | None:
        cid = self.client.client_id
        return cid[0] if cid else None

    def _step(self) -> None:
        if not self.client.connected or self._suspended:
            return
        session = self._session()
        if not self._recalled:
            self._recall_last_term(session)
        self._publish_candidate()
        if self.state == LEADER:  # (the term's lease renews itself: its own thread checks the leader znode)
            if self.may_send():
                self._consider_handback()
            return
        # (read again only when its watch fired, which also wakes this loop: no request per step while a leader
        # leads - before, an `exists` and a `get` every tick, and a new watch callback kept by kazoo every time)
        data = self._leader_view.value()
        stat = self._leader_view.stat if data is not None else None
        if self._old_term_session is not None and (stat is None or stat.ephemeralOwner != self._old_term_session):
            self._old_term_ended()
        if stat is not None:
            if stat.ephemeralOwner == session:
                # Ours, from a term this instance has given up (a lease that ran out): free it for everyone.
                self._release()
                return
            self._saw_leader(data)
            return
        self._saw_vacancy()
        if not self._healthy:
            return
        better = [c for c in self._candidates() if self._preferred_to_me(c)]
        waited = self.clock() - (self._vacant_since or self.clock())
        if better and waited < self.defer:
            self._retry_in = self.defer - waited  # the preferred candidate should win meanwhile
            return
        self._try_to_lead()

    def _rejoining(self) -> bool:
        return self.clock() < self._rejoining_until

    def _recall_last_term(self, session: int | None) -> None:
        """ZooKeeper's record of the region's last term (the `epoch` znode): if it names this instance and was
        not marked released, this instance lost that term (its process was killed or crashed, or was deposed)
        and starts as rejoining, whoever restarted it. While the leader znode of that term still exists (its
        old session not expired yet) the rejoining window has not even started: `_old_term_ended`."""
        try:
            data, _ = self._call(self.client.get_async(self.epoch_path))
            last = json.loads(data.decode() or "{}")
        except NoNodeError:
            last = {}
        except ValueError:
            last = {}
        if not isinstance(last, dict) or last.get("leader") != self.name or last.get("released"):
            self._recalled = True
            return
        try:
            data, stat = self._call(self.client.get_async(self.leader_path))
            holder = json.loads(data.decode() or "{}").get("name")
        except NoNodeError:
            stat, holder = None, None
        except (ValueError, AttributeError):
            holder = None
        # The leader znode of that term, still held by this instance's old session (not yet expired)?
        held = stat is not None and stat.ephemeralOwner != session and holder == self.name
        with self._lock:
            if held:
                assert stat is not None
                self._old_term_session = stat.ephemeralOwner
                self._rejoining_until = math.inf
            else:
                self._rejoining_until = max(self._rejoining_until, self.clock() + self.handback_after)
        self._recalled = True
        log.warning(
            "instance %s: its last term in region %s (epoch %s) ended without being given up: rejoining as a standby%s",
            self.name,
            self.region,
            last.get("epoch"),
            "; its old session still holds the leader znode" if held else "",
        )

    def _old_term_ended(self) -> None:
        """The leader znode of this instance's lost term is gone (its old session expired): the vacancy it made
        goes to another candidate; this instance stays rejoining for `handback_after` from now."""
        with self._lock:
            self._old_term_session = None
            self._rejoining_until = self.clock() + self.handback_after

    def _preferred_to_me(self, c: dict[str, Any]) -> bool:
        """Whether candidate `c` goes before this instance: healthy, not rejoining, and better-ranked (or any
        such candidate while this instance is rejoining itself)."""
        return (
            c["name"] != self.name
            and c["healthy"]
            and not c["rejoining"]
            and (c["rank"] < self.rank or self._rejoining())
        )

    def _publish_candidate(self) -> None:
        want = (self.rank, self._healthy, self._rejoining())
        if self._published == want:
            return
        data = json.dumps(
            {"name": self.name, "rank": self.rank, "healthy": self._healthy, "rejoining": want[2]}
        ).encode()
        try:
            self._call(self.client.create_async(self.candidate_path, data, ephemeral=True, makepath=True))
        except NodeExistsError:
            stat = self._call(self.client.exists_async(self.candidate_path))
            if stat is None:
                return  # gone meanwhile: next tick
            if stat.ephemeralOwner != self._session():
                return  # an earlier process of this instance whose session has not expired yet: next tick
            self._call(self.client.set_async(self.candidate_path, data))
        self._published = want

    def _candidates(self) -> list[dict[str, Any]]:
        """Every published candidate; each znode read again only after it changed (a leader asks every tick)."""
        out: list[dict[str, Any]] = []
        names = self._candidates_view.value()
        for gone in set(self._candidate_views) - set(names):
            del self._candidate_views[gone]
        for name in names:
            view = self._candidate_views.get(name)
            if view is None:
                view = self._candidate_views[name] = self._watched(f"{self.candidates_path}/{name}")
            try:
                data = view.value()
                if data is None:
                    continue
                doc = json.loads(data.decode())
                out.append(
                    {
                        "name": str(doc["name"]),
                        "rank": int(doc["rank"]),
                        "healthy": bool(doc["healthy"]),
                        "rejoining": bool(doc.get("rejoining", False)),
                    }
                )
            except (NoNodeError, ValueError, KeyError, TypeError):
                continue
        return out

    def _saw_leader(self, data: bytes) -> None:
        try:
            self.leader_name = json.loads(data.decode()).get("name")
        except (ValueError, AttributeError):
            return
        self.metrics.leader_present.set(1)
        with self._lock:
            since, self._vacant_since = self._vacant_since, None
        if since is not None:
            self.metrics.leaderless.observe(self.clock() - since)

    def _saw_vacancy(self) -> None:
        self.leader_name = None
        self.metrics.leader_present.set(0)
        with self._lock:
            if self._vacant_since is None:
                self._vacant_since = self.clock()

    def _try_to_lead(self) -> None:
        try:
            data, epoch_stat = self._call(self.client.get_async(self.epoch_path))
            previous = json.loads(data.decode() or "{}")
        except NoNodeError:
            try:
                self._call(self.client.create_async(self.epoch_path, json.dumps({"epoch": 0}).encode(), makepath=True))
            except NodeExistsError:
                pass
            self._wake.set()
            return
        epoch = int(previous.get("epoch", 0)) + 1
        t = self.client.transaction()
        t.create(
            self.leader_path,
            json.dumps({"name": self.name, "epoch": epoch, "since": time.time()}).encode(),
            ephemeral=True,
        )
        t.set_data(
            self.epoch_path, json.dumps({"epoch": epoch, "leader": self.name}).encode(), version=epoch_stat.version
        )
        sent = self.clock()
        results = self._call(t.commit_async())
        if any(isinstance(r, Exception) for r in results):
            return  # someone else won (or the epoch moved): watch the new leader at the next step
        token = epoch_stat.version + 1
        lease = SessionLease(
            self.client,
            self.leader_path,
            self.session_timeout,
            on_lost=self._lease_lost,
            tick=self.tick,
            clock=self.clock,
            lease_fraction=self.lease_fraction,
            resume_within=self.resume_within,
            checks=((self.epoch_path, token),),  # a lapsed term resumes only if the epoch is still its own
            on_pause=self.on_pause,
            on_lapse=self.metrics.lease_lapses.inc,
            on_resume=self.metrics.lease_resumptions.inc,
            who=f"instance {self.name}",
        )
        lease.start(sent)  # (its threads start before the term is seen to be held: nothing waits on them)
        with self._lock:
            self.state = LEADER
            self._token = token
            self._epoch = epoch
            self._lease = lease
            self.term += 1
            since, self._vacant_since = self._vacant_since, None
            self._better_since = None
            self._lock.notify_all()
        self.leader_name = self.name
        m = self.metrics
        m.set_state(LEADER)
        m.leader_present.set(1)
        m.elections.inc()
        if previous.get("leader") not in (None, self.name):
            m.takeovers.inc()
        if since is not None:
            m.leaderless.observe(self.clock() - since)
        log.warning(
            "instance %s leads region %s (epoch %d, fencing token %d; previous leader %s)",
            self.name,
            self.region,
            epoch,
            token,
            previous.get("leader") or "none",
        )
        self.on_elected(token)
        if lease.lost is not None:  # lost before the term was recorded (its own `_lease_lost` found no term)
            self._lease_lost(lease.lost)

    def _lease_lost(self, reason: str) -> None:
        """The term's lease is over for good (the session LOST, no confirmation in time, the leader znode or the
        epoch no longer this term's)."""
        why = {
            "lease": "lease ran out and no answer from ZooKeeper confirmed the term in time",
            "session": "ZooKeeper session lost (expired or closed)",
        }.get(reason, "the leader znode is gone or belongs to another session, or the epoch moved")
        self._depose(reason, why)

    def _consider_handback(self) -> None:
        if self.on_handback is None or self._handing_back:
            return
        better = [c for c in self._candidates() if self._preferred_to_me(c)]
        if not better:
            self._better_since = None
            return
        now = self.clock()
        if self._better_since is None:
            self._better_since = now
        if now - self._better_since >= self.handback_after:
            self._handing_back = True
            log.warning(
                "instance %s hands region %s back to %s (preferred, healthy for %.1fs)",
                self.name,
                self.region,
                min(better, key=lambda c: c["rank"])["name"],
                now - self._better_since,
            )
            self.on_handback()

    def _depose(self, reason: str, why: str, notify: bool = True) -> bool:
        """Stop leading (at once: `may_send()` says no from here on); True if this instance was leading."""
        with self._lock:
            if self.state != LEADER:
                return False
            self.state = STANDBY
            self._token = None
            self._epoch = None
            lease, self._lease = self._lease, None
            if reason not in GIVEN_UP:  # a lost term, not one given up: come back as a standby
                self._rejoining_until = self.clock() + self.handback_after
            self._lock.notify_all()
        if lease is not None:
            lease.stop(wait=False)  # (may be its own callback, or kazoo's thread; may_send() says no already)
        self.metrics.set_state(STANDBY)
        self.metrics.depositions.labels(reason=reason).inc()
        log.warning("instance %s no longer leads region %s: %s", self.name, self.region, why)
        self._wake.set()
        if notify:
            self.on_deposed(reason)
        return True

    def _term_held(self) -> tuple[int, int] | None:
        """(fencing token, epoch) of the term this instance holds, None unless it leads."""
        with self._lock:
            if self.state != LEADER or self._token is None or self._epoch is None:
                return None
            return self._token, self._epoch

    def _release(self, term: tuple[int, int] | None = None, reason: str = "") -> None:
        """Delete the leader znode if this session owns it (a standby then takes over at once). `term`: the
        (token, epoch) of a term given up, not lost: the same multi-operation marks the `epoch` record
        released (checked against the token: only the term's holder can), so that this instance's next
        process does not take it for a lost term (`_recall_last_term`)."""
        if term is None:
            self._delete_own(self.leader_path)
            return
        token, epoch = term
        try:
            if not self.client.connected:
                return
            stat = self._call(self.client.exists_async(self.leader_path))
            if stat is None or stat.ephemeralOwner != self._session():
                return
            t = self.client.transaction()
            t.delete(self.leader_path, version=stat.version)
            t.set_data(
                self.epoch_path,
                json.dumps(
                    {"epoch": epoch, "leader": self.name, "released": reason or "released", "at": time.time()}
                ).encode(),
                version=token,
            )
            results = self._call(t.commit_async())
        except (NoNodeError, KazooException, *UNAVAILABLE) as e:
            log.debug("could not release %s: %s", self.leader_path, e)
            return
        if any(isinstance(r, Exception) for r in results):
            log.warning(
                "instance %s: could not mark its term (epoch %d) released: %s; deleting the leader znode only",
                self.name,
                epoch,
                results,
            )
            self._delete_own(self.leader_path)

    def _delete_own(self, path: str) -> None:
        try:
            if not self.client.connected:
                return
            stat = self._call(self.client.exists_async(path))
            if stat is not None and stat.ephemeralOwner == self._session():
                self._call(self.client.delete_async(path, version=stat.version))
        except (NoNodeError, KazooException, *UNAVAILABLE) as e:
            log.debug("could not delete %s: %s", path, e)


# -- the daemon in HA mode: `squeal run --instance NAME` ------------------------------------------------------------


def gate_flows(flows: Any, may_send: Callable[[], bool]) -> None:
    """No flow hands the batcher a batch unless `may_send()` says so at that very moment: a leader whose lease
    ran out (a process paused past it, a partition) sends nothing more, even before its watchdog has run.
    (Batches already written are acknowledged as usual.)"""
    for flow in flows:
        flow.may_send = may_send


class HaInstance:
    """One squeal instance of an HA region: a standby until elected, then a `RegionDaemon` on its own copy,
    with the region's datamarkers in ZooKeeper (`ZooKeeperDatamarkerStore`, fenced by the election epoch).

    * Start-up (`prepare`): its copy has the binlog settings squeal needs; ZooKeeper answers. /metrics and
      /healthz are served from the start (`state`: starting — waiting for the copy or ZooKeeper —, standby,
      taking_over, leader).
    * Elected: reads every flow's marker, waits (at most `takeover_wait_s`, `squeal_ha_takeover_wait_seconds`)
      until its copy has applied them, then runs a `RegionDaemon` (every shard) from those markers. Its flows hand
      out batches only while the lease holds (`gate_flows`).
    * Deposed (lease ran out, session lost): `rejoin` (by default the process replaces itself and comes back
      as a standby). A better-ranked instance that is back and healthy for `handback_after_s` seconds gets the
      region handed back: the daemon flushes what is queued and writes its markers first.
    * SIGTERM: the daemon flushes and writes its markers; then the leadership is released at once.
    """

    def __init__(
        self,
        topology: Topology,
        instance: str,
        state_dir: str | Path | None = None,
        metrics_port: int | None = None,
        from_gtid: str | None = None,
        reactor: Any = None,
        reply_timeout: float = 2.0,
        sample_every: int = 1000,
        connect_timeout: float = 20.0,
        rejoin: Callable[[str], None] = rejoin_as_standby,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.instance = topology.instance(instance)
        if topology.zookeeper is None:
            raise ValueError(f"{topology.source}: squeal instances need a [zookeeper] section")
        self.zk = topology.zookeeper
        self.region = topology.region(self.instance.region)
        self.rank = [s.name for s in self.region.squeal_instances].index(self.instance.name)
        # The daemon sees the region as if its database were this instance's copy.
        mine = replace(self.region, database=self.instance.database)
        self.topology = replace(topology, regions=tuple(mine if r.name == mine.name else r for r in topology.regions))
        self.state_dir = (
            Path(state_dir) if state_dir is not None else state_dir_for(topology, None) / self.instance.name
        )
        self.metrics_port = metrics_port if metrics_port is not None else self.instance.metrics_port
        self.from_gtid = from_gtid
        self.reply_timeout = reply_timeout
        self.sample_every = sample_every
        self.connect_timeout = connect_timeout
        self.handback_after = self.zk.handback_after_s
        self.rejoin = rejoin
        self.source = source_for(mine)
        self.registry = CollectorRegistry()
        self.metrics = ElectionMetrics(self.registry)
        self.registry.register(_CurrentDaemon(self))
        self.client: KazooClient | None = None
        self.elector: Elector | None = None
        self.daemon: RegionDaemon | None = None
        self.store: ZooKeeperDatamarkerStore | None = None  # the leader's (fenced by its term): the first shard's
        self.stores: dict[str, ZooKeeperDatamarkerStore] = {}  # shard -> its store, while leading
        self.phase = STANDBY  # STANDBY, "taking_over", LEADER
        self.takeover: dict[str, Any] = {}
        self.stopping = False
        self.exit_code = 0
        self._healthy = True
        self._health_stop = threading.Event()
        self.waiting_for: str | None = None  # during `prepare`: "database" or "zookeeper" (a /healthz problem)
        self._serving = False

    # -- start-up --------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Blocking checks (a misconfigured copy or an unreachable ZooKeeper is a one-line error, exit 2).

        A process that replaced a deposed leader (`rejoin_as_standby`) waits for its copy and ZooKeeper as long
        as it takes instead: it was deposed *because* they stopped answering (a partition, a ZooKeeper without
        quorum), the same configuration worked a moment ago, and a standby that waits is harmless."""
        why = rejoined()
        if why:
            log.warning(
                "instance %s: rejoining after %s: waiting for %s and ZooKeeper %s without a time-out",
                self.instance.name,
                why,
                self.instance.database.address,
                self.zk.hosts,
            )
        timeout = startup_timeout(self.connect_timeout)
        self.waiting_for = "database"
        conn = connect_with_retry(self.source, math.inf if timeout is None else timeout)
        try:
            check_server(conn, replica=self.instance.database.role == "replica")
        finally:
            conn.close()
        self.waiting_for = "zookeeper"
        self.client = connect_zookeeper(self.topology, timeout)
        self.waiting_for = None
        log.info(
            "instance %s (region %s, rank %d) on %s %s: standing by%s",
            self.instance.name,
            self.region.name,
            self.rank,
            self.instance.database.role,
            self.instance.database.address,
            f" (rejoined after: {why})" if why else "",
        )

    def serve(self) -> None:
        """/metrics, /healthz and /sampled-deletes on the instance's port, from before `prepare` on (a standby
        waiting for its copy or ZooKeeper says so there instead of looking dead)."""
        if self._serving:
            return
        serve_status(
            self.reactor,
            self.metrics_port,
            self.instance.host,
            self.registry,
            self.status,
            lambda since: self.daemon.sampler.recent(since) if self.daemon is not None else [],
        )
        self._serving = True

    def start(self) -> None:
        """Call after `prepare`, with the reactor about to run (or running)."""
        self.serve()
        assert self.client is not None
        self.elector = Elector(
            self.client,
            self.zk.root,
            self.region.name,
            self.instance.name,
            self.rank,
            session_timeout=self.zk.session_timeout_s,
            metrics=self.metrics,
            handback_after=self.handback_after,
            on_elected=lambda token: self.reactor.callFromThread(self._elected, token),
            on_deposed=self._deposed,
            on_handback=lambda: self.reactor.callFromThread(self._hand_back),
            on_pause=self._paused,
            healthy=self._healthy,
            rejoining=bool(rejoined()),
        )  # it replaced a deposed leader
        self.elector.start()
        threading.Thread(target=self._watch_health, name="ha-health", daemon=True).start()
        # After the daemon's own "before shutdown" (flush, final markers): give the leadership up at once.
        self.reactor.addSystemEventTrigger("during", "shutdown", self._release)

    def _watch_health(self) -> None:
        """Whether this instance's copy answers, every second (the election's preference).

        On one kept connection: a new one a second was a MariaDB login (and a TLS handshake) a second per
        instance. Timeouts bound a check of a frozen server; a failed check drops the connection and the
        next one reconnects, so a restarted server is seen again."""
        conn = None
        timeout = 2
        while not self._health_stop.wait(1.0):
            try:
                if conn is None:
                    conn = self.source.connect(connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout)
                with conn.cursor() as cur:
                    cur.execute("SELECT 1")
                healthy = True
            except Exception:  # noqa: BLE001 - any failure: not healthy
                healthy = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = None
            if healthy != self._healthy:
                log.warning(
                    "instance %s: its copy %s %s",
                    self.instance.name,
                    self.instance.database.address,
                    "answers again" if healthy else "does not answer",
                )
            self._healthy = healthy
            if self.elector is not None:
                self.elector.set_healthy(healthy)
            self._take_loss_acceptance()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _take_loss_acceptance(self) -> None:
        """The leader hands `squeal accept-data-loss` (a znode per shard: any instance's operator may run it) to the
        shard's pipeline, which applies it at its next checkpoint (the pipeline's own request file, as without HA)."""
        daemon = self.daemon
        if daemon is None or self.phase != LEADER:
            return
        daemon.take_loss_acceptances(self.stores, f"instance {self.instance.name}")

    # -- leadership --------------------------------------------------------------------------------------------

    def _elected(self, token: int) -> None:
        """Reactor thread: this instance leads; prepare the daemon on a thread (blocking database work)."""
        if self.stopping or self.daemon is not None or self.phase != STANDBY:
            return
        self.phase = "taking_over"
        self.takeover = {"token": token, "since": time.time()}
        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self._take_over, token)
        d.addCallbacks(self._lead, self._takeover_failed, callbackArgs=(token,))

    def _take_over(self, token: int) -> RegionDaemon:
        """A thread: markers from ZooKeeper, wait for this copy to have them, prepare the daemon (every shard's
        pipeline, each with its own fenced store)."""
        assert self.client is not None and self.elector is not None
        sharded = self.topology.sharded
        stores: dict[str, ZooKeeperDatamarkerStore] = {}
        for shard in self.topology.shards:
            store = ZooKeeperDatamarkerStore(
                self.client,
                self.zk.root,
                self.region.name,
                owner=self.instance.name,
                fence=self.elector.fence_token,
                on_write=self.metrics.marker_write.observe,
                shard=shard.name if sharded else None,
            )
            store.ensure_paths()
            stores[shard.name] = store
        self.stores = stores
        self.store = next(iter(stores.values()))
        markers: dict[str, str] = {}
        self.metrics.takeover_waiting.set(1)
        waited = 0.0
        try:
            for name, store in stores.items():
                positions = store.positions()
                markers.update({f"{name}/{f}" if sharded else f: p for f, p in positions.items()})
                target: dict = {}
                for position in positions.values():
                    g.merge(target, g.parse_position(position))
                copy = source_for(self.topology.shard_copy(name, self.region.name))
                try:
                    waited += wait_for_copy(
                        copy.connect, target, self.zk.takeover_wait_s, progress=self.metrics.takeover_wait.set
                    )
                except pymysql.err.OperationalError as e:
                    if not sharded:
                        raise TakeoverError(f"this copy does not answer: {e}") from e
                    # Every instance reads the region's same copy of a shard, so it has what the markers say
                    # once it answers again; its pipeline starts then (RegionDaemon retries it). The others go on.
                    log.error(
                        "instance %s: shard %s's copy %s does not answer (%s); taking the other shards over",
                        self.instance.name,
                        name,
                        copy.host + ":" + str(copy.port),
                        e,
                    )
        finally:
            self.metrics.takeover_waiting.set(0)
        self.takeover["markers"] = markers
        self.metrics.takeover_wait.set(waited)
        self.takeover["waited_s"] = round(waited, 3)
        if self.elector.fence_token() != token:
            raise TakeoverError("deposed while taking over")
        daemon = RegionDaemon(
            self.topology,
            self.region.name,
            self.state_dir,
            metrics_port=None,
            from_gtid=self.from_gtid,
            reactor=self.reactor,
            reply_timeout=self.reply_timeout,
            connect_timeout=self.connect_timeout,
            sample_every=self.sample_every,
            stores=stores.__getitem__,
            instance=self.instance.name,
        )
        daemon.prepare()
        return daemon

    def _lead(self, daemon: Any, token: int) -> None:
        assert self.elector is not None
        if self.stopping or self.elector.fence_token() != token:
            log.warning("instance %s: deposed while taking over; not starting", self.instance.name)
            return
        gate_flows(daemon.flows.values(), self.elector.may_send)
        self.daemon = daemon
        daemon.start()
        self.phase = LEADER
        took = time.time() - self.takeover["since"]
        self.takeover["ready_after_s"] = round(took, 3)
        log.warning(
            "instance %s leads region %s: delivering from %s's binlog (%s) from the datamarkers %s; "
            "takeover took %.0f ms (waited %.0f ms for the copy)",
            self.instance.name,
            self.region.name,
            self.instance.database.name,
            self.instance.database.address,
            self.takeover.get("markers") or "(none: every flow starts now)",
            took * 1000,
            self.takeover.get("waited_s", 0) * 1000,
        )

    def _takeover_failed(self, failure: Any) -> None:
        log.error(
            "instance %s could not take region %s over: %s; giving the leadership up",
            self.instance.name,
            self.region.name,
            failure.getErrorMessage() if failure.check(TakeoverError) else failure.getTraceback(),
        )
        self.phase = STANDBY
        if self.elector is not None:
            self.elector.resign("takeover")  # -> _deposed -> rejoin

    def _paused(self, paused: bool) -> None:
        """kazoo's thread: the connection is suspended (flows hand out nothing: `gate_flows`) or back."""
        if not paused and self.daemon is not None:
            self.reactor.callFromThread(lambda: [s.kick() for s in self.daemon.senders.values()])

    def _deposed(self, reason: str) -> None:
        """Any thread: this instance no longer leads. It has stopped sending already (the gate); now it starts
        over as a standby."""
        if not self.stopping:
            self.rejoin(reason)

    def _hand_back(self) -> None:
        """Reactor: a better-ranked instance is back and healthy: flush, write the markers, resign."""
        if self.daemon is None or self.elector is None:
            if self.elector is not None and self.phase == STANDBY:
                self.elector.resign("handback")
            return
        log.warning(
            "instance %s: handing region %s back; flushing and writing the datamarkers first",
            self.instance.name,
            self.region.name,
        )
        elector = self.elector

        def resign(_: Any) -> None:
            elector.resign("handback")

        self.daemon.shutdown().addBoth(resign)

    def _release(self) -> None:
        self.stopping = True
        self._health_stop.set()
        if self.daemon is not None:
            self.exit_code = self.daemon.exit_code
        if self.elector is not None:
            self.elector.stop(release=True)
        if self.client is not None:
            try:
                self.client.stop()
                self.client.close()
            except Exception:  # noqa: BLE001
                pass

    # -- status ----------------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        ha = self.elector.snapshot() if self.elector is not None else {"state": STANDBY}
        base = {
            "state": STARTING if self.waiting_for else self.phase,
            "instance": self.instance.name,
            "region": self.region.name,
            "database": {
                "name": self.instance.database.name,
                "address": str(self.instance.database.address),
                "role": self.instance.database.role,
                "answers": self._healthy,
            },
            "ha": ha,
            "takeover": dict(self.takeover),
        }
        if self.daemon is not None:
            status = self.daemon.status()
            status.update(base)
            return status
        problems: dict[str, str] = {}
        if self.waiting_for == "database":
            problems["database"] = (
                f"starting: waiting for this instance's copy {self.instance.database.address} to answer"
            )
        elif self.waiting_for == "zookeeper":
            problems["zookeeper"] = f"starting: waiting for ZooKeeper {self.zk.hosts} to answer"
        elif ha.get("zookeeper") != "connected":
            problems["zookeeper"] = f"ZooKeeper {self.zk.hosts}: {ha.get('zookeeper')}"
        if not self._healthy:
            problems["database"] = f"this instance's copy {self.instance.database.address} does not answer"
        return {"ok": not problems and not self.stopping, "problems": problems, **base}


class _CurrentDaemon:
    """A collector that yields the leading daemon's metrics (none while standing by)."""

    def __init__(self, owner: HaInstance) -> None:
        self.owner = owner

    def collect(self) -> Any:
        daemon = self.owner.daemon
        if daemon is not None:
            yield from daemon.registry.collect()


def run_instance(
    topology: Topology,
    instance: str,
    state_dir: str | Path | None = None,
    metrics_port: int | None = None,
    from_gtid: str | None = None,
    reply_timeout: float = 2.0,
    sample_every: int = 1000,
) -> int:
    """`squeal run --instance NAME`: run until SIGTERM/SIGINT; returns the exit code."""
    from twisted.internet import reactor

    inst = HaInstance(
        topology,
        instance,
        state_dir,
        metrics_port,
        from_gtid,
        reactor=reactor,
        reply_timeout=reply_timeout,
        sample_every=sample_every,
    )
    return serve_while_preparing(reactor, inst)
