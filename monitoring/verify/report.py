"""What `verify` found: stale keys, clusters it could not check, and the exit code."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

EXIT_CLEAN, EXIT_STALE, EXIT_CANNOT_CHECK, EXIT_PARTIAL = 0, 1, 2, 3

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
