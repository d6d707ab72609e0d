"""Stage 1 with the native decoder: the binlog read by the Rust extension `squeal_native`.

`NativeBinlogReader` yields the same plain events as `squeal.read.reader.BinlogReader` (python-mysql-replication,
the reference) and shares its reconnect loop (`_Reconnecting`), so positions, `Restart` and `DataLoss` behave the
same; rows of ruled tables arrive already rendered to delete lines. Here too: whether the extension is there
(`native_module`) and which columns it can render like python-mysql-replication (`native_problems`), which decide
the reader a daemon picks at start-up.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Iterator, Set
from typing import Any

from squeal.read import gtid as g
from squeal.read.reader import ReaderConfigError, Source, _Reconnecting, _StreamEnded
from squeal.read.transactions import Annotate, Begin, Commit, CommittedRun, Event, Query, Rows, XaPrepare


class NativeUnavailable(ReaderConfigError):
    """reader = "native" cannot work here: the extension is missing, or a rule needs what it cannot render."""


# Key templates may name columns of these types (information_schema DATA_TYPE) for the native reader: it
# renders them exactly as python-mysql-replication's values print. Others (FLOAT, TIMESTAMP, ENUM, ...)
# make the daemon read with python-mysql-replication instead (start-up warning).
NATIVE_TYPES = frozenset(
    {
        "tinyint",
        "smallint",
        "mediumint",
        "int",
        "bigint",
        "year",
        "char",
        "varchar",
        "tinytext",
        "text",
        "mediumtext",
        "longtext",
        "binary",
        "varbinary",
        "tinyblob",
        "blob",
        "mediumblob",
        "longblob",
        "decimal",
        "date",
        "datetime",
    }
)
NATIVE_CHARSETS = frozenset({"utf8mb3", "utf8mb4", "utf8", "ascii", "binary", "latin1"})


def native_module() -> Any:
    """The `squeal_native` extension, or NativeUnavailable saying how to build it."""
    try:
        from squeal import squeal_native  # type: ignore[attr-defined]  # compiled in place by the install
    except ImportError as e:
        raise NativeUnavailable(
            f'reader = "native" needs the squeal_native extension ({e}): run scripts/setup.sh '
            '(it installs squeal and compiles squeal_native/ with it), or set [squeal] reader = "python"'
        ) from e
    return squeal_native


@functools.cache
def native_charsets() -> dict[int, str]:
    """Collation id -> what python-mysql-replication does with its text: "text" (decodes UTF-8/ASCII: the
    str's bytes are the column's), "raw" (an encoding Python cannot look up, e.g. binary: bytes), "cp1252"
    (latin1, which PyMySQL decodes as Windows-1252) or "unsupported" (another codec). Built from the
    library's own table, so both readers agree by construction."""
    from pymysqlreplication.constants import CHARSET

    out: dict[int, str] = {}
    for i in range(0, 4096):
        charset = CHARSET.charset_by_id(str(i), "mariadb")
        if charset is None:
            continue  # the library decodes an unknown collation as UTF-8: the extension's default
        try:
            name = codecs.lookup(charset.encoding).name
        except LookupError:
            out[i] = "raw"
            continue
        out[i] = "text" if name in ("utf-8", "ascii") else "cp1252" if name == "cp1252" else "unsupported"
    return out


def native_problems(conn: Any, wanted: set[tuple[str, str, str]]) -> list[str]:
    """Columns (schema, table, column) the native reader needs as text (templated, or compared by a `where`)
    but cannot render like python-mysql-replication (information_schema)."""
    if not wanted:
        return []
    tables = sorted({(s, t) for s, t, _ in wanted})
    where = " OR ".join(["(TABLE_SCHEMA=%s AND TABLE_NAME=%s)"] * len(tables))
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, CHARACTER_SET_NAME "
            f"FROM information_schema.COLUMNS WHERE {where}",
            [v for t in tables for v in t],
        )
        rows = cur.fetchall()
    problems = []
    for schema, table, column, data_type, charset in rows:
        if (schema, table, column) not in wanted:
            continue
        if str(data_type).lower() not in NATIVE_TYPES:
            problems.append(f"{schema}.{table}.{column} is {data_type}")
        elif charset is not None and str(charset).lower() not in NATIVE_CHARSETS:
            problems.append(f"{schema}.{table}.{column} has character set {charset}")
    return problems


