"""One shard's pipeline: wires reader -> transactions -> rules -> flows -> batcher -> datamarkers together.

A `Daemon` reads one shard's copy in its region (a topology without [shards] has one shard: the region's
database). It is a Twisted service; `squeal run` composes one per shard in a `RegionDaemon` (squeal/shard/region.py,
a `MultiService`), which shares the batchers (one `Sender` per destination for every shard), and the process shell
(squeal/process/shell.py) serves its /metrics and /healthz and handles the signals.

Threads: the live binlog read (and each catch-up read) blocks on a thread of its own; everything else
(flows, sockets to routers, timers, HTTP) runs on the Twisted reactor thread, so flows need no locks.

Lifecycle:
* `check()` / `prepare()` (blocking: before the reactor runs, or on a thread, so start-up errors are plain
  exceptions): check the server's binlog settings, check the rules against information_schema, read each flow's
  datamarker (a new destination starts from the server's current GTID position, or `--from-gtid`).
* `startService()`: the live reader from the earliest datamarker, the source poller, a checkpoint every second
  (datamarkers of flows that moved; operator replay requests are applied first: squeal/markers/checkpoints.py).
* `stopService()` (SIGTERM/SIGINT, through its parent): stop reading, flush what is queued (a few seconds at
  most), write the final markers; its Deferred fires when they are written (or given up on).
* `retire()`: the stop that hands the shard on (a pool's planned move): in-flight deletes acknowledged first, off
  the shared senders, final markers.
* `checkpoint()` at once on SIGHUP: apply replay requests now (`squeal replay` sends it).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
from twisted.application import service
from twisted.internet import defer, task

from router_config import CANARY_TABLE, Database, Region, Topology
from squeal.delivery.batcher import Sender
from squeal.delivery.flows import LIVE, Committed, Dispatcher, Flow
from squeal.delivery.native import AnyFlow, Hub, NativeSender, make_hub
from squeal.delivery.sampler import DeleteSampler
from squeal.keys.bulk import load_cascades
from squeal.keys.pipeline import Handoff, HandoffGroup, KeyStage, ReadLoop
from squeal.keys.rules import KeyExtractor, check_rules, load_columns
from squeal.markers.checkpoints import Checkpoints
from squeal.markers.datamarkers import DatamarkerDirError, DatamarkerStore, FileDatamarkerStore, describe_error
from squeal.process.metrics import Metrics
from squeal.read import gtid as g
from squeal.read.native import NativeBinlogReader, native_module, native_problems
from squeal.read.reader import BinlogReader, Source, check_server, current_position, describe_failure
from squeal.read.source import SourcePoller
from squeal.read.transactions import PreparedXa
from squeal.shard.copies import read_order
from squeal.shard.data_loss import DataLossPolicy

log = logging.getLogger(__name__)


def state_dir_for(topology: Topology, state_dir: str | Path | None) -> Path:
    """--state-dir, else the topology's datamarker_dir (relative to the topology file)."""
    if state_dir is not None:
        return Path(state_dir)
    d = Path(topology.squeal.datamarker_dir)
    return d if d.is_absolute() else Path(topology.source).resolve().parent / d


def source_for(region: Region | Database) -> Source:
    """The binlog source of a region's database (or of one database copy)."""
    db = region.database if isinstance(region, Region) else region
    if db.tls is None:
        return Source(db.host, db.port, db.user, db.password, copy=db.name)
    mine = db.tls.cert("squeal")
    return Source(
        db.host,
        db.port,
        db.user,
        db.password,
        tls=True,
        ssl_ca=db.tls.ca,
        ssl_cert=mine.cert if mine else None,
        ssl_key=mine.key if mine else None,
        copy=db.name,
    )


