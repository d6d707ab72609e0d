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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from router_config import Rule
from router_config.predicate import BoolOp, Compare, IsNull, Node, Not, Predicate
from squeal.read.transactions import Rows, Transaction

log = logging.getLogger(__name__)

MAX_PLAIN_KEY = 186  # longest key meta-memcache sends as is (base64 of 187 bytes exceeds 250)
_NEEDS_BASE64 = re.compile(rb"[\x00-\x20\x7f-\xff]")
_MCD_COMMENT = re.compile(rb"/\*\s*mcd:(.*?)\*/", re.DOTALL)
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")  # `{column}` in a key template (the topology's syntax)
# `Rows.kind` of a row event already rendered as it was read (`KeyExtractor.render`): its `images` are its
# keys (str), not row images. The transaction then holds its distinct keys, not every row image, until its commit.
RENDERED = "keys"
# `Rows.kind` of a row event the native reader rendered and encoded itself: `images` is (delete lines for every
# cluster, delete lines for the regional pool only), the keys already distinct within their event group.
LINES = "lines"


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
    out: list[bytes] = []
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


# -- filters (`when_changed`, `where`) ----------------------------------------------------------------

_MISSING = object()


_INTEGER = re.compile(r"-?[0-9]{1,38}")  # fits an i128, like the native reader's


def _numbers(a: str, b: str) -> tuple[int, int] | tuple[float, float]:
    """Two numbers' texts as numbers to compare: ints when both are integers, else floats (exactly what the
    native reader does: i128, else f64)."""
    if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):
        return int(a), int(b)
    return float(a), float(b)


def _compare(op: str, a: Any, b: Any) -> bool:
    if op == "=":
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a >= b


class RowFilter:
    """A rule's filters on one changed row: does the row send the rule's keys?

    * `watched` (`Rule.watched`): an UPDATE sends them only if one of these columns differs between its
      before and after image. INSERT and DELETE always pass.
    * `where`: at least one of the row's images must match (so a row leaving the filtered set, say
      published -> draft, still deletes its cached copy).

    A column the row lacks (dropped after start-up) makes the row pass: a filter never costs an invalidation
    because the schema moved. `missing` collects such columns for the caller to report.
    """

    def __init__(self, watched: tuple[str, ...], where: Predicate | None) -> None:
        self.watched = watched
        self.where = where
        self.missing: set[str] = set()

    def reason_to_skip(self, kind: str, images: tuple[dict, ...]) -> str | None:
        """ "when_changed" or "where" if the row sends nothing, else None (`images`: the row's 1 or 2)."""
        if self.watched and kind == "update" and len(images) == 2:
            before, after = images
            for c in self.watched:
                b, a = before.get(c, _MISSING), after.get(c, _MISSING)
                if b is _MISSING or a is _MISSING:
                    self.missing.add(c)
                    return None
                if b != a:
                    break
            else:
                return "when_changed"
        if self.where is not None:
            for image in images:
                try:
                    if self._eval(self.where.root, image) is True:
                        return None
                except KeyError as e:
                    self.missing.add(str(e.args[0]))
                    return None
            return "where"
        return None

    def _eval(self, node: Node, row: dict) -> bool | None:
        """SQL's three-valued logic: True, False, or None (unknown)."""
        if isinstance(node, Compare):
            value = row[node.column]
            if value is None:
                return None
            text = _text(value)
            if node.literal.number:
                return _compare(node.op, *_numbers(text, node.literal.value))
            return _compare(node.op, text.encode("utf-8", "surrogateescape"), node.literal.value.encode("utf-8"))
        if isinstance(node, IsNull):
            return row[node.column] is None
        if isinstance(node, Not):
            v = self._eval(node.operand, row)
            return None if v is None else not v
        assert isinstance(node, BoolOp)
        values = [self._eval(n, row) for n in node.operands]
        decisive = node.op == "or"  # True decides an OR, False an AND
        if decisive in values:
            return decisive
        return None if None in values else not decisive


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
        self.filters: dict[tuple[str, str], RowFilter] = {}
        for rule in rules:
            schema, table = rule.table.split(".", 1)
            self.templates[(schema, table)] = tuple(Template.compile(k) for k in rule.keys)
            if rule.watched or rule.where is not None:
                self.filters[(schema, table)] = RowFilter(rule.watched, rule.where)
        self.missing_columns: dict[tuple[str, str, str], int] = {}  # (schema.table, column) seen missing
        self.filtered: dict[tuple[str, str, str], int] = {}  # (schema, table, reason) -> rows that sent nothing

    @property
    def tables(self) -> set[tuple[str, str]]:
        return set(self.templates)

    @property
    def text_columns(self) -> set[tuple[str, str, str]]:
        """(schema, table, column) rendered as text: templated, or compared by a `where` filter."""
        out = {(s, t, c) for (s, t), ts in self.templates.items() for tpl in ts for c in tpl.columns}
        for (s, t), f in self.filters.items():
            if f.where is not None:
                out.update((s, t, c) for c in f.where.columns)
        return out

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
            if rows.kind == LINES:
                continue  # already delete lines (`lines`)
            if rows.kind == RENDERED:
                for key in rows.images:
                    if key not in seen:
                        seen[key] = None
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
        return Rows(rows.schema, rows.table, RENDERED, tuple(new)), duplicates

    def _add(self, rows: Rows, seen: dict[str, None], new: list[str] | None) -> int:
        """Keys of `rows`' images not in `seen` into `seen` (and `new`); returns how many were already there."""
        templates = self.templates.get((rows.schema, rows.table))
        if not templates:
            return 0  # a table with no rule (the reader filters most of these out already)
        duplicates = 0
        append = new.append if new is not None else None
        images: Iterable[dict] = rows.images
        row_filter = self.filters.get((rows.schema, rows.table))
        if row_filter is not None:
            images = self._filtered(rows, row_filter)
        for image in images:
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

    def _filtered(self, rows: Rows, row_filter: RowFilter) -> list[dict]:
        """The images of `rows`' rows that pass the rule's filters; the others are counted in `filtered`."""
        step = 2 if rows.kind == "update" else 1
        images = rows.images
        out: list[dict] = []
        for i in range(0, len(images), step):
            row = images[i : i + step]
            reason = row_filter.reason_to_skip(rows.kind, row)
            if reason is None:
                out.extend(row)
            else:
                k = (rows.schema, rows.table, reason)
                self.filtered[k] = self.filtered.get(k, 0) + 1
        for column in row_filter.missing:
            self.count_missing(rows.schema, rows.table, column, "when_changed/where")
        row_filter.missing.clear()
        return out

    def count_filtered(self, schema: str, table: str, reason: str, times: int) -> None:
        """Rows the native reader's filters kept from sending (`take_counts`)."""
        k = (schema, table, reason)
        self.filtered[k] = self.filtered.get(k, 0) + times

    def _missing(self, schema: str, table: str, column: str, t: Template) -> None:
        self.count_missing(schema, table, column, t.source)

    def count_missing(self, schema: str, table: str, column: str, template: str, times: int = 1) -> None:
        """A template met a row without `column` (`times` images; the native reader reports its own)."""
        # A column dropped after start-up: the other templates still work; say so loudly, once per column.
        k = (schema, table, column)
        count = self.missing_columns.get(k, 0)
        self.missing_columns[k] = count + times
        if count == 0:
            if template == "when_changed/where":
                log.error(
                    "rule for %s.%s: its filter names column %r, which the row no longer has; the filter "
                    "lets every row through until the rule is fixed",
                    schema,
                    table,
                    column,
                )
            else:
                log.error(
                    "rule for %s.%s: key template %r names column %r, which the row no longer has; "
                    "that key is not rendered until the rule is fixed",
                    schema,
                    table,
                    template,
                    column,
                )


