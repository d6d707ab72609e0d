"""Stage 5: send the flows' deletes in batches; one connection and one socket write carry every shard's.

A batch is `md <key> q` lines closed by `mn` (see `Flow.take_batch`). Quiet deletes answer only on a miss
(`NF`) or an error; `mn` answers `MN`, so `MN` acknowledges the whole batch. Up to `max_in_flight` full
batches are pipelined on the flow's one connection; memcached (and the router) answer a connection's
requests in order, so the `MN`s acknowledge them in commit order. Pipelining matters when the reader
thread keeps the GIL busy: each reactor turn then costs a GIL hand-off (up to the 5 ms switch interval),
and one batch per round trip would cap a flow at `batch_size` keys per two turns.

When to send: as soon as `batch_size` keys are waiting, otherwise `flush_interval` after the first one
(sub-millisecond by default). While a batch is in flight only full batches join it; the rest pile up and
leave in the next write, so the busier the flow, the fuller the packets (the paper's 18x fewer packets).

Failures (connect error, no `MN` within `reply_timeout`, `SERVER_ERROR`, connection lost): the batch
stays queued, the connection is dropped, the next router of the flow's set is tried after a capped
exponential backoff. A dead destination only ever delays its own flow.
"""

from __future__ import annotations

import functools
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.endpoints import TCP4ClientEndpoint

from router_config import Region, SquealSettings, TlsSettings
from squeal.delivery.flows import Batch, Dispatcher, Flow, flows_for_region
from squeal.delivery.sampler import DeleteSampler
from squeal.delivery.tlswrap import client_context, connect_tls
from squeal.process.metrics import CertExpiry, Metrics, WriteMetrics, own_certificates
from squeal.read import gtid as g

log = logging.getLogger(__name__)


def _abort(transport: Any) -> None:
    """Drop a TCP connection now (`ITCPTransport.abortConnection`: a protocol's `transport` is typed as the
    plain `ITransport`, which has no such method)."""
    transport.abortConnection()


class DeleteProtocol(protocol.Protocol):
    """One connection to one router (or memcached): writes batches, reads replies up to `MN`."""

    def __init__(self, on_reply: Callable[[int, Sequence[bytes], int], None], on_lost: Callable[[str], None]) -> None:
        # (server error count, other error lines, `OK`s: flushes done) for the batch just finished
        self.on_reply = on_reply
        self.on_lost = on_lost
        self._buf = b""
        self._errors: list[bytes] = []
        self._server_errors = 0
        self._oks = 0

    def send(self, payload: bytes) -> None:
        # Replies of the batches before this one may still be arriving: error counts reset only at `MN`.
        assert self.transport is not None  # (sent only while connected)
        self.transport.write(payload)

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\r\n") + 2  # the complete lines end here (1: no complete line yet)
        if end == 1:
            self._buf = buf
            return
        done = buf if end == len(buf) else buf[:end]
        self._buf = buf[end:]
        # Nearly every reply is `NF` (a key nothing cached), `HD` or `MN`, four bytes each. Counted in C, they
        # account for every byte only if every line is one of them: a needle ends in CRLF, so it matches at most
        # once per line, at the line's end, and only a line that is exactly the needle adds no other bytes.
        acks = done.count(b"MN\r\n")
        if 4 * (acks + done.count(b"NF\r\n") + done.count(b"HD\r\n")) == len(done):
            for _ in range(acks):
                self._batch_done()
            return
        lines = done.split(b"\r\n")
        lines.pop()  # (empty: `done` ends in CRLF)
        for line in lines:
            if line == b"MN":
                self._batch_done()
            elif line == b"NF" or line == b"HD":
                continue  # a miss is fine: nothing cached under that key
            elif line == b"OK":
                self._oks += 1  # a flush_all done
            elif line.startswith(b"SERVER_ERROR"):
                self._server_errors += 1
                self._errors.append(line)
            else:
                self._errors.append(line)  # CLIENT_ERROR and the like: retrying would not help

    def _batch_done(self) -> None:
        """`MN`: the replies of the oldest batch in flight are all in."""
        if not (self._errors or self._server_errors or self._oks):
            self.on_reply(0, (), 0)
            return
        self.on_reply(self._server_errors, self._errors, self._oks)
        self._errors = []
        self._server_errors = 0
        self._oks = 0

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802
        self.on_lost(str(reason.value) if reason is not None else "closed")


