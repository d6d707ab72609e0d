"""Changes to a ruled table that carry no row images, found in a transaction's statements.

Row events tell squeal exactly which rows changed; some statements change (or remove) every row of a
table and log only their SQL text: TRUNCATE, DROP TABLE, DROP DATABASE, RENAME TABLE (the swap at the end
of an online schema change), CREATE OR REPLACE TABLE, ALTER TABLE ... RENAME / TRUNCATE|DROP|EXCHANGE
PARTITION, and any change a session logged in statement format. Every cached key of such a table may be
stale, and no key can be rendered from a statement. `bulk_changes` finds them; the key stage applies
the rule's `on_truncate` policy ("alert" or "flush").

Foreign keys with ON DELETE / ON UPDATE CASCADE (or SET NULL / SET DEFAULT) are the other case: InnoDB
changes the child rows itself and MariaDB logs only the parent's row events. A delete of a parent row of
a ruled table, or an update that changes a column the foreign key references (both row images are in the
binlog: an update of any other column changes no child row), counts as a bulk change of the ruled child
("cascade"), through any chain of such foreign keys (`load_cascades`).

`DROP DATABASE` names no tables: it counts for the ruled tables of that database that existed. Which ones
did is known from a snapshot of information_schema the live reader takes when it starts
(`existing_tables`), kept up to date by the DDL it reads after that snapshot's binlog position (CREATE
TABLE, RENAME, DROP). A statement at or before that position (a live reader resuming from an older
marker, a catch-up reader) counts for every ruled table of the database, as if all existed.

Matching is on names, not a full SQL parser: a statement of one of those kinds that names a ruled table
anywhere (qualified, or unqualified in the statement's default database) counts. A false match costs an
alert or a flush, never a stale value.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from router_config import Rule
from squeal.read import gtid as g
from squeal.read.reader import current_position
from squeal.read.transactions import Transaction, statement_body

_IDENT = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$]+)"
_NAME = re.compile(rf"({_IDENT})(?:\s*\.\s*({_IDENT}))?")
_COMMENT = re.compile(r"/\*.*?\*/|--[^\n]*|#[^\n]*", re.DOTALL)
_STRING = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.)*\"", re.DOTALL)

# statement kind -> how it starts (after leading comments)
_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE))
    for kind, pattern in (
        ("truncate", r"TRUNCATE\b"),
        ("drop", r"DROP\s+TABLES?\b"),
        ("drop database", r"DROP\s+(?:DATABASE|SCHEMA)\b"),
        ("rename", r"RENAME\s+TABLES?\b"),
        ("replace", r"CREATE\s+OR\s+REPLACE\s+TABLE\b"),
        ("alter", r"ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\b"),
        ("statement", r"(?:INSERT|REPLACE|UPDATE|DELETE|LOAD\s+DATA|LOAD\s+XML)\b"),
    )
)
# ALTER TABLE changes that replace or remove rows (ADD COLUMN and the like keep them)
_ALTER_RENAME = re.compile(r"\bRENAME\s+(?:TO\s+|AS\s+)?(?!COLUMN\b|INDEX\b|KEY\b)", re.IGNORECASE)
_ALTER_PARTITION = re.compile(r"\b(?:TRUNCATE|DROP|EXCHANGE)\s+PARTITION\b", re.IGNORECASE)
# statements that may create a ruled table (for the tables known to exist)
_CREATES = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\b", re.IGNORECASE)
_DROP_DATABASE = re.compile(r"(?is)^\s*DROP\s+(?:DATABASE|SCHEMA)\s+(?:IF\s+EXISTS\s+)?")


@dataclass(frozen=True, slots=True)
class BulkChange:
    rule: Rule
    statement: str  # kind: "truncate", "drop", "rename", ...
    sql: str


def existing_tables(conn: Any, schemas: Iterable[str]) -> tuple[g.Position, set[tuple[str, str]]] | None:
    """(binlog position, the tables of `schemas` that exist at it), from information_schema; None if DDL kept
    moving the position while it was read."""
    names = sorted(set(schemas))
    if not names:
        return current_position(conn), set()
    marks = ", ".join(["%s"] * len(names))
    with conn.cursor() as cur:
        for _ in range(5):
            before = current_position(conn)
            cur.execute(
                f"SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA IN ({marks})", names
            )
            tables = {(str(s), str(t)) for s, t in cur.fetchall()}
            if current_position(conn) == before:
                return before, tables
    return None


def _unquote(ident: str) -> str:
    return ident[1:-1].replace("``", "`") if ident.startswith("`") else ident


def statement_kind(sql: str) -> str | None:
    """The bulk kind of `sql` ("truncate", "rename", ...), or None for a statement that keeps rows."""
    body = statement_body(sql)
    for kind, pattern in _KINDS:
        if pattern.match(body):
            if kind == "alter":
                text = _STRING.sub("''", body)
                if _ALTER_RENAME.search(text):
                    return "rename"
                return "partition" if _ALTER_PARTITION.search(text) else None
            return kind
    return None


def named_tables(sql: str, default_schema: str) -> set[tuple[str, str]]:
    """Every (schema, table) `sql` could name: each identifier, alone or qualified (over-inclusive)."""
    text = _STRING.sub("''", _COMMENT.sub(" ", sql))
    out: set[tuple[str, str]] = set()
    for m in _NAME.finditer(text):
        first, second = _unquote(m.group(1)), m.group(2)
        if second is not None:
            out.add((first, _unquote(second)))
        elif default_schema:
            out.add((default_schema, first))
    return out


Table = tuple[str, str]
# parent -> [(child, on delete, on update, the parent's referenced columns, lower case)] for foreign keys whose
# actions change the child; no columns: unknown, every update of the parent counts
Cascades = dict[Table, list[tuple[Table, str, str, tuple[str, ...]]]]
_CHANGES_CHILD = ("CASCADE", "SET NULL", "SET DEFAULT")


def load_cascades(conn: Any) -> Cascades:
    """Every foreign key whose ON DELETE / ON UPDATE action changes the child rows, with the parent's columns it
    references (information_schema)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, REFERENCED_COLUMN_NAME "
            "FROM information_schema.KEY_COLUMN_USAGE WHERE REFERENCED_TABLE_NAME IS NOT NULL"
        )
        columns: dict[tuple[str, str, str], list[str]] = {}
        for cs, ct, name, column in cur.fetchall():
            columns.setdefault((cs, ct, name), []).append(column.lower())
        cur.execute(
            "SELECT UNIQUE_CONSTRAINT_SCHEMA, REFERENCED_TABLE_NAME, CONSTRAINT_SCHEMA, TABLE_NAME, DELETE_RULE, "
            "UPDATE_RULE, CONSTRAINT_NAME FROM information_schema.REFERENTIAL_CONSTRAINTS"
        )
        out: Cascades = {}
        for ps, pt, cs, ct, on_delete, on_update, name in cur.fetchall():
            if on_delete in _CHANGES_CHILD or on_update in _CHANGES_CHILD:
                referenced = tuple(columns.get((cs, ct, name), ()))
                out.setdefault((ps, pt), []).append(((cs, ct), on_delete, on_update, referenced))
    return out


