"""What a topology runs, where, on which ports and with which TLS: the one plan both renderers of a topology read.

`squealctl up` (ops/local/) starts every process of the plan on this machine; `squealctl render systemd`
(ops/systemd/) writes a unit for each process of the plan on one host (MariaDB aside: it runs under Debian's
own service) and the monitoring server's list of everything. Each renderer still owns its own layout — command
lines, state directories, where a router serves /metrics — but neither decides again which processes exist,
what they are called, where they listen or which certificate they serve.

The plan is in start order: ZooKeeper (its JVMs are slow, so it starts first), MariaDB (each chain primary
first, then every copy after the copy it replicates from), memcached, routers, squeal (a pooled region's
workers, else its single daemon), monitoring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import router_config
from router_config import Address, Database, Topology

KINDS = ("zookeeper", "mariadb", "memcached", "router", "squeal", "monitoring")
TLS_SERVERS = frozenset(router_config.TLS_SERVERS)  # the kinds that serve a certificate under [tls]


@dataclass(frozen=True)
class ServerTLS:
    """The certificate a server serves its topology port with under `[tls]` (`[tls.<kind>]`), the CA that
    signs its peers' and, for MariaDB, whether plaintext is refused (`require = true`)."""

    cert: str
    key: str
    ca: str
    require: bool


