"""`Controller`: the pool's one planner, elected among the workers with kazoo's `Election` recipe; while it leads,
it plans (`squeal.pool.placement.plan`) and writes the assignment every worker follows.

Runs on its own daemon thread ("pool-controller", started by the worker once it joined): the election's wait, the
planning loop and every ZooKeeper call it makes; kazoo's thread only sets `_kick` (a watch fired). `plan_once` is
the pure-ish step the loop repeats: a fake client and a `clock`/`wall` of a test's own drive it."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from router_config import PoolPlacement
from squeal.pool import placement
from squeal.pool.znodes import read_doc
from squeal.pool.zookeeper import UNAVAILABLE, Watched
from squeal.shard.copies import placement_shard, placement_worker

if TYPE_CHECKING:
    from squeal.pool.worker import PoolWorker

log = logging.getLogger(__name__)

PLAN_EVERY_S = 1.0


def placement_settings(p: PoolPlacement) -> placement.Settings:
    """The controller's `placement.Settings` from a region's `[regions.R.squeal_placement]`."""
    return placement.Settings(
        threshold=p.threshold, persist_s=p.persist_s, cooldown_s=p.cooldown_s, max_moves=p.max_moves or None
    )


class Controller:
    """The pool's controller, elected with kazoo's `Election` recipe: every `PLAN_EVERY_S`, and at once when a
    watch fires, it takes the members, their published loads, drain and move requests and the assignment, calls
    `placement.plan`, and writes the new assignment (compare-and-set: two controllers for a moment, an old one's
    session ending, cannot overwrite each other's plans unseen). Each of those znodes is read again only after
    its watch fired (`Watched`): a plan a second costs no request while nothing changes."""

    def __init__(
        self,
        worker: PoolWorker,
        settings: placement.Settings | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.worker = worker
        # `clock` measures durations (unowned time, health), `wall` stamps the assignment (moves, cooldowns): both
        # injectable, so a test's clock drives the planning decisions without ZooKeeper or sleeps
        self.clock = clock
        self.wall = wall
        self.client: Any = worker.client  # connected: the controller starts after the worker joined
        self.base = worker.base
        self.settings = settings or placement.Settings()
        self.imbalanced_since: float | None = None
        self.loads: dict[str, float] = {}
        self.unowned_since: dict[str, float] = {}  # shard -> when this controller first saw it run nowhere
        self.healthy_since: dict[str, float] = {}  # member -> since when this controller has seen it healthy
        self.pids: dict[str, Any] = {}  # member -> the process (pid) this controller saw last (a new one: a restart)
        self.restarted: set[str] = set()  # members whose process died holding shards, until they settle
        self.leading = False
        self._stop = threading.Event()
        self._kick = threading.Event()  # set by the watches: plan now, not at the next second
        self._election: Any = None
        self._views: dict[str, Watched] = {}  # (while leading) workers/, drain/, move/, assignment
        self._member_views: dict[str, Watched] = {}  # (while leading) workers/<name>

    def start(self) -> None:
        threading.Thread(target=self._run, name="pool-controller", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._election is not None:
            with contextlib.suppress(Exception):
                self._election.cancel()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._election = self.client.Election(f"{self.base}/controller", self.worker.name)
                self._election.run(self._lead)
            except Exception as e:  # noqa: BLE001 - contend again
                log.debug("controller election: %s", e)
            self._stop.wait(0.5)

    def _lead(self) -> None:
        self.leading = True
        self.worker.metrics.controller.set(1)
        log.info("worker %s is the controller of region %s's pool", self.worker.name, self.worker.region.name)
        self.watch_pool()
        try:
            while not self._stop.is_set() and self.client.state == KazooState.CONNECTED:
                try:
                    self.plan_once()
                except (*UNAVAILABLE, KazooException) as e:
                    log.warning("controller: %s: %s (retried)", type(e).__name__, e)
                except Exception:
                    log.exception("controller: planning failed (retried)")
                self._kick.wait(PLAN_EVERY_S)
                self._kick.clear()
        finally:
            self.leading = False
            self.worker.metrics.controller.set(0)
            self.unowned_since.clear()  # the next controller measures from its own first look
            self.healthy_since.clear()
            self.pids.clear()
            self.restarted.clear()
            self.worker.metrics.unowned.clear()
            self._views, self._member_views = {}, {}  # (a next term reads everything afresh)

    def watch_pool(self) -> None:
        """(Taking the lead) the znodes every plan reads, each read afresh once and then only after its watch fired;
        apart from `_lead` so that a test can plan with a fake client and no election."""
        self._views = {
            name: self._watched(f"{self.base}/{name}", children=name != "assignment")
            for name in ("workers", "drain", "move", "assignment")
        }
        self._member_views = {}

    def _watched(self, path: str, children: bool = False) -> Watched:
        return Watched(self.client, path, children=children, timeout=self.worker.call_timeout, on_change=self._kick.set)

    def _get(self, path: str) -> Any:
        return self.client.get_async(path).get(timeout=self.worker.call_timeout)

    def _members(self) -> dict[str, dict[str, Any]]:
        """Every member's published document (name -> doc), each znode read again only after it changed."""
        names = self._views["workers"].value()
        for gone in set(self._member_views) - set(names):
            del self._member_views[gone]
        members: dict[str, dict[str, Any]] = {}
        for name in names:
            view = self._member_views.get(name)
            if view is None:
                view = self._member_views[name] = self._watched(f"{self.base}/workers/{name}")
            data = view.value()
            if data is not None:
                members[name] = read_doc(data)
        return members

    def _account_unowned(self, members: dict[str, dict[str, Any]], names: list[str]) -> None:
        """Which shards run on no worker now (the members' published `shards`, each at most a second old), and
        for how long: the metrics of a move's pause and of the time any shard was without an owner."""
        running = {s for m in members.values() for s in (m.get("shards") or [])}
        now = self.clock()
        for shard in names:
            if shard in running:
                since = self.unowned_since.pop(shard, None)
                if since is not None:
                    self.worker.metrics.pauses.observe(now - since)
                self.worker.metrics.unowned.labels(shard=shard).set(0)
            else:
                since = self.unowned_since.setdefault(shard, now)
                self.worker.metrics.unowned.labels(shard=shard).set(now - since)

    def _settled(self, members: dict[str, dict[str, Any]]) -> set[str]:
        """The members that have been healthy (their own copy answers) for the region's `handback_after_s`, as
        this controller has seen them: only those get a shard handed back (`placement.HANDBACK`)."""
        now = self.clock()
        for name in set(self.healthy_since) - set(members):
            del self.healthy_since[name]
        for name, member in members.items():
            pid = member.get("pid")
            if self.pids.get(name, pid) != pid:  # a new process of the worker: it has been healthy since now
                self.healthy_since.pop(name, None)
            self.pids[name] = pid
            if member.get("healthy", True):
                self.healthy_since.setdefault(name, now)
            else:
                self.healthy_since.pop(name, None)
        wait = self.worker.zk.handback_after_s
        return {name for name, since in self.healthy_since.items() if now - since >= wait}

    def plan_once(self) -> placement.Plan | None:
        # (a member joining or its session ending - a crash's orphans - fires the watch on workers/: plan at once)
        members = self._members()
        settled = self._settled(members)
        drains = set(self._views["drain"].value())
        assignment_view = self._views["assignment"]
        data = assignment_view.value()
        doc, version = (read_doc(data), assignment_view.version) if data is not None else ({}, None)
        assignment: dict[str, str] = dict(doc.get("assignment") or {})
        last_moved: dict[str, float] = {k: float(v) for k, v in (doc.get("last_moved") or {}).items()}
        # The process each worker had when it was given its shards: a member with another one restarted, and the
        # process that held them died (issue 37: the supervisor restarts a killed worker within a second, and it
        # must not win the vacancy its own crash made). It is `restarted` until it has settled.
        assigned_pids: dict[str, Any] = dict(doc.get("pids") or {})
        for name, member in members.items():
            if name in assigned_pids and assigned_pids[name] != member.get("pid") and name in assignment.values():
                self.restarted.add(name)
        self.restarted &= set(members)
        self.restarted -= settled
        names = [s.name for s in self.worker.topology.shards]
        self._account_unowned(members, names)
        for member in members.values():
            for shard, load in (member.get("loads") or {}).items():
                if shard in names and assignment.get(shard) == member.get("name"):
                    self.loads[shard] = float(load.get("load", 1.0))
        now = self.wall()
        # shards an operator moved, and when: a hand-back does not undo a move within the cooldown (it did at once
        # when the preferred worker had settled, so `squealctl move` away from it never took effect)
        manual_at: dict[str, float] = {
            k: float(v) for k, v in (doc.get("manual_moves") or {}).items() if now - float(v) < self.settings.cooldown_s
        }
        manual: list[placement.Move] = []
        taken: list[str] = []
        for shard in self._views["move"].value():
            taken.append(shard)
            with contextlib.suppress(NoNodeError):
                to = str(read_doc(self._get(f"{self.base}/move/{shard}")[0]).get("to"))
                if shard not in names or to not in members or to in drains:
                    log.error(
                        "controller: move request %s -> %s ignored (unknown shard, or %s is not an eligible worker)",
                        shard,
                        to,
                        to,
                    )
                    continue
                if assignment.get(shard) != to:
                    manual.append(
                        placement.Move(
                            shard,
                            assignment.get(shard),
                            to,
                            "manual",
                            "squealctl move",
                            self.loads.get(shard, 1.0),
                            self.worker.region.name,
                            "requested",
                        )
                    )
                    assignment[shard] = to
                    last_moved[shard] = now
                    manual_at[shard] = now
        topo, region = self.worker.topology, self.worker.region.name
        known = {i.name for i in self.worker.region.squeal_instances}  # (a member not in this topology: no copy named)
        workers = [
            placement_worker(
                topo,
                region,
                name,
                draining=name in drains,
                healthy=bool(members[name].get("healthy", True)),
                settled=name in settled,
                restarted=name in self.restarted,
            )
            if name in known
            else placement.Worker(name, draining=name in drains, region=region, rank=len(known), settled=False)
            for name in members
        ]
        shards = [placement_shard(topo, s, region, self.loads.get(s, 1.0)) for s in names]
        p = placement.plan(
            workers,
            shards,
            assignment,
            last_moved,
            now,
            self.imbalanced_since,
            self.settings,
            pinned=frozenset(manual_at),
        )
        self.imbalanced_since = p.imbalanced_since
        out = {s: w for s, w in assignment.items() if s in p.unplaced} | p.assignment
        for shard, worker in out.items():
            self.worker.metrics.owner.labels(shard=shard, worker=worker).set(1)
        # each holder's process, which alone may take what it holds (`PoolWorker._read_assignment`)
        pids = {w: members[w].get("pid") for w in sorted(set(out.values())) if w in members}
        if not p.moves and not manual and pids == {w: assigned_pids.get(w) for w in pids}:
            for shard in taken:
                with contextlib.suppress(NoNodeError):
                    self.client.delete_async(f"{self.base}/move/{shard}").get(timeout=self.worker.call_timeout)
            return p
        for m in p.moves:
            if m.source is not None:  # a hand-over; a first placement is not a move the cooldown protects
                last_moved[m.shard] = now
        new = {
            "assignment": out,
            "last_moved": last_moved,
            "moves": int(doc.get("moves", 0)) + len(p.moves) + len(manual),
            "pids": pids,
            "manual_moves": manual_at,
            "by": self.worker.name,
            "at": now,
        }
        data = json.dumps(new, sort_keys=True).encode()
        try:
            if version is None:
                self.client.create_async(f"{self.base}/assignment", data, makepath=True).get(
                    timeout=self.worker.call_timeout
                )
                written = 0
            else:
                stat = self.client.set_async(f"{self.base}/assignment", data, version=version).get(
                    timeout=self.worker.call_timeout
                )
                written = stat.version
        except (NodeExistsError, KazooException) as e:
            assignment_view.mark_stale()
            log.info("controller: the assignment changed meanwhile (%s): planning again", type(e).__name__)
            return None
        assignment_view.wrote(data, written)  # (the next plan starts from it, whether or not the watch fired yet)
        for shard in taken:
            with contextlib.suppress(NoNodeError):
                self.client.delete_async(f"{self.base}/move/{shard}").get(timeout=self.worker.call_timeout)
        for m in (*manual, *p.moves):
            if m.source:
                self.worker.metrics.owner.labels(shard=m.shard, worker=m.source).set(0)
            self.worker.metrics.owner.labels(shard=m.shard, worker=m.target).set(1)
            self.worker.metrics.moves.labels(reason=m.reason).inc()
            # a move that follows a failure says so at WARNING (the failure itself is someone's problem); planned
            # ones (a new shard, a drain, a rebalance, a hand-back, squealctl move) are routine
            level = logging.WARNING if m.reason in (placement.ORPHANED, placement.UNHEALTHY) else logging.INFO
            log.log(
                level,
                "controller: shard %s: %s -> %s (%s: %s)",
                m.shard,
                m.source or "nobody",
                m.target,
                m.reason,
                m.detail,
            )
        return p
