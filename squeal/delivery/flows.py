"""Stage 4: flows, one per destination, each with its own queue, position and fate.

Destinations of a region: every frontend cluster (its set of routers; the batcher tries the next router
when one fails) and, if the region has one, the regional pool. A key that starts with one of the
regional pool's prefixes goes ONLY to the regional flow (sent through any router of the region, which
routes it to the regional pool); every other key goes to every cluster flow.

A flow is plain data and logic, no I/O (the batcher does that):

* `offer_live(c)` queues a committed transaction's keys, unless the flow has already got it (its
  `enqueued` position covers the GTID: after a restart the live reader starts at the earliest marker).
  A huge transaction may come in pieces (`Committed.partial`), queued as they come so its deletes start
  while it is still being read; only its last piece moves `enqueued`, and its acknowledgement `acked`. A
  flow takes a piece only right after the one before it (or the first): one that missed part of a
  transaction sheds, so the catch-up reader re-reads the transaction whole (never a gap).
* `take_batch(n, max_in_flight)` / `ack(batch)` / `fail(batch)`: up to `max_in_flight` batches in flight on
  one connection (pipelined), acknowledged strictly in order; a failure hands every batch in flight back.
  `acked` (the datamarker) only moves past a transaction once all of its keys are acknowledged.
* Bounded memory (Wormhole's caravans): when the unacknowledged keys pass `max_backlog` the flow is
  *shed*: its queue is dropped and it ignores the live stream. The daemon then starts a catch-up reader
  (its own binlog connection) from `acked`, feeding `offer_catchup`; the catch-up reader waits while the
  backlog is above half the bound. Once the flow has queued everything the live stream has dispatched,
  it `rejoin`s the live stream and the catch-up reader stops.
  One transaction is exempt: the oldest queued one with more keys than the bound on its own
  ("oversize"). Its delete lines are one tuple shared by every flow, so a huge transaction arriving at a
  healthy flow does not shed it; the other keys queued still count, so a dead destination still sheds
  and holds at most `max_backlog` keys plus that one transaction.

Everything here runs on the reactor thread; only `backlog` is read from other threads (a plain int).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router_config import Address, Region
from squeal.process.metrics import Metrics, observe_times
from squeal.read import gtid as g
from squeal.read.transactions import JoinedLines, Lines

LIVE, SHED, CATCHING_UP = "live", "shed", "catching_up"
# Sent ahead of a transaction's deletes when its changes carry no row images (TRUNCATE with the "flush"
# policy) or after binlog data loss. The routers answer `OK` once every server of the cluster is flushed
# (squeal-router needs --enable-flush-cmd). It is always the first line of its entry: `take_batch` counts
# the flushes of a batch from that, and the batcher acknowledges the batch only with as many `OK`s.
FLUSH_LINE = b"flush_all\r\n"
STATES = (LIVE, SHED, CATCHING_UP)
REGIONAL = "regional"


@dataclass(slots=True)
class Committed:
    """One committed transaction as the flows see it: its GTID, times, and the delete lines per kind; or a run
    of them (`transactions` > 1, the native reader's `CommittedRun`: `position` is where they reach, `gtid` the
    last, the times the first's)."""

    gtid: g.Gtid
    commit_ts: float  # GTID event timestamp (wall clock, 1 s resolution)
    read_ts: float  # when squeal read its commit (wall clock)
    cluster_lines: Lines
    regional_lines: Lines
    flush: bool = False  # flush every destination before these deletes (a change without row images)
    # Instead of one GTID, the flows move to this position: each domain's last transaction of a run, or after
    # binlog data loss the position reading resumes after (every transaction between the flow's position and
    # it is gone from the binlog; `flush` is set so nothing cached from then survives). A flow that has some
    # of a run's transactions already takes its lines all the same: a delete sent twice is harmless.
    position: g.Position | None = None
    # A huge transaction is handed on in pieces while it is still being read (squeal/keys/pipeline.py, ReadLoop):
    # each piece holds the lines of its row events [rows_from, rows_to); `partial` says more follow. The last
    # piece (partial False, rows_from > 0) holds the rest and the comment keys; only it completes the GTID.
    partial: bool = False
    rows_from: int = 0
    rows_to: int = 0
    transactions: int = 1  # (a run's: its latency is observed once per transaction)

    @property
    def continued(self) -> bool:
        """Earlier pieces of this transaction were handed on before this one."""
        return self.rows_from > 0


def split_keys(keys: Sequence[str], regional_prefixes: Sequence[str]) -> tuple[list[str], list[str]]:
    """(keys for every cluster, keys for the regional pool only)."""
    if not regional_prefixes:
        return list(keys), []
    prefixes = tuple(regional_prefixes)
    cluster: list[str] = []
    regional: list[str] = []
    for k in keys:
        (regional if k.startswith(prefixes) else cluster).append(k)
    return cluster, regional


@dataclass(slots=True)
class Entry:
    gtid: g.Gtid
    commit_ts: float
    read_ts: float
    lines: Lines
    position: g.Position | None = None  # acknowledged: the flow's position becomes (at least) this
    partial: bool = False  # a piece of a transaction, not its last: acknowledging it completes nothing
    transactions: int = 1
    flush: bool = False  # `lines` starts with FLUSH_LINE


def _add_lines(parts: list[bytes | memoryview], lines: Lines, a: int, b: int) -> None:
    """Append lines [a, b) of an entry to a batch's parts: a run's joined lines as one span."""
    if isinstance(lines, JoinedLines):
        parts.append(lines.span(a, b))
    else:
        parts.extend(lines[a:b] if a or b < len(lines) else lines)


@dataclass(slots=True)
class Batch:
    payload: bytes  # `md ... q` lines then `mn`
    nkeys: int
    entries: int  # queue entries completed by this batch (counted from where the batch before it ended)
    end_offset: int  # lines of the next entry already in this batch (or in the batches before it)
    epoch: int
    flushes: int = 0  # FLUSH_LINEs in the payload: each must be answered `OK`


class Flow:
    def __init__(
        self,
        name: str,
        kind: str,
        destinations: Sequence[Address],
        start: g.Position,
        max_backlog: int,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.kind = kind  # "cluster" or "regional": which lines of a Committed it takes
        self.destinations = tuple(destinations)
        self.acked: g.Position = dict(start)
        self.enqueued: g.Position = dict(start)
        self.max_backlog = max_backlog
        self.metrics = metrics
        self.clock = clock
        self.queue: deque[Entry] = deque()
        self.head_offset = 0
        self.backlog = 0  # unacknowledged keys, including the batches in flight
        # The shed rule's exemption (`_enqueue`): keys queued since the last shed, of which the first
        # `_keys_queued - backlog` are acknowledged (acks go in order), and the span [first, end) in that count
        # of the oldest transaction queued that on its own holds more than `oversize` keys (the bound).
        self.oversize = max_backlog
        self._keys_queued = 0
        self._oversize_span = (0, 0)
        # The transaction arriving in pieces: (its GTID, the row event its next piece must start at), and
        # where its keys started in `_keys_queued` (its pieces count as one transaction for the exemption).
        self._pieces: tuple[g.Gtid, int] | None = None
        self._pieces_start = 0
        self.sending: deque[Batch] = deque()  # batches in flight, oldest first (acknowledged in this order)
        self._sent_entries = 0  # queue entries (from the head) wholly inside the batches in flight
        self._sent_offset = 0  # lines of the entry after those already inside the batches in flight
        self._sent_keys = 0
        self.epoch = 0
        self.state = LIVE
        self.dirty = False  # acked moved since the last checkpoint
        self.last_acked_commit_ts: float | None = None
        # The daemon sets this to the source poller's `behind(acked, now)` (squeal/read/source.py): how far the
        # source's data is ahead of what this flow acknowledged, even when nothing is queued (a stalled replica).
        self.source_lag: Callable[[g.Position, float], float] | None = None
        self.on_ready: Callable[[], None] = lambda: None  # the batcher: there is something to send
        self.on_shed: Callable[[Flow], None] = lambda flow: None  # the daemon: start a catch-up reader
        self.on_acked: Callable[[], None] | None = None  # the catch-up brake (`wait_room`): there may be room now
        self._room = threading.Event()
        # A pool worker's gate (squeal/pool/ownership.py): asked before every batch; False hands out nothing (the
        # lease ran out, or the shard is no longer this worker's).
        self.may_send: Callable[[], bool] | None = None
        self._latency = metrics.latency.labels(flow=name) if metrics is not None else None
        self._delivery = metrics.delivery_latency.labels(flow=name) if metrics is not None else None
        if metrics is not None:
            metrics.backlog.labels(flow=name).set_function(lambda: self.backlog)
            metrics.lag.labels(flow=name).set_function(self.lag)
            self._set_state(LIVE)

    # -- input ------------------------------------------------------------------------------------------

    def lines_of(self, c: Committed) -> Lines:
        lines = c.regional_lines if self.kind == REGIONAL else c.cluster_lines
        return (FLUSH_LINE, *lines) if c.flush else lines

    def offer_live(self, c: Committed) -> None:
        if self.state == LIVE:
            self._enqueue(c, may_shed=True)

    def offer_catchup(self, c: Committed) -> None:
        if self.state == CATCHING_UP:
            self._enqueue(c, may_shed=False)  # the catch-up reader is held back by backlog instead

    def _enqueue(self, c: Committed, may_shed: bool) -> None:
        if c.position is not None:
            if g.covers_position(self.enqueued, c.position):
                return  # this flow has every transaction up to there already
            g.merge(self.enqueued, c.position)
        elif g.covers(self.enqueued, c.gtid):
            return
        elif c.partial or c.continued:
            if not c.continued:  # a first piece (also the start again of one read again after a reconnect)
                self._pieces, self._pieces_start = (c.gtid, 0), self._keys_queued
            if self._pieces != (c.gtid, c.rows_from):
                self.shed()  # missed part of it: the catch-up reader re-reads it whole
                return
            self._pieces = (c.gtid, c.rows_to) if c.partial else None
            if not c.partial:
                g.advance(self.enqueued, c.gtid)
        else:
            g.advance(self.enqueued, c.gtid)
        lines = self.lines_of(c)
        if not lines and not self.queue and not self.sending:
            if c.partial:
                return  # nothing to send, nothing completed
            if c.position is not None:  # nothing to delete and nothing ahead of it: done already
                g.merge(self.acked, c.position)
            else:
                g.advance(self.acked, c.gtid)
            self.dirty = True
            return
        self.queue.append(Entry(c.gtid, c.commit_ts, c.read_ts, lines, c.position, c.partial, c.transactions, c.flush))
        self.backlog += len(lines)
        # (counts the keys in catch-up too; a transaction's pieces count as that one transaction)
        over = self._over_bound(len(lines), self._pieces_start if c.partial or c.continued else None)
        if may_shed and over:
            self.shed()
        elif lines:
            self.on_ready()

    # -- bounded memory -----------------------------------------------------------------------------------

    def _over_bound(self, n: int, since: int | None = None) -> bool:
        """Count the `n` keys just queued; True if the keys queued, less the oversize one's, pass the bound.

        `since`: the keys are a piece of a transaction whose keys started there (in `_keys_queued`).

        Shedding bounds what a slow or dead destination makes this flow hold on its own. One transaction
        bigger than `oversize` is held once whatever the flows do (every flow queues the same tuple) and
        is not a sign of a slow destination, so the oldest such transaction still queued is not counted:
        a healthy flow takes a huge transaction without shedding, a dead one holds at most `max_backlog`
        keys besides it. A second oversize transaction queued behind the first counts in full.
        """
        first = self._keys_queued if since is None else since
        self._keys_queued += n
        acked = self._keys_queued - self.backlog
        start, end = self._oversize_span
        # the exemption is free (its transaction is acknowledged) or already this transaction's (a next piece)
        if self._keys_queued - first > self.oversize and (end <= acked or start == first):
            start, end = self._oversize_span = first, self._keys_queued
        exempt = max(0, end - max(start, acked))
        return self.backlog - exempt > self.max_backlog

    def shed(self) -> None:
        """Drop everything queued; the flow will be re-read from `acked` by a catch-up reader."""
        self.queue.clear()
        self.head_offset = 0
        self.backlog = 0
        self._keys_queued = 0
        self._oversize_span = (0, 0)
        self._pieces = None
        self._drop_in_flight()
        self.epoch += 1  # an ack for the batch in flight now belongs to the past
        self.enqueued = dict(self.acked)
        self._set_state(SHED)
        if self.metrics is not None:
            self.metrics.sheds.labels(flow=self.name).inc()
        self.on_shed(self)

    def start_catchup(self) -> g.Position:
        """Enter catch-up; returns the position the catch-up reader starts from."""
        self.enqueued = dict(self.acked)
        self._set_state(CATCHING_UP)
        if self.metrics is not None:
            self.metrics.catchups.labels(flow=self.name).inc()
        return dict(self.acked)

    def caught_up(self, live: g.Position, live_pieces: g.Gtid | None = None) -> bool:
        """True once this (catching-up) flow has queued everything the live stream has dispatched, and the
        live stream is between transactions (`live_pieces`: the one it is handing on in pieces, if any, whose
        first pieces this flow did not get)."""
        return self.state == CATCHING_UP and live_pieces is None and g.covers_position(self.enqueued, live)

    def wait_room(self, bound: int, timeout: float) -> bool:
        """The catch-up reader's brake (its thread): wait until at most `bound` keys are unacknowledged, at most
        `timeout` seconds; whether they are. Every acknowledgement on the reactor wakes it to look again."""
        if self.backlog <= bound:
            return True
        self.on_acked = self._room.set
        self._room.wait(timeout)
        self._room.clear()  # (an ack between the wait and the clear is seen by the caller's next look)
        return self.backlog <= bound

    def rejoin(self) -> None:
        self._set_state(LIVE)
        self.on_acked = None  # the catch-up reader's brake went with it
        if self.metrics is not None:
            self.metrics.rejoins.labels(flow=self.name).inc()

    def rewind(self, position: g.Position) -> None:
        """Operator replay: forget the queue, resume from `position` through a catch-up reader."""
        self.acked = dict(position)
        self.dirty = True
        self.shed()

    # -- output (the batcher) -------------------------------------------------------------------------------

    @property
    def in_flight(self) -> Batch | None:
        """The oldest batch in flight (the next one to be acknowledged), if any."""
        return self.sending[0] if self.sending else None

    @property
    def pending_keys(self) -> int:
        """Keys queued and not yet in flight."""
        return self.backlog - self._sent_keys

    def take_batch(self, batch_size: int, max_in_flight: int = 1) -> Batch | None:
        """The next batch (up to `batch_size` keys), now in flight behind any others.

        None if `max_in_flight` batches are in flight, nothing is left to send or `may_send` says no. A batch
        of key-less transactions only is handed out when nothing else is in flight (it is acknowledged without
        a round trip, and acknowledgements go in order).
        """
        sending = self.sending
        if len(sending) >= max_in_flight or self._sent_entries >= len(self.queue):
            return None
        if self.may_send is not None and not self.may_send():
            return None
        parts: list[bytes | memoryview] = []
        n = 0
        done = 0
        offset = self._sent_offset
        entries = itertools.islice(self.queue, self._sent_entries, None) if self._sent_entries else self.queue
        flushes = 0
        for e in entries:
            lines = e.lines
            if not offset and e.flush:  # (FLUSH_LINE is only ever an entry's first line)
                flushes += 1
            room = batch_size - n
            total = len(lines)
            avail = total - offset
            if avail <= room:
                if avail:
                    _add_lines(parts, lines, offset, total)
                n += avail
                done += 1
                offset = 0
                if n >= batch_size:
                    break
            else:
                _add_lines(parts, lines, offset, offset + room)
                n += room
                offset += room
                break
        if n == 0 and sending:
            return None
        parts.append(b"mn\r\n")
        batch = Batch(b"".join(parts), n, done, offset, self.epoch, flushes)
        sending.append(batch)
        self._sent_entries += done
        self._sent_offset = offset
        self._sent_keys += n
        return batch

    def ack(self, batch: Batch) -> None:
        """The destination answered `MN` for `batch` (the oldest in flight): its transactions are done."""
        if batch.epoch != self.epoch or not self.sending or batch is not self.sending[0]:
            return
        self.sending.popleft()
        self._sent_entries -= batch.entries
        self._sent_keys -= batch.nkeys
        now = self.clock()
        latency, delivery = self._latency, self._delivery
        for _ in range(batch.entries):
            e = self.queue.popleft()
            if e.partial:
                continue  # its transaction completes with its last piece
            if e.position is not None:
                g.merge(self.acked, e.position)
            else:
                g.advance(self.acked, e.gtid)
            self.last_acked_commit_ts = e.commit_ts
            if e.lines and latency is not None and delivery is not None:
                observe_times(latency, max(0.0, now - e.commit_ts), e.transactions)
                observe_times(delivery, max(0.0, now - e.read_ts), e.transactions)
        self.head_offset = batch.end_offset
        self.backlog -= batch.nkeys
        self.dirty = True
        if self.on_acked is not None:
            self.on_acked()
        if self.queue:
            self.on_ready()

    def fail(self, batch: Batch) -> None:
        """`batch` was not acknowledged: it and every batch sent after it stay queued and are sent again."""
        if any(b is batch for b in self.sending):  # (batches from before a shed are no longer here)
            self._drop_in_flight()

    def _drop_in_flight(self) -> None:
        self.sending.clear()
        self._sent_entries = 0
        self._sent_offset = self.head_offset
        self._sent_keys = 0

    # -- observability ----------------------------------------------------------------------------------------

    def lag(self) -> float:
        """Seconds this destination is behind the primary's commits (a lower bound), the larger of:

        * queued: now minus the commit time of the oldest transaction not yet acknowledged (commit times
          are the primary's, also in a replica's binlog);
        * source: `source_lag(acked, now)`, the time since the source first showed a position `acked` does
          not cover plus the source's own replication lag: nonzero while nothing reaches the queue at all.

        Read from the /metrics thread: no I/O here, and the queue may change under us.
        """
        try:
            oldest: float | None = self.queue[0].commit_ts
        except IndexError:  # nothing queued
            oldest = None
        return lag_of(self.clock(), oldest, self.state, self.last_acked_commit_ts, self.source_lag, dict(self.acked))

    def _set_state(self, state: str) -> None:
        self.state = state
        show_state(self.metrics, self.name, state)


def lag_of(
    now: float,
    oldest: float | None,
    state: str,
    last_acked_commit_ts: float | None,
    source_lag: Callable[[g.Position, float], float] | None,
    acked: g.Position,
) -> float:
    """`Flow.lag` from its parts (a native flow's are read from the delivery thread): the commit time of the
    oldest entry not acknowledged (or, with nothing queued and the flow off the live stream, of the last one
    acknowledged), or the source's lead over `acked`, whichever is further behind."""
    queued = 0.0
    if oldest is not None:
        queued = max(0.0, now - oldest)
    elif state != LIVE and last_acked_commit_ts is not None:
        queued = max(0.0, now - last_acked_commit_ts)
    source = source_lag(acked, now) if source_lag is not None else 0.0
    return max(queued, source)


def show_state(metrics: Metrics | None, name: str, state: str) -> None:
    """`squeal_flow_state`: 1 for the flow's state, 0 for the others."""
    if metrics is not None:
        for s in STATES:
            metrics.state.labels(flow=name, state=s).set(1 if s == state else 0)


def destinations(region: Region) -> list[tuple[str, str, tuple[Address, ...]]]:
    """(name, kind, routers) of each destination of `region`: every cluster, then the regional pool if it has one
    (its keys go through any router of the region)."""
    out = [(c.name, "cluster", tuple(c.routers)) for c in region.clusters]
    if region.regional_pool is not None:
        out.append((REGIONAL, REGIONAL, tuple(a for c in region.clusters for a in c.routers)))
    return out


def flows_for_region(
    region: Region, starts: dict[str, g.Position], max_backlog: int, metrics: Metrics | None = None
) -> list[Flow]:
    """One flow per destination of `region`."""
    return [Flow(n, kind, routers, starts[n], max_backlog, metrics) for n, kind, routers in destinations(region)]


def flow_names(region: Region) -> list[str]:
    return [name for name, _, _ in destinations(region)]


class Dispatcher:
    """Hands each committed transaction of the live stream to every flow; remembers how far it got."""

    def __init__(self, flows: Sequence[Flow], start: g.Position) -> None:
        self.flows = {f.name: f for f in flows}
        self.live: g.Position = dict(start)
        self.pieces: g.Gtid | None = None  # the transaction being handed on in pieces, until its last one

    def dispatch(self, c: Committed) -> None:
        self.dispatched(c)
        for f in self.flows.values():
            f.offer_live(c)

    def dispatched(self, c: Committed) -> None:
        """The live stream got as far as `c` (between transactions unless `c` is a piece with more to come)."""
        if c.position is not None:
            g.merge(self.live, c.position)
            self.pieces = None
        elif c.partial:
            self.pieces = c.gtid
        else:
            g.advance(self.live, c.gtid)
            self.pieces = None
