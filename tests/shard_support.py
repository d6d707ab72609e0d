"""A sharded topology for the web tier, verify and the prober: one MariaDB primary per shard (each in its own GTID
domain, as the loader insists), one region, clusters whose "routers" are memcacheds (or real routers) given by the
test. Shared by tests/client, tests/monitoring (`shard_primaries` in tests/conftest.py starts the databases once
per session: use a database name of your own)."""

from __future__ import annotations

from ops.harness import MariaDB, free_port
from tests.topologies import webtier_rules

SHARDS = ("s0", "s1", "s2")
DOMAINS = {"s0": 31, "s1": 32, "s2": 33}
SERVER_IDS = {"s0": 71, "s1": 72, "s2": 73}


def sharded_topology_text(
    dbs: dict[str, MariaDB],
    database: str,
    clusters: dict[str, str],
    *,
    wildcard: dict[str, str] | None = None,
    canary: bool = False,
) -> str:
    """Shards s0..s2 (one primary each, region east), the demo rules for `database` (with the web tier's codec)
    and one cluster per `clusters` entry (name -> router address; its wildcard pool: `wildcard[name]`, else a
    placeholder address, for a memcached standing in for the router)."""
    shards = "".join(
        f"[shards.{name}]\ngtid_domain_id = {DOMAINS[name]}\n"
        f'east = {{ host = "{db.host}", port = {db.port}, server_id = {db.server_id} }}\n'
        for name, db in dbs.items()
    )
    rules = webtier_rules(database, canary=canary)
    wildcard = wildcard or {}
    cluster_text = "".join(
        f'[regions.east.clusters.{name}]\nrouters = ["{router}"]\n'
        f'pools.wildcard = {{ kind = "wildcard", servers = ["{wildcard.get(name) or f"127.0.0.1:{free_port()}"}"] }}\n'
        for name, router in clusters.items()
    )
    return (
        f'[squeal]\ndatamarker_dir = "var/dm"\nmetrics_port_base = {free_port()}\n'
        + shards
        + rules
        + "[regions.east]\nmaster = true\n"
        + cluster_text
    )
