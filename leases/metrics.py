"""Counters of the web-tier read path, as Prometheus metrics and as plain numbers for tests.

The Prometheus counters are process-wide (one registry entry per name) and labelled by `cache`, the
name a `LeaseCache` was given, so several caches in one process stay apart. `ClientStats` holds the
same counts per `LeaseCache` instance, readable without a scrape.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

from prometheus_client import Counter

_PROM: dict[str, Counter] = {
    "hits": Counter("squeal_client_hits", "Reads answered by memcache with a fresh value", ["cache"]),
    "misses": Counter("squeal_client_misses", "Reads that found no usable value in memcache", ["cache"]),
    "lease_wins": Counter("squeal_client_lease_wins", "Misses that won the lease and ran the loader", ["cache"]),
    "waits": Counter("squeal_client_lease_waits", "Times a reader lost the lease (Z) and waited", ["cache"]),
    "wait_exhausted": Counter(
        "squeal_client_lease_wait_exhausted",
        "Readers that waited their whole budget and read the database without filling",
        ["cache"],
    ),
    "stale_served": Counter("squeal_client_stale_served", "Stale values (X) returned to stale_ok readers", ["cache"]),
    "fills": Counter("squeal_client_fills", "Values written back to memcache after a miss", ["cache"]),
    "fills_refused": Counter(
        "squeal_client_fills_refused",
        "Lease fills refused because the key was deleted or invalidated meanwhile (no stale set)",
        ["cache"],
    ),
    "loads": Counter("squeal_client_loads", "Loader (database) calls made by the read path", ["cache"]),
    "errors": Counter(
        "squeal_client_errors", "memcache requests that failed (server down, timeout); reads fell back", ["cache"]
    ),
    "marker_sets": Counter("squeal_client_remote_marker_sets", "Remote markers written before a write", ["cache"]),
    "master_reads": Counter(
        "squeal_client_master_reads",
        "Misses read from the master database because a remote marker was present",
        ["cache"],
    ),
    "replica_reads": Counter("squeal_client_replica_reads", "Misses read from the local (replica) database", ["cache"]),
}


@dataclass
class ClientStats:
    """Plain, thread-safe counts for one cache (tests read these directly)."""

    hits: int = 0
    misses: int = 0
    lease_wins: int = 0
    waits: int = 0
    wait_exhausted: int = 0
    stale_served: int = 0
    fills: int = 0
    fills_refused: int = 0
    loads: int = 0
    errors: int = 0
    marker_sets: int = 0
    master_reads: int = 0
    replica_reads: int = 0
    name: str = "default"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def incr(self, counter: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + n)
        _PROM[counter].labels(cache=self.name).inc(n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name in _PROM}
