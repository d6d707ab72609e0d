"""Stage 1: read the binlog, as squeal's plain events (see `squeal.read.transactions`).

python-mysql-replication on its MariaDB path (`is_mariadb=True`, annotate-rows on, resume by GTID list),
blocking, on a thread of its own. Two things it does not do for us:

* **Reconnects.** The library's own reconnect replays from the GTID it was *started* with (upstream issue
  367). Our connection class turns a lost connection into `StreamLost`, which the library does not catch;
  `BinlogReader` then reconnects from the last GTID its consumer `commit()`ed and yields `Restart` so the
  half-read transaction is thrown away (it comes again in full).
* **Settings.** Without ROW format, FULL row image, FULL row metadata (column names!) and annotate-rows,
  keys would be wrong or missing without any error. `check_server` refuses to start instead.

Two decoders behind one interface: `BinlogReader` here (python-mysql-replication, the reference) and
`NativeBinlogReader` (squeal/read/native.py: the Rust extension `squeal_native`, rows of ruled tables arrive
rendered to keys). Both yield the same plain events to the same grouping (`squeal.read.transactions`) and share
the reconnect loop (`_Reconnecting`, here), so positions, `Restart` and `DataLoss` behave the same.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
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

from router_config import verifying_context
from squeal.read import gtid as g
from squeal.read.transactions import (
    FL_PREPARED_XA,
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
    """Where and how to connect (from the topology's `Region.database`).

    `tls`: dial with TLS (the topology has `[tls]`), verifying the server's certificate and host name against
    `ssl_ca` (None: the system's trust store); `ssl_cert`/`ssl_key`: squeal's own certificate, if it has one.
    Authentication is whatever the account uses: `mysql_native_password` or `ed25519` (PyNaCl)."""

    host: str
    port: int
    user: str
    password: str
    tls: bool = False
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    copy: str = field(default="", compare=False)  # the topology's name of the copy, for log lines: not where it is

    def __str__(self) -> str:
        return f"MariaDB {self.host}:{self.port}" + (f" ({self.copy})" if self.copy else "")

    def ssl_context(self) -> ssl.SSLContext | None:
        """A fresh client context per connection (renewed certificate files are read at the next connect)."""
        if not self.tls:
            return None
        return verifying_context(self.ssl_ca, self.ssl_cert, self.ssl_key)

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "passwd": self.password,
            "connect_timeout": 5,
        }
        return out | self._tls_settings()

    def _tls_settings(self) -> dict[str, Any]:
        # Without [tls], plaintext: PyMySQL would otherwise try unverified TLS with any server that offers it.
        ctx = self.ssl_context()
        return {"ssl_disabled": True} if ctx is None else {"ssl": ctx}

    def connect(self, **kwargs: Any) -> pymysql.connections.Connection:
        kwargs |= self._tls_settings()
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            autocommit=True,
            **{"connect_timeout": 5, **kwargs},
        )


# OpenSSL's verify codes that mean "no path to a CA we trust": the server's certificate is from another CA.
UNTRUSTED_ISSUER = frozenset({2, 18, 19, 20, 21})


def tls_failure(error: BaseException, ca: str | None = None) -> str | None:
    """Why a TLS handshake failed (the certificate check's reason, e.g. "certificate has expired"), found in
    `error` or what it wraps (PyMySQL keeps the ssl error as `original_exception`); None if not a TLS error."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            hint = ""
            if e.verify_code in UNTRUSTED_ISSUER:
                hint = f" (not signed by the CA squeal trusts: {ca or 'the system trust store'})"
            return f"certificate verify failed: {e.verify_message}{hint}"
        if isinstance(e, ssl.SSLError):
            return e.reason or str(e)
        todo += [getattr(e, "original_exception", None), e.__cause__, e.__context__]
    return None


def describe_failure(source: Source, error: BaseException) -> str:
    """One line naming the server and the reason; TLS failures say so."""
    reason = tls_failure(error, source.ssl_ca)
    if reason is not None:
        return f"TLS to {source} failed: {reason}"
    return f"{source}: {error}"


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
        return Begin(
            (ev.domain_id, ev.server_id, ev.gtid_seq_no),
            float(ev.timestamp),
            bool(ev.flags & FL_STANDALONE),
            bool(ev.flags & FL_PREPARED_XA),
        )
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


class _StreamEnded(Exception):
    """One binlog connection ended: `code` is the server's error (1236: position gone) or 0."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


FALLBACK_AFTER = 2  # failed connections in a row to a preferred copy before the reader tries the next copy
PROBE_S = 5.0  # while on a fallback, how often a preferred copy is asked whether it has caught up


class _Reconnecting:
    """Iterate squeal events from `start` on, forever; reconnects resume from the last `commit()`.

    Subclasses read one connection (`_read_once`: calls `_on_connected` once the server streams, raises
    `_StreamEnded` when the connection fails, returns when the stream ends or `_break_stream()` /
    `stop()` was called); this loop owns reconnects, backoff, data loss and the choice of copy.

    **Copies** (`source` may be several: `squeal.shard.copies.read_order`, the last one the region's own copy, which
    every other one replicates from): the reader starts on `sources[first]`. A copy before the last that fails
    `FALLBACK_AFTER` connections in a row, or cannot serve the position to resume from (error 1236: behind it,
    or purged), is left for the next one, which has everything it had: the same GTIDs, resumed after the last
    committed one. Data loss is judged only on the last copy. While on a fallback, a thread asks the preferred
    copies every `PROBE_S` whether they have caught up with the committed position, and the reader goes back
    to the first that has (ending its current stream: the half-read transaction comes again in full).
    """

    def __init__(
        self,
        source: Source | list[Source],
        start: g.Position,
        tables: set[tuple[str, str]],
        name: str = "live",
        max_backoff: float = 5.0,
        first: int = 0,
    ) -> None:
        self.sources = list(source) if isinstance(source, list) else [source]
        self.current = min(max(0, first), len(self.sources) - 1)  # index of the copy read now
        self.source = self.sources[self.current]
        self.switches = 0  # times the reader changed copies
        self._failures = 0  # failed connections in a row to the current copy
        self._back_to: int | None = None  # a preferred copy that has caught up: read it at the next chance
        self._prober: threading.Thread | None = None
        self.committed: g.Position = dict(start)
        self.tables = tables
        self.name = name
        self.max_backoff = max_backoff
        self.reconnects = 0
        self.errors = 0
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._backoff = 0.1
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
        self._break_stream()

    def _break_stream(self) -> None:
        """End the current connection's blocked read (from any thread); the loop then reconnects."""

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _on_connected(self) -> None:
        if not self.connected.is_set():
            self.connected.set()
            self._backoff = 0.1
            self._failures = 0

    def _read_once(self) -> Iterator[Event]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Event | DataLoss]:
        self._watch_preferred()  # (started on a fallback: its preferred copy did not answer)
        while not self._stop.is_set():
            loss: DataLoss | None = None
            fall_back = ""  # why the current copy is left for the next one
            try:
                yield from self._read_once()
            except _StreamEnded as e:
                if self._stop.is_set():
                    break
                self.errors += 1
                self._failures += 1
                last = self.current == len(self.sources) - 1
                if not last and (e.code == BINLOG_GONE or self._failures >= FALLBACK_AFTER):
                    fall_back = e.message
                elif e.code == BINLOG_GONE:
                    loss = self._data_loss(e.message)
                elif self._back_to is None:
                    log.warning(
                        "binlog reader %s: %s; reconnecting from %s in %.1fs",
                        self.name,
                        e.message,
                        g.format_position(self.committed) or "the start",
                        self._backoff,
                    )
            finally:
                self.connected.clear()
            if self._stop.is_set():
                break
            self.reconnects += 1
            yield Restart()
            if loss is not None:
                yield loss  # the consumer flushes and calls resume_from(), or waits for an operator
                if self._stop.is_set():
                    break
            back_to, self._back_to = self._back_to, None
            if back_to is not None:
                self._use(back_to, "it has caught up: back on it")
                continue
            if fall_back:
                self._use(self.current + 1, f"the preferred copy {self.source} failed: {fall_back}")
                continue
            self._stop.wait(self._backoff)
            self._backoff = min(self._backoff * 2, self.max_backoff)

    def _use(self, index: int, why: str) -> None:
        """Read `sources[index]` from the next connection on; a thread watches the preferred ones meanwhile."""
        level = logging.INFO if index < self.current else logging.WARNING
        self.current, self.source = index, self.sources[index]
        self._failures, self._backoff = 0, 0.1
        self.switches += 1
        log.log(
            level,
            "binlog reader %s: reading %s from %s (%s)",
            self.name,
            self.source,
            g.format_position(self.committed) or "the start",
            why,
        )
        self._watch_preferred()

    def _watch_preferred(self) -> None:
        """On a fallback copy: the thread that finds a preferred copy caught up (`_probe`), if not running."""
        if self.current > 0 and (self._prober is None or not self._prober.is_alive()):
            self._prober = threading.Thread(target=self._probe, name=f"squeal-copy-probe-{self.name}", daemon=True)
            self._prober.start()

    def _probe(self) -> None:
        """While on a fallback: every PROBE_S, the first preferred copy that answers and has applied everything
        committed so far becomes the next one read; the current stream is ended for that."""
        while not self._stop.wait(PROBE_S) and self.current > 0:
            if self._back_to is not None:
                self._break_stream()  # (asked before, while no stream was open: again)
                continue
            committed = dict(self.committed)
            for index in range(self.current):
                try:
                    conn = self.sources[index].connect(connect_timeout=2, read_timeout=2, write_timeout=2)
                    try:
                        caught_up = g.covers_position(current_position(conn), committed)
                    finally:
                        conn.close()
                except (pymysql.err.MySQLError, OSError, g.GtidError):
                    continue
                if caught_up:
                    self._back_to = index
                    self._break_stream()
                    break


class BinlogReader(_Reconnecting):
    """python-mysql-replication (the reference decoder).

    `tables`: (schema, table) pairs that have rules; row events of other tables are skipped by the
    library before their rows are decoded (annotate events still arrive, for `/* mcd: */` comments).
    """

    EVENTS = [
        MariadbGtidEvent,
        MariadbAnnotateRowsEvent,
        WriteRowsEvent,
        UpdateRowsEvent,
        DeleteRowsEvent,
        XidEvent,
        QueryEvent,
        XAPrepareEvent,
        HeartbeatLogEvent,
    ]

    def __init__(
        self,
        source: Source | list[Source],
        start: g.Position,
        tables: set[tuple[str, str]],
        name: str = "live",
        max_backoff: float = 5.0,
        first: int = 0,
    ) -> None:
        super().__init__(source, start, tables, name, max_backoff, first)
        self._stream: BinLogStreamReader | None = None

    def _break_stream(self) -> None:
        stream = self._stream
        conn = getattr(stream, "_stream_connection", None) if stream else None
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread; the library cannot do this
            except OSError:
                pass

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

    def _read_once(self) -> Iterator[Event]:
        stream = self._stream = self._open()
        try:
            while not self._stop.is_set():
                ev = stream.fetchone()
                if ev is None:
                    break
                self._on_connected()
                out = convert(ev)
                if out is not None:
                    yield out
        except (StreamLost, pymysql.err.MySQLError, OSError, struct_error) as e:
            code = e.args[0] if isinstance(e, pymysql.err.MySQLError) and e.args else 0
            if code == BINLOG_GONE and len(e.args) > 1:
                message = str(e.args[1])
            else:
                message = describe_failure(self.source, e)
            raise _StreamEnded(code if isinstance(code, int) else 0, message) from e
        finally:
            self._stream = None
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                pass
