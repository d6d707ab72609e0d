"""The daemon: wires reader -> transactions -> rules -> flows -> batcher -> datamarkers together.

Threads: the live binlog read (and each catch-up read) blocks on a thread of its own; everything else
(flows, sockets to routers, timers, HTTP) runs on the Twisted reactor thread, so flows need no locks.

Lifecycle:
* `prepare()` (before the reactor runs, so start-up errors are plain exceptions and a non-zero exit):
  check the server's binlog settings, check the rules against information_schema, read each flow's
  datamarker (a new destination starts from the server's current GTID position, or `--from-gtid`).
* `start()`: HTTP `/metrics` + `/healthz`, the live reader from the earliest datamarker, a checkpoint
  every second (datamarkers of flows that moved; operator replay requests are applied first).
* SIGTERM/SIGINT: stop reading, flush what is queued (a few seconds at most), checkpoint, exit 0.
* SIGHUP: apply replay requests now (`squeal replay` sends it).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
from prometheus_client.twisted import MetricsResource
from twisted.internet import defer, task
from twisted.web import resource, server

from router_config import Region, Topology
from squeal import gtid as g
from squeal.batcher import Sender
from squeal.datamarkers import DatamarkerStore, FileDatamarkerStore
from squeal.flows import Committed, Dispatcher, Flow, flows_for_region
from squeal.metrics import Metrics
from squeal.pipeline import Handoff, KeyStage, ReadLoop
from squeal.reader import BinlogReader, Source, check_server, current_position
from squeal.rules import KeyExtractor, check_rules, load_columns
from squeal.sampler import DeleteSampler

log = logging.getLogger(__name__)


def state_dir_for(topology: Topology, state_dir: str | Path | None) -> Path:
    """--state-dir, else the topology's datamarker_dir (relative to the topology file)."""
    if state_dir is not None:
        return Path(state_dir)
    d = Path(topology.squeal.datamarker_dir)
    return d if d.is_absolute() else Path(topology.source).resolve().parent / d


def source_for(region: Region) -> Source:
    db = region.database
    return Source(db.host, db.port, db.user, db.password)