@dataclass(frozen=True)
class Process:
    """One process of the topology. `name`, `role`, `region`, `cluster`, `pool`, `instance` and `shard` are what
    `squealctl status` lists and monitoring's components.json records; the rest is what starting it needs."""

    kind: str  # one of KINDS (what `up --without` takes)
    role: str  # the kind, but MariaDB's is mariadb-primary or mariadb-replica
    name: str  # router/east-a/0, mariadb/east/users-0, squeal/east/east-1 (`component_name`)
    region: str
    address: Address  # its topology port (ZooKeeper: the client port; squeal: /metrics and /healthz)
    cluster: str | None = None
    pool: str | None = None
    instance: str | None = None  # a pool's worker; a MariaDB extra copy's name
    shard: str | None = None  # a MariaDB copy of a declared shard
    index: int = 0  # its place in its pool's or cluster's list
    tls: ServerTLS | None = None  # with [tls]: what it serves its topology port with (None: plaintext)
    peer_ports: tuple[int, ...] = ()  # ZooKeeper: its quorum and election ports
    # ZooKeeper: its myid and the ensemble (empty: standalone); MariaDB: its server_id
    server_id: int = 0
    peers: tuple[tuple[int, str, int, int], ...] = ()
    # MariaDB: the copy, the chain of servers it belongs to (a shard's name, the implicit one's too) and the name
    # of the process it replicates from (None: a primary, which also gets the demo schema)
    database: Database | None = None
    chain: str = ""
    source: str | None = None
    metrics_port: int | None = None  # a router's /metrics port, when the caller chose one (`router_metrics`)

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port it listens on that the topology names."""
        return (self.address.port, *self.peer_ports)

    @property
    def metrics(self) -> str | None:
        """host:port serving its Prometheus /metrics (a router's only once chosen; MariaDB and memcached none)."""
        if self.kind in ("squeal", "monitoring"):
            return str(self.address)
        if self.kind == "router" and self.metrics_port is not None:
            return f"{self.address.host}:{self.metrics_port}"
        return None


def component_name(
    role: str,
    region: str,
    cluster: str | None,
    pool: str | None,
    index: int = 0,
    instance: str | None = None,
    shard: str | None = None,
) -> str:
    """`router/east-a/0`, `memcached/east-a/wildcard/1`, `memcached/east/regional/0`, `mariadb/east`,
    `squeal/east`, `monitoring`, `demo` (index: the server's place in its pool's or cluster's list). Topologies
    with a worker pool add `zookeeper/1` (index: the server's id), `mariadb/east/east-r1` (a region's extra
    replica) and `squeal/east/east-1` (one worker); sharded ones `mariadb/east/users-0` (a shard's copy) and
    `mariadb/east/users-0/east-b` (its extra copy `[shards.users.replicas.east-b]`)."""
    if role == "zookeeper":
        return f"zookeeper/{index}"
    if role == "router":
        return f"router/{cluster}/{index}"
    if role == "memcached":
        return f"memcached/{cluster or region}/{pool}/{index}"
    if role in ("mariadb-primary", "mariadb-replica"):
        return "/".join(["mariadb", region, *(part for part in (shard, instance) if part)])
    if role == "squeal":
        return f"squeal/{region}/{instance}" if instance else f"squeal/{region}"
    return role


def plan(
    topo: Topology,
    *,
    host: str | None = None,
    without: frozenset[str] = frozenset(),
    certificates: bool = True,
    router_metrics: Callable[[Address], int] | None = None,
) -> list[Process]:
    """The processes of `topo` in start order: those on `host` (None: every host), except the kinds in `without`.

    With `[tls]` each server's certificate is looked up only for the kinds selected (a TopologyError names a
    missing `[tls.<kind>]`), so a host without routers needs no router certificate; `certificates=False` skips
    them (a list of what runs, e.g. for monitoring). `router_metrics` picks each router's /metrics port."""
    every = [
        *_zookeepers(topo),
        *_databases(topo),
        *_memcached(topo),
        *_routers(topo, router_metrics),
        *_squeal(topo),
        _monitoring(topo),
    ]
    chosen = [p for p in every if p.kind not in without and (host is None or p.address.host == host)]
    if topo.tls is None or not certificates:
        return chosen
    tls = {kind: server_tls(topo, kind) for kind in dict.fromkeys(p.kind for p in chosen) if kind in TLS_SERVERS}
    return [replace(p, tls=tls[p.kind]) if p.kind in tls else p for p in chosen]


def server_tls(topo: Topology, kind: str) -> ServerTLS | None:
    """What a server of `kind` serves under the topology's `[tls]` (None without it); a TopologyError naming the
    missing key (`tls.router`, `tls.ca`) when the topology lacks it."""
    if topo.tls is None:
        return None
    mine = router_config.server_certificate(topo, kind)
    assert topo.tls.ca is not None  # server_certificate checked it
    return ServerTLS(mine.cert, mine.key, topo.tls.ca, topo.tls.require)


def _zookeepers(topo: Topology) -> list[Process]:
    """The `[zookeeper]` ensemble (recorded under the master region, as `squealctl up` always has)."""
    zk = topo.zookeeper
    if zk is None:
        return []
    peers = zk.peers()
    return [
        Process(
            "zookeeper",
            "zookeeper",
            component_name("zookeeper", topo.master.name, None, None, server_id),
            topo.master.name,
            zk.servers[server_id - 1],
            index=server_id,
            peer_ports=(quorum, election),
            server_id=server_id,
            peers=peers if len(peers) > 1 else (),
        )
        for server_id, _, quorum, election in peers
    ]


def _databases(topo: Topology) -> list[Process]:
    """Every MariaDB server, chain by chain (a shard's, or the implicit shard's: the regions' databases and their
    replicas): the primary, its copy in every other region, then the extra copies, each after its source."""
    out: list[Process] = []
    for shard in topo.shards:
        shard_name = None if shard.implicit else shard.name
        primary = ""
        by_copy: dict[str, str] = {}  # copy name -> its process name
        for db in sorted(shard.copies, key=lambda d: d.role != "primary"):
            role = f"mariadb-{db.role}"
            name = component_name(role, db.region, None, None, shard=shard_name)
            out.append(_database(db, role, name, db.region, shard.name, primary or None, shard=shard_name))
            primary = primary or name
            by_copy[db.name] = name
        # Extra copies: a shard's `[shards.NAME.replicas.R]`, or (no [shards]) the regions' `[regions.R.replicas]`.
        extras = [(d.region, d) for d in shard.replicas] if not shard.implicit else []
        extras += [(r.name, d) for r in topo.regions for d in r.replicas] if shard.implicit else []
        while extras:  # in an order where each one's source runs (the loader refused loops)
            region, db = next((r, d) for r, d in extras if _source(topo, r, d) in by_copy)
            extras.remove((region, db))
            instance = db.name.partition("@")[2] if not shard.implicit else db.name
            name = component_name("mariadb-replica", region, None, None, instance=instance, shard=shard_name)
            source = by_copy[_source(topo, region, db)]
            out.append(_database(db, "mariadb-replica", name, region, shard.name, source, shard_name, instance))
            by_copy[db.name] = name
    return out


def _source(topo: Topology, region: str, db: Database) -> str:
    """The copy an extra copy replicates from (a region's replica without `replicates_from`: the region's own)."""
    return db.replicates_from or topo.region(region).database.name


def _database(
    db: Database,
    role: str,
    name: str,
    region: str,
    chain: str,
    source: str | None,
    shard: str | None = None,
    instance: str | None = None,
) -> Process:
    return Process(
        "mariadb",
        role,
        name,
        region,
        db.address,
        instance=instance,
        shard=shard,
        server_id=db.server_id,
        database=db,
        chain=chain,
        source=source,
    )


def _memcached(topo: Topology) -> list[Process]:
    """Every memcached: a region's regional pool, then each of its clusters' pools."""
    out: list[Process] = []

    def add(region: str, cluster: str | None, pool: str, servers: tuple[Address, ...]) -> None:
        for i, addr in enumerate(servers):
            name = component_name("memcached", region, cluster, pool, i)
            out.append(Process("memcached", "memcached", name, region, addr, cluster=cluster, pool=pool, index=i))

    for region in topo.regions:
        if region.regional_pool:
            add(region.name, None, "regional", region.regional_pool.servers)
        for cluster in region.clusters:
            for pool in cluster.pools:
                add(region.name, cluster.name, pool.name, pool.servers)
    return out


def _routers(topo: Topology, metrics: Callable[[Address], int] | None) -> list[Process]:
    """Every cluster's routers, each serving the cluster's config (router_config.cluster_config)."""
    return [
        Process(
            "router",
            "router",
            component_name("router", cluster.region, cluster.name, None, i),
            cluster.region,
            addr,
            cluster=cluster.name,
            index=i,
            metrics_port=metrics(addr) if metrics else None,
        )
        for cluster in topo.clusters
        for i, addr in enumerate(cluster.routers)
    ]


def _squeal(topo: Topology) -> list[Process]:
    """A pooled region's workers (`squeal run --instance`), else the region's single daemon (`--region`)."""
    out: list[Process] = []
    for endpoint in topo.squeal_daemons():
        instance = endpoint.instance.name if endpoint.instance else None
        name = component_name("squeal", endpoint.region, None, None, instance=instance)
        out.append(Process("squeal", "squeal", name, endpoint.region, endpoint.address, instance=instance))
    return out


def _monitoring(topo: Topology) -> Process:
    m = topo.monitoring
    return Process("monitoring", "monitoring", "monitoring", topo.master.name, Address(m.host, m.port))
