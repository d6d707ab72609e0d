"""Stages 4 and 5 natively (`[squeal] delivery = "native"`): the flows and their connections on one Rust thread.

`squeal_native.NativeDelivery` (squeal_native/src/delivery.rs) holds every flow's queue and every destination's
connection, sends the batches and takes the acknowledgements without the GIL; the rules are those of
squeal/delivery/flows.py and batcher.py, which stay the reference. This module gives it the faces the daemon already
uses, so the control plane does not change:

* `NativeHub` stands where `SenderHub` does: one per process, `flows_for_region` and `dispatcher` make a shard's
  flows and its live dispatcher, `attach` joins a flow to its destination's sender (`NativeSender`:
  `when_drained`, `remove_flow`).
* `NativeFlow` stands where `Flow` does: what the datamarkers, catch-up readers, lag and /healthz ask (`acked`,
  `backlog`, `state`, `dirty`, `start_catchup`, `rejoin`, `rewind`, ...) is read from the thread's flow.
* The thread's counters, histograms, log lines and sampled deletes are taken on the reactor every `COLLECT_S`
  seconds and given to the flows' Prometheus series, the `logging` module and the `DeleteSampler`: every series in
  docs/metrics.md keeps its name and labels.

A pool worker's gate (`may_send`) is pushed to the thread as a window (`set_window`): how long the lease says the
shard may still send. It is an instant on the thread's monotonic clock, so a process paused past its lease sends
nothing when it resumes, before anything in Python has run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import defer, task

from router_config import Address, Region, SquealSettings, TlsSettings
from squeal.delivery.batcher import SenderHub
from squeal.delivery.flows import REGIONAL, Committed, Dispatcher, Flow, destinations, lag_of, show_state
from squeal.delivery.sampler import DeleteSampler, SampledDelete
from squeal.process.metrics import (
    BATCH_BUCKETS,
    LATENCY_BUCKETS,
    CertExpiry,
    Metrics,
    WriteMetrics,
    add_counts,
    own_certificates,
)
from squeal.read import gtid as g
from squeal.read.native import native_module

log = logging.getLogger(__name__)

COLLECT_S = 0.2  # how often the thread's counters, log lines and samples are taken (and the gates pushed)
DRAINED_POLL_S = 0.01


def offered(c: Committed) -> tuple[Any, ...]:
    """`c` as `NativeDelivery.offer` takes it, after the flow ids and `live`."""
    return (
        c.gtid,
        c.commit_ts,
        c.read_ts,
        c.cluster_lines,
        c.regional_lines,
        c.flush,
        c.position,
        c.partial,
        c.rows_from,
        c.rows_to,
        c.transactions,
    )


class NativeFlow:
    """One shard's flow to one destination, held by the delivery thread; the `Flow` interface the daemon uses."""

    def __init__(
        self,
        hub: NativeHub,
        name: str,
        kind: str,
        destinations: Sequence[Address],
        start: g.Position,
        max_backlog: int,
        shard: str,
        metrics: Metrics | None = None,
    ) -> None:
        self.hub = hub
        self.engine = hub.engine
        self.name = name
        self.kind = kind
        self.destinations = tuple(destinations)
        self.max_backlog = max_backlog
        self.shard = shard
        self.metrics = metrics
        routers = [(a.host, a.port) for a in self.destinations]
        self.id: int = self.engine.add_flow(name, routers, kind == REGIONAL, shard, dict(start), max_backlog)
        self.source_lag: Callable[[g.Position, float], float] | None = None
        self.on_shed: Callable[[NativeFlow], None] = lambda flow: None
        self._may_send: Callable[[], bool] | None = None
        if metrics is not None:
            self._latency = metrics.latency.labels(flow=name)
            self._delivery = metrics.delivery_latency.labels(flow=name)
            self._deletes = metrics.deletes.labels(flow=name)
            metrics.backlog.labels(flow=name).set_function(lambda: self.backlog)
            metrics.lag.labels(flow=name).set_function(self.lag)
        self._set_state("live")

    # -- what the control plane asks --------------------------------------------------------------------------

    @property
    def acked(self) -> g.Position:
        return self.engine.acked(self.id)

    @property
    def enqueued(self) -> g.Position:
        return self.engine.flow(self.id)[1]

    @property
    def backlog(self) -> int:
        return self.engine.backlog(self.id)

    @property
    def queue(self) -> int:
        """Entries queued (a count: the daemon asks whether there are any)."""
        return self.engine.flow(self.id)[4]

    @property
    def sending(self) -> int:
        """Batches in flight (a count)."""
        return self.engine.flow(self.id)[5]

    @property
    def epoch(self) -> int:
        return self.engine.flow(self.id)[6]

    @property
    def last_acked_commit_ts(self) -> float | None:
        return self.engine.flow(self.id)[8]

    @property
    def dirty(self) -> bool:
        return self.engine.dirty(self.id)

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self.engine.set_dirty(self.id, value)

    @property
    def may_send(self) -> Callable[[], bool] | None:
        return self._may_send

    @may_send.setter
    def may_send(self, gate: Callable[[], bool] | None) -> None:
        """A pool worker's gate: pushed to the thread as a window every `COLLECT_S` (see `NativeHub.push_gates`)."""
        self._may_send = gate
        self.hub.gate(self.shard, gate)

    # -- input --------------------------------------------------------------------------------------------------

    def offer_live(self, c: Committed) -> None:
        self.hub.offer([self], c, live=True)

    def offer_catchup(self, c: Committed) -> None:
        self.hub.offer([self], c, live=False)

    def shed(self) -> None:
        self.engine.shed(self.id)
        self._shed()

    def _shed(self) -> None:
        """The thread dropped this flow's queue (an offer passed the bound, or `shed`/`rewind`)."""
        self._set_state("shed")
        if self.metrics is not None:
            self.metrics.sheds.labels(flow=self.name).inc()
        self.on_shed(self)

    def start_catchup(self) -> g.Position:
        position = self.engine.start_catchup(self.id)
        self._set_state("catching_up")
        if self.metrics is not None:
            self.metrics.catchups.labels(flow=self.name).inc()
        return position

    def caught_up(self, live: g.Position, live_pieces: g.Gtid | None = None) -> bool:
        return self.engine.caught_up(self.id, dict(live), live_pieces)

    def rejoin(self) -> None:
        self.engine.rejoin(self.id)
        self._set_state("live")
        if self.metrics is not None:
            self.metrics.rejoins.labels(flow=self.name).inc()

    def rewind(self, position: g.Position) -> None:
        """Operator replay: forget the queue, resume from `position` through a catch-up reader."""
        self.engine.shed(self.id, dict(position))
        self._shed()

    def wait_room(self, bound: int, timeout: float) -> bool:
        """The catch-up reader's brake: wait (without the GIL) until at most `bound` keys are unacknowledged."""
        return self.engine.wait_room(self.id, bound, timeout)

    # -- observability -------------------------------------------------------------------------------------------

    def lag(self) -> float:
        """As `Flow.lag` (`flows.lag_of`), from the thread's flow."""
        acked, _, _, state, _, _, _, oldest, last = self.engine.flow(self.id)
        return lag_of(time.time(), oldest, state, last, self.source_lag, acked)

    def _set_state(self, state: str) -> None:
        self.state = state
        show_state(self.metrics, self.name, state)

    def take(self, deletes: int, flushes: int, errors: dict[str, int], latency: Any, delivery: Any) -> None:
        """The thread's counters for this flow since the last take, into its series."""
        m = self.metrics
        if m is None:
            return
        if deletes:
            self._deletes.inc(deletes)
        if flushes:
            m.flushes.labels(flow=self.name).inc(flushes)
        for error, n in errors.items():
            m.reply_errors.labels(flow=self.name, error=error).inc(n)
        add_counts(self._latency, *latency)
        add_counts(self._delivery, *delivery)


