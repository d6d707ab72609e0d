"""Stage 3: which memcache keys does a committed transaction invalidate?

Two sources, both from the topology's contract:

* **Rules** (`[[rules]]` in the topology): `table = "app.users"`, `keys = ["user:{id}", "user:email:{email}"]`.
  Each template is rendered from the before AND the after image of every changed row, so an UPDATE that
  changes `email` deletes the old and the new `user:email:` key. A NULL column renders no key (no cached
  object can be keyed by it).
* **Comments** in the committed statement, Facebook style: `/* mcd:key1,key2 */`, read from MariaDB's
  annotate-rows event (the statement exactly as the client sent it).

Keys go on the wire the way the web tier's client (meta-memcache) stores them, so squeal deletes the very
key that was set: printable ASCII up to 186 bytes as is; otherwise (spaces, control or non-ASCII bytes)
base64 with memcached's `b` flag; longer keys as the base64 of their 18-byte BLAKE2b digest (memcached
refuses tokens over 250 bytes, and base64 of 187+ bytes is longer than that). Nothing is dropped: every
rewritten key is counted (`squeal_keys_rewritten_total`).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from router_config import Rule
from squeal.transactions import Rows, Transaction

log = logging.getLogger(__name__)

MAX_PLAIN_KEY = 186  # longest key meta-memcache sends as is (base64 of 187 bytes exceeds 250)
_NEEDS_BASE64 = re.compile(rb"[\x00-\x20\x7f-\xff]")
_MCD_COMMENT = re.compile(rb"/\*\s*mcd:(.*?)\*/", re.DOTALL)
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")  # `{column}` in a key template (the topology's syntax)
# `Rows.kind` of a row event already rendered as it was read (`KeyExtractor.render`): its `images` are its
# keys (str), not row images. The transaction then holds its distinct keys, not every row image, until its commit.
RENDERED = "keys"


class RuleError(ValueError):
    """An invalidation rule that cannot work against the live schema (a start-up error)."""


# -- wire form of a key -----------------------------------------------------------------------------

def encode_key(key: bytes) -> tuple[bytes, str]:
    """The memcached token for `key` and how it was produced: "plain", "base64" or "hashed"."""
    if len(key) > MAX_PLAIN_KEY:
        return base64.b64encode(hashlib.blake2b(key, digest_size=18).digest()), "hashed"
    if not key or _NEEDS_BASE64.search(key):
        return base64.b64encode(key), "base64"
    return key, "plain"


def delete_line(key: str) -> tuple[bytes, str]:
    """`md <token> [b] q\\r\\n` for one key (quiet: memcached answers only misses and errors)."""
    if 0 < len(key) <= MAX_PLAIN_KEY and key.isascii() and key.isprintable() and " " not in key:
        return ("md " + key + " q\r\n").encode("ascii"), "plain"  # the common case, without the regex
    token, how = encode_key(key.encode("utf-8", "surrogateescape"))
    if how == "plain":
        return b"md " + token + b" q\r\n", how
    return b"md " + token + b" b q\r\n", how


def delete_lines(keys: Iterable[str], rewritten: dict[str, int] | None = None) -> tuple[bytes, ...]:
    """`delete_line` of each key; keys sent in another form than plain are counted into `rewritten`.

    Printable ASCII without spaces, 1..186 characters (nearly every key) is one str check and one encode:
    for ASCII `isprintable()` is exactly 0x20-0x7e, so excluding the space leaves memcached's plain key bytes.
    """
    out = []
    append = out.append
    for k in keys:
        if 0 < len(k) <= MAX_PLAIN_KEY and k.isascii() and k.isprintable() and " " not in k:
            append(("md " + k + " q\r\n").encode("ascii"))
            continue
        line, how = delete_line(k)
        if how != "plain" and rewritten is not None:
            rewritten[how] = rewritten.get(how, 0) + 1
        append(line)
    return tuple(out)


# -- rendering --------------------------------------------------------------------------------------

def _text(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "surrogateescape")  # keeps binary values byte-exact
    return str(value)


@dataclass(frozen=True)
class Template:
    """One key template compiled into literal text and column names, alternating."""

    source: str
    parts: tuple[str, ...]  # literal, column, literal, column, ..., literal

    @classmethod
    def compile(cls, template: str) -> Template:
        return cls(template, tuple(PLACEHOLDER.split(template)))

    @property
    def columns(self) -> tuple[str, ...]:
        return self.parts[1::2]

    def render(self, row: dict) -> str | None:
        """The key for one row image; None if a column is NULL. KeyError if a column is missing."""
        parts = self.parts
        if len(parts) == 3:  # one column, the usual `prefix:{column}`: no list, no join
            value = row[parts[1]]
            if value is None:
                return None
            kind = type(value)
            if kind is int or kind is str:
                return parts[0] + (value if kind is str else str(value)) + parts[2]
            return parts[0] + _text(value) + parts[2]
        out = [parts[0]]
        for i in range(1, len(parts), 2):
            value = row[parts[i]]
            if value is None:
                return None
            out.append(_text(value))
            out.append(parts[i + 1])
        return "".join(out)


def comment_keys(sql: bytes) -> list[str]:
    """Keys named in `/* mcd:k1,k2 */` comments of one statement."""
    keys: list[str] = []
    for m in _MCD_COMMENT.finditer(sql):
        for k in m.group(1).split(b","):
            k = k.strip()
            if k:
                keys.append(k.decode("utf-8", "surrogateescape"))
    return keys


class KeyExtractor:
    """Rules (compiled once) applied to transactions: `keys(txn)` -> distinct keys in first-seen order."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.templates: dict[tuple[str, str], tuple[Template, ...]] = {}
        for rule in rules:
            schema, table = rule.table.split(".", 1)
            self.templates[(schema, table)] = tuple(Template.compile(k) for k in rule.keys)
        self.missing_columns: dict[tuple[str, str, str], int] = {}  # (schema.table, column) seen missing

    @property
    def tables(self) -> set[tuple[str, str]]:
        return set(self.templates)

    def keys(self, txn: Transaction) -> tuple[list[str], int, int]:
        """(keys, number from rules, number from comments) for one committed transaction.

        Distinct keys only: a key rendered again (say `feed:{author_id}` by every row of one author) is sent
        once. Comment keys come first, then rule keys in row order; `txn.rows` may hold row events already
        rendered (`render`), whose keys are taken as they are.
        """
        seen: dict[str, None] = {}
        for sql in txn.statements:
            if b"mcd:" in sql:  # cheap test first: most statements carry no comment
                for k in comment_keys(sql):
                    if k not in seen:
                        seen[k] = None
        from_comments = len(seen)
        for rows in txn.rows:
            if rows.kind == RENDERED:
                for key in rows.images:
                    if key not in seen:
                        seen[key] = None  # type: ignore[index]
            else:
                self._add(rows, seen, None)
        return list(seen), len(seen) - from_comments, from_comments

    def render(self, rows: Rows, seen: dict[str, None]) -> tuple[Rows, int]:
        """Render one row event as soon as it is read: (the event with its row images replaced by the keys they
        render that `seen` lacks, number of duplicate keys dropped).

        `seen` holds the keys rendered so far from the same transaction (this adds to it), so the transaction
        keeps each of its distinct keys once and none of its row images. The keys are sent only once the
        transaction commits (`keys` takes them from the returned event).
        """
        new: list[str] = []
        duplicates = self._add(rows, seen, new)
        return Rows(rows.schema, rows.table, RENDERED, tuple(new)), duplicates  # type: ignore[arg-type]

    def _add(self, rows: Rows, seen: dict[str, None], new: list[str] | None) -> int:
        """Keys of `rows`' images not in `seen` into `seen` (and `new`); returns how many were already there."""
        templates = self.templates.get((rows.schema, rows.table))
        if not templates:
            return 0  # a table with no rule (the reader filters most of these out already)
        duplicates = 0
        append = new.append if new is not None else None
        for image in rows.images:
            for t in templates:
                try:
                    key = t.render(image)
                except KeyError as e:
                    self._missing(rows.schema, rows.table, str(e.args[0]), t)
                    continue
                if key is None:
                    continue
                if key in seen:
                    duplicates += 1
                    continue
                seen[key] = None
                if append is not None:
                    append(key)
        return duplicates

    def _missing(self, schema: str, table: str, column: str, t: Template) -> None:
        self.count_missing(schema, table, column, t.source)

    def count_missing(self, schema: str, table: str, column: str, template: str, times: int = 1) -> None:
        """A template met a row without `column` (`times` images; the native reader reports its own)."""
        # A column dropped after start-up: the other templates still work; say so loudly, once per column.
        k = (schema, table, column)
        count = self.missing_columns.get(k, 0)
        self.missing_columns[k] = count + times
        if count == 0:
            log.error("rule for %s.%s: key template %r names column %r, which the row no longer has; "
                      "that key is not rendered until the rule is fixed", schema, table, template, column)


