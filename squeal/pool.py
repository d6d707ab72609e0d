"""An elastic squeal worker pool (issue 24): a region's shards divided among its workers through ZooKeeper.

A region with `[[regions.R.squeal_instances]]` runs them as the *workers* of its pool
(`squeal run --instance NAME`). Each (region, shard) has exactly one owner among them; one elected
controller decides who owns what with the load-aware policy (`squeal.placement.plan`); a worker runs one
pipeline per shard it owns (a `RegionDaemon` whose shards come and go at run time). Znodes, under
`<root>/regions/<region>/pool/`:

    workers/<name>        ephemeral, JSON {"name", "pid", "region", "shards", "loads", "load", "since"}: the pool's
                          members (alive while their session is) and what each measures: per owned shard
                          {"rows_s", "bytes_s", "load"}, smoothed (`placement.smooth`, 60 s half-life)
    controller/           kazoo's `Election` recipe: the one worker that plans
    assignment            persistent, JSON {"assignment": {shard: worker}, "last_moved": {shard: t}, "moves", "by",
                          "at"}: the plan, written by the controller with compare-and-set (its znode version)
    drain/<name>          persistent: an operator's `squealctl drain NAME`: the controller moves its shards away
    move/<shard>          persistent, JSON {"to"}: an operator's `squealctl move SHARD --to NAME`
    shards/<shard>/owner  ephemeral, JSON {"worker", "epoch", "since"}: who owns the shard now
    shards/<shard>/epoch  persistent, JSON {"epoch", "owner"[, "released"]}: bumped (version + 1) in the multi-
                          operation that creates `owner`, so its version is the owner's fencing token; an owner that
                          hands the shard on marks it "released" in the multi-operation that deletes `owner`
    shards/<shard>/markers  every destination's GTID for the shard (`zkstore.ShardMarkerStore`)

**Ownership and fencing** (the region election's argument, per shard). A worker takes a shard only when the
assignment names it and nobody owns the shard: creating `owner` (ephemeral: it dies with the session) and
bumping `epoch` are one multi-operation. The worker acts for the shard only within its *lease* (`SessionLease`:
each round trip to ZooKeeper proves the session alive until its send time + T, the session timeout; the lease
runs to send time + 0.6 T): the shard's flows hand the batcher a batch only while `may_send(shard)` holds at
that instant, and every marker write checks the shard's epoch version. A shard changes hands only after its
`owner` znode is gone: released by its owner once it has stopped (a planned move), or expired with its
owner's session (a crash, a partition), which ZooKeeper does no earlier than T after it last heard from that
session, i.e. after the old owner's lease ran out. So the old owner has stopped sending before the new one
starts, and its late marker writes fail (the epoch moved).

**A planned move** (rebalance, drain, `squealctl move`): the controller writes the new assignment; the old
owner stops reading the shard, waits (bounded) for its in-flight deletes to be acknowledged, writes the
shard's markers and releases `owner`; the new owner, watching `owner`, takes it, reads the markers and starts
from them. Its pipeline's database checks were done ahead (`RegionDaemon.warm`, while the old owner handed on;
in a region of at most `WARM_ALL_UP_TO` shards, for every shard, for a takeover too): only what needs ownership
is in the shard's pause. At least once: whatever was not acknowledged is after the markers and is sent again.

**A crash**: the dead worker's `workers/<name>` and `owner` znodes expire with its session; the controller
sees the shards orphaned and places them at once; their new owners start from the markers.

Load: each owner measures rows/s (`squeal_rows_total`) and binlog bytes/s (`BinlogMeter`) per shard, smooths
both (`[regions.R.squeal_placement] half_life_s`) and publishes them with their combination (`placement.shard_load`,
`bytes_per_row`); the controller plans with the region's `squeal_placement` settings.

The session lease, start-up and the rejoin after a loss are squeal/owner.py.
A shard that has no markers znode yet starts from the HA layout's markers of the same shard (an HA region turned
into a pool). Which copy of a shard a worker reads: `squeal.copies.read_order` (the copy it names, else an extra
copy on its host, else the region's own copy; the region's copy is every reader's fallback); without [shards], its
instance's own copy (`own_copy_topology`), whose health it publishes (`healthy` in its member znode: a worker whose
copy does not answer is given nothing and its shard moves). Preference: the instance's rank in `squeal_instances`
breaks ties, and a shard alone on its worker is handed back to an empty better-ranked worker once that one has been
healthy for `handback_after_s` (`placement.HANDBACK`): HA mode's "two instances, one leader" as "one shard, two
workers" (the region-level election it replaces is gone: docs/squeal.md, "HA mode on the pool: inventory"). Not yet:
no shard is placed on a worker for the copy it would read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from twisted.internet import defer, threads

from router_config import PoolPlacement, SquealInstance, Topology
from squeal import gtid as g
from squeal import placement
from squeal.copies import placement_shard, placement_worker
from squeal.daemon import accept_path, source_for, state_dir_for
from squeal.owner import (
    SessionLease,
    connect_zookeeper,
    rejoin_owning_nothing,
    serve_status,
    serve_while_preparing,
    startup_timeout,
    wait_for_copy,
)
from squeal.region import RegionDaemon
from squeal.zkstore import UNAVAILABLE, ShardMarkerStore, Watched, ha_marker_dir, pool_path, shard_path

log = logging.getLogger(__name__)

LOAD_HALF_LIFE_S = 60.0
PUBLISH_EVERY_S = 1.0
PLAN_EVERY_S = 1.0
BINLOG_EVERY_S = 5.0  # how often a worker asks each owned shard's copy for its binlog's size (`BinlogMeter`)
BINLOG_TIMEOUT_S = 5.0  # `BinlogMeter`'s connect/read/write timeout: a frozen copy must not hang its thread
LOAD_CHANGE = 0.05  # a worker republishes a shard's load when it moved by more than this fraction of itself
PAUSE_BUCKETS = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60, 120, 300)  # seconds; the members publish every second
RETRY_FAILED_S = 5.0  # a shard whose pipeline failed to start is tried again after this long
WARM_ALL_UP_TO = 64  # a worker of a region with at most this many shards checks every shard's pipeline ahead
HEALTH_EVERY_S = 1.0  # how often a worker of a region without [shards] asks its own copy whether it answers


def own_copy_topology(topology: Topology, instance: SquealInstance) -> Topology:
    """The topology as `instance` reads it: without [shards], its region's database is the instance's own copy
    (the primary, or a replica of its own: each instance of a region names a different one, so losing a copy loses
    one worker). With [shards], unchanged: every worker reads the shards' copies (`squeal.copies.read_order`)."""
    if topology.sharded:
        return topology
    region = topology.region(instance.region)
    mine = replace(region, database=instance.database)
    return replace(topology, regions=tuple(mine if r.name == mine.name else r for r in topology.regions))


