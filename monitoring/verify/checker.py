"""Judging one cached value against the database (`ConsistencyChecker`): a `Verdict`."""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors

import router_config
from monitoring.verify.codec import Codec, as_rows, failure_reason, resolve_codec
from monitoring.verify.database import Database, agree, connection_lost, database_rows, quote_name, quoted_table, shown
from monitoring.verify.families import KeyFamily, family_of, key_families

log = logging.getLogger(__name__)

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
            cached = as_rows(self.codec_for(family)(family.template, value, flags))
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
            return Verdict("unjudged", reason=f"not comparable with {family.table}: {failure_reason(e)}")
        state = "agrees" if agree(cached, current) else "differs"
        return Verdict(state, shown(cached), shown(current), shards=tuple(shards) if self.topo.sharded else ())

    def sample_keys(self, sample: int | None, rng: random.Random) -> list[str]:
        """Keys of up to `sample` distinct rows per family (all when `sample` is None)."""
        keys: list[str] = []
        for family in self.families:
            cols = ", ".join(quote_name(c) for c in family.columns)
            found: dict[str, None] = {}  # keys, each once (a followee's followers are on several shards)
            for db in self._databases(family.shards or list(self.dbs)):
                try:
                    rows = db.query(f"SELECT DISTINCT {cols} FROM {quoted_table(family.table)}")
                except pymysql.err.Error as e:  # a rule's table missing from this database, no privilege
                    if connection_lost(e):
                        raise
                    log.warning(
                        "verify: family %s not sampled from %s: %s", family.template, db.label, failure_reason(e)
                    )
                    continue
                found.update((family.key(r), None) for r in rows)
            sampled = list(found)
            if sample is not None and len(sampled) > sample:
                sampled = rng.sample(sampled, sample)
            keys.extend(sampled)
        return keys
