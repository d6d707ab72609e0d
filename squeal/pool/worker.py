"""`PoolWorker`: one member of a region's pool (`squeal run --instance NAME`) - it joins, follows the assignment
(takes the shards it is given, hands on the ones it is not), publishes what it runs and measures, and leaves on
SIGTERM; one pipeline per owned shard, in one `RegionDaemon`. It is a Twisted service run by the process shell
(squeal/process/shell.py: the status site from the first moment, signals, exit code).

Threads: `prepare` runs on the shell's "squeal-prepare" thread; `startService`, `stopService` and `status` on the
reactor. The member's loop
(`_run`: join, then `_step` every lease tick or at once when a watch wakes it) on its own daemon thread
("pool-worker"): every blocking ZooKeeper call of ownership and publication is there; what touches pipelines it
hands to the reactor (`callFromThread`: handover.py). The controller, the binlog meter and the copy health check
run on threads of their own (controller.py, binlog_meter.py, copy_health.py); `_leave` in the reactor's pool."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError
from prometheus_client import CollectorRegistry
from twisted.application import service
from twisted.internet import defer, threads

from router_config import SquealInstance, Topology
from squeal.delivery.sampler import SampledDelete
from squeal.markers.zkstore import ShardMarkerStore
from squeal.pool import placement
from squeal.pool.binlog_meter import BinlogMeter
from squeal.pool.controller import Controller, placement_settings
from squeal.pool.copy_health import watch_copy_health
from squeal.pool.handover import RETRY_FAILED_S, give_back_acceptance, start_shard, stop_shard
from squeal.pool.metrics import DaemonMetrics, PoolMetrics
from squeal.pool.owner import SessionLease, connect_zookeeper, rejoin_owning_nothing, startup_timeout
from squeal.pool.ownership import Ownership
from squeal.pool.shard_loads import ShardLoads, loads_changed
from squeal.pool.znodes import read_doc
from squeal.pool.zookeeper import UNAVAILABLE, Watched, ha_marker_dir, pool_path
from squeal.shard.daemon import source_for, state_dir_for
from squeal.shard.region import RegionDaemon

log = logging.getLogger(__name__)


class SendGate:
    """A shard's permission to send, asked before every batch (`gate()`); the native delivery thread asks how long
    it lasts (`left()`: the rest of the lease, so a window it is given never outlives the lease)."""

    def __init__(self, ownership: Callable[[], Ownership | None], shard: str) -> None:
        self.ownership = ownership
        self.shard = shard

    def __call__(self) -> bool:
        o = self.ownership()
        return o is not None and o.may_send(self.shard)

    def left(self) -> float:
        o = self.ownership()
        return o.window(self.shard) if o is not None else 0.0


PUBLISH_EVERY_S = 1.0  # how often a worker measures its shards' loads (and publishes them if they moved)
WARM_ALL_UP_TO = 64  # a worker of a region with at most this many shards checks every shard's pipeline ahead


def own_copy_topology(topology: Topology, instance: SquealInstance) -> Topology:
    """The topology as `instance` reads it: without [shards], its region's database is the instance's own copy
    (the primary, or a replica of its own: each instance of a region names a different one, so losing a copy loses
    one worker). With [shards], unchanged: every worker reads the shards' copies (`squeal.shard.copies.read_order`)."""
    if topology.sharded:
        return topology
    region = topology.region(instance.region)
    mine = replace(region, database=instance.database)
    return replace(topology, regions=tuple(mine if r.name == mine.name else r for r in topology.regions))