def _doc(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode() or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def loads_changed(before: dict[str, dict[str, float]], now: dict[str, dict[str, float]]) -> bool:
    """Whether a worker's published shard loads are out of date: a shard came or went, or its load moved by more
    than `LOAD_CHANGE` of itself (0.05 rows/s equivalents at least)."""
    if before.keys() != now.keys():
        return True
    for shard, load in now.items():
        old = before[shard].get("load", 0.0)
        if abs(load.get("load", 0.0) - old) > max(0.05, LOAD_CHANGE * old):
            return True
    return False


def placement_settings(p: PoolPlacement) -> placement.Settings:
    """The controller's `placement.Settings` from a region's `[regions.R.squeal_placement]`."""
    return placement.Settings(
        threshold=p.threshold, persist_s=p.persist_s, cooldown_s=p.cooldown_s, max_moves=p.max_moves or None
    )


class BinlogMeter:
    """How fast each owned shard's binlog grows: every `every` seconds, `SHOW BINARY LOGS` on the copy the worker
    reads (what its reader streams, whether or not the transactions touch tables with rules). `grown[shard]` is
    the bytes added since the first sample (file by file: a rotation adds the new file's size, a purge subtracts
    nothing), `rate[shard]` the bytes/s between the last two samples (over the meter's own interval, so the load's
    once-a-second smoothing sees a steady figure, not a burst every `every` seconds). A copy that does not answer
    (down, or the account lacks BINLOG MONITOR / REPLICATION CLIENT) keeps its last figure; the load then rests on
    rows/s alone; one that stops answering mid-query (frozen, a cut network) fails the sample after
    `BINLOG_TIMEOUT_S`, so the other shards' figures keep coming. Every `BINLOG_EVERY_S` (5 s), not every
    second: a query per owned shard per second is a cost only a pool worker pays (its fixed cost,
    docs/benchmarks.md), and a load smoothed over a minute does not need it."""

    def __init__(
        self, source: Callable[[str], Any], every: float = BINLOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self.every = every
        self.clock = clock
        self.grown: dict[str, int] = {}
        self.rate: dict[str, float] = {}
        self._sampled_at: dict[str, float] = {}
        self._sizes: dict[str, dict[str, int]] = {}
        self._conns: dict[str, Any] = {}
        self._wanted: set[str] = set()
        self._warned: set[str] = set()
        self._stop = threading.Event()

    def keep(self, shards: set[str]) -> None:
        """Measure these shards (the ones this worker runs now); forget the others."""
        self._wanted = set(shards)

    def start(self) -> None:
        threading.Thread(target=self._run, name="pool-binlog-meter", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            wanted = set(self._wanted)
            for shard in sorted(set(self._conns) - wanted):
                self._forget(shard)
            for shard in sorted(set(self._sizes) - wanted):
                self._sizes.pop(shard, None)
                self.grown.pop(shard, None)
                self.rate.pop(shard, None)
                self._sampled_at.pop(shard, None)
            for shard in sorted(wanted):
                try:
                    self.sample(shard)
                except Exception as e:  # noqa: BLE001 - a copy that does not answer: its last figure stays
                    self._forget(shard)
                    if shard not in self._warned:
                        self._warned.add(shard)
                        log.warning(
                            "pool: cannot read shard %s's binlog size (SHOW BINARY LOGS): %s; its load is "
                            "its rows/s alone until it can",
                            shard,
                            e,
                        )
        for shard in list(self._conns):
            self._forget(shard)

    def _forget(self, shard: str) -> None:
        conn = self._conns.pop(shard, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def sample(self, shard: str) -> int:
        conn = self._conns.get(shard)
        if conn is None:
            t = BINLOG_TIMEOUT_S
            conn = self._conns[shard] = self.source(shard).connect(connect_timeout=t, read_timeout=t, write_timeout=t)
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            sizes = {str(row[0]): int(row[1]) for row in cur.fetchall()}
        now = self.clock()
        before = self._sizes.get(shard)
        self._sizes[shard] = sizes
        if before is None:
            self.grown[shard] = 0
        else:
            added = sum(
                max(0, size - before.get(name, 0 if name > max(before, default="") else size))
                for name, size in sizes.items()
            )
            self.grown[shard] = self.grown.get(shard, 0) + added
            elapsed = now - self._sampled_at.get(shard, now)
            if elapsed > 0:
                self.rate[shard] = added / elapsed
        self._sampled_at[shard] = now
        return self.grown[shard]


class Ownership:
    """This worker's shards (shard -> fencing token): taken and released with the per-shard multi-operations of
    the module docstring."""

    def __init__(
        self, client: KazooClient, root: str, region: str, worker: str, lease: SessionLease, call_timeout: float = 2.0
    ) -> None:
        self.client = client
        self.root = root
        self.region = region
        self.worker = worker
        self.lease = lease
        self.call_timeout = call_timeout
        self.tokens: dict[str, int] = {}
        self.epochs: dict[str, int] = {}
        self._lock = threading.Lock()

    def _call(self, async_result: Any) -> Any:
        return async_result.get(timeout=self.call_timeout)

    def paths(self, shard: str) -> tuple[str, str]:
        base = shard_path(self.root, self.region, shard)
        return f"{base}/owner", f"{base}/epoch"

    def owner_of(self, shard: str, watch: Callable[[Any], None] | None = None) -> str | None:
        """The shard's owner now (None: nobody); `watch` fires when the `owner` znode changes."""
        owner, _ = self.paths(shard)
        stat = self._call(self.client.exists_async(owner, watch=watch))
        if stat is None:
            return None
        try:
            data, _ = self._call(self.client.get_async(owner))
        except NoNodeError:
            return None
        return str(_doc(data).get("worker") or "?")

    def acquire(self, shard: str) -> int | None:
        """Take the shard if nobody owns it (and this worker's lease holds): its fencing token, or None."""
        if not self.lease.valid():
            return None
        owner, epoch_path = self.paths(shard)
        try:
            data, stat = self._call(self.client.get_async(epoch_path))
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                self._call(self.client.create_async(epoch_path, json.dumps({"epoch": 0}).encode(), makepath=True))
            data, stat = self._call(self.client.get_async(epoch_path))
        epoch = int(_doc(data).get("epoch", 0)) + 1
        t = self.client.transaction()
        t.create(
            owner, json.dumps({"worker": self.worker, "epoch": epoch, "since": time.time()}).encode(), ephemeral=True
        )
        t.set_data(epoch_path, json.dumps({"epoch": epoch, "owner": self.worker}).encode(), version=stat.version)
        results = self._call(t.commit_async())
        if any(isinstance(r, Exception) for r in results):
            return None  # someone owns it (or took it a moment ago)
        token = stat.version + 1
        with self._lock:
            self.tokens[shard] = token
            self.epochs[shard] = epoch
        log.info("worker %s owns shard %s (epoch %d, fencing token %d)", self.worker, shard, epoch, token)
        return token

    def may_send(self, shard: str) -> bool:
        return shard in self.tokens and self.lease.valid()

    def fence(self, shard: str) -> int | None:
        token = self.tokens.get(shard)
        return token if token is not None and self.lease.valid() else None

    def release(self, shard: str, reason: str) -> None:
        """Give the shard up (after its pipeline stopped and wrote its markers): from here on nothing of this
        worker is sent or written for it, and the next owner may take it at once."""
        with self._lock:
            token = self.tokens.pop(shard, None)
            epoch = self.epochs.pop(shard, None)
        if token is None:
            return
        owner, epoch_path = self.paths(shard)
        try:
            stat = self._call(self.client.exists_async(owner))
            session = self.client.client_id[0] if self.client.client_id else None
            if stat is None or stat.ephemeralOwner != session:
                return
            t = self.client.transaction()
            t.delete(owner, version=stat.version)
            t.set_data(
                epoch_path,
                json.dumps({"epoch": epoch, "owner": self.worker, "released": reason, "at": time.time()}).encode(),
                version=token,
            )
            results = self._call(t.commit_async())
            if any(isinstance(r, Exception) for r in results):
                log.warning(
                    "worker %s: could not mark shard %s released (%s); deleting its owner znode only",
                    self.worker,
                    shard,
                    results,
                )
                self._call(self.client.delete_async(owner, version=stat.version))
        except (NoNodeError, KazooException, *UNAVAILABLE) as e:
            log.warning(
                "worker %s: could not release shard %s (%s); it is free when this session ends", self.worker, shard, e
            )
            return
        log.info("worker %s released shard %s (%s)", self.worker, shard, reason)


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.owned = Gauge("squeal_pool_shard_owned", "1 for each shard this worker owns", ["shard"], registry=r)
        self.shard_load = Gauge(
            "squeal_pool_shard_load",
            "A shard's smoothed load (rows/s equivalents) as its owner measures it",
            ["shard"],
            registry=r,
        )
        self.shard_rows = Gauge(
            "squeal_pool_shard_rows_per_second",
            "A shard's smoothed rows/s (changed rows of tables with rules) as its owner measures it",
            ["shard"],
            registry=r,
        )
        self.shard_bytes = Gauge(
            "squeal_pool_shard_binlog_bytes_per_second",
            "A shard's smoothed binlog growth "
            "(bytes/s of its copy's binlog, what its reader streams) as its owner measures it",
            ["shard"],
            registry=r,
        )
        self.load = Gauge("squeal_pool_worker_load", "The sum of this worker's shards' loads", registry=r)
        self.controller = Gauge("squeal_pool_controller", "1 while this worker is the pool's controller", registry=r)
        self.owner = Gauge(
            "squeal_pool_owner", "(controller) 1 for each shard's assigned worker", ["shard", "worker"], registry=r
        )
        self.moves = Counter(
            "squeal_pool_moves", "(controller) shards moved by plans, by reason", ["reason"], registry=r
        )
        self.starts = Counter("squeal_pool_shard_starts", "Shard pipelines this worker started", registry=r)
        self.start_seconds = Histogram(
            "squeal_pool_shard_start_seconds",
            "From taking a shard (its owner znode "
            "created) to its pipeline started: the new owner's part of a move's pause",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.stops = Counter("squeal_pool_shard_stops", "Shard pipelines this worker stopped and handed on", registry=r)
        self.zk_connected = Gauge(
            "squeal_pool_zookeeper_connected", "1 while the ZooKeeper session is connected", registry=r
        )
        self.lease_lapses = Counter(
            "squeal_pool_lease_lapses",
            "Times this worker's lease ran out waiting for an answer from ZooKeeper (sending paused, shards kept)",
            registry=r,
        )
        self.lease_resumptions = Counter(
            "squeal_pool_lease_resumptions",
            "Lapsed leases ZooKeeper confirmed: sending resumed, every shard in the same epoch",
            registry=r,
        )
        self.copy_wait = Gauge(
            "squeal_pool_takeover_wait_seconds",
            "How long the shard's last start waited for this worker's copy to apply its datamarkers (while "
            "waiting: so far)",
            ["shard"],
            registry=r,
        )
        self.marker_write = Histogram(
            "squeal_pool_marker_write_seconds",
            "Datamarker writes to ZooKeeper (a compare-and-set multi-operation per shard)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        self.healthy = Gauge(
            "squeal_pool_worker_healthy",
            "1 while this worker's own copy answers (0: the controller places no shard on it)",
            registry=r,
        )
        self.unowned = Gauge(
            "squeal_pool_shard_unowned_seconds",
            "(controller) How long the shard has run on no "
            "worker (0 while it runs on one), from the workers' published shards",
            ["shard"],
            registry=r,
        )
        self.pauses = Histogram(
            "squeal_pool_unowned_seconds",
            "(controller) Each stretch a shard ran on no worker, "
            "observed when it runs again: a move's or a takeover's pause",
            buckets=PAUSE_BUCKETS,
            registry=r,
        )


class _DaemonMetrics:
    def __init__(self, daemon: RegionDaemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Any]:
        yield from self.daemon.registry.collect()


class Controller:
    """The pool's controller, elected with kazoo's `Election` recipe: every `PLAN_EVERY_S`, and at once when a
    watch fires, it takes the members, their published loads, drain and move requests and the assignment, calls
    `placement.plan`, and writes the new assignment (compare-and-set: two controllers for a moment, an old one's
    session ending, cannot overwrite each other's plans unseen). Each of those znodes is read again only after
    its watch fired (`Watched`): a plan a second costs no request while nothing changes."""

    def __init__(self, worker: PoolWorker, settings: placement.Settings | None = None) -> None:
        self.worker = worker
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
        self._views = {
            name: self._watched(f"{self.base}/{name}", children=name != "assignment")
            for name in ("workers", "drain", "move", "assignment")
        }
        self._member_views = {}
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
                members[name] = _doc(data)
        return members

    def _account_unowned(self, members: dict[str, dict[str, Any]], names: list[str]) -> None:
        """Which shards run on no worker now (the members' published `shards`, each at most a second old), and
        for how long: the metrics of a move's pause and of the time any shard was without an owner."""
        running = {s for m in members.values() for s in (m.get("shards") or [])}
        now = time.monotonic()
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
        now = time.monotonic()
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
        doc, version = (_doc(data), assignment_view.version) if data is not None else ({}, None)
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
        now = time.time()
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
                to = str(_doc(self._get(f"{self.base}/move/{shard}")[0]).get("to"))
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


class PoolWorker:
    """`squeal run --instance NAME` in a pooled region: a member of the pool, the owner of the shards the
    assignment gives it (one pipeline each, in one `RegionDaemon`), and a candidate for controller."""

    def __init__(
        self,
        topology: Topology,
        instance: str,
        state_dir: str | Path | None = None,
        metrics_port: int | None = None,
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
        self.topology = topology = own_copy_topology(topology, self.instance)
        self.region = topology.region(self.instance.region)
        self.name = self.instance.name
        self.state_dir = Path(state_dir) if state_dir is not None else state_dir_for(topology, None) / self.name
        self.metrics_port = metrics_port if metrics_port is not None else self.instance.metrics_port
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
        self.loads: dict[str, dict[str, float]] = {}
        self._rows: dict[str, tuple[float, float]] = {}  # shard -> (rows counted, when)
        self._measured_at = 0.0
        self._published: dict[str, Any] | None = None  # the member znode's content as last written
        self.stopping = False
        self.exit_code = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._state = threading.Lock()
        self.waiting_for: str | None = None  # during `prepare`: "zookeeper" (a /healthz problem)
        self._serving = False
        self.healthy = True  # this worker's own copy answers (published: the controller places nothing otherwise)
        self.metrics.healthy.set(1)

    # -- start-up ---------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """ZooKeeper answers (a one-line start-up error otherwise)."""
        self.waiting_for = "zookeeper"
        self.client = connect_zookeeper(self.topology, startup_timeout(self.connect_timeout))
        for sub in ("workers", "drain", "move", "shards"):
            self.client.ensure_path(f"{self.base}/{sub}")
        self.waiting_for = None

    def serve(self) -> None:
        """/metrics, /healthz, /sampled-deletes, from before `prepare` on (waiting for ZooKeeper shows there)."""
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
        assert self.client is not None
        self.state_dir.mkdir(parents=True, exist_ok=True)  # the shards' request files (accept-data-loss)
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
            stores=self._store_for,
            gate=self._gate,
            instance=self.name,
        )
        self.daemon = daemon
        self.registry.register(_DaemonMetrics(daemon))
        self.serve()
        self.reactor.addSystemEventTrigger("before", "shutdown", self.shutdown)
        if threading.current_thread() is threading.main_thread():  # as a region daemon: replay requests now
            signal.signal(signal.SIGHUP, lambda *_: self.reactor.callFromThread(daemon.checkpoint))
        threading.Thread(target=self._run, name="pool-worker", daemon=True).start()
        if not self.topology.sharded:
            threading.Thread(target=self._watch_health, name="pool-health", daemon=True).start()

    def _watch_health(self) -> None:
        """Whether this worker's own copy answers, every `HEALTH_EVERY_S` (regions without [shards], where each
        worker reads a copy of its own): published in the member znode, so that the controller gives a worker
        whose copy is lost no shard and moves its shard to one whose copy answers.

        On one kept connection (a new one a second was a MariaDB login, and a TLS handshake, a second per worker);
        timeouts bound a check of a frozen server; a failed check drops the connection and the next reconnects."""
        source = source_for(self.topology.region(self.region.name).database)
        conn = None
        timeout = 2
        while not self._stop.wait(HEALTH_EVERY_S):
            try:
                if conn is None:
                    conn = source.connect(connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout)
                with conn.cursor() as cur:
                    cur.execute("SELECT 1")
                healthy = True
            except Exception:  # noqa: BLE001 - any failure: not healthy
                healthy = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = None
            if healthy != self.healthy:
                log.log(
                    logging.INFO if healthy else logging.WARNING,
                    "worker %s: its copy %s %s",
                    self.name,
                    self.instance.database.address,
                    "answers again" if healthy else "does not answer: it should own nothing",
                )
                self.healthy = healthy
                self.metrics.healthy.set(1 if healthy else 0)
                self._wake.set()  # publish it now
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

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
            who=f"worker {self.name}",
        )
        self.lease.start(sent)
        self.ownership = Ownership(
            self.client, self.zk.root, self.region.name, self.name, self.lease, self.call_timeout
        )
        self._assignment = Watched(
            self.client, f"{self.base}/assignment", timeout=self.call_timeout, on_change=self._wake.set
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
            self._wake.wait(self.lease.tick)
            self._wake.clear()

    # -- the worker's step ------------------------------------------------------------------------------------

    def _store_for(self, shard: str) -> ShardMarkerStore:
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

    def _gate(self, shard: str) -> Callable[[], bool]:
        return lambda: self.ownership is not None and self.ownership.may_send(shard)

    def _owner_changed(self, _: Any) -> None:
        """A shard this worker waits for changed hands (one bound method: kazoo keeps one callback per znode,
        not one per step that asked)."""
        self._wake.set()

    def _read_assignment(self) -> dict[str, str]:
        """The assignment, read again only when its watch fired (the step runs every lease tick)."""
        assert self._assignment is not None
        doc = _doc(self._assignment.value() or b"")
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
        with self._state:
            owned = set(self.ownership.tokens)
            busy = self.starting | self.stopping_shards
        self._warm(mine, busy | owned)
        now = time.monotonic()
        for shard in sorted(mine - owned - busy):
            if now - self.failed_at.get(shard, -RETRY_FAILED_S) < RETRY_FAILED_S:
                continue
            if self.ownership.acquire(shard) is not None:  # (first: a takeover's orphan is free already)
                with self._state:
                    self.starting.add(shard)
                self.reactor.callFromThread(self._start_shard, shard)
            elif self.ownership.owner_of(shard, watch=self._owner_changed) is None:
                self._wake.set()  # released between the two: try again at once
            # (else its owner has not released it yet: the watch on `owner` wakes this loop when it does)
        for shard in sorted(owned - mine - busy):
            with self._state:
                self.stopping_shards.add(shard)
            self.reactor.callFromThread(self._stop_shard, shard)
        if time.monotonic() - self._measured_at >= PUBLISH_EVERY_S:
            self._measured_at = time.monotonic()
            self._measure()
            self._take_loss_acceptance()
        self._publish_if_changed()

    def _take_loss_acceptance(self) -> None:
        """`squeal accept-data-loss` for a shard this worker owns (a znode beside its markers, taken fenced by the
        shard's epoch) goes to that shard's pipeline, which applies it at its next checkpoint."""
        daemon = self.daemon
        if daemon is None:
            return
        daemon.take_loss_acceptances(self.stores, f"worker {self.name}")

    def _start_shard(self, shard: str) -> None:
        """Reactor: the pipeline of a shard just taken: markers from ZooKeeper, its copy caught up with them."""
        assert self.client is not None and self.daemon is not None and self.ownership is not None
        ownership = self.ownership
        store = self._store_for(shard)  # (the one of the pipeline checked ahead, if it was)

        taken = time.monotonic()
        phases: dict[str, float] = {}
        ahead = shard in self.daemon.checked_ahead

        def before() -> None:
            phases["queued"] = time.monotonic() - taken
            store.ensure_paths()  # (made already if the pipeline was checked ahead)
            target: dict = {}
            for position in store.read().values():  # read once: the pipeline starts from these
                g.merge(target, g.parse_position(position))
            copy = source_for(self.topology.shard_copy(shard, self.region.name))
            wait_for_copy(
                copy.connect, target, self.zk.takeover_wait_s, progress=self.metrics.copy_wait.labels(shard=shard).set
            )
            phases["markers"] = time.monotonic() - taken

        def started(_: Any) -> None:
            took = time.monotonic() - taken
            self.metrics.owned.labels(shard=shard).set(1)
            self.metrics.starts.inc()
            self.metrics.start_seconds.observe(took)
            log.info(
                "worker %s: shard %s delivering %.0f ms after it was taken (waited for a thread %.0f ms, "
                "markers read and copy caught up by %.0f ms, then %s and the start)",
                self.name,
                shard,
                took * 1000,
                phases.get("queued", 0) * 1000,
                phases.get("markers", 0) * 1000,
                "the flows (its database checked ahead)" if ahead else "the pipeline's checks, flows",
            )
            self._started_or_not(shard)

        def failed(f: Any) -> None:
            log.error(
                "worker %s: shard %s could not start: %s; released, retried in %gs",
                self.name,
                shard,
                f.getErrorMessage(),
                RETRY_FAILED_S,
            )
            self.failed_at[shard] = time.monotonic()
            self.stores.pop(shard, None)
            d = threads.deferToThreadPool(
                self.reactor, self.reactor.getThreadPool(), ownership.release, shard, "failed"
            )
            d.addBoth(lambda _: self._started_or_not(shard))

        self.daemon.add_shard(shard, before=before).addCallbacks(started, failed)

    def _started_or_not(self, shard: str) -> None:
        with self._state:
            self.starting.discard(shard)
        self._wake.set()

    def _stop_shard(self, shard: str) -> None:
        """Reactor: a shard assigned elsewhere: stop reading it, let its in-flight deletes be acknowledged, write
        its markers, then release it."""
        assert self.daemon is not None and self.ownership is not None
        ownership = self.ownership
        log.info(
            "worker %s: shard %s is assigned to %s now: handing it on",
            self.name,
            shard,
            self.assignment.get(shard, "nobody"),
        )

        def release(saved: Any) -> defer.Deferred:
            if saved is not True:
                log.error(
                    "worker %s: shard %s's final markers were not all written; its next owner resends from "
                    "the older ones",
                    self.name,
                    shard,
                )

            def hand_on() -> None:
                self._give_back_acceptance(shard)
                ownership.release(shard, "moved")

            return threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), hand_on)

        def done(_: Any) -> None:
            self.stores.pop(shard, None)
            self.loads.pop(shard, None)
            self._rows.pop(shard, None)
            if shard in self._owned_labels():
                self.metrics.owned.remove(shard)
            self.metrics.stops.inc()
            with self._state:
                self.stopping_shards.discard(shard)
            self._wake.set()

        self.daemon.remove_shard(shard).addBoth(release).addBoth(done)

    def _give_back_acceptance(self, shard: str) -> None:
        """An operator's accept-data-loss this worker took for `shard` but whose pipeline stopped before applying
        it (a move in the same second, a SIGTERM) goes back beside the shard's markers for the next owner: taken
        from ZooKeeper, it would otherwise be lost with this worker's request file and the shard stay halted."""
        store = self.stores.get(shard)
        path = accept_path(self.state_dir, self.region.name, shard if self.topology.sharded else None)
        if store is None or not path.exists():
            return
        try:
            store.request_loss_acceptance()
        except (*UNAVAILABLE, KazooException) as e:
            log.error(
                "worker %s: could not hand shard %s's accepted data loss on (%s): run `squeal accept-data-loss "
                "--shard %s` again",
                self.name,
                shard,
                e,
                shard,
            )
            return
        path.unlink(missing_ok=True)
        log.warning(
            "worker %s: shard %s's accepted data loss was not applied here: handed on to its next owner",
            self.name,
            shard,
        )

    def _owned_labels(self) -> set[str]:
        return {s.labels["shard"] for m in self.metrics.owned.collect() for s in m.samples}

    def _measure(self) -> None:
        """Each owned shard's rows/s and binlog bytes/s since the last measure, each smoothed (`placement.smooth`,
        the region's `squeal_placement.half_life_s`), combined into its load (`placement.shard_load`)."""
        daemon = self.daemon
        if daemon is None:
            return
        now = time.monotonic()
        self.meter.keep(set(daemon.shards))
        for shard, pipeline in list(daemon.shards.items()):
            rows = sum(s.value for m in pipeline.metrics.rows.collect() for s in m.samples if s.name.endswith("_total"))
            before = self._rows.get(shard)
            self._rows[shard] = (rows, now)
            if before is None or now <= before[1]:
                continue
            elapsed = now - before[1]
            previous = self.loads.get(shard, {})
            rows_s = placement.smooth(
                previous.get("rows_s"), max(0.0, (rows - before[0]) / elapsed), elapsed, self.half_life_s
            )
            bytes_s = previous.get("bytes_s", 0.0)
            rate = self.meter.rate.get(shard)
            if rate is not None:  # (None: the binlog's growth is not known yet)
                bytes_s = placement.smooth(
                    previous.get("bytes_s") if "rows_s" in previous else None, max(0.0, rate), elapsed, self.half_life_s
                )
            load = placement.shard_load(rows_s, bytes_s, bytes_per_row=self.bytes_per_row)
            self.loads[shard] = {"rows_s": round(rows_s, 3), "bytes_s": round(bytes_s, 1), "load": round(load, 3)}
            self.metrics.shard_load.labels(shard=shard).set(load)
            self.metrics.shard_rows.labels(shard=shard).set(rows_s)
            self.metrics.shard_bytes.labels(shard=shard).set(bytes_s)
        self.metrics.load.set(sum(v["load"] for s, v in self.loads.items() if s in daemon.shards))

    def _member(self) -> dict[str, Any]:
        shards = sorted(self.daemon.shards) if self.daemon is not None else []
        loads = {s: v for s, v in self.loads.items() if s in shards}
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

    # -- shutdown, status -------------------------------------------------------------------------------------

    def shutdown(self) -> defer.Deferred:
        """SIGTERM: every shard's pipeline flushes and writes its markers, then every shard is released at once
        (its next owner starts without waiting for this session to expire), then the member znode goes."""
        self.stopping = True
        self._stop.set()
        self._wake.set()
        if self.controller is not None:
            self.controller.stop()
        daemon = self.daemon
        d = daemon.shutdown() if daemon is not None else defer.succeed(None)

        def release(_: Any) -> defer.Deferred:
            if daemon is not None:
                self.exit_code = daemon.exit_code
            return threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self._leave)

        return d.addBoth(release)

    def _leave(self) -> None:
        self.meter.stop()
        if self.ownership is not None:
            for shard in list(self.ownership.tokens):
                self._give_back_acceptance(shard)
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
            "loads": dict(self.loads),
            "flows": {f"{name}/{f}": v for name, st in shards.items() for f, v in st["flows"].items()},
            "shards": shards,
        }


def run_worker(
    topology: Topology,
    instance: str,
    state_dir: str | Path | None = None,
    metrics_port: int | None = None,
    from_gtid: str | None = None,
    reply_timeout: float = 2.0,
    sample_every: int = 1000,
) -> int:
    """`squeal run --instance NAME`: a worker of its region's pool, until SIGTERM/SIGINT; returns the exit code."""
    from twisted.internet import reactor

    worker = PoolWorker(
        topology,
        instance,
        state_dir,
        metrics_port,
        from_gtid=from_gtid,
        reactor=reactor,
        reply_timeout=reply_timeout,
        sample_every=sample_every,
    )
    return serve_while_preparing(reactor, worker)


# -- what squealctl asks -----------------------------------------------------------------------------------------


def workers(client: KazooClient, root: str, region: str) -> list[dict[str, Any]]:
    """Every member of the region's pool: name, region, pid, the shards it owns now (from the shards' `owner`
    znodes: ownership, not the plan), its load and the shards the assignment gives it."""
    base = pool_path(root, region)
    try:
        names = client.get_children(f"{base}/workers")
    except NoNodeError:
        names = []
    try:
        assignment = _doc(client.get(f"{base}/assignment")[0]).get("assignment") or {}
    except NoNodeError:
        assignment = {}
    try:
        shard_names = client.get_children(f"{base}/shards")
    except NoNodeError:
        shard_names = []
    owners: dict[str, str] = {}
    for shard in shard_names:
        with contextlib.suppress(NoNodeError):
            owners[shard] = str(_doc(client.get(f"{base}/shards/{shard}/owner")[0]).get("worker"))
    try:
        drains = set(client.get_children(f"{base}/drain"))
    except NoNodeError:
        drains = set()
    out = []
    for name in sorted(names):
        try:
            doc = _doc(client.get(f"{base}/workers/{name}")[0])
        except NoNodeError:
            continue
        out.append(
            {
                "name": name,
                "region": region,
                "pid": doc.get("pid"),
                "shards": sorted(s for s, w in owners.items() if w == name),
                "load": doc.get("load", 0.0),
                "loads": doc.get("loads", {}),
                "assigned": sorted(s for s, w in assignment.items() if w == name),
                "draining": name in drains,
                "healthy": bool(doc.get("healthy", True)),
            }
        )
    return out


def request_drain(client: KazooClient, root: str, region: str, worker: str, undo: bool = False) -> None:
    """`squealctl drain WORKER`: the controller moves the worker's shards to the others (and gives it none)."""
    path = f"{pool_path(root, region)}/drain/{worker}"
    if undo:
        with contextlib.suppress(NoNodeError):
            client.delete(path)
        return
    with contextlib.suppress(NodeExistsError):
        client.create(path, json.dumps({"requested_at": time.time()}).encode(), makepath=True)


def request_move(client: KazooClient, root: str, region: str, shard: str, to: str) -> None:
    """`squealctl move SHARD --to WORKER`: the controller reassigns the shard at its next plan."""
    path = f"{pool_path(root, region)}/move/{shard}"
    data = json.dumps({"to": to, "requested_at": time.time()}).encode()
    try:
        client.create(path, data, makepath=True)
    except NodeExistsError:
        client.set(path, data)
