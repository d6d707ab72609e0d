"""Stage 1: read the binlog, as squeal's plain events (see `squeal.transactions`).

python-mysql-replication on its MariaDB path (`is_mariadb=True`, annotate-rows on, resume by GTID list),
blocking, on a thread of its own. Two things it does not do for us:

* **Reconnects.** The library's own reconnect replays from the GTID it was *started* with (upstream issue
  367). Our connection class turns a lost connection into `StreamLost`, which the library does not catch;
  `BinlogReader` then reconnects from the last GTID its consumer `commit()`ed and yields `Restart` so the
  half-read transaction is thrown away (it comes again in full).
* **Settings.** Without ROW format, FULL row image, FULL row metadata (column names!) and annotate-rows,
  keys would be wrong or missing without any error. `check_server` refuses to start instead.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from struct import error as struct_error  # a truncated packet after a socket shutdown
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    HeartbeatLogEvent,
    MariadbAnnotateRowsEvent,
    MariadbGtidEvent,
    QueryEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from squeal import gtid as g
from squeal.transactions import (
    FL_STANDALONE,
    Annotate,
    Begin,
    Commit,
    Event,
    Query,
    Restart,
    Rows,
    XaPrepare,
    xid_text,
)

log = logging.getLogger(__name__)

LOST = (2006, 2013)  # "server has gone away", "lost connection"
BINLOG_GONE = 1236  # the dump request's GTID position is not in the server's binlog (purged, or never there)


class ReaderConfigError(RuntimeError):
    """The server's binlog settings cannot give squeal correct keys."""


class StreamLost(Exception):
    """The binlog connection dropped. Deliberately not an OperationalError: the library must not catch it."""


class _Connection(pymysql.connections.Connection):
    """A PyMySQL connection whose lost-connection errors escape the replication library's retry loop."""

    def _read_packet(self, packet_type: Any = pymysql.connections.MysqlPacket) -> Any:
        try:
            return super()._read_packet(packet_type)
        except pymysql.err.OperationalError as e:
            if e.args and e.args[0] in LOST:
                raise StreamLost(str(e)) from e
            raise


@dataclass(frozen=True)
class Source:
    """Where and how to connect (from the topology's `Region.database`)."""

    host: str
    port: int
    user: str
    password: str

    def settings(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": self.user, "passwd": self.password,
                "connect_timeout": 5}

    def connect(self) -> pymysql.connections.Connection:
        return pymysql.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                               autocommit=True, connect_timeout=5)


REQUIRED = {
    "log_bin": ("1", "--log-bin"),
    "binlog_format": ("ROW", "--binlog-format=ROW"),
    "binlog_row_image": ("FULL", "--binlog-row-image=FULL"),
    "binlog_row_metadata": ("FULL", "--binlog-row-metadata=FULL"),
    "binlog_annotate_row_events": ("1", "--binlog-annotate-row-events=ON"),
}


def check_server(conn: Any, replica: bool = False) -> None:
    """Raise ReaderConfigError listing every binlog setting squeal needs that the server lacks."""
    names = list(REQUIRED) + (["replicate_annotate_row_events"] if replica else [])
    with conn.cursor() as cur:
        cur.execute("SELECT " + ", ".join(f"@@GLOBAL.{n}" for n in names))
        values = cur.fetchone()
    problems = []
    for name, value in zip(names, values, strict=True):
        want, flag = REQUIRED.get(name, ("1", "--replicate-annotate-row-events=ON"))
        if str(value).upper() not in (want, "ON" if want == "1" else want):
            problems.append(f"{name} is {value!r}, squeal needs {want} ({flag})")
    if problems:
        raise ReaderConfigError(
            "refusing to start: the server's binlog cannot give squeal correct invalidation keys:\n  "
            + "\n  ".join(problems)
        )


@dataclass(frozen=True)
class DataLoss:
    """The server cannot serve `requested` (error 1236): the transactions after it are gone.

    `oldest` is the position at the start of the server's oldest binlog: reading can resume from there,
    merged with `requested` (`resume`). None when that would not move forward (the position is not
    behind the oldest binlog: a GTID this server never had, e.g. a restored backup or another server).
    Yielded by `BinlogReader`; the consumer decides (flush and `resume_from`, or wait) before it goes on.
    """

    requested: g.Position
    oldest: g.Position | None
    message: str

    @property
    def resume(self) -> g.Position | None:
        if self.oldest is None:
            return None
        out = dict(self.requested)
        g.merge(out, self.oldest)
        return None if g.covers_position(self.requested, out) else out

    def lost_range(self) -> str:
        """Per domain, the GTIDs gone: "0-1-43..0-1-120" (after requested, up to and including oldest)."""
        if self.oldest is None:
            return "unknown"
        parts = []
        for d, (s, n) in sorted(self.oldest.items()):
            before = self.requested.get(d)
            if before is None or before[1] < n:
                first = f"{d}-{before[0]}-{before[1] + 1}" if before else f"{d}-*-1"
                parts.append(f"{first}..{d}-{s}-{n}")
        return ", ".join(parts) or "none"


def oldest_position(conn: Any) -> g.Position:
    """The GTID position at the start of the server's oldest binlog (the oldest it can serve after)."""
    with conn.cursor() as cur:
        cur.execute("SHOW BINARY LOGS")
        first = cur.fetchone()
        if first is None:
            return {}
        cur.execute("SELECT BINLOG_GTID_POS(%s, 4)", (first[0],))
        row = cur.fetchone()
    return g.parse_position((row[0] if row else "") or "")


