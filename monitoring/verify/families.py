"""Key families from the topology's rules: which rows of which table a cache key holds."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import router_config
from router_config.model import PLACEHOLDER

log = logging.getLogger(__name__)

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
