"""Consistency checker (`squealctl verify`): is anything cached that disagrees with the database?

For a sample (or all) of the demo web tier's rows, read every cache key the web tier would fill for them
from every cluster (through the cluster's router) and compare with what the web tier would cache if it
read the master database now. A cached value that differs is *stale*: an invalidation was lost, or has
not arrived yet. Absent keys are fine (the next read fills them).

Which keys exist and how their values are computed comes from the web tier itself
(`loadtest.webtier.KEY_FAMILIES`), so the checker never drifts from what the web servers cache.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from pymemcache.client.base import Client

import router_config
from loadtest.webtier import KEY_FAMILIES, SqlClient

JSON_FLAG = 64  # the web tier's JsonSerializer client flag


@dataclass(frozen=True)
class StaleKey:
    cluster: str
    key: str
    cached: Any
    expected: Any
    ttl_left: int | None  # seconds until memcached expires it on its own (None: unknown/no expiry)

    def __str__(self) -> str:
        expiry = f"expires in {self.ttl_left}s" if self.ttl_left and self.ttl_left > 0 else "no expiry"
        return f"{self.cluster}: {self.key} is stale ({expiry}): cached {self.cached!r}, database {self.expected!r}"


@dataclass(frozen=True)
class VerifyReport:
    checked: int  # (cluster, key) pairs found cached and compared
    absent: int  # (cluster, key) pairs not cached (nothing to compare)
    stale: tuple[StaleKey, ...]

    @property
    def ok(self) -> bool:
        return not self.stale


def decode_value(value: bytes, flags: int) -> Any:
    if flags != JSON_FLAG:
        return value
    return json.loads(value)


def _ttl_left(client: Client, key: str) -> int | None:
    """Remaining TTL via the meta protocol (`mg K t` → `HD t<seconds>`; -1 means no expiry)."""
    reply = client.raw_command(f"mg {key} t".encode(), b"\r\n")
    for token in reply.split()[1:]:
        if token.startswith(b"t"):
            return int(token[1:])
    return None


def sample_keys(db: SqlClient, sample: int | None, rng: random.Random) -> list[str]:
    """Cache keys of up to `sample` rows per key family (all rows when `sample` is None)."""
    keys: list[str] = []
    for family in KEY_FAMILIES.values():
        rows = family.all_keys(db)
        if sample is not None and len(rows) > sample:
            rows = rng.sample(rows, sample)
        keys.extend(rows)
    return keys


def verify(
    topo: router_config.Topology,
    *,
    database: str = "app",
    sample: int | None = 200,
    keys: list[str] | None = None,
    seed: int = 0,
) -> VerifyReport:
    """Compare every cluster's cached copy of the sampled keys with the master database."""
    db = SqlClient.for_database(topo.master.database, database, role="master")
    try:
        keys = keys if keys is not None else sample_keys(db, sample, random.Random(seed))
        checked = absent = 0
        stale: list[StaleKey] = []
        for cluster in topo.clusters:
            router = cluster.routers[0]
            client = Client((router.host, router.port), connect_timeout=2, timeout=5, serde=KeepFlags())
            try:
                for start in range(0, len(keys), 100):
                    chunk = keys[start : start + 100]
                    found = client.get_many(chunk)
                    absent += len(chunk) - len(found)
                    for key, (value, flags) in found.items():
                        checked += 1
                        cached, expected = decode_value(value, flags), expected_value(db, key)
                        if cached != expected:
                            stale.append(StaleKey(cluster.name, key, cached, expected, _ttl_left(client, key)))
            finally:
                client.close()
        return VerifyReport(checked, absent, tuple(stale))
    finally:
        db.close()


def expected_value(db: SqlClient, key: str) -> Any:
    """What the web tier would cache for `key` if it read the database now."""
    family = KEY_FAMILIES[key.rsplit(":", 1)[0]]
    return family.load(db, key)


class KeepFlags:
    """pymemcache serde that hands back (raw bytes, client flags): the checker decodes by flag itself."""

    def serialize(self, key: str, value: Any) -> tuple[bytes, int]:
        raise TypeError("the consistency checker never writes")

    def deserialize(self, key: str, value: bytes, flags: int) -> tuple[bytes, int]:
        return value, flags
