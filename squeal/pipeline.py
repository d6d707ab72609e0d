"""The reading half of the pipeline on one thread: reader -> transactions -> rules -> `Committed`.

The live stream and every catch-up reader run this same loop on their own thread and binlog connection.
Results cross to the reactor thread through a `Handoff`, which coalesces: under load one reactor wake-up
carries many transactions; when idle each transaction is handed over at once (no added latency).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from squeal.flows import Committed, split_keys
from squeal.metrics import Metrics
from squeal.reader import BinlogReader
from squeal.rules import KeyExtractor, delete_lines
from squeal.transactions import Transaction, TransactionGrouper

log = logging.getLogger(__name__)


class KeyStage:
    """Transaction -> Committed: keys from rules and comments, split by destination kind, as wire lines."""

    def __init__(self, extractor: KeyExtractor, regional_prefixes: Sequence[str],
                 metrics: Metrics | None = None) -> None:
        self.extractor = extractor
        self.regional_prefixes = tuple(regional_prefixes)
        self.metrics = metrics
        self._missing_reported: dict[tuple[str, str, str], int] = {}
        # Label lookups are dict work under a lock: resolve the children once, not per transaction.
        self._keys_rule = metrics.keys.labels(source="rule") if metrics is not None else None
        self._keys_comment = metrics.keys.labels(source="comment") if metrics is not None else None

    def process(self, txn: Transaction, read_ts: float | None = None) -> Committed:
        keys, from_rules, from_comments = self.extractor.keys(txn)
        rewritten: dict[str, int] = {}
        if self.regional_prefixes:
            cluster, regional = split_keys(keys, self.regional_prefixes)
            cluster_lines, regional_lines = delete_lines(cluster, rewritten), delete_lines(regional, rewritten)
        else:
            cluster_lines, regional_lines = delete_lines(keys, rewritten), ()
        c = Committed(txn.gtid, txn.timestamp, time.time() if read_ts is None else read_ts,
                      cluster_lines, regional_lines)
        m = self.metrics
        if m is not None:
            if from_rules:
                self._keys_rule.inc(from_rules)  # type: ignore[union-attr]
            if from_comments:
                self._keys_comment.inc(from_comments)  # type: ignore[union-attr]
            for how, n in rewritten.items():
                m.keys_rewritten.labels(encoding=how).inc(n)
            if len(self.extractor.missing_columns) != len(self._missing_reported):
                for (schema, table, column), n in self.extractor.missing_columns.items():
                    before = self._missing_reported.get((schema, table, column), 0)
                    m.missing_columns.labels(table=f"{schema}.{table}", column=column).inc(n - before)
                    self._missing_reported[(schema, table, column)] = n
        return c


class Handoff:
    """Reader thread -> reactor thread, coalescing and bounded.

    The bound counts keys (plus one per transaction) and is squeal's own back-pressure: if the reactor
    thread cannot keep up with decoding, the reader waits here instead of piling transactions up (and
    making healthy flows shed). Destinations never hold the reader back; only their flows shed.
    The reactor takes at most `chunk` transactions per turn so sockets (acks, sends) are served between.

    Wake-ups: the first transaction after a quiet spell wakes the reactor at once (no added latency).
    While transactions keep coming, the reactor instead looks again `linger` seconds after a drain that
    found some, without being woken per transaction: each wake-up costs a GIL hand-off between the two
    threads, and under a fast replay those hand-offs, not the work, were a good share of squeal's cost.
    """

    def __init__(self, reactor: Any, deliver: Callable[[list[Committed]], None], bound: int = 20000,
                 chunk: int = 200, linger: float = 0.001) -> None:
        self.reactor = reactor
        self.deliver = deliver
        self.bound = bound
        self.chunk = chunk
        self.linger = linger
        self._items: collections.deque[Committed] = collections.deque()
        self._weight = 0
        self._scheduled = False
        self._cond = threading.Condition()

    @staticmethod
    def _weigh(c: Committed) -> int:
        return 1 + len(c.cluster_lines) + len(c.regional_lines)

    def put(self, c: Committed) -> None:  # reader thread
        w = self._weigh(c)
        with self._cond:
            while self._weight >= self.bound:
                self._cond.wait(0.5)
            self._items.append(c)
            self._weight += w
            if self._scheduled:
                return
            self._scheduled = True
        self.reactor.callFromThread(self._drain)

    def _drain(self) -> None:  # reactor thread
        with self._cond:
            n = min(self.chunk, len(self._items))
            items = [self._items.popleft() for _ in range(n)]
            self._weight -= sum(self._weigh(c) for c in items)
            more = bool(self._items)
            again = more or (bool(items) and self.linger > 0)  # busy: look again soon rather than be woken
            self._scheduled = again
            self._cond.notify_all()
        if items:
            self.deliver(items)
        if more:
            self.reactor.callLater(0, self._drain)  # let the reactor serve sockets before the next chunk
        elif again:
            self.reactor.callLater(self.linger, self._drain)


class ReadLoop:
    """Runs reader -> grouper -> key stage on a thread; each committed transaction goes to `sink`."""

    def __init__(self, reader: BinlogReader, stage: KeyStage, sink: Callable[[Committed], None],
                 metrics: Metrics | None = None, wait: Callable[[], None] | None = None) -> None:
        self.reader = reader
        self.stage = stage
        self.sink = sink
        self.metrics = metrics
        self.wait = wait  # called before each transaction is handed on: a catch-up reader's brake
        self.grouper = TransactionGrouper()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        name = self.reader.name
        m = self.metrics
        tx = m.transactions.labels(reader=name) if m else None
        rows = m.rows.labels(reader=name) if m else None
        event_time = m.reader_event_time.labels(reader=name) if m else None
        try:
            reconnects = rolled_back = 0
            for ev in self.reader:
                txn = self.grouper.feed(ev)
                if txn is None:
                    if m is not None and self.reader.reconnects != reconnects:
                        m.reader_reconnects.labels(reader=name).inc(self.reader.reconnects - reconnects)
                        reconnects = self.reader.reconnects
                    if m is not None and self.grouper.rolled_back != rolled_back and name == "live":
                        m.rolled_back.inc(self.grouper.rolled_back - rolled_back)
                        rolled_back = self.grouper.rolled_back
                    continue
                self.reader.commit(txn.gtid)
                if self.wait is not None:
                    self.wait()
                    if self.reader.stopped:
                        break
                c = self.stage.process(txn)
                if tx is not None and rows is not None and event_time is not None:
                    tx.inc()
                    n = sum([r.changes for r in txn.rows])
                    if n:
                        rows.inc(n)
                    event_time.set(txn.timestamp)
                self.sink(c)
        except BaseException as e:  # noqa: BLE001 - reported by the daemon, which stops
            self.error = e
            log.exception("binlog reader %s failed", name)

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self.run, name=f"squeal-reader-{self.reader.name}", daemon=True)
        self.thread.start()
        return self.thread

    def stop(self, timeout: float = 2.0) -> None:
        self.reader.stop()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)
