"""Stage 2: group binlog events into committed transactions.

The reader turns library events into the small plain-data events below; `TransactionGrouper.feed`
returns a `Transaction` only when the transaction's outcome is seen:

* `Begin` (MariaDB's GTID event) opens a transaction. MariaDB writes no `BEGIN` query: the GTID event
  is the begin. A GTID event flagged *standalone* is a DDL statement (or similar) that commits by itself.
* `Annotate` carries the original SQL text of the statement whose row events follow (the source of
  `/* mcd:... */` keys).
* `Rows` carries the before/after images of the changed rows of one table.
* `Commit` is the XID event (transactional engines) or a `COMMIT` query (non-transactional engines).
* `XaPrepare` ends the first half of an XA transaction (`XA PREPARE`): its rows are logged now, the
  decision (`XA COMMIT` / `XA ROLLBACK`) comes later as a group of its own with no rows. The grouper keeps
  the prepared rows by XID and emits them with the `XA COMMIT`'s GTID. The daemon must not let a
  datamarker pass a prepare whose decision it has not seen (`PreparedXa` below).
* `Query` is any other query event. Parsed, not guessed from its first word: `ROLLBACK TO SAVEPOINT`
  inside a committed group is nothing; a whole `ROLLBACK` drops the group unless it carries row images
  (rows that reached the binlog of a group that rolled back were written to a table that cannot roll
  back, e.g. MyISAM: they persisted and their keys are invalidated); `XA COMMIT`/`XA ROLLBACK` decide a
  prepared XA transaction; in a standalone group the query itself ends it (DDL such as ALTER TABLE);
  any other statement inside a group (a statement-logged change, no row images) is kept in `queries`
  so the key stage can tell the operator.
* `Restart` means the reader reconnected: anything half-read is discarded, the reader resumes from the
  last committed GTID so the transaction will come again in full.
* `CommittedRun` (the native reader only) is not fed to the grouper: consecutive *ordinary* transactions
  (rows and an XID, nothing this stage would decide) that the native reader grouped itself, handed on as
  their delete lines and the position they reach (`squeal_native/src/stream.rs`). It comes only between
  groups; one still open when it comes never committed (`TransactionGrouper.abandon`).

Invalidations happen only for what this stage emits, so a delete is never sent for a transaction that
did not commit (and rows of a rolled-back group only when they could not be rolled back).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from squeal.read import gtid as g
from squeal.read.gtid import Gtid

# MariaDB GTID event flags: the event group is a single statement with no XID (DDL, FLUSH, ...); the group
# is an XA transaction's prepared part (committed or rolled back later, by its own decision group).
FL_STANDALONE = 0x01
FL_PREPARED_XA = 0x40

# Statements are matched after leading comments and whitespace; case-insensitive.
_LEADING_COMMENTS = re.compile(r"^(?:\s+|/\*.*?\*/|--[^\n]*\n|#[^\n]*\n)*", re.DOTALL)
_WHOLE_ROLLBACK = re.compile(
    r"ROLLBACK(?:\s+WORK)?(?:\s+AND\s+(?:NO\s+)?CHAIN)?(?:\s+(?:NO\s+)?RELEASE)?\s*;?\s*$", re.IGNORECASE
)
_SAVEPOINT_ROLLBACK = re.compile(r"ROLLBACK(?:\s+WORK)?\s+TO\b", re.IGNORECASE)
_NOTHING_TO_DO = re.compile(
    r"(?:BEGIN|START\s+TRANSACTION|SAVEPOINT|RELEASE\s+SAVEPOINT|XA\s+(?:START|BEGIN|END))\b", re.IGNORECASE
)
# MariaDB logs an XID as X'<gtrid hex>',X'<bqual hex>',<formatID> in XA END / XA COMMIT / XA ROLLBACK.
_XA_DECISION = re.compile(
    r"XA\s+(COMMIT|ROLLBACK)\s+X'([0-9A-Fa-f]*)'\s*,\s*X'([0-9A-Fa-f]*)'\s*,\s*(\d+)", re.IGNORECASE
)


def xid_text(gtrid: bytes, bqual: bytes, format_id: int) -> str:
    """One spelling of an XA transaction id, the same from the prepare event and the decision query."""
    return f"{gtrid.hex()},{bqual.hex()},{format_id}"


def statement_body(sql: str) -> str:
    """`sql` without leading comments and whitespace (MariaDB may log `/* ... */` before a statement)."""
    return sql[_LEADING_COMMENTS.match(sql).end() :]  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class Begin:
    gtid: Gtid
    timestamp: float  # the GTID event's header timestamp (commit time, 1 s resolution)
    standalone: bool = False
    prepared_xa: bool = False  # an XA PREPARE group: its rows are prepared, not committed (FL_PREPARED_XA)


@dataclass(frozen=True, slots=True)
class Annotate:
    sql: bytes


@dataclass(frozen=True, slots=True)
class Rows:
    schema: str
    table: str
    kind: str  # "insert" | "update" | "delete" (`rules.RENDERED`: `images` are keys; `rules.LINES`: delete lines)
    images: tuple[Any, ...]  # every row image: after (insert), before (delete), before and after (update)
    # Rows changed, when `images` cannot tell: the native reader's events carry keys (or, for a parent of a
    # cascading foreign key, nothing) instead of row images. -1: count the images.
    changed: int = -1
    # The native reader's event for an update of a parent of a cascading foreign key (no images): the columns
    # (lower case) it changed in some row. None: tell from `images`.
    changed_columns: frozenset[str] | None = None

    @property
    def changes(self) -> int:
        """Rows changed (an UPDATE carries two images per row)."""
        if self.changed >= 0:
            return self.changed
        return len(self.images) // 2 if self.kind == "update" else len(self.images)


@dataclass(frozen=True, slots=True)
class Commit:
    pass


@dataclass(frozen=True, slots=True)
class Query:
    sql: str
    schema: str = ""  # the session's default database when the statement ran (for unqualified names)


@dataclass(frozen=True, slots=True)
class XaPrepare:
    """`XA PREPARE` (MariaDB's XA_PREPARE_LOG_EVENT): the rows before it are prepared, not committed."""

    xid: str  # see `xid_text`


@dataclass(frozen=True, slots=True)
class Restart:
    pass


class JoinedLines:
    """Delete lines end to end in one buffer, as the native reader hands a run's on: `data` holds them and line
    `i` ends at `ends[i]`. A flow sends a span of them with one copy (`span`) instead of handling one object per
    line, which was most of the reactor's cost per row. Iterating gives the lines one by one (tests, oracles)."""

    __slots__ = ("data", "ends")

    def __init__(self, data: bytes, ends: bytes) -> None:
        self.data = data
        self.ends = memoryview(ends).cast("I")  # native-endian u32 offsets, one per line

    def __len__(self) -> int:
        return len(self.ends)

    def span(self, a: int, b: int) -> memoryview:
        """Lines [a, b), CRLFs included (a < b <= len)."""
        ends = self.ends
        return memoryview(self.data)[ends[a - 1] if a else 0 : ends[b - 1]]

    def __iter__(self) -> Iterator[bytes]:
        start = 0
        for end in self.ends:
            yield self.data[start:end]
            start = end

    def __repr__(self) -> str:
        return f"JoinedLines({len(self)} lines)"


# A transaction's delete lines for one kind of destination: one bytes object per line, or a run's joined ones.
Lines = tuple[bytes, ...] | JoinedLines


@dataclass(frozen=True, slots=True)
class CommittedRun:
    """Consecutive ordinary transactions, grouped and rendered by the native reader (one object for all)."""

    position: g.Position  # each domain's last transaction in the run
    last: Gtid
    first_ts: float  # commit time (GTID event timestamp) of the first transaction
    last_ts: float
    transactions: int
    rows: int  # rows changed in ruled tables
    cluster_lines: JoinedLines  # delete lines for every cluster, in transaction order
    regional_lines: JoinedLines  # for the regional pool only

    @classmethod
    def from_buffers(
        cls,
        position: g.Position,
        last: Gtid,
        first_ts: float,
        last_ts: float,
        transactions: int,
        rows: int,
        cluster: tuple[bytes, bytes],
        regional: tuple[bytes, bytes],
    ) -> CommittedRun:
        """The native reader's constructor: each kind's lines as (data, ends) buffers."""
        return cls(position, last, first_ts, last_ts, transactions, rows, JoinedLines(*cluster), JoinedLines(*regional))


Event = Begin | Annotate | Rows | Commit | Query | XaPrepare | Restart | CommittedRun


@dataclass(slots=True)
class Transaction:
    gtid: Gtid
    timestamp: float
    statements: list[bytes] = field(default_factory=list)
    rows: list[Rows] = field(default_factory=list)
    ddl: str | None = None  # the statement of a standalone (DDL) transaction
    schema: str = ""  # the default database of `ddl`
    queries: list[tuple[str, str]] = field(default_factory=list)  # (schema, sql) logged as statements in a group
    rolled_back: bool = False  # ended in ROLLBACK, but carried rows that persisted (non-transactional tables)
    xa: str = ""  # "prepare": rows of an undecided XA transaction; "commit" / "rollback": its decision group
    xid: str = ""
    xa_unknown: bool = False  # a decision whose prepare this reader never saw (its rows are unknown)
    cascades: list = field(default_factory=list)  # squeal.keys.bulk.BulkChange: FK cascades to ruled tables

    @property
    def gtid_text(self) -> str:
        return "-".join(map(str, self.gtid))


class TransactionGrouper:
    """Feed events in binlog order; get back each transaction at its commit.

    Also returned, so the reader loop can keep positions right: an XA PREPARE group (`xa == "prepare"`,
    not yet committed: send nothing) and an XA decision group (`xa == "commit"` with the prepared rows
    under the decision's GTID, or `xa == "rollback"` with none).
    """

    def __init__(self, max_prepared: int = 10_000) -> None:
        self._open: Transaction | None = None
        self._standalone = False
        self._prepared_xa = False
        self.prepared: dict[str, Transaction] = {}  # XID -> the rows of an undecided XA PREPARE
        self.max_prepared = max_prepared
        self.discarded = 0  # transactions dropped half-read (reconnect, or a GTID without a commit)
        self.rolled_back = 0

    def feed(self, event: Event) -> Transaction | None:
        kind = type(event)
        if kind is Rows:
            if self._open is not None:
                self._open.rows.append(event)  # type: ignore[arg-type]
            return None
        if kind is Annotate:
            if self._open is not None:
                self._open.statements.append(event.sql)  # type: ignore[union-attr, arg-type]
            return None
        if kind is Begin:
            if self._open is not None:
                self.discarded += 1  # a new GTID before the old one committed: never emit the partial one
            self._open = Transaction(gtid=event.gtid, timestamp=event.timestamp)  # type: ignore[union-attr]
            self._standalone = event.standalone  # type: ignore[union-attr]
            self._prepared_xa = event.prepared_xa  # type: ignore[union-attr]
            return None
        if kind is Commit:
            return self._close()
        if kind is Query:
            return self._query(event.sql, event.schema)  # type: ignore[union-attr, arg-type]
        if kind is XaPrepare:
            return self._prepare(event.xid)  # type: ignore[union-attr]
        if kind is Restart:
            if self._open is not None:
                self.discarded += 1
            self._open = None
            return None
        raise TypeError(f"not a transaction event: {event!r}")

    def abandon(self) -> None:
        """A `CommittedRun` came: the native reader saw a GTID event after the open group, which never
        committed (what `feed(Begin)` does with it)."""
        if self._open is not None:
            self.discarded += 1
            self._open = None

    @property
    def committing(self) -> Transaction | None:
        """The group being read, if its rows are committed already: a group reaches the binlog at its commit,
        so only an XA PREPARE group (whose rows its decision may still roll back) is not. Its rows so far may be
        acted on before the group ends (`ReadLoop` streams a huge one); the group still ends in
        a `Transaction` with all of them."""
        return self._open if self._open is not None and not self._prepared_xa else None

    def _query(self, sql: str, schema: str) -> Transaction | None:
        if self._open is None:
            return None
        body = statement_body(sql)
        word = body.split(None, 1)[0].upper() if body else ""
        if word == "COMMIT":
            return self._close()
        if word == "XA":
            decision = _XA_DECISION.match(body)
            if decision is not None:
                return self._decide(decision)
            return None  # XA END / XA START inside the group: nothing to do
        if word == "ROLLBACK" and not self._standalone:
            if _SAVEPOINT_ROLLBACK.match(body):
                return None  # part of a transaction that goes on (and may commit)
            if _WHOLE_ROLLBACK.match(body):
                txn, self._open = self._open, None
                self.rolled_back += 1
                if txn.rows:  # rows that could not be rolled back reached the binlog: they persisted
                    txn.rolled_back = True
                    return txn
                return None
        if self._standalone:
            self._open.ddl = sql
            self._open.schema = schema
            return self._close()
        if not _NOTHING_TO_DO.match(body):
            self._open.queries.append((schema, sql))  # a change logged as a statement: no row images
        return None

    def _prepare(self, xid: str) -> Transaction | None:
        txn, self._open = self._open, None
        if txn is None:
            return None
        txn.xa, txn.xid = "prepare", xid
        if xid not in self.prepared and len(self.prepared) >= self.max_prepared:
            raise OverflowError(f"more than {self.max_prepared} XA transactions prepared and undecided")
        self.prepared[xid] = txn  # a re-read after a reconnect replaces the same XID's rows
        return txn

    def _decide(self, m: re.Match[str]) -> Transaction | None:
        decision, gtrid, bqual, fmt = m.group(1).lower(), m.group(2), m.group(3), int(m.group(4))
        xid = xid_text(bytes.fromhex(gtrid), bytes.fromhex(bqual), fmt)
        txn, self._open = self._open, None
        assert txn is not None
        txn.xa, txn.xid = decision, xid
        prepared = self.prepared.pop(xid, None)
        if prepared is None:
            txn.xa_unknown = True
        elif decision == "commit":
            txn.statements = prepared.statements
            txn.rows = prepared.rows
            txn.queries = prepared.queries
            txn.cascades = prepared.cascades
        return txn

    def _close(self) -> Transaction | None:
        txn, self._open = self._open, None
        return txn


class PreparedXa:
    """Undecided XA transactions as positions the datamarkers must not pass (shared across threads).

    The live reader records each XA PREPARE with `before`, a position from which reading again meets
    the prepare. Until a flow has acknowledged the decision, `cap` keeps that flow's durable marker (and a
    catch-up reader's start) at `before`: after a restart, the prepare's rows are read again and the later
    `XA COMMIT` finds them. Without this, a restart between PREPARE and COMMIT would lose the rows' keys.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # xid -> (prepare GTID, position before it, decision GTID or None)
        self._holds: dict[str, tuple[Gtid, g.Position, Gtid | None]] = {}

    def prepared(self, xid: str, gtid: Gtid, before: g.Position) -> None:
        with self._lock:
            old = self._holds.get(xid)
            if old is None or old[2] is not None:
                self._holds[xid] = (gtid, dict(before), None)

    def decided(self, xid: str, gtid: Gtid) -> None:
        with self._lock:
            hold = self._holds.get(xid)
            if hold is not None:
                self._holds[xid] = (hold[0], hold[1], gtid)

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for _, _, decision in self._holds.values() if decision is None)

    def cap(self, position: g.Position) -> g.Position:
        """`position`, moved back before every prepare it passes whose decision it does not cover."""
        out = dict(position)
        with self._lock:
            holds = list(self._holds.values())
        for prepare, before, decision in holds:
            if not g.covers(out, prepare) or (decision is not None and g.covers(position, decision)):
                continue
            domain = prepare[0]
            if domain in before:
                out[domain] = before[domain]
            else:
                out.pop(domain, None)  # (read that domain from the start)
        return out

    def forget_decided(self, positions: list[g.Position]) -> None:
        """Drop holds whose decision every one of `positions` (each flow's acknowledged one) covers."""
        with self._lock:
            for xid, (_, _, decision) in list(self._holds.items()):
                if decision is not None and all(g.covers(p, decision) for p in positions):
                    del self._holds[xid]
