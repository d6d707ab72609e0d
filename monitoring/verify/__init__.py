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

The package, in the order a check runs: `families` (key families from the rules), `codec` (what a cached value
says: `CachedRows`), `database` (what the database holds now), `checker` (one value judged: a `Verdict`),
`scan` (every cluster read through its routers, the grace period, `verify`), `report` (what was found, the exit
code) and `cli` (`squealctl verify`).
"""

from monitoring.verify.checker import ConsistencyChecker, Verdict
from monitoring.verify.cli import run
from monitoring.verify.codec import JSON_FLAG, CachedRows, Codec, VerifyError, json_rows, load_codec, resolve_codec
from monitoring.verify.database import Database, agree, database_rows, order_terms, shard_databases
from monitoring.verify.families import KeyFamily, family_of, key_families
from monitoring.verify.meta import MetaReader, plain_key
from monitoring.verify.report import (
    EXIT_CANNOT_CHECK,
    EXIT_CLEAN,
    EXIT_PARTIAL,
    EXIT_STALE,
    StaleKey,
    Unchecked,
    VerifyReport,
)
from monitoring.verify.scan import (
    DEFAULT_GRACE,
    GRACE_BOUNDS,
    GRACE_FACTOR,
    KeepFlags,
    measured_grace,
    router_tls,
    verify,
)

__all__ = [
    "DEFAULT_GRACE",
    "EXIT_CANNOT_CHECK",
    "EXIT_CLEAN",
    "EXIT_PARTIAL",
    "EXIT_STALE",
    "GRACE_BOUNDS",
    "GRACE_FACTOR",
    "JSON_FLAG",
    "CachedRows",
    "Codec",
    "ConsistencyChecker",
    "Database",
    "KeepFlags",
    "KeyFamily",
    "MetaReader",
    "StaleKey",
    "Unchecked",
    "Verdict",
    "VerifyError",
    "VerifyReport",
    "agree",
    "database_rows",
    "family_of",
    "json_rows",
    "key_families",
    "load_codec",
    "order_terms",
    "plain_key",
    "measured_grace",
    "resolve_codec",
    "router_tls",
    "run",
    "shard_databases",
    "verify",
]