class Sender:
    """Drives the flows of one destination: timer, connection, failover across its routers, backoff.

    A destination has one flow per shard the daemon reads (`add_flow`); their batches share this one connection
    and, when they are ready together, one write (the paper's aggregation: deletes per packet grow with the
    shards). Each flow's batches are still acknowledged in its own order, by the `MN` that closes each batch.
    """

    def __init__(
        self,
        flow: Flow,
        reactor: Any,
        batch_size: int,
        flush_interval: float,
        reply_timeout: float = 2.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 5.0,
        metrics: Metrics | WriteMetrics | None = None,
        max_in_flight: int = 4,
        sampler: DeleteSampler | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self.name = flow.name  # the destination's name (every shard's flow to it has this name)
        self.destinations = flow.destinations
        self.flows: list[Flow] = []
        self._next = 0  # the flow asked first at the next send (round robin across shards)
        self.sampler = sampler
        self.tls = tls  # deletes over TLS ([tls]): a fresh verifying client context per connection
        self.max_in_flight = max(1, max_in_flight)  # per flow
        self.reactor = reactor
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.reply_timeout = reply_timeout
        self.backoff_initial = self.backoff = backoff_initial
        self.backoff_max = backoff_max
        self.metrics = metrics  # write-level series (writes, deletes per write); per-flow ones use flow.metrics
        self.router = 0  # index into destinations
        self.client: DeleteProtocol | None = None
        self.connecting = False
        self.waiting = False  # backing off after a failure
        self.timer: Any = None
        self.timeout: Any = None
        # In flight on `client`, oldest first; a flow of None: a removed flow's batch, still owed its `MN`.
        self.batches: deque[tuple[Flow | None, Batch]] = deque()
        self.stopped = False
        self._drained: list[defer.Deferred] = []
        m = metrics
        self._writes = m.writes.labels(flow=self.name) if m is not None else None
        self._per_write = m.deletes_per_write.labels(flow=self.name) if m is not None else None
        self.add_flow(flow)

    def add_flow(self, flow: Flow) -> None:
        """Another shard's flow to the same destination."""
        if flow.name != self.name or flow.destinations != self.destinations:
            raise ValueError(f"flow {flow.name} ({flow.destinations}) is not for destination {self.name}")
        self.flows.append(flow)
        flow.on_ready = functools.partial(self.kick, flow)

    def remove_flow(self, flow: Any) -> None:
        """A shard's pipeline stopped: its flow leaves (whatever it has in flight is handed back to it).

        Its batches are still on the wire and each will be answered by an `MN`: they stay in `batches`, in
        order, with no flow (placeholders), so that `MN` is consumed by them, not taken as the next shard's
        acknowledgement (which would move that shard's marker past keys not yet acknowledged)."""
        mine = [b for f, b in self.batches if f is flow]
        for b in mine:
            flow.fail(b)
        self.batches = deque((None if f is flow else f, b) for f, b in self.batches)
        self.flows = [f for f in self.flows if f is not flow]
        flow.on_ready = lambda: None

    @property
    def _limit(self) -> int:
        return self.max_in_flight * max(1, len(self.flows))

    def _pending(self) -> int:
        return sum(f.pending_keys for f in self.flows)

    # -- scheduling --------------------------------------------------------------------------------------

    def kick(self, flow: Flow | None = None) -> None:
        """There may be something to send (from `flow`, or from any flow). What is sent at once leaves at the
        end of this reactor turn (`callLater(0)`), not here: the shards whose transactions this turn hands on
        (one handoff each) all enqueue first, and their batches share the write. Called for every transaction
        queued: what it looks at does not grow with the number of shards, unless a send may be due."""
        if self.stopped or self.connecting or self.waiting or len(self.batches) >= self._limit:
            return
        timer = self.timer
        if timer is not None and timer.getTime() <= self.reactor.seconds():
            return  # a send at the end of this turn already looks at every flow
        if self.batches:
            if any(f.pending_keys >= self.batch_size for f in (self.flows if flow is None else (flow,))):
                self._send_in(0.0)  # a full batch joins those in flight; a partial one waits for their acks
            return
        if timer is not None and flow is not None and flow.pending_keys < self.batch_size:
            return  # the flush timer runs: this flow adds nothing that would send sooner
        pending = self._pending()
        if pending <= 0 and not any(f.queue for f in self.flows):
            self._check_drained()
            return
        if pending >= self.batch_size or self.flush_interval <= 0:
            self._send_in(0.0)
        else:
            self._send_in(self.flush_interval)

    def _send_in(self, delay: float) -> None:
        """Send after `delay` seconds, unless a send is already due that soon."""
        if self.timer is not None:
            if self.timer.getTime() <= self.reactor.seconds() + delay:
                return
            self.timer.cancel()
        self.timer = self.reactor.callLater(delay, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        self._send()

    def _send(self) -> None:
        if self.timer is not None:
            if self.timer.active():
                self.timer.cancel()
            self.timer = None
        if self.stopped or self.connecting or self.waiting:
            return
        if self.client is None:
            self._connect()
            return
        # A write carries at most one batch per flow (shard), so `batch_size = 1` with one shard stays one delete
        # per write (the experiments' "unbatched"). Nothing in flight: one batch from every flow with something
        # queued, full or not, share the write. Then, and while batches are in flight, only full batches are
        # pipelined: those of every shard that has one share a write, round after round.
        n = len(self.flows)
        full_only = bool(self.batches)
        progress = True
        while progress and len(self.batches) < self._limit:
            progress = False
            joined: list[bytes] = []
            joined_keys = 0
            for i in range(n):
                flow = self.flows[(self._next + i) % n]
                if len(self.batches) >= self._limit:
                    break
                if full_only and flow.pending_keys < self.batch_size:
                    continue
                batch = self._take(flow)
                if batch is not None:
                    joined.append(batch.payload)
                    joined_keys += batch.nkeys
                    progress = True
            self._write(joined, joined_keys)
            full_only = True
        self._next = (self._next + 1) % max(1, n)
        self._check_drained()

    def _take(self, flow: Flow) -> Batch | None:
        """The flow's next batch, now in flight (a batch of key-less transactions is done at once: None)."""
        while (batch := flow.take_batch(self.batch_size, self.max_in_flight)) is not None:
            if batch.nkeys:
                self.batches.append((flow, batch))
                return batch
            flow.ack(batch)  # only key-less transactions, nothing ahead: done without a round trip
        return None

    def _write(self, payloads: list[bytes], nkeys: int) -> None:
        if not payloads:
            return
        assert self.client is not None
        if self.timeout is None:
            self.timeout = self.reactor.callLater(self.reply_timeout, self._on_timeout)
        self.client.send(payloads[0] if len(payloads) == 1 else b"".join(payloads))
        if self._writes is not None and self._per_write is not None:
            self._writes.inc()
            self._per_write.observe(nkeys)

    # -- connection ----------------------------------------------------------------------------------------

    def _connect(self) -> None:
        addr = self.destinations[self.router % len(self.destinations)]
        self.connecting = True
        client = DeleteProtocol(self._on_reply, self._on_lost)
        endpoint = TCP4ClientEndpoint(self.reactor, addr.host, addr.port, timeout=self.reply_timeout)
        if self.tls is not None:
            d = connect_tls(endpoint, client, self.tls(), addr.host, str(addr))
        else:
            d = endpoint.connect(protocol.Factory.forProtocol(lambda: client))

        def connected(p: DeleteProtocol) -> None:
            self.connecting = False
            if self.stopped:
                _abort(p.transport)
                return
            self.client = p
            self._send()

        def failed(f: Any) -> None:
            self.connecting = False
            self._failure(f"connect to {addr}: {f.getErrorMessage()}")

        d.addCallbacks(connected, failed)

    def _on_reply(self, server_errors: int, errors: Sequence[bytes], oks: int = 0) -> None:
        if not self.batches:
            return
        flow, batch = self.batches.popleft()
        if self.timeout is not None and self.timeout.active():
            if self.batches:
                self.timeout.reset(self.reply_timeout)  # the next batch in flight gets its own full time
            else:
                self.timeout.cancel()
        if not self.batches:
            self.timeout = None
        if flow is None:  # a removed flow's batch (see remove_flow): already handed back; its replies are its own
            if not self.batches or len(self.batches) == self._limit - 1:
                self.kick()
            return
        m = flow.metrics
        for line in errors:
            if m is not None:
                m.reply_errors.labels(flow=flow.name, error=line.split(b" ", 1)[0].decode(errors="replace")).inc()
        flushes = batch.flushes
        if oks < flushes:  # a refused flush is never acknowledged: the flow retries it
            self.batches.appendleft((flow, batch))
            log.error(
                "flow %s: flush_all refused (%r); squeal-router flushes only with --enable-flush-cmd",
                self.name,
                errors[0] if errors else b"no OK",
            )
            self._failure("flush_all not acknowledged")
            return
        if server_errors:
            self.batches.appendleft((flow, batch))  # _failure hands it (and those after it) back to the flow
            self._failure(f"{server_errors} SERVER_ERROR replies, e.g. {errors[0]!r}")
            return
        if flushes and m is not None:
            m.flushes.labels(flow=flow.name).inc(flushes)
        if errors:
            log.warning(
                "flow %s: %d error replies in a batch (not retried), e.g. %r", self.name, len(errors), errors[0]
            )
        self.backoff = self.backoff_initial
        flow.ack(batch)
        if m is not None:
            m.deletes.labels(flow=flow.name).inc(batch.nkeys)
        if self.sampler is not None:
            self.sampler.offer(self.name, batch.payload, batch.nkeys, time.time())
        if not self.batches or len(self.batches) == self._limit - 1:
            self.kick()  # partial batches may leave now, or full ones again below the limit (`flow`'s: its ack)

    def _on_timeout(self) -> None:
        self.timeout = None
        self._failure(f"no reply within {self.reply_timeout:.1f}s")

    def _on_lost(self, reason: str) -> None:
        if self.client is not None and not self.stopped:
            self._failure(f"connection lost: {reason}")

    def _failure(self, why: str) -> None:
        addr = self.destinations[self.router % len(self.destinations)]
        for flow, batch in self.batches:  # every batch in flight goes back, in order (some may predate a shed)
            if flow is not None:  # (a removed flow's were handed back when it left)
                flow.fail(batch)
        self.batches.clear()
        if self.timeout is not None and self.timeout.active():
            self.timeout.cancel()
        self.timeout = None
        client, self.client = self.client, None
        if client is not None and client.transport is not None:
            _abort(client.transport)
        if self.stopped or self.waiting:
            return
        self.router += 1  # the next router of the set, round robin
        for m in {id(f.metrics): f.metrics for f in self.flows if f.metrics is not None}.values():
            m.retries.labels(flow=self.name).inc()
        log.warning(
            "flow %s: %s %s; retrying in %.2fs via %s",
            self.name,
            addr,
            why,
            self.backoff,
            self.destinations[self.router % len(self.destinations)],
        )
        self.waiting = True
        self.reactor.callLater(self.backoff, self._retry)
        self.backoff = min(self.backoff * 2, self.backoff_max)

    def _retry(self) -> None:
        self.waiting = False
        self.kick()

    # -- shutdown ------------------------------------------------------------------------------------------

    def drained(self) -> bool:
        return not self.batches and not any(f.queue for f in self.flows)

    def _check_drained(self) -> None:
        if self.drained():
            waiters, self._drained = self._drained, []
            for d in waiters:
                d.callback(None)

    def when_drained(self) -> defer.Deferred:
        """Fires once nothing is queued or in flight."""
        d: defer.Deferred = defer.Deferred()
        self._drained.append(d)
        self._check_drained()
        return d

    def stop(self) -> None:
        self.stopped = True
        for call in (self.timer, self.timeout):
            if call is not None and call.active():
                call.cancel()
        if self.client is not None and self.client.transport is not None:
            self.client.transport.loseConnection()
        self.client = None


class SenderHub:
    """The batchers of a process, one `Sender` per destination, shared by every shard's flow to it."""

    def __init__(
        self,
        reactor: Any,
        settings: SquealSettings,
        metrics: Metrics | WriteMetrics,
        sampler: DeleteSampler,
        reply_timeout: float,
        tls: TlsSettings | None = None,
    ) -> None:
        self.reactor, self.settings, self.metrics, self.sampler = reactor, settings, metrics, sampler
        self.reply_timeout = reply_timeout
        self.tls = tls  # [tls]: deletes to the routers over TLS
        self.senders: dict[str, Sender] = {}
        if tls is not None:  # one hub per process: the expiry of the certificates squeal loads, exported once
            metrics.registry.register(CertExpiry(own_certificates(tls, "squeal")))

    def flows_for_region(
        self,
        region: Region,
        starts: dict[str, g.Position],
        max_backlog: int,
        metrics: Metrics | None = None,
        shard: str = "",
    ) -> list[Flow]:
        """A shard's flows (`flows.flows_for_region`; `shard` is for the native hub's gates)."""
        return flows_for_region(region, starts, max_backlog, metrics)

    def dispatcher(self, flows: Sequence[Any], start: g.Position) -> Dispatcher:
        return Dispatcher(flows, start)

    def push_gates(self) -> None:
        """(The senders ask each flow's gate before every batch: nothing to push.)"""

    def refresh(self) -> None:
        """(The senders count into the Prometheus series as they go: nothing to take.)"""

    def attach(self, flow: Any) -> Sender:
        assert isinstance(flow, Flow)
        sender = self.senders.get(flow.name)
        if sender is None:
            s = self.settings
            sender = self.senders[flow.name] = Sender(
                flow,
                self.reactor,
                s.batch_size,
                s.flush_interval_ms / 1000.0,
                reply_timeout=self.reply_timeout,
                metrics=self.metrics,
                sampler=self.sampler,
                tls=functools.partial(client_context, self.tls) if self.tls is not None else None,
            )
        else:
            sender.add_flow(flow)
        return sender
