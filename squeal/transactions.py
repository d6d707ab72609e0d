"""Stage 2: group binlog events into committed transactions.

The reader turns library events into the small plain-data events below; `TransactionGrouper.feed`
returns a `Transaction` only when the transaction's commit is seen:

* `Begin` (MariaDB's GTID event) opens a transaction. MariaDB writes no `BEGIN` query: the GTID event
  is the begin. A GTID event flagged *standalone* is a DDL statement (or similar) that commits by itself.
* `Annotate` carries the original SQL text of the statement whose row events follow (the source of
  `/* mcd:... */` keys).
* `Rows` carries the before/after images of the changed rows of one table.
* `Commit` is the XID event (transactional engines) or a `COMMIT` query (non-transactional engines).
* `Query` is any other query event: `ROLLBACK` drops the open transaction (nothing is sent); in a
  standalone transaction the query itself ends it (DDL such as ALTER TABLE).
* `Restart` means the reader reconnected: anything half-read is discarded, the reader resumes from the
  last committed GTID so the transaction will come again in full.

Invalidations happen only for what this stage emits, so a delete is never sent for a transaction that
did not commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from squeal.gtid import Gtid

# MariaDB GTID event flag: the event group is a single statement with no XID (DDL, FLUSH, ...).
FL_STANDALONE = 0x01


@dataclass(frozen=True, slots=True)
class Begin:
    gtid: Gtid
    timestamp: float  # the GTID event's header timestamp (commit time, 1 s resolution)
    standalone: bool = False


@dataclass(frozen=True, slots=True)
class Annotate:
    sql: bytes


@dataclass(frozen=True, slots=True)
class Rows:
    schema: str
    table: str
    kind: str  # "insert" | "update" | "delete"
    images: tuple[dict, ...]  # every row image: after (insert), before (delete), before and after (update)

    @property
    def changes(self) -> int:
        """Rows changed (an UPDATE carries two images per row)."""
        return len(self.images) // 2 if self.kind == "update" else len(self.images)


@dataclass(frozen=True, slots=True)
class Commit:
    pass


@dataclass(frozen=True, slots=True)
class Query:
    sql: str


@dataclass(frozen=True, slots=True)
class Restart:
    pass


Event = Begin | Annotate | Rows | Commit | Query | Restart


@dataclass(slots=True)
class Transaction:
    gtid: Gtid
    timestamp: float
    statements: list[bytes] = field(default_factory=list)
    rows: list[Rows] = field(default_factory=list)
    ddl: str | None = None  # the statement of a standalone (DDL) transaction

    @property
    def gtid_text(self) -> str:
        return "-".join(map(str, self.gtid))


class TransactionGrouper:
    """Feed events in binlog order; get back each transaction at its commit."""

    def __init__(self) -> None:
        self._open: Transaction | None = None
        self._standalone = False
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
                self._open.statements.append(event.sql)  # type: ignore[union-attr]
            return None
        if kind is Begin:
            if self._open is not None:
                self.discarded += 1  # a new GTID before the old one committed: never emit the partial one
            self._open = Transaction(gtid=event.gtid, timestamp=event.timestamp)  # type: ignore[union-attr]
            self._standalone = event.standalone  # type: ignore[union-attr]
            return None
        if kind is Commit:
            return self._close()
        if kind is Query:
            return self._query(event.sql)  # type: ignore[union-attr]
        if kind is Restart:
            if self._open is not None:
                self.discarded += 1
            self._open = None
            return None
        raise TypeError(f"not a transaction event: {event!r}")

    def _query(self, sql: str) -> Transaction | None:
        if self._open is None:
            return None
        word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        if word == "COMMIT":
            return self._close()
        if word == "ROLLBACK" and not self._standalone:
            self._open = None
            self.rolled_back += 1
            return None
        if self._standalone:
            self._open.ddl = sql
            return self._close()
        return None  # BEGIN, SAVEPOINT, ... inside a transaction: nothing to do

    def _close(self) -> Transaction | None:
        txn, self._open = self._open, None
        return txn