# -- start-up check against the live schema ---------------------------------------------------------

# information_schema DATA_TYPEs a `where` may compare with a number (any other with a 'string').
NUMERIC_TYPES = frozenset(
    {
        "tinyint",
        "smallint",
        "mediumint",
        "int",
        "integer",
        "bigint",
        "year",
        "decimal",
        "numeric",
        "float",
        "double",
        "real",
    }
)


def check_rules(
    rules: Iterable[Rule], columns_of: dict[tuple[str, str], Any], indices: Sequence[int] | None = None
) -> list[str]:
    """Raise RuleError if a template or filter names a column its table lacks, or a `where` compares a
    column with the wrong kind of literal; return warnings (missing tables).

    `columns_of` maps (schema, table) to the table's columns as information_schema lists them: a list of
    names, or (`load_columns`) a dict name -> DATA_TYPE, which also enables the literal check. `indices`: each
    rule's place in the topology file's [[rules]] (when `rules` is a shard's subset), for the messages.
    """
    warnings: list[str] = []
    rules = list(rules)
    places = list(indices) if indices is not None else list(range(len(rules)))
    for i, rule in zip(places, rules, strict=True):
        schema, table = rule.table.split(".", 1)
        cols = columns_of.get((schema, table))
        if cols is None:
            warnings.append(
                f"rules[{i}] (table {rule.table}): the table does not exist (yet); "
                "its templates are checked when rows arrive"
            )
            continue
        have = set(cols)
        listing = ", ".join(cols)
        for template in rule.keys:
            for column in PLACEHOLDER.findall(template):
                if column not in have:
                    raise RuleError(
                        f"rules[{i}] (table {rule.table}): key template {template!r} names column "
                        f"{column!r}, which {rule.table} does not have (columns: {listing})"
                    )
        for column in rule.when_changed:
            if column not in have:
                raise RuleError(
                    f"rules[{i}].when_changed (table {rule.table}): {rule.table} has no column "
                    f"{column!r} (columns: {listing})"
                )
        if rule.where is None:
            continue
        for column in rule.where.columns:
            if column not in have:
                raise RuleError(
                    f"rules[{i}].where (table {rule.table}): {rule.where.source!r} names column "
                    f"{column!r}, which {rule.table} does not have (columns: {listing})"
                )
        if isinstance(cols, dict):
            for c in rule.where.comparisons():
                numeric = str(cols[c.column]).lower() in NUMERIC_TYPES
                if numeric != c.literal.number:
                    want = "a number" if numeric else "a 'string'"
                    raise RuleError(
                        f"rules[{i}].where (table {rule.table}): {c.column} is {cols[c.column]}: compare it with "
                        f"{want}, not {c.literal.value!r} (squeal compares numbers as numbers and strings byte "
                        "for byte)"
                    )
    return warnings


def load_columns(conn: Any, tables: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
    """Columns of each (schema, table) from information_schema (a PyMySQL connection): name -> DATA_TYPE, in
    table order."""
    tables = list(tables)
    out: dict[tuple[str, str], dict[str, str]] = {}
    if not tables:
        return out
    where = " OR ".join(["(TABLE_SCHEMA=%s AND TABLE_NAME=%s)"] * len(tables))
    args = [v for t in tables for v in t]
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
            f"WHERE {where} ORDER BY ORDINAL_POSITION",
            args,
        )
        for schema, table, column, data_type in cur.fetchall():
            out.setdefault((schema, table), {})[column] = str(data_type)
    return out
