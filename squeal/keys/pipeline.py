"""The reading half of the pipeline on one thread: reader -> transactions -> rules -> `Committed`.

The live stream and every catch-up reader run this same loop on their own thread and binlog connection.
Results cross to the reactor thread through a `Handoff`, which coalesces: under load one reactor wake-up
carries many transactions; when idle each transaction is handed over at once (no added latency).

A huge transaction is handed on in pieces while it is read (`stream_lines`): MariaDB writes a group to the
binlog when it commits, so its rows are committed already (except an XA PREPARE group's, which waits for its
decision) and their deletes can start before its last row arrives; reading and sending then overlap. The
datamarkers still move only past whole transactions (squeal/delivery/flows.py).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import Counter

from router_config import Rule
from squeal.delivery.flows import Committed, split_keys
from squeal.keys.bulk import BulkChange, BulkDetector, changed_columns, existing_tables
from squeal.keys.rules import LINES, RENDERED, KeyExtractor, delete_lines
from squeal.process.metrics import Metrics
from squeal.read import gtid as g
from squeal.read.native import NativeBinlogReader
from squeal.read.reader import BinlogReader, DataLoss
from squeal.read.transactions import Begin, CommittedRun, PreparedXa, Restart, Rows, Transaction, TransactionGrouper

log = logging.getLogger(__name__)

# A transaction with more delete lines than this waiting to be handed on sends them before it ends, in
# pieces of about this size: big enough that a piece costs one hand-off among thousands of keys, small
# enough that the deletes of a 100,000-row transaction start within a few milliseconds of its first rows.
STREAM_LINES = 8192


class KeyStage:
    """Transaction -> Committed: keys from rules and comments, split by destination kind, as wire lines.

    Row events are rendered as they are read (`render`, called by the read loop): an open transaction holds
    its distinct keys, not its row images, and a key it renders again is dropped there (counted in
    `squeal_keys_duplicates_total`). One `Committed` carries one copy of those keys as delete lines, and every
    flow queues that same tuple.
    """

    def __init__(
        self,
        extractor: KeyExtractor,
        regional_prefixes: Sequence[str],
        metrics: Metrics | None = None,
        rules: Sequence[Rule] = (),
    ) -> None:
        self.extractor = extractor
        self.bulk = BulkDetector(rules)
        self.alerts: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)  # for /healthz
        self.regional_prefixes = tuple(regional_prefixes)
        self.metrics = metrics
        self._missing_reported: dict[tuple[str, str, str], int] = {}
        self._filtered_reported: dict[tuple[str, str, str], int] = {}
        # Label lookups are dict work under a lock: resolve the children once, not per transaction.
        self._keys_rule = metrics.keys.labels(source="rule") if metrics is not None else None
        self._keys_comment = metrics.keys.labels(source="comment") if metrics is not None else None
        # One KeyStage per daemon (and registry): the live and catch-up read loops share it.
        self._duplicates = (
            Counter(
                "squeal_keys_duplicates",
                "Keys a transaction rendered again (e.g. feed:{author_id} for every row of "
                "one author), dropped: each transaction holds and sends each key once",
                registry=metrics.registry,
            )
            if metrics is not None
            else None
        )

    def render(self, rows: Rows, seen: dict[str, None]) -> Rows:
        """A row event of the open transaction as its keys not yet in `seen` (which gains them)."""
        out, duplicates = self.extractor.render(rows, seen)
        if duplicates and self._duplicates is not None:
            self._duplicates.inc(duplicates)
        return out

    def rendered_elsewhere(
        self,
        duplicates: int,
        missing: list[tuple[str, str, str, str, int]],
        filtered: list[tuple[str, str, str, int]],
        rewritten: dict[str, int],
    ) -> None:
        """What the native reader dropped, missed, filtered or encoded while rendering rows itself (`take_counts`)."""
        if duplicates and self._duplicates is not None:
            self._duplicates.inc(duplicates)
        if self.metrics is not None:
            for how, n in rewritten.items():
                if n:
                    self.metrics.keys_rewritten.labels(encoding=how).inc(n)
        for schema, table, column, template, times in missing:
            self.extractor.count_missing(schema, table, column, template, times)
        for schema, table, reason, times in filtered:
            self.extractor.count_filtered(schema, table, reason, times)

    def piece(self, txn: Transaction, rows_from: int) -> Committed:
        """The delete lines of `txn`'s row events from `rows_from` on, as a piece of it (`Committed.partial`):
        `txn` is still being read, its rows are committed (`TransactionGrouper.committing`)."""
        rows = txn.rows[rows_from:]
        keys = [k for r in rows if r.kind == RENDERED for k in r.images]  # (the python reader: keys)
        rewritten: dict[str, int] = {}
        cluster, regional = self._lines(keys, rewritten)
        native = [r.images for r in rows if r.kind == LINES]  # (the native reader: delete lines)
        if native:
            cluster, regional, _ = _with_native_lines(cluster, regional, native, 0)
        if self.metrics is not None:
            self.metrics.pieces.inc()
            self._keys_rule.inc(len(cluster) + len(regional))  # type: ignore[union-attr]
            for how, n in rewritten.items():
                self.metrics.keys_rewritten.labels(encoding=how).inc(n)
        return Committed(
            txn.gtid,
            txn.timestamp,
            time.time(),
            cluster,
            regional,
            partial=True,
            rows_from=rows_from,
            rows_to=len(txn.rows),
        )

    def run(self, run: CommittedRun) -> Committed:
        """A run of ordinary transactions the native reader grouped and rendered: nothing to decide here."""
        if self._keys_rule is not None:
            self._keys_rule.inc(len(run.cluster_lines) + len(run.regional_lines))
        self._mirror_counts()
        return Committed(
            run.last,
            run.first_ts,
            time.time(),
            run.cluster_lines,
            run.regional_lines,
            position=run.position,
            transactions=run.transactions,
        )

    def _lines(self, keys: list[str], rewritten: dict[str, int]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
        """(delete lines for every cluster, for the regional pool only)."""
        if self.regional_prefixes:
            cluster, regional = split_keys(keys, self.regional_prefixes)
            return delete_lines(cluster, rewritten), delete_lines(regional, rewritten)
        return delete_lines(keys, rewritten), ()

    def process(
        self, txn: Transaction, read_ts: float | None = None, report: bool = True, rows_from: int = 0
    ) -> Committed:
        """`report`: log and count what needs an operator (the live reader; catch-up readers re-read).
        `rows_from`: the row events before it were handed on already, in pieces (`piece`)."""
        if rows_from:
            txn.rows = txn.rows[rows_from:]  # (what the transaction still holds; bulk changes look at queries)
        keys, from_rules, from_comments = self.extractor.keys(txn)
        native = [rows.images for rows in txn.rows if rows.kind == LINES]  # the native reader's delete lines
        flush = False
        if txn.ddl is not None or txn.queries or txn.cascades:
            for change in self.bulk.changes(txn, live=report):
                flush = flush or change.rule.on_truncate == "flush"
                if report:
                    self._report(txn, change)
        rewritten: dict[str, int] = {}
        cluster_lines, regional_lines = self._lines(keys, rewritten)
        if native:
            cluster_lines, regional_lines, n = _with_native_lines(cluster_lines, regional_lines, native, from_comments)
            from_rules += n
        c = Committed(
            txn.gtid,
            txn.timestamp,
            time.time() if read_ts is None else read_ts,
            cluster_lines,
            regional_lines,
            flush,
            rows_from=rows_from,
        )
        m = self.metrics
        if m is not None:
            if from_rules:
                self._keys_rule.inc(from_rules)  # type: ignore[union-attr]
            if from_comments:
                self._keys_comment.inc(from_comments)  # type: ignore[union-attr]
            for how, n in rewritten.items():
                m.keys_rewritten.labels(encoding=how).inc(n)
        self._mirror_counts()
        return c

    def _mirror_counts(self) -> None:
        """The extractor's running counts of missing columns and filtered rows, into Prometheus."""
        m = self.metrics
        if m is None:
            return
        _mirror(
            self.extractor.missing_columns,
            self._missing_reported,
            lambda s, t, column: m.missing_columns.labels(table=f"{s}.{t}", column=column),
        )
        _mirror(
            self.extractor.filtered,
            self._filtered_reported,
            lambda s, t, reason: m.rule_filtered.labels(table=f"{s}.{t}", reason=reason),
        )

    def _report(self, txn: Transaction, change: BulkChange) -> None:
        rule, policy = change.rule, change.rule.on_truncate
        sql = change.sql if len(change.sql) <= 200 else change.sql[:200] + "..."
        what = (
            f"{change.statement.upper()} of ruled table {rule.table} at GTID {txn.gtid_text} ({sql!r}) "
            f"carries no row images: every cached key of {', '.join(rule.keys)} may be stale"
        )
        if policy == "flush":
            log.warning('%s; on_truncate = "flush": flushing every destination of the region', what)
        else:
            log.error(
                '%s; on_truncate = "alert": nothing was deleted, flush the region\'s caches '
                '(squealctl flush) or set on_truncate = "flush" for this rule',
                what,
            )
        self.alerts.append(
            {
                "time": time.time(),
                "gtid": txn.gtid_text,
                "table": rule.table,
                "statement": change.statement,
                "policy": policy,
                "sql": sql,
            }
        )
        if self.metrics is not None:
            self.metrics.bulk_changes.labels(table=rule.table, statement=change.statement, policy=policy).inc()