def connect_with_retry(source: Source, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return source.connect()
        except pymysql.err.OperationalError as e:
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot connect to the database {source.host}:{source.port}: {e}") from e
            time.sleep(0.5)


class _SampledDeletes(resource.Resource):
    """`GET /sampled-deletes?since=UNIXTIME`: 1-in-N acknowledged deletes, for the prober to re-check."""

    isLeaf = True

    def __init__(self, sampler: DeleteSampler) -> None:
        super().__init__()
        self.sampler = sampler

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - Twisted's name
        try:
            since = float(request.args.get(b"since", [b"0"])[0])
        except ValueError:
            request.setResponseCode(400)
            return b"since must be a unix time\n"
        request.setHeader(b"content-type", b"application/json")
        return json.dumps([{"flow": s.flow, "key": s.key, "acked_at": s.acked_at}
                           for s in self.sampler.recent(since)]).encode()


class _Health(resource.Resource):
    isLeaf = True

    def __init__(self, daemon: Daemon) -> None:
        super().__init__()
        self.daemon = daemon

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - Twisted's name
        status = self.daemon.status()
        request.setResponseCode(200 if status["ok"] else 503)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(status).encode() + b"\n"


class Daemon:
    def __init__(self, topology: Topology, region: str, state_dir: str | Path | None = None,
                 metrics_port: int | None = None, from_gtid: str | None = None,
                 store: DatamarkerStore | None = None, reactor: Any = None, reply_timeout: float = 2.0,
                 checkpoint_interval: float = 1.0, connect_timeout: float = 20.0,
                 sample_every: int = 1000) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor
            reactor = default_reactor
        self.reactor = reactor
        self.topology = topology
        self.region = topology.region(region)
        self.state_dir = state_dir_for(topology, state_dir)
        self.store: DatamarkerStore = store or FileDatamarkerStore(self.state_dir)
        self.metrics_port = metrics_port
        self.from_gtid = g.parse_position(from_gtid) if from_gtid else None
        self.reply_timeout = reply_timeout
        self.checkpoint_interval = checkpoint_interval
        self.sampler = DeleteSampler(every=sample_every)
        self.connect_timeout = connect_timeout
        self.settings = topology.squeal
        self.metrics = Metrics()
        self.source = source_for(self.region)
        self.extractor = KeyExtractor(topology.rules)
        prefixes = self.region.regional_pool.prefixes if self.region.regional_pool else ()
        self.stage = KeyStage(self.extractor, prefixes, self.metrics)
        self.flows: dict[str, Flow] = {}
        self.senders: dict[str, Sender] = {}
        self.catchups: dict[str, ReadLoop] = {}
        self.live: ReadLoop | None = None
        self.dispatcher: Dispatcher | None = None
        self.stopping = False
        self.exit_code = 0
        self._site_port: Any = None

    # -- start-up ----------------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Blocking checks and state loading. Raises ReaderConfigError / RuleError with a clear message."""
        conn = connect_with_retry(self.source, self.connect_timeout)
        try:
            check_server(conn, replica=self.region.database.role == "replica")
            columns = load_columns(conn, self.extractor.tables)
            for warning in check_rules(self.topology.rules, columns):
                log.warning("%s", warning)
            now = current_position(conn)
        finally:
            conn.close()
        names = [c.name for c in self.region.clusters] + (["regional"] if self.region.regional_pool else [])
        starts: dict[str, g.Position] = {}
        for name in names:
            marker = self.store.load(name)
            if marker is not None:
                starts[name] = g.parse_position(marker)
                how = "its datamarker"
            elif self.from_gtid is not None:
                starts[name] = dict(self.from_gtid)
                how = "--from-gtid"
            else:
                starts[name] = dict(now)  # a new destination starts from "now"
                how = "now (no datamarker yet)"
            log.info("flow %s starts after %s (%s)", name, g.format_position(starts[name]) or "the start", how)
        for name, position in self.store.take_replay_requests().items():
            if name in starts:
                starts[name] = g.parse_position(position)
                log.info("flow %s: replay request, starts after %s", name, position or "the start")
        s = self.settings
        flows = flows_for_region(self.region, starts, s.max_backlog, self.metrics)
        for f in flows:
            self.flows[f.name] = f
            self.store.save(f.name, g.format_position(f.acked))  # a new destination's "now" is now durable
            f.on_shed = self._on_shed
            self.senders[f.name] = Sender(f, self.reactor, s.batch_size, s.flush_interval_ms / 1000.0,
                                          reply_timeout=self.reply_timeout, metrics=self.metrics,
                                          sampler=self.sampler)
        start = g.earliest([f.acked for f in flows])
        self.dispatcher = Dispatcher(flows, start)
        reader = BinlogReader(self.source, start, self.extractor.tables, name="live")
        handoff = Handoff(self.reactor, self._deliver_live, bound=max(100, s.max_backlog // 4))
        self.live = ReadLoop(reader, self.stage, handoff.put, self.metrics)
        self.metrics.reader_connected.labels(reader="live").set_function(lambda: int(reader.connected.is_set()))

    def start(self) -> None:
        """Call with the reactor about to run (or running)."""
        if self.metrics_port is not None:
            root = resource.Resource()
            root.putChild(b"metrics", MetricsResource(registry=self.metrics.registry))
            root.putChild(b"healthz", _Health(self))
            root.putChild(b"sampled-deletes", _SampledDeletes(self.sampler))
            # loopback only: /metrics is for the local scraper, not the network
            self._site_port = self.reactor.listenTCP(self.metrics_port, server.Site(root), interface="127.0.0.1")
        assert self.live is not None
        self.live.start()
        self._checkpoints = task.LoopingCall(self.checkpoint)
        self._checkpoints.clock = self.reactor
        self._checkpoints.start(self.checkpoint_interval, now=False)
        self.reactor.addSystemEventTrigger("before", "shutdown", self.shutdown)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda *_: self.reactor.callFromThread(self.checkpoint))
        self._write_pid()

    # -- the live stream and catch-up readers -------------------------------------------------------------

    def _deliver_live(self, items: list[Committed]) -> None:
        assert self.dispatcher is not None
        for c in items:
            self.dispatcher.dispatch(c)

    def _on_shed(self, flow: Flow) -> None:
        log.warning("flow %s: backlog passed %d keys; shed from memory, a catch-up reader re-reads from %s",
                    flow.name, flow.max_backlog, g.format_position(flow.acked) or "the start")
        old = self.catchups.pop(flow.name, None)
        if old is not None:
            old.reader.stop()
        if not self.stopping:
            self.reactor.callLater(0, self._start_catchup, flow)

    def _start_catchup(self, flow: Flow) -> None:
        assert self.dispatcher is not None
        if self.stopping or flow.name in self.catchups:
            return
        start = flow.start_catchup()
        if flow.caught_up(self.dispatcher.live):
            flow.rejoin()
            return
        reader = BinlogReader(self.source, start, self.extractor.tables, name=f"catchup-{flow.name}")
        bound = max(1, flow.max_backlog // 2)

        def brake() -> None:  # catch-up thread: hold back while the destination has not taken what it has
            while flow.backlog > bound and not reader.stopped:
                time.sleep(0.01)

        loop: ReadLoop
        handoff = Handoff(self.reactor, lambda items: self._deliver_catchup(flow, loop, items),
                          bound=max(100, bound // 2))
        loop = ReadLoop(reader, self.stage, handoff.put, self.metrics, wait=brake)
        self.catchups[flow.name] = loop
        log.info("flow %s: catch-up reader from %s", flow.name, g.format_position(start) or "the start")
        loop.start()

    def _deliver_catchup(self, flow: Flow, loop: ReadLoop, items: list[Committed]) -> None:
        assert self.dispatcher is not None
        if self.catchups.get(flow.name) is not loop:
            return  # a catch-up reader that was replaced (replay) or finished
        for c in items:
            flow.offer_catchup(c)
            if flow.caught_up(self.dispatcher.live):
                flow.rejoin()
                del self.catchups[flow.name]
                loop.reader.stop()
                log.info("flow %s: caught up at %s, back on the live stream", flow.name,
                         g.format_position(flow.enqueued))
                return

    # -- checkpoints, replay, health --------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Apply replay requests, then write the datamarkers of flows that moved."""
        for name, position in self.store.take_replay_requests().items():
            flow = self.flows.get(name)
            if flow is None:
                log.error("replay request for unknown flow %r ignored (flows: %s)", name, ", ".join(self.flows))
                continue
            log.warning("flow %s: replay from %s requested", name, position or "the start")
            flow.rewind(g.parse_position(position))
        for flow in self.flows.values():
            if flow.dirty:
                flow.dirty = False
                self.store.save(flow.name, g.format_position(flow.acked))
                self.metrics.checkpoints.labels(flow=flow.name).inc()
        if self.live is not None and self.live.error is not None and not self.stopping:
            log.error("the live binlog reader died (%s); exiting", self.live.error)
            self.exit_code = 1
            self.reactor.stop()

    def status(self) -> dict[str, Any]:
        live = self.live
        ok = live is not None and live.error is None and live.thread is not None and live.thread.is_alive()
        return {
            "ok": bool(ok) and not self.stopping,
            "region": self.region.name,
            "reader_connected": bool(live and live.reader.connected.is_set()),
            "live_position": g.format_position(self.dispatcher.live) if self.dispatcher else "",
            "flows": {n: {"state": f.state, "backlog": f.backlog, "acked": g.format_position(f.acked)}
                      for n, f in self.flows.items()},
        }

    def _pid_path(self) -> Path:
        return self.state_dir / f"squeal-{self.region.name}.pid"

    def _write_pid(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._pid_path().write_text(f"{os.getpid()}\n")

    # -- shutdown ----------------------------------------------------------------------------------------------

    def shutdown(self, flush_timeout: float = 3.0) -> defer.Deferred:
        """Stop reading, flush queued deletes (bounded time), checkpoint. Runs before the reactor stops."""
        self.stopping = True
        if self.live is not None:
            self.live.reader.stop()
        for loop in self.catchups.values():
            loop.reader.stop()
        finished: defer.Deferred = defer.Deferred()

        def finish(_: Any = None) -> None:
            if finished.called:
                return
            for s in self.senders.values():
                s.stop()
            self.checkpoint()
            if self._checkpoints.running:
                self._checkpoints.stop()
            try:
                self._pid_path().unlink(missing_ok=True)
            except OSError:
                pass
            log.info("stopped; datamarkers: %s",
                     {n: g.format_position(f.acked) for n, f in self.flows.items()})
            finished.callback(None)

        timeout = self.reactor.callLater(flush_timeout, finish)  # a dead destination must not hold us up
        drained = defer.DeferredList([s.when_drained() for s in self.senders.values()])
        drained.addCallback(lambda _: (timeout.cancel() if timeout.active() else None, finish()))
        return finished


def run(topology: Topology, region: str, state_dir: str | Path | None = None, metrics_port: int | None = None,
        from_gtid: str | None = None, reply_timeout: float = 2.0, sample_every: int = 1000) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the exit code."""
    from twisted.internet import reactor

    daemon = Daemon(topology, region, state_dir, metrics_port, from_gtid, reactor=reactor,
                    reply_timeout=reply_timeout, sample_every=sample_every)
    daemon.prepare()
    reactor.callWhenRunning(daemon.start)
    reactor.run()
    return daemon.exit_code