# -- start-up check against the live schema ---------------------------------------------------------

def check_rules(rules: Iterable[Rule], columns_of: dict[tuple[str, str], list[str]]) -> list[str]:
    """Raise RuleError if a template names a column its table lacks; return warnings (missing tables).

    `columns_of` maps (schema, table) to the table's columns as information_schema lists them.
    """
    warnings: list[str] = []
    for i, rule in enumerate(rules):
        schema, table = rule.table.split(".", 1)
        cols = columns_of.get((schema, table))
        if cols is None:
            warnings.append(f"rules[{i}] (table {rule.table}): the table does not exist (yet); "
                            "its templates are checked when rows arrive")
            continue
        have = set(cols)
        for template in rule.keys:
            for column in PLACEHOLDER.findall(template):
                if column not in have:
                    raise RuleError(
                        f"rules[{i}] (table {rule.table}): key template {template!r} names column "
                        f"{column!r}, which {rule.table} does not have (columns: {', '.join(cols)})"
                    )
    return warnings


def load_columns(conn: Any, tables: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """Columns of each (schema, table) from information_schema (a PyMySQL connection)."""
    tables = list(tables)
    out: dict[tuple[str, str], list[str]] = {}
    if not tables:
        return out
    where = " OR ".join(["(TABLE_SCHEMA=%s AND TABLE_NAME=%s)"] * len(tables))
    args = [v for t in tables for v in t]
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS "
                    f"WHERE {where} ORDER BY ORDINAL_POSITION", args)
        for schema, table, column in cur.fetchall():
            out.setdefault((schema, table), []).append(column)
    return out