def _mirror(
    counts: dict[tuple[str, str, str], int],
    reported: dict[tuple[str, str, str], int],
    child: Callable[[str, str, str], Any],
) -> None:
    """Move a labelled Prometheus counter (`child(schema, table, x)`) up to the extractor's running `counts`;
    `reported` remembers what it already added."""
    if counts == reported:
        return
    for key, n in counts.items():
        before = reported.get(key, 0)
        if n != before:
            child(*key).inc(n - before)
            reported[key] = n


class HandoffGroup:
    """The reactor's side of one or more hand-offs: one wake-up, one drain and one linger for all of them.

    A region's daemon puts every shard's live hand-off in one group (`RegionDaemon`), so N shards cost the
    reactor what one shard at the same total rate does: with a hand-off per shard, each of N trickling
    shards would wake the reactor per transaction (its own quiet spell after every drain), where one busy
    stream is picked up by the linger without any wake-up; and the transactions of every shard read in
    the last `linger` reach the flows in the same turn, so their deletes share the next write.
    """

    def __init__(self, reactor: Any, chunk: int = 200, linger: float = 0.001, chunk_keys: int = 8192) -> None:
        self.reactor = reactor
        # items per turn and their keys (an item's weight), all hand-offs together, so sockets (acks, sends) are
        # served between however many shards have a backlog; shared out from a rotating first hand-off, so none
        # waits behind the others. The keys bound matters for the native reader's runs (up to ~8,192 lines an
        # item): a turn that delivered 200 of them could put more than `max_backlog` into a flow at once.
        self.chunk = chunk
        self.chunk_keys = chunk_keys
        self.linger = linger
        self.members: list[Handoff] = []
        self._cond = threading.Condition()  # guards every member's items and weight, and `_scheduled`
        self._scheduled = False
        self._first = 0

    def _drain(self) -> None:  # reactor thread
        taken: list[tuple[Handoff, list[Committed]]] = []
        more = held = False
        with self._cond:
            members = self.members[self._first :] + self.members[: self._first]
            self._first = (self._first + 1) % max(1, len(self.members))
            room, keys = self.chunk, self.chunk_keys
            for h in members:
                if h.ready is not None and h._items and not h.ready():
                    held = True  # (still scheduled: put() won't wake us)
                    continue
                items = []
                while h._items and room > 0 and keys > 0:  # (the first item of a turn always goes)
                    c = h._items.popleft()
                    w = h._weigh(c)
                    h._weight -= w
                    keys -= w
                    room -= 1
                    items.append(c)
                if items:
                    taken.append((h, items))
                more = more or bool(h._items)
                if h.closed and not h._items:
                    self.members.remove(h)
            # busy: look again soon rather than be woken
            again = more or held or (bool(taken) and self.linger > 0)
            self._scheduled = again
            self._cond.notify_all()
        for h, items in taken:
            h.deliver(items)
        if more:
            self.reactor.callLater(0, self._drain)  # let the reactor serve sockets before the next chunk
        elif again:
            self.reactor.callLater(max(self.linger, 0.001) if held and not taken else self.linger, self._drain)


