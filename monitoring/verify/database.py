"""Reading what the database holds now for a key family's arguments, on each shard that owns its rows,
and comparing it with what a cached value says (`agree`)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pymysql
import pymysql.cursors

import router_config
from monitoring.verify.codec import CachedRows, VerifyError, failure_reason
from monitoring.verify.families import KeyFamily
from router_config.model import COLUMN_NAME

log = logging.getLogger(__name__)

# -- the database ------------------------------------------------------------------------------------


def quote_name(name: str) -> str:
    if not COLUMN_NAME.match(name):
        raise ValueError(f"{name!r} is not a column name")
    return f"`{name}`"


def quoted_table(name: str) -> str:
    return ".".join(quote_name(p) for p in name.split("."))


def _norm(value: Any) -> Any:
    """Database values as the web tier's JSON carries them (json.dumps(default=str))."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _row_sort_key(row: Mapping[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


class Database:
    """The master database (a shard's primary), read with one connection (reconnecting once if it was lost).
    `label` names it in errors (default: "the master database HOST:PORT")."""

    def __init__(self, db: router_config.Database, connect_timeout: float = 3.0, label: str | None = None) -> None:
        self.db, self.connect_timeout = db, connect_timeout
        self.label = label or f"the master database {db.address}"
        self.conn: pymysql.connections.Connection | None = None
        self.lost = False  # the connection failed for good (after one retry): the error to name

    def connect(self) -> None:
        try:
            self.conn = router_config.connect_database(
                self.db,
                "monitoring",
                connect_timeout=self.connect_timeout,
                read_timeout=30,
                cursorclass=pymysql.cursors.DictCursor,
            )
        except pymysql.err.Error as e:
            self.lost = True
            raise VerifyError(f"{self.label} does not answer ({failure_reason(e)})") from e

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        for attempt in (1, 2):
            try:
                if self.conn is None or not self.conn.open:
                    self.connect()
                assert self.conn is not None
                with self.conn.cursor() as cur:
                    cur.execute(sql, tuple(args))
                    return list(cur.fetchall())
            except pymysql.err.Error as e:
                if not connection_lost(e):
                    raise  # the query's own fault (no such table, no privilege): the connection is fine
                self.close()
                if attempt == 2:
                    self.lost = True
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except pymysql.err.Error:
                pass
            self.conn = None


def shard_databases(topo: router_config.Topology) -> dict[str, Database]:
    """Each shard's primary (the master region's copy), by shard name; one ("main") without [shards]."""
    return {
        s.name: Database(
            topo.shard_copy(s.name, topo.master.name),
            label=f"the primary of shard {s.name} ({s.primary.address})" if topo.sharded else None,
        )
        for s in topo.shards
    }


def connection_lost(e: BaseException) -> bool:
    """A database error that is about the connection (retry / give up), not about one query."""
    code = e.args[0] if isinstance(e, pymysql.err.OperationalError) and e.args else None
    return isinstance(e, pymysql.err.InterfaceError) or code in (2003, 2006, 2013, 2055)


def order_terms(order_by: str | None) -> list[tuple[str, bool]]:
    """`a DESC, b` → [("a", True), ("b", False)]."""
    out = []
    for term in (order_by or "").split(","):
        words = term.split()
        if words:
            out.append((words[0], len(words) > 1 and words[1].upper() == "DESC"))
    return out


def _nulls_first(column: str, row: Mapping[str, Any]) -> tuple[bool, Any]:
    """A sort key for one column as MariaDB orders it: NULLs first."""
    return row[column] is not None, row[column]


def database_rows(
    db: Database | Sequence[Database], family: KeyFamily, values: Sequence[str], cached: CachedRows
) -> CachedRows:
    """What the database holds now for the key, shaped like `cached` (same columns, order and window). Several
    databases (the shards a key's rows may be on): their rows merged in the value's order, cut to its window."""
    dbs = [db] if isinstance(db, Database) else list(db)
    columns = list(dict.fromkeys(c for row in cached.rows for c in row))
    order = order_terms(cached.order_by)
    # merging shards sorts here: the order's columns must come back even when the value does not hold them
    extra = [c for c, _ in order if c not in columns] if columns and len(dbs) > 1 else []
    select = ", ".join(quote_name(c) for c in columns + extra) if columns else "*"
    where = " AND ".join(f"{quote_name(c)} = %s" for c in family.columns)
    sql = f"SELECT {select} FROM {quoted_table(family.table)} WHERE {where}"
    if cached.order_by:
        sql += f" ORDER BY {cached.order_by}"
    limit = 1 if cached.one else cached.limit
    if not columns:  # the value says "no rows": any row at all disagrees (a few are enough to show)
        limit = min(limit or 5, 5)
    if limit:
        sql += f" LIMIT {int(limit)}"
    found = [r for d in dbs for r in d.query(sql, values)]
    if len(dbs) > 1:
        for column, descending in reversed(order):  # stable sorts, last term first; NULLs first, as MariaDB
            found.sort(key=functools.partial(_nulls_first, column), reverse=descending)
        found = found[:limit] if limit else found
    rows = tuple({k: _norm(v) for k, v in r.items() if k not in extra} for r in found)
    return CachedRows(rows, cached.order_by, cached.limit, cached.one)


def agree(cached: CachedRows, current: CachedRows) -> bool:
    a = [dict(r) for r in cached.rows]
    b = [dict(r) for r in current.rows]
    if not cached.order_by:
        a.sort(key=_row_sort_key)
        b.sort(key=_row_sort_key)
    return a == b


def shown(rows: CachedRows) -> Any:
    """A report's view: a single-row value as the row (or None), a list as a list."""
    if rows.one:
        return dict(rows.rows[0]) if rows.rows else None
    return [dict(r) for r in rows.rows]