def current_position(conn: Any) -> g.Position:
    """The server's @@gtid_binlog_pos: "now" for a destination that has no datamarker yet."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        return g.parse_position(cur.fetchone()[0] or "")


def convert(ev: Any) -> Event | None:
    """A library event as one of squeal's plain events (None: nothing squeal needs)."""
    kind = type(ev)
    if kind is WriteRowsEvent:
        return Rows(ev.schema, ev.table, "insert", tuple(r["values"] for r in ev.rows))
    if kind is UpdateRowsEvent:
        images: list[dict] = []
        for r in ev.rows:
            images.append(r["before_values"])
            images.append(r["after_values"])
        return Rows(ev.schema, ev.table, "update", tuple(images))
    if kind is DeleteRowsEvent:
        return Rows(ev.schema, ev.table, "delete", tuple(r["values"] for r in ev.rows))
    if kind is MariadbGtidEvent:
        return Begin((ev.domain_id, ev.server_id, ev.gtid_seq_no), float(ev.timestamp),
                     bool(ev.flags & FL_STANDALONE))
    if kind is MariadbAnnotateRowsEvent:
        return Annotate(ev.sql_statement)
    if kind is XidEvent:
        return Commit()
    if kind is QueryEvent:
        schema = ev.schema.decode("utf-8", "replace") if isinstance(ev.schema, bytes) else str(ev.schema or "")
        return Query(ev.query, schema)
    if kind is XAPrepareEvent:
        if ev.one_phase:  # XA COMMIT ... ONE PHASE: an ordinary commit
            return Commit()
        return XaPrepare(xid_text(ev.xid_gtrid, ev.xid_bqual, ev.xid_format_id))
    return None


class BinlogReader:
    """Iterate squeal events from `start` on, forever; reconnects resume from the last `commit()`.

    `tables`: (schema, table) pairs that have rules; row events of other tables are skipped by the
    library before their rows are decoded (annotate events still arrive, for `/* mcd: */` comments).
    """

    EVENTS = [MariadbGtidEvent, MariadbAnnotateRowsEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent,
              XidEvent, QueryEvent, XAPrepareEvent, HeartbeatLogEvent]

    def __init__(self, source: Source, start: g.Position, tables: set[tuple[str, str]],
                 name: str = "live", max_backoff: float = 5.0) -> None:
        self.source = source
        self.committed: g.Position = dict(start)
        self.tables = tables
        self.name = name
        self.max_backoff = max_backoff
        self.reconnects = 0
        self.errors = 0
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._stream: BinLogStreamReader | None = None
        # Each binlog connection needs its own replica server_id: MariaDB drops the older connection of two
        # that share one. Random in a range real servers rarely use.
        self.server_id = random.randint(1 << 24, (1 << 31) - 1)

    def commit(self, gtid: g.Gtid) -> None:
        """The consumer has a complete transaction `gtid`: a reconnect resumes after it."""
        g.advance(self.committed, gtid)

    def resume_from(self, position: g.Position) -> None:
        """After `DataLoss`: the next connection reads after `position` (the consumer has dealt with the gap)."""
        g.merge(self.committed, position)

    def _data_loss(self, message: str) -> DataLoss:
        try:
            conn = self.source.connect()
            try:
                oldest: g.Position | None = oldest_position(conn)
            finally:
                conn.close()
        except (pymysql.err.MySQLError, OSError, g.GtidError) as e:
            log.warning("binlog reader %s: cannot read the server's oldest binlog position: %s", self.name, e)
            oldest = None
        return DataLoss(dict(self.committed), oldest, message)

    def stop(self) -> None:
        """Make the blocked read return (from any thread)."""
        self._stop.set()
        stream = self._stream
        conn = getattr(stream, "_stream_connection", None) if stream else None
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread; the library cannot do this
            except OSError:
                pass

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _open(self) -> BinLogStreamReader:
        schemas = sorted({s for s, _ in self.tables})
        names = sorted({t for _, t in self.tables})
        return BinLogStreamReader(
            connection_settings=self.source.settings(),
            server_id=self.server_id,
            blocking=True,
            resume_stream=True,
            is_mariadb=True,
            annotate_rows_event=True,
            auto_position=g.format_position(self.committed),
            only_events=self.EVENTS,
            only_tables=names,
            only_schemas=schemas,
            slave_heartbeat=1.0,  # idle streams still wake up to notice stop()
            pymysql_wrapper=_Connection,
            enable_logging=False,
        )

    def __iter__(self) -> Iterator[Event]:
        backoff = 0.1
        while not self._stop.is_set():
            stream = self._stream = self._open()
            loss: DataLoss | None = None
            try:
                while not self._stop.is_set():
                    ev = stream.fetchone()
                    if ev is None:
                        break
                    if not self.connected.is_set():
                        self.connected.set()
                        backoff = 0.1
                    out = convert(ev)
                    if out is not None:
                        yield out
            except (StreamLost, pymysql.err.MySQLError, OSError, struct_error) as e:
                if self._stop.is_set():
                    break
                self.errors += 1
                if isinstance(e, pymysql.err.MySQLError) and e.args and e.args[0] == BINLOG_GONE:
                    loss = self._data_loss(str(e.args[1] if len(e.args) > 1 else e))
                else:
                    log.warning("binlog reader %s: %s; reconnecting from %s in %.1fs", self.name, e,
                                g.format_position(self.committed) or "the start", backoff)
            finally:
                self.connected.clear()
                self._stream = None
                try:
                    stream.close()
                except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                    pass
            if self._stop.is_set():
                break
            self.reconnects += 1
            yield Restart()
            if loss is not None:
                yield loss  # the consumer flushes and calls resume_from(), or waits for an operator
                if self._stop.is_set():
                    break
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff)