class Handoff:
    """Reader thread -> reactor thread, coalescing and bounded.

    The bound counts keys (plus one per transaction) and is squeal's own back-pressure: if the reactor
    thread cannot keep up with decoding, the reader waits here instead of piling transactions up (and
    making healthy flows shed). With `ready` (the live stream: some live flow is below half its
    `max_backlog`) the hand-off also waits while every destination is full: a reader faster than the
    reactor's sending (the native reader) fills flows, not sheds them. One slow destination never holds the
    reader back while another has room; only its flow sheds.
    `put` waits only while the hand-off already holds `bound` or more, so a transaction heavier than the
    whole bound goes through (into an empty hand-off at worst) and the next `put` waits for the drain.
    The reactor takes at most `chunk` items (transactions, runs or pieces) and about `chunk_keys` keys per turn
    so sockets (acks, sends) are served between.

    Wake-ups: the first transaction after a quiet spell wakes the reactor at once (no added latency).
    While transactions keep coming, the reactor instead looks again `linger` seconds after a drain that
    found some, without being woken per transaction: each wake-up costs a GIL hand-off between the two
    threads, and under a fast replay those hand-offs, not the work, were a good share of squeal's cost.
    The wake-ups and the linger are the `group`'s (`HandoffGroup`, shared by a region's shards); without
    one, the hand-off has a group of its own.
    """

    def __init__(
        self,
        reactor: Any,
        deliver: Callable[[list[Committed]], None],
        bound: int = 20000,
        chunk: int = 200,
        linger: float = 0.001,
        ready: Callable[[], bool] | None = None,
        group: HandoffGroup | None = None,
    ) -> None:
        self.deliver = deliver
        # Reactor: False holds the hand-off (and so, once it holds `bound`, the reader) while no destination
        # has room: a reader faster than the reactor can send must not make healthy flows shed.
        self.ready = ready
        self.bound = bound
        self.group = group if group is not None else HandoffGroup(reactor, chunk, linger)
        self._items: collections.deque[Committed] = collections.deque()
        self._weight = 0
        self.closed = False  # the group forgets a closed hand-off once it is empty
        with self.group._cond:
            self.group.members.append(self)

    @staticmethod
    def _weigh(c: Committed) -> int:
        return 1 + len(c.cluster_lines) + len(c.regional_lines)

    def put(self, c: Committed) -> None:  # reader thread
        w = self._weigh(c)
        group = self.group
        with group._cond:
            while self._weight >= self.bound:
                group._cond.wait(0.5)
            self._items.append(c)
            self._weight += w
            if group._scheduled:
                return
            group._scheduled = True
        group.reactor.callFromThread(group._drain)

    def close(self) -> None:
        """Its reader stopped: what it holds is still delivered, then the group forgets it."""
        self.closed = True


