"""Render one mcrouter-dialect JSON config per frontend cluster.

The output is valid for real mcrouter and is what `squeal-router` loads. Shape of a cluster's tree:

    PrefixSelectorRoute
      policies:  app/replicated pool prefixes -> that pool; regional prefixes -> the region's pool
      wildcard:  FailoverWithExptimeRoute(normal=wildcard pool, failover=gutter pool)   [if a gutter]
                 wrapped in WarmUpRoute(cold=..., warm=warm cluster's wildcard) [if the cluster is cold]
                 wrapped in TransparentLeaseRoute [if the pool has `leases`; app pools too]

With `[tls]` every pool says `"security_mech": "tls"` (mcrouter's pool field): memcached's topology ports
speak TLS only (`-Z`), and the router verifies each server against the CA it is started with (`--pem-ca-path`).

Replicated pools: sets and deletes go to every replica (AllSyncRoute); a read goes to one replica
through a LoadBalancerRoute, failing over to the others. squeal-router chooses that replica by the
load it measures (the key's own replica unless measurably busier or slower than the key's second
one, docs/router.md); a real mcrouter, whose memcached servers report no load, hashes the key (Ch3).
"""

from __future__ import annotations

import json
from typing import Any

from router_config.model import Cluster, Leases, Pool, Topology

# Every route handle type this emitter may produce; the router must implement each (tested).
EMITTED_HANDLES = frozenset(
    {
        "PoolRoute",
        "PrefixSelectorRoute",
        "OperationSelectorRoute",
        "AllSyncRoute",
        "LoadBalancerRoute",
        "FailoverWithExptimeRoute",
        "WarmUpRoute",
        "TransparentLeaseRoute",
    }
)

REGIONAL_POOL = "regional"
# How long a replicated pool's router trusts a replica's measured latency (LoadBalancerRoute `load_ttl_ms`).
REPLICA_LOAD_TTL_MS = 1000
# Operations that change data: on a replicated pool they must reach every replica.
_WRITE_OPS = ("set", "add", "replace", "append", "prepend", "cas", "delete", "incr", "decr", "touch")


def _servers(pool_servers: tuple) -> list[str]:
    return [str(a) for a in pool_servers]


def replicated_route(pool: Pool) -> dict[str, Any]:
    """A replicated pool's route: writes to every replica, each read to one (by load)."""
    replicas = f"Pool|{pool.name}"  # one destination per server, in order
    reads = {
        "type": "LoadBalancerRoute",
        "children": replicas,
        "failover_count": len(pool.servers),
        # a replica found slow is read again (to measure it) once a second, not every 100 ms (the
        # default): ~1 read a second per router waits on a slow replica, and one that recovers is
        # back within a second
        "load_ttl_ms": REPLICA_LOAD_TTL_MS,
    }
    return {
        "type": "OperationSelectorRoute",
        "operation_policies": {op: {"type": "AllSyncRoute", "children": replicas} for op in _WRITE_OPS},
        "default_policy": reads,
    }


def with_leases(route: Any, leases: Leases | None) -> Any:
    """`route` behind squeal-router's TransparentLeaseRoute when the pool asks for leases (`Pool.leases`)."""
    if leases is None:
        return route
    out = {
        "type": "TransparentLeaseRoute",
        "target": route,
        "lease_ttl": leases.ttl,
        "lease_wait_ms": leases.wait_ms,
        "lease_retries": leases.retries,
        "max_tokens": leases.max_tokens,
    }
    if leases.stale_ttl:
        out["stale_ttl"] = leases.stale_ttl
    return out


def cluster_config(topo: Topology, cluster_name: str) -> dict[str, Any]:
    """The mcrouter JSON config (as a dict) for every router of `cluster_name`."""
    cluster = topo.cluster(cluster_name)
    region = topo.region(cluster.region)
    pools: dict[str, Any] = {p.name: {"servers": _servers(p.servers)} for p in cluster.pools}
    policies: dict[str, Any] = {}
    for p in cluster.pools:
        if p.kind == "app":
            for prefix in p.prefixes:
                policies[prefix] = with_leases(f"PoolRoute|{p.name}", p.leases)
        elif p.kind == "replicated":
            route = replicated_route(p)
            for prefix in p.prefixes:
                policies[prefix] = route
    if region.regional_pool is not None:
        pools[REGIONAL_POOL] = {"servers": _servers(region.regional_pool.servers)}
        for prefix in region.regional_pool.prefixes:
            policies[prefix] = f"PoolRoute|{REGIONAL_POOL}"

    wildcard: Any = f"PoolRoute|{cluster.wildcard.name}"
    if cluster.gutter is not None:
        wildcard = {
            "type": "FailoverWithExptimeRoute",
            "normal": wildcard,
            "failover": f"PoolRoute|{cluster.gutter.name}",
            "failover_exptime": cluster.gutter.ttl,
        }
    if cluster.cold is not None:
        warm: Cluster = topo.cluster(cluster.cold.warm_cluster)
        warm_pool = f"warm__{warm.name}"
        pools[warm_pool] = {"servers": _servers(warm.wildcard.servers)}
        wildcard = {
            "type": "WarmUpRoute",
            "cold": wildcard,
            "warm": f"PoolRoute|{warm_pool}",
            "exptime": cluster.cold.exptime,
        }
    wildcard = with_leases(wildcard, cluster.wildcard.leases)  # outermost: a fill after failover is guarded too
    route = wildcard
    if policies:
        route = {"type": "PrefixSelectorRoute", "policies": policies, "wildcard": wildcard}
    if topo.tls is not None:
        pools = {name: body | {"security_mech": "tls"} for name, body in pools.items()}
    return {"pools": pools, "route": route}


def all_cluster_configs(topo: Topology) -> dict[str, dict[str, Any]]:
    """Every cluster's router config, keyed by cluster name."""
    return {c.name: cluster_config(topo, c.name) for c in topo.clusters}


def render(config: dict[str, Any]) -> str:
    """Stable JSON text (sorted keys) so generated files diff cleanly."""
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def handle_types(node: Any) -> set[str]:
    """All route handle type names used anywhere in a config tree (objects and `Type|rest` strings)."""
    found: set[str] = set()
    if isinstance(node, str):
        if "|" in node:
            head = node.split("|", 1)[0]
            if head != "Pool":
                found.add(head)
    elif isinstance(node, dict):
        if isinstance(node.get("type"), str):
            found.add(node["type"])
        for key, value in node.items():
            if key != "pools":
                found |= handle_types(value)
    elif isinstance(node, list):
        for item in node:
            found |= handle_types(item)
    return found