class PoolWorker(service.Service):
    """`squeal run --instance NAME` in a pooled region: a member of the pool, the owner of the shards the
    assignment gives it (one pipeline each, in one `RegionDaemon`), and a candidate for controller."""

    serves_while_preparing = True  # (the shell) /healthz while it waits for ZooKeeper: the wait is visible
    name: str  # type: ignore[assignment]  # the instance's name, also its service name (Twisted's `None` default)

    def __init__(
        self,
        topology: Topology,
        instance: str,
        state_dir: str | Path | None = None,
        reactor: Any = None,
        reply_timeout: float = 2.0,
        sample_every: int = 1000,
        connect_timeout: float = 20.0,
        rejoin: Callable[[str], None] = rejoin_owning_nothing,
        from_gtid: str | None = None,
        settings: placement.Settings | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.instance = topology.instance(instance)
        if topology.zookeeper is None:
            raise ValueError(f"{topology.source}: a squeal pool needs a [zookeeper] section")
        self.zk = topology.zookeeper
        super().__init__()
        self.topology = topology = own_copy_topology(topology, self.instance)
        self.region = topology.region(self.instance.region)
        self.name = self.instance.name
        self.state_dir = Path(state_dir) if state_dir is not None else state_dir_for(topology, None) / self.name
        self.reply_timeout = reply_timeout
        self.sample_every = sample_every
        self.connect_timeout = connect_timeout
        self.from_gtid = from_gtid  # where a flow without a marker starts (`squeal run --from-gtid`; default: now)
        self.rejoin = rejoin
        self.settings = settings if settings is not None else placement_settings(self.region.squeal_placement)
        self.bytes_per_row = self.region.squeal_placement.bytes_per_row
        self.half_life_s = self.region.squeal_placement.half_life_s
        self.meter = BinlogMeter(lambda shard: source_for(topology.shard_copy(shard, self.region.name)))
        self.base = pool_path(self.zk.root, self.region.name)
        self.member_path = f"{self.base}/workers/{self.name}"
        self.call_timeout = max(0.5, self.zk.session_timeout_s / 3)
        self.registry = CollectorRegistry()
        self.metrics = PoolMetrics(self.registry)
        self.shard_loads = ShardLoads(self.meter, self.metrics, self.half_life_s, self.bytes_per_row)
        self.client: KazooClient | None = None
        self.lease: SessionLease | None = None
        self.ownership: Ownership | None = None
        self.controller: Controller | None = None
        self.daemon: RegionDaemon | None = None
        self.stores: dict[str, ShardMarkerStore] = {}
        self.assignment: dict[str, str] = {}
        self._assignment: Watched | None = None  # the `assignment` znode, read when its watch fires
        self.starting: set[str] = set()
        self.stopping_shards: set[str] = set()
        self.failed_at: dict[str, float] = {}
        self._measured_at = 0.0
        self._published: dict[str, Any] | None = None  # the member znode's content as last written
        self.stopping = False
        self.exit_code = 0
        self.wake = threading.Event()
        self._stop = threading.Event()
        self.state_lock = threading.Lock()
        self.waiting_for: str | None = None  # during `prepare`: "zookeeper" (a /healthz problem)
        self.healthy = True  # this worker's own copy answers (published: the controller places nothing otherwise)
        self.metrics.healthy.set(1)

    # -- start-up (`prepare` on the shell's thread, `startService` on the reactor) ---------------------------------

    def prepare(self) -> None:
        """ZooKeeper answers (a one-line start-up error otherwise)."""
        self.waiting_for = "zookeeper"
        self.client = connect_zookeeper(self.topology, startup_timeout(self.connect_timeout))
        for sub in ("workers", "drain", "move", "shards"):
            self.client.ensure_path(f"{self.base}/{sub}")
        self.waiting_for = None

    def sampled(self, since: float) -> list[SampledDelete]:
        """/sampled-deletes: its shards' sampled acknowledged deletes (none while it runs no pipeline)."""
        return self.daemon.sampler.recent(since) if self.daemon is not None else []

    def reload(self) -> None:
        """SIGHUP, as for a region daemon: its shards' replay requests now."""
        if self.daemon is not None:
            self.daemon.checkpoint()

    def startService(self) -> None:  # noqa: N802 - Twisted's name
        """After `prepare`, on the reactor: its (empty) `RegionDaemon`, the member's loop and the copy health
        check; shards come and go from the loop."""
        assert self.client is not None
        super().startService()
        self.state_dir.mkdir(parents=True, exist_ok=True)  # the shards' request files (accept-data-loss)
        daemon = RegionDaemon(
            self.topology,
            self.region.name,
            self.state_dir,
            from_gtid=self.from_gtid,
            reactor=self.reactor,
            reply_timeout=self.reply_timeout,
            connect_timeout=self.connect_timeout,
            sample_every=self.sample_every,
            stores=self.store_for,
            gate=self._gate,
            instance=self.name,
        )
        self.daemon = daemon
        self.registry.register(DaemonMetrics(daemon))
        daemon.startService()  # (a running parent: each shard's pipeline starts as it is added)
        threading.Thread(target=self._run, name="pool-worker", daemon=True).start()
        if not self.topology.sharded:
            own_copy = source_for(self.topology.region(self.region.name).database)
            threading.Thread(
                target=watch_copy_health,
                args=(own_copy, self._stop, lambda: self.healthy, self._health_changed),
                name="pool-health",
                daemon=True,
            ).start()

    def _health_changed(self, healthy: bool) -> None:
        """The "pool-health" thread: this worker's own copy answers again, or stopped answering; published in the
        member znode at once, so that the controller gives a worker whose copy is lost no shard and moves its
        shard to one whose copy answers."""
        log.log(
            logging.INFO if healthy else logging.WARNING,
            "worker %s: its copy %s %s",
            self.name,
            self.instance.database.address,
            "answers again" if healthy else "does not answer: it should own nothing",
        )
        self.healthy = healthy
        self.metrics.healthy.set(1 if healthy else 0)
        self.wake.set()  # publish it now

    def _join(self) -> float:
        """Create this worker's member znode (waiting for a previous process's to expire); returns when the
        request that created it was sent (the lease's first round trip)."""
        assert self.client is not None
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                member = self._member()
                self.client.create(self.member_path, self._member_doc(), ephemeral=True, makepath=True)
                self._published = member
                return sent
            except NodeExistsError:
                log.info(
                    "worker %s: a previous process of this worker is still a member (its session has not "
                    "expired yet): waiting",
                    self.name,
                )
                gone = threading.Event()
                if self.client.exists(self.member_path, watch=lambda _, gone=gone: gone.set()) is not None:
                    gone.wait(self.zk.session_timeout_s)
        return time.monotonic()

    def _run(self) -> None:
        assert self.client is not None
        sent = self._join()
        if self._stop.is_set():
            return
        self.lease = SessionLease(
            self.client,
            self.member_path,
            self.zk.session_timeout_s,
            on_lost=self._lost,
            on_lapse=self.metrics.lease_lapses.inc,
            on_resume=self.metrics.lease_resumptions.inc,
            on_pause=self._paused,
            who=f"worker {self.name}",
        )
        self.lease.start(sent)
        self.ownership = Ownership(
            self.client, self.zk.root, self.region.name, self.name, self.lease, self.call_timeout
        )
        self._assignment = Watched(
            self.client, f"{self.base}/assignment", timeout=self.call_timeout, on_change=self.wake.set
        )
        self.controller = Controller(self, self.settings)
        self.controller.start()
        self.meter.start()
        log.info("worker %s joined region %s's pool", self.name, self.region.name)
        while not self._stop.is_set():
            try:
                self.metrics.zk_connected.set(1 if self.client.connected else 0)
                self._step()
            except (*UNAVAILABLE, KazooException) as e:
                log.debug("worker step: %s", e)
            except Exception:
                log.exception("worker step failed (retried)")
            self.wake.wait(self.lease.tick)
            self.wake.clear()

    # -- the member's loop: the "pool-worker" thread ---------------------------------------------------------------

    def store_for(self, shard: str) -> ShardMarkerStore:
        """The shard's marker store for its next (or current) pipeline, fenced by this worker's ownership of it:
        made when the pipeline is built (checked ahead or started), dropped when the pipeline stops."""
        store = self.stores.get(shard)
        if store is None:
            ownership = self.ownership
            assert self.client is not None and ownership is not None
            store = self.stores[shard] = ShardMarkerStore(
                self.client,
                self.zk.root,
                self.region.name,
                shard,
                owner=self.name,
                fence=lambda: ownership.fence(shard),
                on_write=self.metrics.marker_write.observe,
                legacy=ha_marker_dir(self.zk.root, self.region.name, shard if self.topology.sharded else None),
            )
        return store

    def _warm(self, mine: set[str], busy: set[str]) -> None:
        """Check ahead (`RegionDaemon.warm`: the database checks, no markers, nothing sent) the pipelines of the
        shards this worker may take next: those the assignment gives it (a planned move: while their old owner
        hands them on) and, in a region of at most `WARM_ALL_UP_TO` shards, every shard (a takeover after a
        crash), so that a takeover starts from checks already made."""
        daemon = self.daemon
        if daemon is None:
            return
        names = [s.name for s in self.topology.shards]
        wanted = set(names) if len(names) <= WARM_ALL_UP_TO else set(mine)
        wanted -= set(daemon.shards) | busy
        warmed = daemon.warmed
        for shard in sorted(warmed - wanted - busy):
            self.reactor.callFromThread(daemon.unwarm, shard)
        for shard in sorted(wanted - warmed):
            if time.monotonic() - self.failed_at.get(shard, -RETRY_FAILED_S) >= RETRY_FAILED_S:
                self.reactor.callFromThread(daemon.warm, shard)

    def _paused(self, paused: bool) -> None:
        """The lease's threads: sending must stop (or may go on) now. The reactor's senders ask the gate before
        every batch; the native delivery thread is told at once (`push_gates`)."""
        daemon = self.daemon
        if daemon is not None:
            daemon.hub.push_gates()

    def _gate(self, shard: str) -> Callable[[], bool]:
        return SendGate(lambda: self.ownership, shard)

    def _owner_changed(self, _: Any) -> None:
        """A shard this worker waits for changed hands (one bound method: kazoo keeps one callback per znode,
        not one per step that asked)."""
        self.wake.set()

    def _read_assignment(self) -> dict[str, str]:
        """The assignment, read again only when its watch fired (the step runs every lease tick)."""
        assert self._assignment is not None
        doc = read_doc(self._assignment.value() or b"")
        assignment = {str(k): str(v) for k, v in (doc.get("assignment") or {}).items()}
        given_to = (doc.get("pids") or {}).get(self.name, os.getpid())
        if given_to != os.getpid():
            # given to this worker's previous process, which died: the controller places them anew, away from it
            return {s: w for s, w in assignment.items() if w != self.name}
        return assignment

    def _step(self) -> None:
        assert self.lease is not None and self.ownership is not None
        if self.stopping or not self.lease.valid():
            return
        self.assignment = self._read_assignment()
        mine = {s for s, w in self.assignment.items() if w == self.name}
        with self.state_lock:
            owned = set(self.ownership.tokens)
            busy = self.starting | self.stopping_shards
        self._warm(mine, busy | owned)
        now = time.monotonic()
        for shard in sorted(mine - owned - busy):
            if now - self.failed_at.get(shard, -RETRY_FAILED_S) < RETRY_FAILED_S:
                continue
            if self.ownership.acquire(shard) is not None:  # (first: a takeover's orphan is free already)
                with self.state_lock:
                    self.starting.add(shard)
                self.reactor.callFromThread(start_shard, self, shard)
            elif self.ownership.owner_of(shard, watch=self._owner_changed) is None:
                self.wake.set()  # released between the two: try again at once
            # (else its owner has not released it yet: the watch on `owner` wakes this loop when it does)
        for shard in sorted(owned - mine - busy):
            with self.state_lock:
                self.stopping_shards.add(shard)
            self.reactor.callFromThread(stop_shard, self, shard)
        if time.monotonic() - self._measured_at >= PUBLISH_EVERY_S:
            self._measured_at = time.monotonic()
            if self.daemon is not None:
                self.shard_loads.measure(self.daemon)
            self._take_loss_acceptance()
        self._publish_if_changed()

    def _take_loss_acceptance(self) -> None:
        """`squeal accept-data-loss` for a shard this worker owns (a znode beside its markers, taken fenced by the
        shard's epoch) goes to that shard's pipeline, which applies it at its next checkpoint."""
        daemon = self.daemon
        if daemon is None:
            return
        daemon.take_loss_acceptances(self.stores, f"worker {self.name}")

    def _member(self) -> dict[str, Any]:
        shards = sorted(self.daemon.shards) if self.daemon is not None else []
        loads = {s: v for s, v in self.shard_loads.loads.items() if s in shards}
        return {
            "name": self.name,
            "region": self.region.name,
            "pid": os.getpid(),
            "shards": shards,
            "loads": loads,
            "load": round(sum(v["load"] for v in loads.values()), 3),
            "healthy": self.healthy,
        }

    def _member_doc(self) -> bytes:
        return json.dumps({**self._member(), "at": time.time()}, sort_keys=True).encode()

    def _publish_if_changed(self) -> None:
        """Write the member znode when what the controller plans with changed: the shards this worker runs (at
        once: the controller's count of unowned time reads them), or a load by more than `LOAD_CHANGE` of itself
        (every second under a steady load was a write - and a read by the controller - for nothing)."""
        now = self._member()
        last = self._published
        if (
            last is not None
            and last["shards"] == now["shards"]
            and last.get("healthy") == now["healthy"]
            and not loads_changed(last["loads"], now["loads"])
        ):
            return
        assert self.client is not None
        self.client.set_async(self.member_path, self._member_doc()).get(timeout=self.call_timeout)
        self._published = now

    def _lost(self, reason: str) -> None:
        """The lease is gone for good (session lost, no confirmation): nothing more is sent (the gate says no
        already); the process starts over (it comes back owning nothing)."""
        if self.stopping:
            return
        log.error(
            "worker %s lost its ZooKeeper session (%s): every shard it owned may have a new owner; starting over",
            self.name,
            reason,
        )
        self.rejoin(reason)

    # -- stopService (the reactor, then its thread pool), status (the reactor) -------------------------------------

    def stopService(self) -> defer.Deferred:  # noqa: N802 - Twisted's name
        """SIGTERM: every shard's pipeline flushes and writes its markers, then every shard is released at once
        (its next owner starts without waiting for this session to expire), then the member znode goes."""
        super().stopService()
        self.stopping = True
        self._stop.set()
        self.wake.set()
        if self.controller is not None:
            self.controller.stop()
        daemon = self.daemon
        d = defer.maybeDeferred(daemon.stopService) if daemon is not None else defer.succeed(None)

        def release(_: Any) -> defer.Deferred:
            if daemon is not None:
                self.exit_code = daemon.exit_code
            return threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self._leave)

        return d.addBoth(release)

    def _leave(self) -> None:
        self.meter.stop()
        if self.ownership is not None:
            for shard in list(self.ownership.tokens):
                give_back_acceptance(self, shard)
                self.ownership.release(shard, "stopped")
        if self.lease is not None:
            self.lease.stop()
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.delete(self.member_path)
            with contextlib.suppress(Exception):
                self.client.stop()
                self.client.close()

    def status(self) -> dict[str, Any]:
        daemon = self.daemon
        shards = {name: d.status() for name, d in list(daemon.shards.items())} if daemon is not None else {}
        problems = {
            f"{name}: {k}": f"shard {name}: {v}" for name, st in shards.items() for k, v in st["problems"].items()
        }
        lease = self.lease
        if self.waiting_for == "zookeeper":
            problems["zookeeper"] = f"starting: waiting for ZooKeeper {self.zk.hosts} to answer"
        if lease is None or not lease.valid():
            problems["lease"] = "no valid lease on the ZooKeeper session: this worker sends nothing"
        if not self.healthy:
            problems["database"] = f"this worker's copy {self.instance.database.address} does not answer"
        return {
            "ok": not problems and not self.stopping,
            "problems": problems,
            "state": "starting" if self.waiting_for else "worker",
            "instance": self.name,
            "region": self.region.name,
            "pid": os.getpid(),
            "healthy": self.healthy,
            "controller": bool(self.controller and self.controller.leading),
            "owns": sorted(self.ownership.tokens) if self.ownership is not None else [],
            "starting": sorted(self.starting),
            "stopping": sorted(self.stopping_shards),
            "checked_ahead": sorted(daemon.checked_ahead) if daemon is not None else [],
            "lease_left_s": round(lease.left(), 3) if lease is not None else 0.0,
            "loads": dict(self.shard_loads.loads),
            "flows": {f"{name}/{f}": v for name, st in shards.items() for f, v in st["flows"].items()},
            "shards": shards,
        }