def _with_native_lines(
    cluster: tuple[bytes, ...], regional: tuple[bytes, ...], native: list, from_comments: int
) -> tuple[tuple[bytes, ...], tuple[bytes, ...], int]:
    """The comment keys' lines, then the native reader's (kind LINES: (cluster, regional) per event), less any
    line a comment already sends (what `KeyExtractor.keys` drops as a duplicate); and the lines added."""
    sent = set(cluster) | set(regional) if from_comments else None
    out_c, out_r = [cluster], [regional]
    added = 0
    for c, r in native:
        if sent is not None:
            c = tuple(line for line in c if line not in sent)
            r = tuple(line for line in r if line not in sent)
        out_c.append(c)
        out_r.append(r)
        added += len(c) + len(r)
    return tuple(itertools.chain.from_iterable(out_c)), tuple(itertools.chain.from_iterable(out_r)), added


class ReadLoop:
    """Runs reader -> grouper -> key stage on a thread; each committed transaction goes to `sink`."""

    def __init__(
        self,
        reader: BinlogReader | NativeBinlogReader,
        stage: KeyStage,
        sink: Callable[[Committed], None],
        metrics: Metrics | None = None,
        wait: Callable[[], None] | None = None,
        xa: PreparedXa | None = None,
        on_data_loss: Callable[[ReadLoop, DataLoss], g.Position | None] | None = None,
        stream_lines: int = STREAM_LINES,
    ) -> None:
        self.reader = reader
        self.stream_lines = stream_lines  # hand a transaction on in pieces once this many lines wait (0: never)
        if stream_lines and isinstance(reader, NativeBinlogReader):
            reader.whole_up_to = stream_lines  # (a bigger transaction comes as events, to be handed on in pieces)
        self.xa = xa  # the live reader records XA prepares and decisions here (datamarkers wait for them)
        # Called on this thread when the binlog cannot serve the reader's position: returns the position to
        # resume after (the destinations have been told to flush) or None (stopping). May block (halt).
        self.on_data_loss = on_data_loss
        self.stage = stage
        self.sink = sink
        self.metrics = metrics
        self.wait = wait  # called before each transaction is handed on: a catch-up reader's brake
        self.grouper = TransactionGrouper()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _know_existing_tables(self) -> None:
        """The live stream: which ruled tables exist now, so a DROP DATABASE counts only for those that existed
        (`BulkDetector.know_existing`). Without it (no source, an error) every ruled table counts."""
        source = getattr(self.reader, "source", None)
        if source is None:
            return
        try:
            conn = source.connect()
            try:
                found = existing_tables(conn, {schema for schema, _ in self.stage.bulk.rules})
            finally:
                conn.close()
        except Exception as e:  # noqa: BLE001 - only the DROP DATABASE alerts get wider
            log.warning(
                "cannot read which ruled tables exist (%s): a DROP DATABASE will alert for every ruled "
                "table of its database",
                e,
            )
            return
        if found is not None:
            self.stage.bulk.know_existing(*found)

    def run(self) -> None:
        name = self.reader.name
        m = self.metrics
        if name == "live":
            self._know_existing_tables()
        tx = m.transactions.labels(reader=name) if m else None
        rows = m.rows.labels(reader=name) if m else None
        event_time = m.reader_event_time.labels(reader=name) if m else None
        try:
            reconnects = rolled_back = 0
            # Keys of the group being read. Each row event is rendered as it arrives and the grouper gets it
            # as its new keys (`KeyStage.render`): an open transaction holds its distinct keys, not its row
            # images. Every group starts with a GTID event (`Begin`); after a reconnect it is read again whole.
            group: dict[str, None] = {}
            streamed = waiting = 0  # row events of the group handed on in pieces; delete lines not yet
            cascades: list = []  # FK cascades to ruled tables in the group being read (not in the binlog)
            parents = self.stage.bulk.parents
            take_counts = getattr(self.reader, "take_counts", None)  # NativeBinlogReader
            read_rows = 0
            for ev in self.reader:
                if isinstance(ev, DataLoss):  # (isinstance: mypy narrows the event union by it)
                    self._data_loss(ev)
                    continue
                if type(ev) is CommittedRun:  # the native reader's: ordinary transactions, grouped and rendered
                    self.grouper.abandon()
                    group, cascades, streamed, waiting = {}, [], 0, 0
                    read_rows += ev.rows
                    if take_counts is not None:
                        self.stage.rendered_elsewhere(*take_counts())
                    self.reader.commit_run(ev)  # type: ignore[union-attr]
                    if self.wait is not None:
                        self.wait()
                        if self.reader.stopped:
                            break
                    c = self.stage.run(ev)
                    if tx is not None and rows is not None and event_time is not None:
                        tx.inc(ev.transactions)
                        if read_rows:
                            rows.inc(read_rows)
                        event_time.set(ev.last_ts)
                    read_rows = 0
                    self.sink(c)
                    del c
                    continue
                if type(ev) is Rows:
                    read_rows += ev.changes
                    if parents and (ev.schema, ev.table) in parents:
                        # an update cascades only if it changed a column a foreign key references
                        changed = ev.changed_columns
                        if changed is None and ev.kind == "update" and ev.images:
                            changed = changed_columns(ev.images)
                        cascades += self.stage.bulk.cascaded((ev.schema, ev.table), ev.kind, changed)
                    if ev.kind == LINES:  # (the native reader renders rows itself)
                        waiting += len(ev.images[0]) + len(ev.images[1])
                    else:
                        if ev.kind != RENDERED:
                            ev = self.stage.render(ev, group)
                        waiting += len(ev.images)
                elif type(ev) is Begin or type(ev) is Restart:
                    group = {}
                    cascades = []
                    streamed = waiting = 0
                txn = self.grouper.feed(ev)
                if txn is None:
                    if self.stream_lines and waiting >= self.stream_lines:
                        streaming = self.grouper.committing
                        if streaming is not None:
                            if self.wait is not None:
                                self.wait()
                            self.sink(self.stage.piece(streaming, streamed))
                            streamed, waiting = len(streaming.rows), 0
                    if m is not None and self.reader.reconnects != reconnects:
                        m.reader_reconnects.labels(reader=name).inc(self.reader.reconnects - reconnects)
                        reconnects = self.reader.reconnects
                    if m is not None and self.grouper.rolled_back != rolled_back and name == "live":
                        m.rolled_back.inc(self.grouper.rolled_back - rolled_back)
                        rolled_back = self.grouper.rolled_back
                    continue
                group = {}  # the transaction holds its keys (as rendered row events); the index can go
                rows_from, streamed, waiting = streamed, 0, 0
                if take_counts is not None:
                    self.stage.rendered_elsewhere(*take_counts())
                if cascades:
                    txn.cascades, cascades = cascades, []
                if txn.xa:
                    if not self._xa(txn):
                        continue
                self.reader.commit(txn.gtid)
                if self.wait is not None:
                    self.wait()
                    if self.reader.stopped:
                        break
                c = self.stage.process(txn, report=name == "live", rows_from=rows_from)
                if tx is not None and rows is not None and event_time is not None:
                    tx.inc()
                    if read_rows:
                        rows.inc(read_rows)  # rows read since the last transaction handed on
                    event_time.set(txn.timestamp)
                read_rows = 0
                self.sink(c)
                del txn, c  # the flows hold its delete lines: keep no keys alive until the next transaction
        except BaseException as e:
            self.error = e
            log.exception("binlog reader %s failed", name)

    def _xa(self, txn: Transaction) -> bool:
        """Record an XA prepare (False: nothing to send yet) or decision (True: send it like any commit)."""
        if txn.xa == "prepare":
            if self.xa is not None:  # reading again from before the prepare finds its rows
                self.xa.prepared(txn.xid, txn.gtid, dict(self.reader.committed))
            return False
        if self.xa is not None:
            self.xa.decided(txn.xid, txn.gtid)
            if txn.xa_unknown and txn.xa == "commit":
                log.error(
                    "XA COMMIT %s at GTID %s: its XA PREPARE is before squeal's start position, so its "
                    "rows' keys are unknown and were not deleted",
                    txn.xid,
                    txn.gtid_text,
                )
                if self.metrics is not None:
                    self.metrics.xa_unknown.inc()
        return True

    def _data_loss(self, loss: DataLoss) -> None:
        resume = self.on_data_loss(self, loss) if self.on_data_loss is not None else None
        if resume is None or self.reader.stopped:
            return
        self.reader.resume_from(resume)
        domain, (server, seq) = next(iter(sorted(resume.items())), (0, (0, 0)))
        now = time.time()
        self.sink(Committed((domain, server, seq), now, now, (), (), flush=True, position=dict(resume)))

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self.run, name=f"squeal-reader-{self.reader.name}", daemon=True)
        self.thread.start()
        return self.thread

    def stop(self, timeout: float = 2.0) -> None:
        self.reader.stop()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)