def connect_with_retry(source: Source, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return source.connect()
        except pymysql.err.OperationalError as e:
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot connect to the database: {describe_failure(source, e)}") from e
            time.sleep(0.5)


class Daemon(service.Service):
    """One shard's pipeline, a Twisted service (see the module docstring)."""

    def __init__(
        self,
        topology: Topology,
        region: str,
        state_dir: str | Path | None = None,
        from_gtid: str | None = None,
        store: DatamarkerStore | None = None,
        reactor: Any = None,
        reply_timeout: float = 2.0,
        checkpoint_interval: float = 1.0,
        connect_timeout: float = 20.0,
        sample_every: int = 1000,
        shard: str | None = None,
        hub: Hub | None = None,
        instance: str | None = None,
        handoffs: HandoffGroup | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.topology = topology
        self.region = topology.region(region)
        if shard is None and len(topology.shards) > 1:
            raise ValueError(
                f"{topology.source}: region {region} has {len(topology.shards)} shards: name one "
                f"({', '.join(s.name for s in topology.shards)})"
            )
        self.shard = topology.shard(shard) if shard is not None else topology.shards[0]
        # The region's copy of the shard (without [shards]: the region's database): what the web tier reads, so
        # what lag is measured against (the source poller), and the last copy the readers fall back to.
        self.database = topology.shard_copy(self.shard.name, self.region.name)
        # The copies the readers read, in the order they try them (squeal/shard/copies.py), each with why; `instance`:
        # the pool worker this pipeline runs in (None: the region's single daemon).
        self.read_order = read_order(topology, self.shard.name, self.region.name, instance)
        self.read_sources = [source_for(d) for d, _ in self.read_order]
        self._first_copy = 0  # the one `check` found answering first: the readers start there
        self.rules = topology.rules_for(self.shard.name)
        self.state_dir = state_dir_for(topology, state_dir)
        self.shard_dir = self.state_dir / "shards" / self.shard.name if topology.sharded else self.state_dir
        self.store: DatamarkerStore = store or FileDatamarkerStore(self.shard_dir)
        self.from_gtid = g.parse_position(from_gtid) if from_gtid else None
        self.reply_timeout = reply_timeout
        self.checkpoint_interval = checkpoint_interval
        self.sampler = DeleteSampler(every=sample_every)
        self.connect_timeout = connect_timeout
        self.settings = topology.squeal
        self.metrics = Metrics()
        # Shared batchers (a RegionDaemon's), or our own: one Sender per destination either way.
        self.hub = hub or make_hub(reactor, self.settings, self.metrics, self.sampler, reply_timeout, tls=topology.tls)
        self.source = source_for(self.database)  # (the source poller's)
        # The reactor's side of the live reader's hand-off: shared by a RegionDaemon's shards, else our own.
        self.handoffs = handoffs or HandoffGroup(reactor)
        self._live_handoff: Handoff | None = None
        self.extractor = KeyExtractor(self.rules)
        prefixes = self.region.regional_pool.prefixes if self.region.regional_pool else ()
        self.stage = KeyStage(self.extractor, prefixes, self.metrics, rules=self.rules)
        self.xa = PreparedXa()  # undecided XA prepares: datamarkers and catch-up readers stay before them
        self.flows: dict[str, AnyFlow] = {}
        self.senders: dict[str, Sender | NativeSender] = {}
        self.catchups: dict[str, ReadLoop] = {}
        self.live: ReadLoop | None = None
        self.dispatcher: Dispatcher | None = None
        self.stopping = False
        self.exit_code = 0
        self._stopped: defer.Deferred | None = None  # stopService's or retire's: fires once stopped
        # Why the daemon is unhealthy, by cause (e.g. "data_loss", "datamarker:east-a"): /healthz answers 503
        # while any is set. Each part of the daemon sets and clears its own entries.
        self.problems: dict[str, str] = {}
        # Binlog data loss (squeal/shard/data_loss.py): with on_data_loss = "halt" readers wait until an operator
        # accepts the loss (`squeal accept-data-loss`, a request file taken at the next checkpoint).
        self.data_loss = DataLossPolicy(
            reactor,
            self.settings,
            self.metrics,
            self.problems,
            self.state_dir,
            self.region.name,
            self.shard.name if topology.sharded else None,
        )
        # Datamarker rounds, replay requests, marker health, the final markers (squeal/markers/checkpoints.py).
        self.checkpoints = Checkpoints(
            reactor, self.store, self.flows, self.xa, self.metrics, self.settings, self.problems, self.state_dir
        )
        self._checkpoint_timer: task.LoopingCall | None = None  # start_checkpoints': every checkpoint_interval
        self.source_poller: SourcePoller | None = None  # the source's position and replication lag (prepare)
        self.reader_kind = "python"  # "native" when prepare() chose squeal_native ([squeal] reader)
        self._check_lock = threading.Lock()
        self._checked_at: float | None = None  # when `check` was done (monotonic)
        self._checked_now: g.Position | None = None  # the copy's position when it was

    # -- start-up ----------------------------------------------------------------------------------------

    def check(self) -> None:
        """The blocking checks that need neither the datamarkers nor the right to send: the copy's binlog
        settings, the rules against its columns, its cascading foreign keys, the reader. Done once (later calls
        return at once; a concurrent one waits for it): a pool worker runs it for a shard before it owns it, so
        that a move's pause or a takeover holds only what does need ownership (`prepare`). Raises like `prepare`."""
        with self._check_lock:
            if self._checked_at is not None:
                return
            conn = self._connect_first()
            try:
                self._check_fallbacks()
                check_server(conn, replica=self.read_order[self._first_copy][0].role == "replica")
                columns = load_columns(conn, self.extractor.tables)
                places = [i for i, r in enumerate(self.topology.rules) if r.applies_to(self.shard.name)]
                for warning in check_rules(self.rules, columns, places):
                    # the canary's table appears with the prober's first probe: expected, not a mistake
                    level = logging.INFO if f"(table {CANARY_TABLE})" in warning else logging.WARNING
                    log.log(level, "%s%s", f"shard {self.shard.name}: " if self.topology.sharded else "", warning)
                self.stage.bulk.set_cascades(load_cascades(conn))
                self.reader_kind = self._choose_reader(conn)
                self._checked_now = current_position(conn)
            finally:
                conn.close()
            check_writable = getattr(self.store, "check_writable", None)
            if check_writable is not None:
                check_writable()  # an unwritable marker dir: a one-line start-up error, not a failure a second later
            self._checked_at = time.monotonic()

    def _connect_first(self) -> Any:
        """A connection to the first copy of the read order that answers (`_first_copy`: where the readers
        start), trying them in turn until `connect_timeout`; ConnectionError naming the last failure then."""
        deadline = time.monotonic() + self.connect_timeout
        failure = ""
        while True:
            for index, source in enumerate(self.read_sources):
                try:
                    conn = source.connect(connect_timeout=2 if index < len(self.read_sources) - 1 else 5)
                except pymysql.err.OperationalError as e:
                    failure = describe_failure(source, e)
                    continue
                if index:
                    log.warning(
                        "shard %s: %s does not answer; starting on %s (%s)",
                        self.shard.name,
                        self.read_sources[0],
                        source,
                        self.read_order[index][1],
                    )
                self._first_copy = index
                return conn
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot connect to the database: {failure}")
            time.sleep(0.5)

    def _check_fallbacks(self) -> None:
        """The binlog settings of every other copy of the read order that answers now (a reader may switch to it
        later); one that does not answer is checked by nobody, and said so."""
        for index, ((db, _), source) in enumerate(zip(self.read_order, self.read_sources, strict=True)):
            if index == self._first_copy:
                continue
            try:
                conn = source.connect(connect_timeout=2)
            except pymysql.err.OperationalError as e:
                log.warning("shard %s: %s, a copy it may read, not checked now: %s", self.shard.name, source, e)
                continue
            try:
                check_server(conn, replica=db.role == "replica")
            finally:
                conn.close()

    @property
    def checked(self) -> bool:
        """Whether `check` is done."""
        return self._checked_at is not None

    def _now(self, fresh: bool) -> g.Position:
        """The copy's position now (where a destination without a datamarker starts): the one `check` read, or,
        if that was a while ago (`fresh` False: checked before this pipeline was needed), read again."""
        if fresh and self._checked_now is not None:
            return self._checked_now
        conn = connect_with_retry(self.read_sources[self._first_copy], self.connect_timeout)
        try:
            return current_position(conn)
        finally:
            conn.close()

    def prepare(self) -> None:
        """Blocking checks (`check`, unless done before) and state loading: the flows start from their
        datamarkers. Raises ReaderConfigError / RuleError with a clear message."""
        checked_before = self._checked_at is not None
        self.check()
        now: g.Position | None = None
        names = [c.name for c in self.region.clusters] + (["regional"] if self.region.regional_pool else [])
        starts: dict[str, g.Position] = {}
        unsaved: set[str] = set()  # flows not starting from their datamarker: theirs is written before they run
        for name in names:
            try:
                marker = self.store.load(name)
            except OSError as e:
                raise DatamarkerDirError(f"cannot read the datamarker of flow {name}: {describe_error(e)}") from e
            if marker is not None:
                starts[name] = g.parse_position(marker)
                how = "its datamarker"
            elif self.from_gtid is not None:
                starts[name] = dict(self.from_gtid)
                how = "--from-gtid"
            else:
                if now is None:
                    now = self._now(fresh=not checked_before)
                starts[name] = dict(now)  # a new destination starts from "now"
                how = "now (no datamarker yet)"
            if marker is None:
                unsaved.add(name)
            log.info("flow %s starts after %s (%s)", name, g.format_position(starts[name]) or "the start", how)
        for name, position in self.store.take_replay_requests().items():
            if name in starts:
                starts[name] = g.parse_position(position)
                unsaved.add(name)
                log.info("flow %s: replay request, starts after %s", name, position or "the start")
        s = self.settings
        flows = self.hub.flows_for_region(self.region, starts, s.max_backlog, self.metrics, shard=self.shard.name)
        for f in flows:
            self.flows[f.name] = f
            try:
                if f.name in unsaved:  # a new destination's "now" (or a replay's start) is now durable
                    self.store.save(f.name, g.format_position(f.acked))
            except OSError as e:
                raise DatamarkerDirError(
                    f"cannot write the datamarker of flow {f.name} in {self.checkpoints.where}: {describe_error(e)}"
                ) from e
            self.checkpoints.watch_flow(f)
            f.on_shed = self._on_shed
            self.senders[f.name] = self.hub.attach(f)
        start = g.earliest([f.acked for f in flows])
        self.dispatcher = self.hub.dispatcher(flows, start)
        bulk = self.stage.bulk
        for parent in sorted(bulk.parents):
            children = {r.table: r.on_truncate for k in ("delete", "update") for r in bulk.cascade_targets(parent, k)}
            log.warning(
                "foreign keys: deleting or updating a row of %s.%s changes %s through ON DELETE/UPDATE "
                "actions MariaDB does not log; squeal applies their on_truncate policy to such changes (%s)",
                parent[0],
                parent[1],
                ", ".join(sorted(children)),
                ", ".join(f"{t}: {p}" for t, p in sorted(children.items())),
            )
        # The parents of cascading foreign keys are read too (their row events signal the cascades).
        self.read_tables = self.extractor.tables | self.stage.bulk.parents
        reader = self._reader(start, "live")
        handoff = self._live_handoff = Handoff(
            self.reactor,
            self._deliver_live,
            bound=max(100, s.max_backlog // 4),
            ready=self._live_room,
            group=self.handoffs,
        )
        self.live = ReadLoop(
            reader, self.stage, handoff.put, self.metrics, xa=self.xa, on_data_loss=self.data_loss.on_data_loss
        )
        self.metrics.reader_connected.labels(reader="live").set_function(lambda: int(reader.connected.is_set()))
        self.source_poller = SourcePoller(
            self.source,
            replica=self.database.role == "replica",
            metrics=self.metrics,
            positions=lambda: [dict(f.acked) for f in flows],
            on_problem=lambda text: self.reactor.callFromThread(self._source_problem, text),
        )
        for f in flows:
            f.source_lag = self.source_poller.behind  # lag against the source, even when nothing is queued
        if not checked_before:  # (checked ahead, as a pool worker does: the poller's thread polls first thing)
            self.source_poller.tick()  # a first poll now: /healthz and the gauges know the source from the start

    def _choose_reader(self, conn: Any) -> str:
        """[squeal] reader: "native" needs the extension (else a start-up error) and rules whose columns it
        renders exactly like python-mysql-replication (else a warning and the python reader)."""
        if self.settings.reader != "native":
            return "python"
        native_module()
        problems = native_problems(conn, self.extractor.text_columns)
        if problems:
            log.warning(
                'reader = "native": rules name columns the native reader cannot render exactly '
                "like python-mysql-replication (%s); reading with python-mysql-replication instead",
                "; ".join(problems),
            )
            return "python"
        log.info("binlog reader: native (squeal_native)")
        return "native"

    def _live_room(self) -> bool:
        """Reactor: the live stream goes on while some live flow is below half its bound (or none is live)."""
        live = [f for f in self.flows.values() if f.state == LIVE]
        return not live or any(f.backlog < f.max_backlog // 2 for f in live)

    def _reader(self, start: g.Position, name: str) -> BinlogReader | NativeBinlogReader:
        # a catch-up reader starts on the copy the live one reads now
        first = self.live.reader.current if self.live is not None else self._first_copy
        if self.reader_kind == "native":
            return NativeBinlogReader(
                self.read_sources,
                start,
                self.read_tables,
                self.extractor.templates,
                self.stage.bulk.parents,
                name=name,
                filters=self.extractor.filters,
                regional_prefixes=self.stage.regional_prefixes,
                first=first,
            )
        return BinlogReader(self.read_sources, start, self.read_tables, name=name, first=first)

    @property
    def registry(self) -> Any:
        """The Prometheus registry of this pipeline's metrics."""
        return self.metrics.registry

    def start_pipeline(self) -> None:
        """The live reader, the source poller and the checkpoints (no HTTP, signals or pid file)."""
        assert self.live is not None
        self.live.start()
        if self.source_poller is not None:
            self.source_poller.start()
        self.start_checkpoints()

    def start_checkpoints(self) -> None:
        """The checkpoint timer (`checkpoint(periodic=True)` every `checkpoint_interval`)."""
        timer = self._checkpoint_timer = task.LoopingCall(self.checkpoint, periodic=True)
        timer.clock = self.reactor
        timer.start(self.checkpoint_interval, now=False)

    def _stop_checkpoint_timer(self) -> None:
        if self._checkpoint_timer is not None and self._checkpoint_timer.running:
            self._checkpoint_timer.stop()

    def startService(self) -> None:  # noqa: N802 - Twisted's name
        """The pipeline starts delivering (after `prepare`)."""
        super().startService()
        self.start_pipeline()

    def stopService(self) -> defer.Deferred:  # noqa: N802 - Twisted's name
        """`shutdown` with its default time-outs; once stopped (or retired), the same stop again (a parent's
        `removeService` after `retire`): fires when the final markers are written or given up on."""
        super().stopService()
        if self._stopped is None:
            self._stopped = self.shutdown()
        return self._when_stopped()

    def _when_stopped(self) -> defer.Deferred:
        """A Deferred of its own that fires (None) with `_stopped`, which it leaves as it is."""
        assert self._stopped is not None
        d: defer.Deferred = defer.Deferred()

        def fire(result: Any) -> Any:
            d.callback(None)
            return result

        self._stopped.addBoth(fire)
        return d

    # -- the live stream and catch-up readers -------------------------------------------------------------

    def _deliver_live(self, items: list[Committed]) -> None:
        assert self.dispatcher is not None
        for c in items:
            self.dispatcher.dispatch(c)
        if self.catchups and self.dispatcher.pieces is None:
            # A flow whose catch-up reader has read everything waits for the live stream to be between
            # transactions (it may have been in the middle of one sent in pieces): now it is.
            for name, loop in list(self.catchups.items()):
                self._rejoin_if_caught_up(self.dispatcher.flows[name], loop)

    def _on_shed(self, flow: Flow) -> None:
        log.warning(
            "flow %s: backlog passed %d keys; shed from memory, a catch-up reader re-reads from %s",
            flow.name,
            flow.max_backlog,
            g.format_position(flow.acked) or "the start",
        )
        old = self.catchups.pop(flow.name, None)
        if old is not None:
            old.reader.stop()
        if not self.stopping:
            self.reactor.callLater(0, self._start_catchup, flow)

    def _start_catchup(self, flow: Flow) -> None:
        assert self.dispatcher is not None
        if self.stopping or flow.name in self.catchups:
            return
        start = self.xa.cap(flow.start_catchup())  # from before any undecided XA prepare: its rows are needed
        if flow.caught_up(self.dispatcher.live, self.dispatcher.pieces):
            flow.rejoin()
            return
        reader = self._reader(start, f"catchup-{flow.name}")
        bound = max(1, flow.max_backlog // 2)

        def brake() -> None:  # catch-up thread: hold back while the destination has not taken what it has
            # (the timeout only bounds how long a stopped reader takes to notice)
            while not flow.wait_room(bound, 0.1) and not reader.stopped:
                pass

        loop: ReadLoop
        handoff = Handoff(
            self.reactor, lambda items: self._deliver_catchup(flow, loop, items), bound=max(100, bound // 2)
        )
        loop = ReadLoop(
            reader, self.stage, handoff.put, self.metrics, wait=brake, on_data_loss=self.data_loss.on_data_loss
        )
        self.catchups[flow.name] = loop
        log.info("flow %s: catch-up reader from %s", flow.name, g.format_position(start) or "the start")
        loop.start()

    def _deliver_catchup(self, flow: Flow, loop: ReadLoop, items: list[Committed]) -> None:
        assert self.dispatcher is not None
        if self.catchups.get(flow.name) is not loop:
            return  # a catch-up reader that was replaced (replay) or finished
        for c in items:
            flow.offer_catchup(c)
            if self._rejoin_if_caught_up(flow, loop):
                return

    def _rejoin_if_caught_up(self, flow: Flow, loop: ReadLoop) -> bool:
        assert self.dispatcher is not None
        if not flow.caught_up(self.dispatcher.live, self.dispatcher.pieces):
            return False
        flow.rejoin()
        del self.catchups[flow.name]
        loop.reader.stop()
        log.info("flow %s: caught up at %s, back on the live stream", flow.name, g.format_position(flow.enqueued))
        return True

    # -- the checkpoint tick, lag health ------------------------------------------------------------------------

    def checkpoint(self, periodic: bool = False) -> None:
        """The once-a-second tick (and SIGHUP's, `squeal replay`'s "apply now"): take an operator's acceptance of
        data loss, forget decided XA prepares, check lag, then a checkpoint round (squeal/markers/checkpoints.py: apply
        replay requests, write the datamarkers of flows that moved; never waits for the disk).

        `periodic` (the checkpoint timer): replay requests are looked for only if the store knows of a change
        (`take_replay_requests(if_changed=True)`: a ZooKeeper store's watch); an asked checkpoint (SIGHUP) looks.
        Never raises: that would stop the checkpoint loop for good.
        """
        try:
            self.data_loss.take_acceptance()
            self.xa.forget_decided([f.acked for f in self.flows.values()])
            self.metrics.xa_prepared.set(len(self.xa))
        except Exception:
            log.exception("checkpoint: data-loss or XA bookkeeping failed; retried at the next one")
        try:
            self._watch_lag()
        except Exception:
            log.exception("checkpoint: the lag check failed; retried at the next one")
        self.checkpoints.run(if_changed=periodic)
        if self.live is not None and self.live.error is not None and not self.stopping:
            log.error("the live binlog reader died (%s); exiting", self.live.error)
            self.exit_code = 1
            self.reactor.stop()

    def _watch_lag(self) -> None:
        """/healthz: a flow further behind the primary's commits than max_lag_s is a problem naming the copy this
        pipeline reads (a stalled replica, a dead destination); cleared when it is back under the limit."""
        limit = self.settings.max_lag_s
        source = self.source_poller.snapshot() if self.source_poller is not None else None
        for name, flow in self.flows.items():
            key = f"lag:{name}"
            lag = flow.lag()
            if lag <= limit:
                self.problems.pop(key, None)
                continue
            why = f"its destination has not acknowledged for {lag:.0f}s" if flow.backlog else "nothing reached it"
            copy = f"{self.database.name or self.region.name} ({self.database.address}, {self.database.role})"
            if source and source.get("role") == "replica":
                rep = source.get("replication") or {}
                why = (
                    f"its source, the replica {copy}, is {source.get('replication_lag') or 0:.0f}s behind its "
                    f"primary (replication io {rep.get('io_running', '?')}, sql {rep.get('sql_running', '?')})"
                    if flow.backlog == 0
                    else why
                )
            elif source and not source.get("up", True):
                why = f"its source {copy} does not answer"
            self.problems[key] = f"flow {name}: {lag:.0f}s behind the primary's commits (max_lag_s = {limit:g}): {why}"

    def status(self) -> dict[str, Any]:
        live = self.live
        ok = live is not None and live.error is None and live.thread is not None and live.thread.is_alive()
        return {
            "ok": bool(ok) and not self.stopping and not self.problems,
            "problems": dict(self.problems),
            "region": self.region.name,
            "shard": self.shard.name,
            "database": {"name": self.database.name, "address": str(self.database.address)},
            "reads": self._reads(),
            "reader_connected": bool(live and live.reader.connected.is_set()),
            "live_position": g.format_position(self.dispatcher.live) if self.dispatcher else "",
            "source": self.source_poller.snapshot() if self.source_poller is not None else None,
            "alerts": list(self.stage.alerts)[-10:],  # recent changes without row images (TRUNCATE, ...)
            "xa_prepared": len(self.xa),
            "flows": {
                n: {"state": f.state, "backlog": f.backlog, "acked": g.format_position(f.acked)}
                for n, f in self.flows.items()
            },
        }

    def _reads(self) -> dict[str, Any]:
        """/healthz: the copy the live reader reads now, why, and the order it falls back in."""
        index = self.live.reader.current if self.live is not None else self._first_copy
        db, why = self.read_order[index]
        if index:
            why = f"{self.read_order[0][0].name} is not read now (it failed or is behind); {why}"
        return {
            "name": db.name,
            "address": str(db.address),
            "why": why,
            "order": [d.name for d, _ in self.read_order],
        }

    # -- the source poller ---------------------------------------------------------------------------------------

    def _source_problem(self, text: str | None) -> None:
        """The source poller: the database could not be polled for long (text), or can be again (None)."""
        if text is None:
            self.problems.pop("source", None)
        else:
            log.error("%s", text)
            self.problems["source"] = text

    # -- shutdown ----------------------------------------------------------------------------------------------

    def _stop_reading(self) -> None:
        """Stop the live reader, the source poller and every catch-up reader (shutdown and hand-on)."""
        self.stopping = True
        if self._live_handoff is not None:
            self._live_handoff.close()
        if self.live is not None:
            self.live.reader.stop()
        if self.source_poller is not None:
            self.source_poller.stop(timeout=0)
        for loop in self.catchups.values():
            loop.reader.stop()

    def shutdown(self, flush_timeout: float = 3.0, save_timeout: float = 3.0) -> defer.Deferred:
        """Stop reading, flush queued deletes (bounded time), write the datamarkers (bounded time: markers
        still unwritten after `save_timeout`, a failing or hung store, are an ERROR and exit code 1). Runs
        before the reactor stops; the Deferred it returns always fires."""
        self._stop_reading()
        finished: defer.Deferred = defer.Deferred()

        finishing: list[bool] = []

        def finish(_: Any = None) -> None:
            if finishing:
                return
            finishing.append(True)
            try:
                for s in self.senders.values():
                    s.stop()
                self._stop_checkpoint_timer()
                saved = self.checkpoints.final(save_timeout)
            except Exception:
                log.exception("shutdown: writing the datamarkers failed")
                saved = defer.succeed(False)
            saved.addBoth(done)

        def done(saved: Any) -> None:
            try:
                markers = {n: g.format_position(f.acked) for n, f in self.flows.items()}
                unsaved = self.checkpoints.unsaved()
                if saved is not True and unsaved:
                    errors = [e for e in (self.checkpoints.watch.last_error(n) for n in unsaved) if e]
                    log.error(
                        "could not save the datamarkers of flow(s) %s in %s within %gs (%s); on restart "
                        "they resume from their older markers and send those deletes again",
                        ", ".join(f"{n} at {markers[n]}" for n in unsaved),
                        self.checkpoints.where,
                        save_timeout,
                        errors[0] if errors else "the write has not returned (a hung disk?)",
                    )
                    self.exit_code = self.exit_code or 1
                elif saved is not True:
                    log.warning(
                        "the datamarker store in %s did not answer within %gs (every marker was already written)",
                        self.checkpoints.where,
                        save_timeout,
                    )
                log.info("stopped; datamarkers: %s", markers)
            except Exception:
                log.exception("shutdown failed")
                self.exit_code = self.exit_code or 1
            finally:
                if not finished.called:
                    finished.callback(None)

        timeout = self.reactor.callLater(flush_timeout, finish)  # a dead destination must not hold us up
        drained = defer.DeferredList([s.when_drained() for s in self.senders.values()])

        def drained_all(_: Any) -> None:
            if timeout.active():
                timeout.cancel()
            finish()

        drained.addCallback(drained_all)
        return finished

    def retire(self, flush_timeout: float = 10.0, save_timeout: float = 5.0) -> defer.Deferred:
        """Stop this pipeline and hand its shard on (a worker pool's planned move, `RegionDaemon.remove_shard`):
        stop reading, wait (at most `flush_timeout`) until every flow has nothing queued or in flight, take the
        flows off the shared senders (which keep serving the other shards), write the final markers (at most
        `save_timeout`). Fires True if every marker is written: the next owner starts exactly where this one's
        destinations acknowledged. Anything unacknowledged at the time-out stays after the markers: the next owner
        sends it again (at least once, never a gap). The service is stopped from here on: a later `stopService`
        (its parent's `removeService`) waits for this hand-on instead of shutting down again."""
        super().stopService()
        self._stop_reading()
        result: defer.Deferred = defer.Deferred()
        self._stopped = result
        started = self.reactor.seconds()

        def idle() -> bool:
            return all(not f.queue and not f.sending for f in self.flows.values())

        def hand_on() -> None:
            poll.stop()
            self._stop_checkpoint_timer()
            if not idle():
                log.warning(
                    "shard %s: deletes still unacknowledged after %gs (%s); the next owner sends them again",
                    self.shard.name,
                    flush_timeout,
                    ", ".join(f"{n}: {f.backlog} keys" for n, f in self.flows.items() if f.queue),
                )
            for name, flow in self.flows.items():
                sender = self.senders.get(name)
                if sender is not None and flow in sender.flows:
                    sender.remove_flow(flow)
            saved = self.checkpoints.final(save_timeout)

            def handed_on(ok: Any) -> None:
                self.checkpoints.close()
                result.callback(ok)

            saved.addBoth(handed_on)

        def check() -> None:
            if idle() or self.reactor.seconds() - started >= flush_timeout:
                hand_on()

        poll = task.LoopingCall(check)
        poll.clock = self.reactor
        poll.start(0.02, now=True)
        return result