def changed_columns(images: tuple[dict, ...]) -> frozenset[str]:
    """The columns (lower case) whose value differs between the before and after image of some row of an
    update's images (before, after, before, after, ...)."""
    out: set[str] = set()
    for i in range(0, len(images) - 1, 2):
        before, after = images[i], images[i + 1]
        out.update(c.lower() for c in before.keys() | after.keys() if before.get(c) != after.get(c))
    return frozenset(out)


class BulkDetector:
    """Finds the ruled tables a transaction changed without row images."""

    def __init__(self, rules: Iterable[Rule], cascades: Cascades | None = None) -> None:
        self.rules: dict[tuple[str, str], Rule] = {}
        for rule in rules:
            schema, table = rule.table.split(".", 1)
            self.rules[(schema, table)] = rule
        self.cascades: Cascades = {}
        self.parents: set[Table] = set()  # tables whose row changes can cascade to a ruled table
        self.set_cascades(cascades or {})
        # The ruled tables that exist after binlog position `existing_at` (`know_existing`); None: unknown.
        self.existing: set[Table] | None = None
        self.existing_at: g.Position = {}

    def know_existing(self, position: g.Position, tables: Iterable[Table]) -> None:
        """The tables (`existing_tables`) that exist at `position`: from there on, the live stream's DDL keeps
        the set current and DROP DATABASE counts only for the ruled tables in it."""
        self.existing = {t for t in tables if t in self.rules}
        self.existing_at = dict(position)

    def _tracked(self, txn: Transaction) -> bool:
        return self.existing is not None and not g.covers(self.existing_at, txn.gtid)

    def _track(self, kind: str | None, sql: str, schema: str) -> None:
        """Keep `existing` current with one statement of the live stream (over-inclusive: a table named by a
        statement that may create it counts as existing)."""
        assert self.existing is not None
        if kind == "drop database":
            dropped = _dropped_database(sql)
            self.existing = {t for t in self.existing if t[0] != dropped}
        elif kind == "drop":
            self.existing -= named_tables(sql, schema)
        elif kind in ("rename", "replace") or _CREATES.match(statement_body(sql)):
            # (a rename's old name stays "existing": a later DROP DATABASE may alert once too often, never miss)
            self.existing |= {t for t in named_tables(sql, schema) if t in self.rules}

    def set_cascades(self, cascades: Cascades) -> None:
        self.cascades = cascades
        self.parents = {p for p in cascades if self.cascade_targets(p, "delete") or self.cascade_targets(p, "update")}

    def cascade_targets(self, parent: Table, kind: str, changed: frozenset[str] | None = None) -> list[Rule]:
        """Ruled tables a `kind` ("delete"/"update") of a `parent` row can change, through any FK chain.
        `changed`: for an update, the parent's columns (lower case) it changed; None: any column."""
        found: dict[str, Rule] = {}
        seen = {parent}
        todo: deque[tuple[Table, bool]] = deque([(parent, True)])
        while todo:
            table, first = todo.popleft()
            for child, on_delete, on_update, referenced in self.cascades.get(table, ()):
                action = (on_delete if kind == "delete" else on_update) if first else "CASCADE"
                if action not in _CHANGES_CHILD or child in seen:
                    continue
                if first and kind == "update" and changed is not None and referenced and changed.isdisjoint(referenced):
                    continue  # the update left every referenced column as it was: no child row changed
                seen.add(child)
                if child in self.rules:
                    found[self.rules[child].table] = self.rules[child]
                todo.append((child, False))
        return [found[t] for t in sorted(found)]

    def cascaded(self, parent: Table, kind: str, changed: frozenset[str] | None = None) -> list[BulkChange]:
        """The bulk changes a `kind` row event of `parent` makes to ruled children (none for inserts).
        `changed`: for an update, the columns it changed (`changed_columns`); None: any column."""
        if kind not in ("delete", "update"):
            return []
        what = f"{kind.upper()} on {parent[0]}.{parent[1]} (foreign key cascade)"
        return [BulkChange(rule, "cascade", what) for rule in self.cascade_targets(parent, kind, changed)]

    def changes(self, txn: Transaction, live: bool = False) -> list[BulkChange]:
        """The bulk changes of `txn`. `live`: `txn` is the live stream's next transaction (which keeps the
        tables known to exist current); any other reader's is judged as if every ruled table existed."""
        statements = list(txn.queries)
        if txn.ddl is not None:
            statements.append((txn.schema, txn.ddl))
        out: list[BulkChange] = list(txn.cascades)
        tracked = live and self._tracked(txn)
        for schema, sql in statements:
            kind = statement_kind(sql)
            if kind == "drop database":
                dropped = _dropped_database(sql)
                hit = [
                    rule
                    for (s, t), rule in self.rules.items()
                    if s == dropped and (not tracked or (s, t) in (self.existing or ()))
                ]
            elif kind is not None:
                hit = [self.rules[name] for name in named_tables(sql, schema) if name in self.rules]
            if kind is not None:
                out += [BulkChange(rule, kind, sql) for rule in sorted(hit, key=lambda r: r.table)]
            if tracked:
                self._track(kind, sql, schema)
        return out


def _dropped_database(sql: str) -> str:
    m = _NAME.search(_DROP_DATABASE.sub("", statement_body(sql)))
    return _unquote(m.group(1)) if m else ""
