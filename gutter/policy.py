"""Gutter pool policy (paper 3.3): a small idle pool that takes over for failed servers.

Sizing: about 1% of a cluster's memcached servers, at least one. TTL: entries in the gutter expire
quickly (the router caps the TTL of failover sets to the gutter pool's `ttl`), because the gutter is not
invalidated as reliably as the normal pool while a server is down; a short TTL bounds how stale it can be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router_config import Cluster, Topology

GUTTER_FRACTION = 0.01
DEFAULT_TTL = 10  # seconds; the router's failover_exptime for the gutter route


def recommended_gutter_size(cluster_servers: int) -> int:
    """Gutter servers a cluster of `cluster_servers` normal memcached servers should have."""
    if cluster_servers < 0:
        raise ValueError(f"cluster_servers must be >= 0, got {cluster_servers}")
    return max(1, math.ceil(cluster_servers * GUTTER_FRACTION))


def gutter_ttl(requested: int, cap: int = DEFAULT_TTL) -> int:
    """The TTL a set gets when it lands in the gutter: never longer than `cap` (0 = no expiry counts as longer)."""
    if requested <= 0 or requested > cap:
        return cap
    return requested


@dataclass(frozen=True)
class SizingAdvice:
    cluster: str
    normal_servers: int
    gutter_servers: int
    recommended: int

    @property
    def ok(self) -> bool:
        return self.gutter_servers >= self.recommended

    def __str__(self) -> str:
        verdict = "ok" if self.ok else f"too small: add {self.recommended - self.gutter_servers}"
        return (
            f"{self.cluster}: {self.normal_servers} servers, gutter {self.gutter_servers} "
            f"(recommended {self.recommended}) — {verdict}"
        )


def sizing_advice(cluster: Cluster) -> SizingAdvice:
    normal = sum(len(p.servers) for p in cluster.pools if p.kind != "gutter")
    gutter = len(cluster.gutter.servers) if cluster.gutter else 0
    return SizingAdvice(cluster.name, normal, gutter, recommended_gutter_size(normal))


def check_topology(topo: Topology) -> list[SizingAdvice]:
    """Sizing advice for every cluster (callers print the ones that are not `ok`)."""
    return [sizing_advice(c) for c in topo.clusters]