class NativeDispatcher(Dispatcher):
    """`Dispatcher` with one call into the thread per transaction for all of a shard's flows (its lines are
    copied once, shared by the flows)."""

    def __init__(self, hub: NativeHub, flows: Sequence[NativeFlow], start: g.Position) -> None:
        super().__init__(flows, start)  # type: ignore[arg-type]
        self.hub = hub
        self.native_flows = list(flows)

    def dispatch(self, c: Committed) -> None:
        self.dispatched(c)
        live = [f for f in self.native_flows if f.state == "live"]
        if live:
            self.hub.offer(live, c, live=True)


class NativeSender:
    """A destination's face towards the daemon (`Sender`'s): its flows, `when_drained`, `remove_flow`."""

    def __init__(self, hub: NativeHub, name: str) -> None:
        self.hub = hub
        self.name = name
        self.flows: list[NativeFlow] = []
        self.stopped = False

    def add_flow(self, flow: NativeFlow) -> None:
        self.flows.append(flow)

    def remove_flow(self, flow: Any) -> None:
        """A shard's pipeline stopped: its flow leaves (its batches in flight still take their `MN`)."""
        assert isinstance(flow, NativeFlow)
        self.hub.engine.remove_flow(flow.id)
        self.flows = [f for f in self.flows if f is not flow]
        self.hub.flows.pop(flow.id, None)
        if not any(f.shard == flow.shard for f in self.hub.flows.values()):
            self.hub.gate(flow.shard, None)  # the shard's last flow left: its gate goes with it

    def drained(self) -> bool:
        return bool(self.hub.engine.drained(self.name))

    def when_drained(self) -> defer.Deferred:
        """Fires once nothing is queued or in flight."""
        d: defer.Deferred = defer.Deferred()

        def check() -> None:
            if self.drained():
                poll.stop()
                d.callback(None)

        poll = task.LoopingCall(check)
        poll.clock = self.hub.reactor
        poll.start(DRAINED_POLL_S, now=True)
        return d

    def stop(self) -> None:
        """Nothing more is sent to this destination: once every destination's sender is stopped (the process
        stops), so is the thread."""
        self.stopped = True
        if all(s.stopped for s in self.hub.senders.values()):
            self.hub.stop()


