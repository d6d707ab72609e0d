"""Health view of a cluster's normal and gutter pools, read from the servers' own `stats`.

Used by `squealctl gutter status` and the gutter experiment: which wildcard servers answer, and how much
traffic the gutter absorbs (its hit rate over a short sample).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from monitoring.scrape import scrape_memcached
from router_config import Cluster


@dataclass(frozen=True)
class ServerHealth:
    address: str
    pool: str
    up: bool
    get_hits: float = 0.0
    get_misses: float = 0.0


@dataclass(frozen=True)
class GutterHealth:
    cluster: str
    servers: tuple[ServerHealth, ...]
    gutter_hit_rate: float | None  # over the sample; None when the gutter saw no gets
    gutter_gets_per_second: float

    @property
    def down(self) -> list[str]:
        return [s.address for s in self.servers if not s.up]


def _read(cluster: Cluster, tls: ssl.SSLContext | None) -> list[ServerHealth]:
    out = []
    for pool in cluster.pools:
        for addr in pool.servers:
            try:
                stats = {name: value for name, _, value in scrape_memcached(str(addr), tls=tls)}
            except OSError:
                out.append(ServerHealth(str(addr), pool.name, up=False))
                continue
            out.append(
                ServerHealth(
                    str(addr),
                    pool.name,
                    True,
                    stats.get("memcached_get_hits", 0.0),
                    stats.get("memcached_get_misses", 0.0),
                )
            )
    return out


def gutter_health(
    cluster: Cluster,
    sample_seconds: float = 1.0,
    tls: ssl.SSLContext | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> GutterHealth:
    """Which servers answer, and the gutter's hit rate over `sample_seconds`. `tls`: the servers speak TLS
    (`router_config.tls_context` of the topology's `[tls]`); `sleep` waits out the sample window."""
    gutter = cluster.gutter.name if cluster.gutter else None
    before = {s.address: s for s in _read(cluster, tls)}
    sleep(sample_seconds)
    after = _read(cluster, tls)
    hits = misses = 0.0
    for s in after:
        if s.pool == gutter and s.up and before.get(s.address) and before[s.address].up:
            hits += s.get_hits - before[s.address].get_hits
            misses += s.get_misses - before[s.address].get_misses
    gets = hits + misses
    return GutterHealth(cluster.name, tuple(after), hits / gets if gets else None, gets / sample_seconds)
