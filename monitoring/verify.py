"""Consistency checker (`squealctl verify`): is anything cached that disagrees with the database?

For a sample (or all) of the rows of every table an invalidation rule names, read each cache key the rule
renders from every cluster (through one of the cluster's routers) and compare what the cached value says
about the database with what the master database holds now. Nothing here knows the web tier's code:

* **Key families come from the topology.** A rule `table = "app.users"`, `keys = ["user:{id}"]` says a key
  `user:42` holds rows of `app.users` whose `id` is `42`; the key's columns are the WHERE clause.
* **Values are read by a codec the web tier registers** with the rule (`codec = "package.module:function"`
  in the topology's `[[rules]]`; `--codec` overrides it for every rule): `decode(family, value, flags)`
  gets the rule's key template (the *family*, e.g. `"user:{id}"`), the cached bytes and memcached client
  flags, and returns what the value says the database holds (see `CachedRows`). A codec raises
  `LookupError` for a family it does not fill (not checked) and `ValueError` for a value it did not write
  (not checked: the web tier would not serve it either). A rule without a codec is read with `json_rows`:
  a JSON object is one row, JSON null is "no such row".
* **Shards** (`[shards]`, docs/squeal.md "Shards"): a key's rows are compared with the primaries of the shards
  that own them. A codec may say, per family, which of the template's columns places every row of a key on
  one shard: `codec.shard_column(family)` returns that column (its value is a row id of the web tier's shard
  map, `Topology.shard_of`) or None. With a column, the key is compared with that one shard; without (or
  for a value that is not an id), with every shard the rule applies to (`rules.shards`), their rows merged
  as one database would return them (the value's order and window; strings sort as Python sorts them, not
  by the column's collation). A topology without [shards] has one: its master database.

Not stale, by design:

* an absent key (the next read fills it);
* a lease placeholder: the 0-byte item `mg … N` leaves while a lease holder loads the row (the web tier
  never stores a 0-byte value; see leases/serializer.py);
* an invalidation in flight: a mismatch is re-read after a grace period (default `GRACE_FACTOR` times the
  p99 of squeal's `squeal_invalidation_latency_seconds`, from the daemons' /metrics; `DEFAULT_GRACE` when no
  daemon answers). It is stale only if the *same* copy (same cas) is still cached and still disagrees with
  the database; a copy that was replaced meanwhile is judged again after another grace period.

A cluster whose routers do not answer is reported and the other clusters are still checked. Exit codes of
`squealctl verify` (`VerifyReport.exit_code`): 0 every cluster checked, nothing stale; 1 stale copies found;
2 could not check at all (database or every router unreachable, bad codec); 3 some clusters could not be
checked and none of the others holds a stale copy.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import random
import re
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql
import pymysql.cursors
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheError

import router_config
from monitoring.panels import quantile
from monitoring.scrape import scrape_prometheus
from router_config.model import COLUMN_NAME, PLACEHOLDER

log = logging.getLogger(__name__)

JSON_FLAG = 64  # the web tier's JsonSerializer client flag (leases/serializer.py)

EXIT_CLEAN, EXIT_STALE, EXIT_CANNOT_CHECK, EXIT_PARTIAL = 0, 1, 2, 3

DEFAULT_GRACE = 2.0  # seconds, when no squeal daemon's latency histogram can be read
GRACE_FACTOR = 3.0  # grace = this many times the measured p99 invalidation latency ...
GRACE_BOUNDS = (0.5, 30.0)  # ... kept within these bounds (seconds)
LATENCY_METRIC = "squeal_invalidation_latency_seconds"
RECHECK_ROUNDS = 3  # a mismatching copy replaced by another mismatching copy is re-read at most this often
CHUNK = 100  # keys per multi-get


class VerifyError(Exception):
    """verify could not check anything (one line, for `squealctl verify`'s exit code 2)."""


# -- what a cached value says ------------------------------------------------------------------------


@dataclass(frozen=True)
class CachedRows:
    """What one cached value says the database holds for its key: the rows of the rule's table whose key
    columns equal the key's values, each a dict of (some of) their columns.

    `one`: the value is a single row or "no such row" (compared with the row the key selects).
    `order_by` / `limit`: the value holds only the first `limit` rows in this order (e.g. a feed of the
    latest 20 posts: `order_by="id DESC", limit=20`); without them it holds every matching row, in any order.
    A codec may also return a plain dict (one row), None (no row) or a list of dicts (every matching row).
    """

    rows: tuple[Mapping[str, Any], ...]
    order_by: str | None = None
    limit: int | None = None
    one: bool = False


Codec = Callable[[str, bytes, int], Any]
ORDER_BY = re.compile(r"^\s*[A-Za-z_]\w*(\s+(ASC|DESC))?(\s*,\s*[A-Za-z_]\w*(\s+(ASC|DESC))?)*\s*$", re.I)


def json_rows(family: str, value: bytes, flags: int) -> Any:
    """The default codec: a JSON object is one row, JSON null is "no such row"; anything else (lists, whose
    window and columns only the writer knows) needs the web tier's codec."""
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from e
    if doc is None or isinstance(doc, dict):
        return doc
    raise ValueError(f"a JSON {type(doc).__name__} needs the web tier's codec ([monitoring] verify_codec)")


def load_codec(spec: str) -> Codec:
    """`"package.module:function"` → the function (raises VerifyError naming what is wrong)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise VerifyError(f"codec {spec!r} is not a `package.module:function` import path")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as e:
        raise VerifyError(f"codec {spec!r} cannot be loaded: {e}") from e
    if not callable(found):
        raise VerifyError(f"codec {spec!r} is not callable")
    return found


def resolve_codec(codec: Codec | str | None) -> Codec:
    """A codec given as a callable or an import path; None is `json_rows`."""
    if codec is None:
        return json_rows
    return load_codec(codec) if isinstance(codec, str) else codec


def _as_rows(decoded: Any) -> CachedRows:
    if isinstance(decoded, CachedRows):
        found = decoded
    elif decoded is None:
        found = CachedRows((), one=True)
    elif isinstance(decoded, Mapping):
        found = CachedRows((decoded,), one=True)
    elif isinstance(decoded, Sequence) and not isinstance(decoded, str | bytes):
        found = CachedRows(tuple(decoded))
    else:
        raise ValueError(f"codec returned {type(decoded).__name__}, not rows")
    if any(not isinstance(r, Mapping) for r in found.rows):
        raise ValueError("codec returned a row that is not a dict of column values")
    if found.one and len(found.rows) > 1:
        raise ValueError("codec returned several rows for a single-row value")
    if found.order_by is not None and not ORDER_BY.match(found.order_by):
        raise ValueError(f"codec's order_by {found.order_by!r} is not `column [ASC|DESC], ...`")
    if found.limit is not None and (not isinstance(found.limit, int) or found.limit <= 0):
        raise ValueError(f"codec's limit {found.limit!r} is not a positive integer")
    return found


# -- key families from the topology's rules ------------------------------------------------------------


@dataclass(frozen=True)
class KeyFamily:
    """One rule key template: keys `template` renders hold rows of `table` selected by `columns`."""

    template: str  # e.g. "user:email:{email}" (what the codec gets as `family`)
    table: str  # "schema.table"
    columns: tuple[str, ...]  # the template's placeholders, in order
    pattern: re.Pattern[str] = field(compare=False, repr=False)
    codec: str | None = None  # the rule's codec import path (None: json_rows)
    shards: tuple[str, ...] = ()  # the shards whose copies have the table (the rule's `shards`); () = every one

    @classmethod
    def from_template(
        cls, template: str, table: str, codec: str | None = None, shards: tuple[str, ...] = ()
    ) -> KeyFamily:
        parts, columns, at = [], [], 0
        for m in PLACEHOLDER.finditer(template):
            parts.append(re.escape(template[at : m.start()]) + "(.+?)")
            columns.append(m.group(1))
            at = m.end()
        parts.append(re.escape(template[at:]))
        return cls(template, table, tuple(columns), re.compile("^" + "".join(parts) + "$", re.S), codec, shards)

    @property
    def literal(self) -> int:
        """Characters of fixed text: of two templates matching a key, the longer one is meant."""
        return len(PLACEHOLDER.sub("", self.template))

    def values(self, key: str) -> tuple[str, ...] | None:
        m = self.pattern.match(key)
        return m.groups() if m else None

    def key(self, row: Mapping[str, Any]) -> str:
        return PLACEHOLDER.sub(lambda m: str(row[m.group(1)]), self.template)


def key_families(topo: router_config.Topology, database: str | None = None) -> tuple[KeyFamily, ...]:
    """Every key template of every rule (of tables in `database`, if given)."""
    return tuple(
        KeyFamily.from_template(
            template,
            rule.table,
            getattr(rule, "codec", None),
            tuple(s.name for s in topo.shards if rule.applies_to(s.name)) if topo.sharded else (),
        )
        for rule in topo.rules
        if database is None or rule.table.split(".", 1)[0] == database
        for template in rule.keys
    )


def family_of(families: Iterable[KeyFamily], key: str) -> tuple[KeyFamily, tuple[str, ...]] | None:
    """The most specific family whose template matches `key`, with the key's column values."""
    best = None
    for family in families:
        values = family.values(key)
        if values is not None and (best is None or family.literal > best[0].literal):
            best = (family, values)
    return best


# -- the database ------------------------------------------------------------------------------------


def _q(name: str) -> str:
    if not COLUMN_NAME.match(name):
        raise ValueError(f"{name!r} is not a column name")
    return f"`{name}`"


def _table(name: str) -> str:
    return ".".join(_q(p) for p in name.split("."))


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
            raise VerifyError(f"{self.label} does not answer ({_reason(e)})") from e

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


def _order_terms(order_by: str | None) -> list[tuple[str, bool]]:
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
    order = _order_terms(cached.order_by)
    # merging shards sorts here: the order's columns must come back even when the value does not hold them
    extra = [c for c, _ in order if c not in columns] if columns and len(dbs) > 1 else []
    select = ", ".join(_q(c) for c in columns + extra) if columns else "*"
    where = " AND ".join(f"{_q(c)} = %s" for c in family.columns)
    sql = f"SELECT {select} FROM {_table(family.table)} WHERE {where}"
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


def _shown(rows: CachedRows) -> Any:
    """A report's view: a single-row value as the row (or None), a list as a list."""
    if rows.one:
        return dict(rows.rows[0]) if rows.rows else None
    return [dict(r) for r in rows.rows]


# -- judging one cached value ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """How one cached copy compares: `state` is "agrees", "differs", "placeholder" or "unjudged"."""

    state: str
    cached: Any = None
    expected: Any = None
    reason: str = ""
    shards: tuple[str, ...] = ()  # the shards compared with (sharded topologies only)


class ConsistencyChecker:
    """Compares cached values with the database: key families from the topology, values through the codec."""

    def __init__(
        self,
        topo: router_config.Topology,
        db: Database | Mapping[str, Database],
        codec: Codec | str | None = None,
        database: str | None = None,
    ) -> None:
        """db: each shard's primary by name (`shard_databases`), or one Database holding every shard's rows.
        codec: one codec for every family (callable or import path), instead of each rule's own."""
        self.topo = topo
        self.dbs = dict(db) if isinstance(db, Mapping) else {s.name: db for s in topo.shards}
        self.db = next(iter(self.dbs.values()))
        self.families = key_families(topo, database)
        self.override = None if codec is None else resolve_codec(codec)
        # each rule's codec, loaded now so that a bad import path fails before anything is read
        self.codecs = {f.codec: resolve_codec(f.codec) for f in self.families if self.override is None}
        self.unknown_families: set[str] = set()  # families the codec does not fill

    def codec_for(self, family: KeyFamily) -> Codec:
        return self.override or self.codecs[family.codec]

    def owners(self, family: KeyFamily, values: Sequence[str]) -> list[str]:
        """The shards whose rows a key of `family` with these column values is compared with."""
        names = list(family.shards or self.dbs)
        if len(self.dbs) < 2:
            return names
        shard_column = getattr(self.codec_for(family), "shard_column", None)
        column = shard_column(family.template) if shard_column is not None else None
        if column in family.columns:
            value = values[family.columns.index(column)]
            if value.isdigit():
                return [self.topo.shard_of(int(value)).name]
        return names

    def _databases(self, shards: Sequence[str]) -> list[Database]:
        """The databases of these shards, each once (one Database may stand for all)."""
        return list({id(d): d for d in (self.dbs[s] for s in shards)}.values())

    def judge(self, key: str, value: bytes, flags: int) -> Verdict:
        if not value:
            return Verdict("placeholder")  # a lease holder's empty item: no value was ever stored
        found = family_of(self.families, key)
        if found is None:
            return Verdict("unjudged", reason="no rule's key template matches it")
        family, values = found
        try:
            cached = _as_rows(self.codec_for(family)(family.template, value, flags))
        except LookupError:
            self.unknown_families.add(family.template)
            return Verdict("unjudged", reason=f"the codec does not read family {family.template}")
        except (ValueError, TypeError) as e:
            return Verdict("unjudged", reason=f"the codec could not read it: {e}")
        shards = self.owners(family, values)
        try:
            current = database_rows(self._databases(shards), family, values, cached)
        except (ValueError, pymysql.err.Error) as e:  # a column or table that is not there
            if isinstance(e, pymysql.err.Error) and connection_lost(e):
                raise
            return Verdict("unjudged", reason=f"not comparable with {family.table}: {_reason(e)}")
        state = "agrees" if agree(cached, current) else "differs"
        return Verdict(state, _shown(cached), _shown(current), shards=tuple(shards) if self.topo.sharded else ())

    def sample_keys(self, sample: int | None, rng: random.Random) -> list[str]:
        """Keys of up to `sample` distinct rows per family (all when `sample` is None)."""
        keys: list[str] = []
        for family in self.families:
            cols = ", ".join(_q(c) for c in family.columns)
            found: dict[str, None] = {}  # keys, each once (a followee's followers are on several shards)
            for db in self._databases(family.shards or list(self.dbs)):
                try:
                    rows = db.query(f"SELECT DISTINCT {cols} FROM {_table(family.table)}")
                except pymysql.err.Error as e:  # a rule's table missing from this database, no privilege
                    if connection_lost(e):
                        raise
                    log.warning("verify: family %s not sampled from %s: %s", family.template, db.label, _reason(e))
                    continue
                found.update((family.key(r), None) for r in rows)
            sampled = list(found)
            if sample is not None and len(sampled) > sample:
                sampled = rng.sample(sampled, sample)
            keys.extend(sampled)
        return keys


# -- the report -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StaleKey:
    cluster: str
    key: str
    cached: Any
    expected: Any
    ttl_left: int | None  # seconds until memcached expires it on its own (None: unknown/no expiry)
    shards: tuple[str, ...] = ()  # the shards `expected` came from (sharded topologies only)

    def __str__(self) -> str:
        expiry = f"expires in {self.ttl_left}s" if self.ttl_left and self.ttl_left > 0 else "no expiry"
        where = f" (shard {', '.join(self.shards)})" if self.shards else ""
        return (
            f"{self.cluster}: {self.key} is stale ({expiry}): cached {self.cached!r}, database {self.expected!r}"
            + where
        )


@dataclass(frozen=True)
class Unchecked:
    """A cluster that could not be (fully) checked."""

    cluster: str
    reason: str

    def __str__(self) -> str:
        return f"{self.cluster}: NOT CHECKED: {self.reason}"


@dataclass(frozen=True)
class VerifyReport:
    checked: int  # (cluster, key) pairs found cached and compared
    absent: int  # (cluster, key) pairs not cached (nothing to compare)
    stale: tuple[StaleKey, ...]
    placeholders: int = 0  # lease placeholders seen (not stale)
    in_flight: int = 0  # mismatches gone or fixed within the grace period (invalidations in flight)
    unjudged: int = 0  # cached values the codec does not read (other writers, families it does not fill)
    unchecked: tuple[Unchecked, ...] = ()  # clusters whose routers did not answer
    clusters: tuple[str, ...] = ()  # clusters checked
    grace: float | None = None  # seconds a mismatch was given (None: no mismatch needed one)
    grace_source: str = ""

    @property
    def ok(self) -> bool:
        return not self.stale and not self.unchecked

    @property
    def exit_code(self) -> int:
        if self.stale:
            return EXIT_STALE
        if self.unchecked and not self.clusters:
            return EXIT_CANNOT_CHECK
        return EXIT_PARTIAL if self.unchecked else EXIT_CLEAN

    def summary(self) -> str:
        grace = f"; mismatches re-read after {self.grace:.1f}s ({self.grace_source})" if self.grace else ""
        missed = f"; NOT CHECKED: {', '.join(u.cluster for u in self.unchecked)}" if self.unchecked else ""
        return (
            f"verify: {len(self.clusters)} clusters, {self.checked} cached copies compared, {self.absent} not cached, "
            f"{self.placeholders} lease placeholders, {self.in_flight} in flight, {self.unjudged} not judged, "
            f"{len(self.stale)} stale{grace}{missed}"
        )


# -- grace: a few times the measured p99 invalidation latency ----------------------------------------------


def squeal_metrics_addresses(topo: router_config.Topology) -> list[str]:
    return [str(address) for role, _, address in topo.listeners() if role == "squeal"]


def measured_grace(topo: router_config.Topology, timeout: float = 1.0) -> tuple[float, str]:
    """(grace seconds, where it came from): GRACE_FACTOR × the worst daemon's p99 invalidation latency."""
    p99s: list[float] = []
    for address in squeal_metrics_addresses(topo):
        buckets: dict[float, float] = {}
        try:
            for name, labels, value in scrape_prometheus(address, timeout):
                if name == f"{LATENCY_METRIC}_bucket":
                    le = float(labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + value  # summed over flows
        except (OSError, ValueError) as e:
            log.debug("verify: no latency histogram from %s: %s", address, e)
            continue
        p99 = quantile(0.99, buckets)
        if p99 is not None:
            p99s.append(p99)
    if not p99s:
        return DEFAULT_GRACE, "default: no squeal daemon's latency histogram was readable"
    low, high = GRACE_BOUNDS
    p99 = max(p99s)
    grace = min(max(GRACE_FACTOR * p99, low), high)
    return grace, f"{GRACE_FACTOR:g} x p99 invalidation latency {p99:.2f}s of {len(p99s)} squeal daemon(s)"


# -- reading the caches ---------------------------------------------------------------------------------


class KeepFlags:
    """pymemcache serde that hands back (raw bytes, client flags): the checker decodes by flag itself."""

    def serialize(self, key: str, value: Any) -> tuple[bytes, int]:
        raise TypeError("the consistency checker never writes")

    def deserialize(self, key: str, value: bytes, flags: int) -> tuple[bytes, int]:
        return value, flags


def _reason(e: BaseException) -> str:
    if isinstance(e, pymysql.err.Error) and e.args:
        return str(e.args[-1])
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


CACHE_ERRORS = (OSError, MemcacheError)  # OSError includes timeouts


def _client(address: router_config.Address, tls: ssl.SSLContext | None) -> Client:
    return Client((address.host, address.port), connect_timeout=2, timeout=5, serde=KeepFlags(), tls_context=tls)


def router_tls(topo: router_config.Topology) -> ssl.SSLContext | None:
    """monitoring's client context for the routers with `[tls]` (None: plaintext)."""
    return router_config.tls_context(topo.tls, "monitoring")


def _connect(cluster: router_config.Cluster, tls: ssl.SSLContext | None) -> tuple[Client, router_config.Address]:
    """A client on the first of the cluster's routers that answers `version`."""
    failures = []
    for router in cluster.routers:
        client = _client(router, tls)
        try:
            client.version()
            return client, router
        except CACHE_ERRORS as e:
            client.close()
            failures.append(f"router {router} does not answer ({_reason(e)})")
    raise ConnectionError("; ".join(failures))


def _valid_key(key: str) -> bool:
    raw = key.encode()
    return 0 < len(raw) <= 250 and not any(b <= 0x20 or b == 0x7F for b in raw)


def _ttl_left(client: Client, key: str) -> int | None:
    """Remaining TTL via the meta protocol (`mg K t` → `HD t<seconds>`; -1 means no expiry)."""
    try:
        reply = client.raw_command(f"mg {key} t".encode(), b"\r\n")
    except CACHE_ERRORS:
        return None
    for token in reply.split()[1:]:
        if token.startswith(b"t"):
            return int(token[1:])
    return None


@dataclass
class _Suspect:
    cluster: str
    key: str
    cas: bytes | None
    seen: float
    verdict: Verdict


@dataclass
class FirstLook:
    """What the first look at the clusters found: counts over the clusters checked in full, and the copies that
    disagreed with the database (re-read after the grace: `_recheck`)."""

    checked: int = 0  # (cluster, key) pairs found cached and compared
    absent: int = 0  # (cluster, key) pairs not cached
    placeholders: int = 0  # lease placeholders
    unjudged: int = 0  # values the codec does not read
    suspects: list[_Suspect] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)  # checked in full
    unchecked: dict[str, Unchecked] = field(default_factory=dict)  # cluster -> why not
    routers: dict[str, router_config.Address] = field(default_factory=dict)  # cluster -> the router it answered on
    tls: ssl.SSLContext | None = None  # [tls]: the routers are dialled with it

    def add(self, cluster: str, other: FirstLook) -> None:
        """Count one cluster's look (`_look_at`) in."""
        self.clusters.append(cluster)
        self.checked += other.checked
        self.absent += other.absent
        self.placeholders += other.placeholders
        self.unjudged += other.unjudged
        self.suspects.extend(other.suspects)


@dataclass
class Recheck:
    """The mismatches re-read after their grace: stale copies, and how many were invalidations in flight."""

    stale: list[StaleKey] = field(default_factory=list)
    in_flight: int = 0


def _look_at(
    cluster: str,
    client: Client,
    keys: list[str],
    checker: ConsistencyChecker,
    seen: dict[tuple[str, bytes, int], Verdict],
) -> FirstLook:
    """One cluster's cached copies of `keys`, judged against the database (`seen`: verdicts by (key, bytes,
    flags), as clusters mostly hold the same bytes). Raises CACHE_ERRORS when its router fails."""
    look = FirstLook()
    for start in range(0, len(keys), CHUNK):
        chunk = keys[start : start + CHUNK]
        found = client.gets_many(chunk)
        look.absent += len(chunk) - len(found)
        for key, ((value, flags), cas) in found.items():
            v = seen.get((key, value, flags))
            if v is None:
                v = seen[(key, value, flags)] = checker.judge(key, value, flags)
            if v.state == "placeholder":
                look.placeholders += 1
            elif v.state == "unjudged":
                look.unjudged += 1
            else:
                look.checked += 1
                if v.state == "differs":
                    look.suspects.append(_Suspect(cluster, key, cas, time.monotonic(), v))
    return look


def _first_look(topo: router_config.Topology, keys: list[str], checker: ConsistencyChecker) -> FirstLook:
    """Phase 1: every cluster's copies, through one of its routers; a cluster whose routers do not answer (or
    fail mid-check) is `unchecked`, and none of its counts are kept."""
    total = FirstLook(tls=router_tls(topo))
    seen: dict[tuple[str, bytes, int], Verdict] = {}
    for cluster in topo.clusters:
        try:
            client, router = _connect(cluster, total.tls)
        except ConnectionError as e:
            total.unchecked[cluster.name] = Unchecked(cluster.name, str(e))
            continue
        total.routers[cluster.name] = router
        try:
            look = _look_at(cluster.name, client, keys, checker, seen)
        except CACHE_ERRORS as e:
            total.unchecked[cluster.name] = Unchecked(cluster.name, f"router {router} failed mid-check ({_reason(e)})")
            continue
        finally:
            client.close()
        total.add(cluster.name, look)
    return total


def _grace(topo: router_config.Topology, look: FirstLook, grace: float | None) -> tuple[float | None, str]:
    """Phase 2: how long a mismatch gets before it is re-read, and where that figure came from ("" when no
    mismatch needs one)."""
    if not look.suspects:
        return grace, ""
    if grace is None:
        return measured_grace(topo)
    return grace, "--grace"


def _recheck(look: FirstLook, checker: ConsistencyChecker, grace: float, sleep: Callable[[float], None]) -> Recheck:
    """Phase 3: re-read each mismatch once its grace is over. Gone or agreeing: an invalidation in flight. The
    same copy (same CAS), or any copy in the last round: stale. Replaced by another copy that disagrees too: that
    one gets its grace (at most RECHECK_ROUNDS rounds). A router failing here makes its cluster `unchecked`."""
    result = Recheck()
    suspects = look.suspects
    for last_round in (r == RECHECK_ROUNDS for r in range(1, RECHECK_ROUNDS + 1)):
        if not suspects:
            break
        sleep(max(0.0, max(s.seen for s in suspects) + grace - time.monotonic()))
        again: list[_Suspect] = []
        for name in dict.fromkeys(s.cluster for s in suspects if s.cluster not in look.unchecked):
            mine = [s for s in suspects if s.cluster == name]
            client = _client(look.routers[name], look.tls)
            try:
                found = client.gets_many([s.key for s in mine])
                for s in mine:
                    if s.key not in found:
                        result.in_flight += 1  # deleted within the grace: the invalidation was on its way
                        continue
                    (value, flags), cas = found[s.key]
                    v = checker.judge(s.key, value, flags)
                    if v.state != "differs":
                        result.in_flight += 1
                    elif cas == s.cas or last_round:
                        ttl = _ttl_left(client, s.key)
                        result.stale.append(StaleKey(name, s.key, v.cached, v.expected, ttl, v.shards))
                    else:  # replaced by another copy that disagrees too: give that one its grace
                        again.append(_Suspect(name, s.key, cas, time.monotonic(), v))
            except CACHE_ERRORS as e:
                reason = f"router {look.routers[name]} failed while re-reading {len(mine)} mismatches ({_reason(e)})"
                look.unchecked[name] = Unchecked(name, reason)
                look.clusters.remove(name)
                again = [s for s in again if s.cluster != name]
            finally:
                client.close()
        suspects = again
    return result


def verify(
    topo: router_config.Topology,
    *,
    database: str | None = None,
    sample: int | None = 200,
    keys: list[str] | None = None,
    seed: int = 0,
    codec: Codec | str | None = None,
    grace: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> VerifyReport:
    """Compare every cluster's cached copy of the sampled keys with the master database (with [shards]: the
    primaries of the shards that own each key's rows).

    database: only rules of tables in this schema (default: every rule). codec: a callable or import path
    for every rule (default: each rule's `codec`, else `json_rows`). grace: seconds a mismatch gets
    before it is re-read (default: `measured_grace`). Raises VerifyError when nothing can be checked because
    the database does not answer or the codec cannot be loaded; unreachable routers are in the report.

    The phases: the keys (`sample_keys`), the first look at every cluster (`_first_look`), the grace
    (`_grace`), the re-read of the mismatches (`_recheck`).
    """
    dbs = shard_databases(topo)
    checker = ConsistencyChecker(topo, dbs, codec, database)
    try:
        for db in dbs.values():
            db.connect()
        keys = keys if keys is not None else checker.sample_keys(sample, random.Random(seed))
        keys = [k for k in keys if _valid_key(k)]  # a row whose key memcached refuses is never cached
        look = _first_look(topo, keys, checker)
        grace, grace_source = _grace(topo, look, grace)
        recheck = _recheck(look, checker, grace, sleep) if grace is not None and grace_source else Recheck()
        if checker.unknown_families:
            log.info("verify: the codec does not read %s", ", ".join(sorted(checker.unknown_families)))
        return VerifyReport(
            look.checked,
            look.absent,
            tuple(recheck.stale),
            placeholders=look.placeholders,
            in_flight=recheck.in_flight,
            unjudged=look.unjudged,
            unchecked=tuple(look.unchecked.values()),
            clusters=tuple(look.clusters),
            grace=grace if grace_source else None,
            grace_source=grace_source,
        )
    except pymysql.err.Error as e:
        failed = next((d for d in dbs.values() if d.lost), next(iter(dbs.values())))
        raise VerifyError(f"{failed.label} failed mid-check ({_reason(e)})") from e
    finally:
        for db in dbs.values():
            db.close()


def run(
    topo: router_config.Topology,
    *,
    database: str | None = None,
    sample: int | None = 200,
    codec: str | None = None,
    grace: float | None = None,
    out: Callable[[str], None] = print,
    err: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> int:
    """`squealctl verify`: print unchecked clusters, stale copies and a summary; return the exit code."""
    try:
        report = verify(topo, database=database, sample=sample, codec=codec, grace=grace)
    except VerifyError as e:
        err(f"squealctl verify: cannot check: {e}")
        return EXIT_CANNOT_CHECK
    for unchecked in report.unchecked:
        err(str(unchecked))
    for stale in report.stale:
        out(str(stale))
    out(report.summary())
    return report.exit_code