class NativeHub:
    """The delivery thread of a process and its senders, one per destination (`SenderHub`'s place)."""

    def __init__(
        self,
        reactor: Any,
        settings: SquealSettings,
        metrics: Metrics | WriteMetrics,
        sampler: DeleteSampler,
        reply_timeout: float,
        tls: TlsSettings | None = None,
        max_in_flight: int = 4,
    ) -> None:
        self.reactor, self.settings, self.metrics, self.sampler = reactor, settings, metrics, sampler
        mine = tls.cert("squeal") if tls is not None else None
        self.engine = native_module().NativeDelivery(
            settings.batch_size,
            settings.flush_interval_ms / 1000.0,
            reply_timeout,
            max_in_flight,
            list(LATENCY_BUCKETS),
            list(BATCH_BUCKETS),
            sampler.every,
            tls_ca=tls.ca if tls is not None else None,
            tls_cert=mine.cert if mine is not None else None,
            tls_key=mine.key if mine is not None else None,
        )
        self.senders: dict[str, NativeSender] = {}
        self.flows: dict[int, NativeFlow] = {}
        self._gates: dict[str, Callable[[], bool] | None] = {}
        # One push at a time, each reading the gates and setting the windows under it: the reactor's periodic
        # push and a lease thread's push on a pause may race, and a push that read "may send" before the pause
        # must not set its window after the pause's push (it would reopen the window for the rest of the lease).
        self._pushing = threading.Lock()
        if tls is not None:
            metrics.registry.register(CertExpiry(own_certificates(tls, "squeal")))
        self._collector = task.LoopingCall(self.collect)
        self._collector.clock = reactor
        self._collector.start(COLLECT_S, now=False)
        self.stopped = False

    # -- making a shard's flows -----------------------------------------------------------------------------

    def flows_for_region(
        self,
        region: Region,
        starts: dict[str, g.Position],
        max_backlog: int,
        metrics: Metrics | None = None,
        shard: str = "",
    ) -> list[NativeFlow]:
        """One flow per destination of `region` (`flows.destinations`), this hub's."""
        flows = [
            NativeFlow(self, n, kind, routers, starts[n], max_backlog, shard, metrics)
            for n, kind, routers in destinations(region)
        ]
        for f in flows:
            self.flows[f.id] = f
        return flows

    def dispatcher(self, flows: Sequence[Any], start: g.Position) -> NativeDispatcher:
        assert all(isinstance(f, NativeFlow) for f in flows)
        return NativeDispatcher(self, flows, start)

    def attach(self, flow: Any) -> NativeSender:
        assert isinstance(flow, NativeFlow)
        sender = self.senders.get(flow.name)
        if sender is None:
            sender = self.senders[flow.name] = NativeSender(self, flow.name)
        sender.add_flow(flow)
        return sender

    # -- the data path ----------------------------------------------------------------------------------------

    def offer(self, flows: Sequence[NativeFlow], c: Committed, live: bool) -> None:
        shed = self.engine.offer([f.id for f in flows], live, *offered(c))
        for flow_id in shed:
            self.flows[flow_id]._shed()

    # -- gates, counters, logs ------------------------------------------------------------------------------------

    def gate(self, shard: str, may_send: Callable[[], bool] | None) -> None:
        self._gates[shard] = may_send
        self.push_gates()

    def push_gates(self) -> None:
        """Each gated shard's window: shut unless `may_send()`; else what is left of the lease when the gate tells
        it (`SendGate.left`), or two collect periods. Pushed every collect and at once when the lease pauses or
        resumes (`PoolWorker._paused`), so the thread stops sending when the Python senders would."""
        with self._pushing:  # (also called from the lease's threads)
            for shard, may_send in list(self._gates.items()):
                if may_send is None:
                    self.engine.set_window(shard, None)
                    continue
                left = getattr(may_send, "left", None)
                if not may_send():
                    self.engine.set_window(shard, 0.0)
                elif left is not None:
                    self.engine.set_window(shard, float(left()))
                else:
                    self.engine.set_window(shard, 2 * COLLECT_S)

    def collect(self) -> None:
        """Take the thread's counters, log lines and samples (every `COLLECT_S`, and before a stop)."""
        try:
            self.push_gates()
            flows, dests = self.engine.take_stats()
            for flow_id, deletes, flushes, errors, latency, delivery in flows:
                flow = self.flows.get(flow_id)
                if flow is not None:
                    flow.take(deletes, flushes, errors, latency, delivery)
            for name, writes, per_write, retries in dests:
                m = self.metrics
                if writes:
                    m.writes.labels(flow=name).inc(writes)
                    add_counts(m.deletes_per_write.labels(flow=name), *per_write)
                if retries:
                    flows_here = self.senders[name].flows if name in self.senders else []
                    for fm in {id(f.metrics): f.metrics for f in flows_here if f.metrics is not None}.values():
                        fm.retries.labels(flow=name).inc(retries)
            for level, message in self.engine.take_log():
                log.log(level, "%s", message)
            samples = self.engine.take_samples()
            if samples:
                self.sampler.take([SampledDelete(flow, key, at) for flow, key, at in samples])
        except Exception:
            log.exception("taking the delivery thread's counters failed; taken again at the next collect")

    def refresh(self) -> None:
        """Before a scrape: the thread's counters into the series now (not up to `COLLECT_S` late)."""
        if not self.stopped:
            self.collect()

    def stop(self) -> None:
        """Stop the thread (its connections close; nothing more is sent), after a last collect."""
        if self.stopped:
            return
        self.stopped = True
        if self._collector.running:
            self._collector.stop()
        self.collect()
        self.engine.stop()


Hub = SenderHub | NativeHub
AnyFlow = Flow | NativeFlow  # what a hub's flows_for_region makes


def make_hub(
    reactor: Any,
    settings: SquealSettings,
    metrics: Metrics | WriteMetrics,
    sampler: DeleteSampler,
    reply_timeout: float,
    tls: TlsSettings | None = None,
) -> Hub:
    """The process's senders as `[squeal] delivery` says: the Rust delivery thread or the reactor's `Sender`s."""
    if settings.delivery == "native":
        log.info("delivery: native (squeal_native's delivery thread)")
        return NativeHub(reactor, settings, metrics, sampler, reply_timeout, tls=tls)
    return SenderHub(reactor, settings, metrics, sampler, reply_timeout, tls=tls)