class NativeBinlogReader(_Reconnecting):
    """The Rust extension (`squeal_native.NativeStream`): same events as `BinlogReader`, except that row
    events of ruled tables come as delete lines (kind `rules.LINES`, keys deduplicated per event group, with
    `Rows.changed`), other tables' rows are skipped undecoded (parents of cascading foreign keys still give
    an event carrying their kind, no images), and annotate events come only when they hold `mcd:`.

    `templates` and `filters`: the key extractor's (`KeyExtractor.templates`, `.filters`); `parents`:
    `BulkDetector.parents`; `regional_prefixes`: the key stage's (`flows.split_keys`). `take_counts()`
    returns what the consumer would have counted while rendering: duplicate keys dropped, templates that met a
    missing column, rows the rules' filters skipped, keys rewritten by encoding.

    `runs`: ordinary transactions (rows and an XID, nothing to decide) with at most `whole_up_to` delete lines
    come grouped as `CommittedRun`s, many per object, instead of Begin, rows and Commit each (the data plane's
    per-transaction work stays in Rust; `ReadLoop` sets `whole_up_to` to its `stream_lines`). False: every
    transaction as plain events (the differential tests compare both).
    """

    batch = 1024  # events per GIL acquisition at most
    # Seconds a batch sleeps after its first event on a busy stream (the last batch held more than one event;
    # `NativeStream.next_batch`), then takes what came meanwhile: a replay's transactions come in runs of ~70,
    # each one pass of the Python read loop and one hand-off, instead of ~3. A quiet stream's first event is
    # never held.
    linger = 0.001
    whole_up_to = 8192  # (ReadLoop: its stream_lines, so a bigger transaction is handed on in pieces)

    def __init__(
        self,
        source: Source | list[Source],
        start: g.Position,
        tables: set[tuple[str, str]],
        templates: dict[tuple[str, str], tuple[Any, ...]],
        parents: Set[tuple[str, str]] = frozenset(),
        name: str = "live",
        max_backoff: float = 5.0,
        filters: dict[tuple[str, str], Any] | None = None,
        regional_prefixes: tuple[str, ...] = (),
        first: int = 0,
        runs: bool = True,
    ) -> None:
        super().__init__(source, start, tables, name, max_backoff, first)
        self.runs = runs
        self.native = native_module()
        self.rules = [(s, t, [tpl.source for tpl in ts]) for (s, t), ts in sorted(templates.items())]
        self.filters = [
            (s, t, list(f.watched), f.where.steps() if f.where is not None else [])
            for (s, t), f in sorted((filters or {}).items())
        ]
        self.parents = set(parents)
        self.regional_prefixes = list(regional_prefixes)
        self._rewritten_seen = (0, 0)
        self._rewritten = {"base64": 0, "hashed": 0}
        self._streamobj: Any = None
        self._duplicates_seen = 0
        self._duplicates = 0
        self._missing: list[tuple[str, str, str, str, int]] = []
        self._filtered: list[tuple[str, str, str, int]] = []

    def commit_run(self, run: CommittedRun) -> None:
        """The consumer has every transaction of `run`: a reconnect resumes after them."""
        g.merge(self.committed, run.position)

    def _break_stream(self) -> None:
        stream = self._streamobj
        if stream is not None:
            stream.stop()

    def take_counts(
        self,
    ) -> tuple[int, list[tuple[str, str, str, str, int]], list[tuple[str, str, str, int]], dict[str, int]]:
        """(duplicate keys dropped, [(schema, table, column, template, times)], [(schema, table, reason, rows)],
        {encoding: keys}) since the last call."""
        out = self._duplicates, self._missing, self._filtered, self._rewritten
        self._duplicates, self._missing, self._filtered, self._rewritten = 0, [], [], {"base64": 0, "hashed": 0}
        return out

    def _read_once(self) -> Iterator[Event]:
        from squeal.keys.rules import LINES

        native = self.native
        s = self.source
        stream = self._streamobj = native.NativeStream(
            s.host,
            s.port,
            s.user,
            s.password,
            self.server_id,
            g.format_position(self.committed),
            self.rules,
            sorted(self.tables),
            sorted(self.parents),
            native_charsets(),
            (Begin, Annotate, Rows, Commit, Query, XaPrepare, LINES),
            1.0,
            filters=self.filters,
            regional_prefixes=self.regional_prefixes,
            tls=(s.ssl_ca, s.ssl_cert, s.ssl_key) if s.tls else None,
            run=CommittedRun.from_buffers if self.runs and self.whole_up_to > 0 else None,
            whole_up_to=self.whole_up_to,
        )
        self._duplicates_seen = 0
        self._rewritten_seen = (0, 0)
        try:
            while not self._stop.is_set():
                batch = stream.next_batch(self.batch, 0.5, self.linger)
                if batch is None:
                    break
                if stream.connected:
                    self._on_connected()
                dups = stream.duplicates
                if dups != self._duplicates_seen:
                    self._duplicates += dups - self._duplicates_seen
                    self._duplicates_seen = dups
                missing = stream.take_missing()
                if missing:
                    self._missing += missing
                filtered = stream.take_filtered()
                if filtered:
                    self._filtered += filtered
                rewritten = stream.rewritten
                if rewritten != self._rewritten_seen:
                    self._rewritten["base64"] += rewritten[0] - self._rewritten_seen[0]
                    self._rewritten["hashed"] += rewritten[1] - self._rewritten_seen[1]
                    self._rewritten_seen = rewritten
                yield from batch
        except native.NativeStreamError as e:
            code, message = e.args
            if code == native.ERR_UNSUPPORTED:
                raise NativeUnavailable(f"binlog reader {self.name}: {message}") from e
            raise _StreamEnded(code, message) from e
        finally:
            self._streamobj = None
            stream.stop()
