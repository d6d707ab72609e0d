"""A small thread-safe SQL handle for the web tier: one PyMySQL connection per thread, reconnect on loss.

PyMySQL connections must not be shared between threads, and a web tier (or a locust run) calls from
many threads; a thread-local connection is the simplest correct answer.
"""

from __future__ import annotations

import threading
from typing import Any

import pymysql
import pymysql.cursors

import router_config


class SqlClient:
    """Queries against one MariaDB server and database. `role` ("master"/"replica") names it in logs."""

    def __init__(
        self,
        host: str,
        port: int,
        user: str,
        password: str,
        database: str | None = None,
        *,
        role: str = "",
        connect_timeout: float = 5.0,
        init_command: str | None = None,
        tls: dict[str, Any] | None = None,
    ) -> None:
        """init_command: SQL run on every new connection, e.g. a shard's `SET SESSION auto_increment_...`
        (a reconnect gets it again, so the session never silently loses it). `tls`: PyMySQL's TLS options
        (`router_config.mysql_options`), applied to every new connection."""
        self.host, self.port, self.user, self.password = host, port, user, password
        self.database = database
        self.role = role
        self.connect_timeout = connect_timeout
        self.init_command = init_command
        self.tls = tls or {}
        self._local = threading.local()

    @classmethod
    def for_database(
        cls, db: Any, database: str | None, *, role: str = "", init_command: str | None = None
    ) -> SqlClient:
        """From a `router_config.Database` (host, port, user, password; its `[tls]`, as the web tier)."""
        return cls(
            db.host,
            db.port,
            db.user,
            db.password,
            database,
            role=role,
            init_command=init_command,
            tls=router_config.mysql_options(db, "webtier") if isinstance(db, router_config.Database) else None,
        )

    def _conn(self) -> pymysql.connections.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or not conn.open:
            conn = pymysql.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password,
                database=self.database,
                autocommit=True,
                connect_timeout=self.connect_timeout,
                init_command=self.init_command,
                cursorclass=pymysql.cursors.DictCursor,
                **self.tls,
            )
            self._local.conn = conn
        return conn

    def query(self, sql: str, args: Any = None) -> list[dict[str, Any]]:
        """Rows of a SELECT as dicts. A read is retried once on a fresh connection if the old one died."""
        try:
            with self._cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError):
            self.close()
            with self._cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())

    def query_one(self, sql: str, args: Any = None) -> dict[str, Any] | None:
        rows = self.query(sql, args)
        return rows[0] if rows else None

    def execute(self, sql: str, args: Any = None) -> tuple[int, int]:
        """Run a write (autocommit); returns (rowcount, lastrowid). Never retried: it may have committed."""
        try:
            with self._cursor() as cur:
                cur.execute(sql, args)
                return cur.rowcount, cur.lastrowid
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError):
            self.close()  # the next call starts on a fresh connection
            raise

    def _cursor(self) -> Any:
        return self._conn().cursor()

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            try:
                conn.close()
            except pymysql.err.Error:
                pass

    def __repr__(self) -> str:
        return f"SqlClient({self.role or 'db'} {self.host}:{self.port}/{self.database})"
