"""Turn a topology back into TOML, optionally moving every port.

Tests start the example topology on ports that are free right now (`reassign_ports`), so runs
never collide with each other or with services the machine happens to run.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import tomli_w

from router_config.model import Address, Cluster, ColdStart, Pool, PoolPlacement, Region, Topology


def reassign_ports(topo: Topology, allocate: Callable[[], int]) -> Topology:
    """A copy of `topo` where every listening port is replaced by `allocate()`."""

    def addr(a: Address) -> Address:
        return Address(a.host, allocate())

    def addrs(items: tuple[Address, ...]) -> tuple[Address, ...]:
        return tuple(addr(a) for a in items)

    def pool(p: Pool) -> Pool:
        return replace(p, servers=addrs(p.servers))

    def cluster(c: Cluster) -> Cluster:
        return replace(c, routers=addrs(c.routers), pools=tuple(pool(p) for p in c.pools))

    shards = tuple(
        replace(
            sh,
            copies=tuple(replace(d, port=allocate()) for d in sh.copies),
            replicas=tuple(replace(d, port=allocate()) for d in sh.replicas),
        )
        for sh in topo.declared_shards
    )
    shard_copies = {d.name: d for sh in shards for d in sh.copies}

    def region(r: Region) -> Region:
        rp = r.regional_pool
        copies = {d.name: shard_copies.get(d.name) or replace(d, port=allocate()) for d in r.copies}
        return replace(
            r,
            database=copies[r.database.name],
            regional_pool=replace(rp, servers=addrs(rp.servers)) if rp else None,
            clusters=tuple(cluster(c) for c in r.clusters),
            replicas=tuple(copies[d.name] for d in r.replicas),
            squeal_instances=tuple(
                replace(s, database=copies[s.database.name], metrics_port=allocate()) for s in r.squeal_instances
            ),
        )

    base = _free_run(allocate, len(topo.regions))
    zk = topo.zookeeper
    return replace(
        topo,
        declared_shards=shards,
        regions=tuple(region(r) for r in topo.regions),
        squeal=replace(topo.squeal, metrics_port_base=base),
        monitoring=replace(topo.monitoring, port=allocate()),
        zookeeper=replace(zk, servers=addrs(zk.servers), peer_ports=tuple((allocate(), allocate()) for _ in zk.servers))
        if zk
        else None,
    )


def _free_run(allocate: Callable[[], int], n: int) -> int:
    """A port from `allocate` whose next n-1 ports are free too (squeal daemon i serves on base + i)."""
    while True:
        base = allocate()
        if all(can_listen(Address("127.0.0.1", base + i)) for i in range(1, n)):
            return base


def can_listen(address: Address) -> bool:
    """Whether a server could bind `address` now (SO_REUSEADDR, as servers bind: TIME_WAIT is no obstacle)."""
    if address.port > 65535:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address.host, address.port))
        except OSError:
            return False
    return True


def to_document(topo: Topology) -> dict[str, Any]:
    """The TOML document (as plain data) that `router_config.loads` reads back into `topo`."""
    s = topo.squeal
    doc: dict[str, Any] = {
        "squeal": asdict(s),  # every setting, so a round trip through TOML keeps them all
        "monitoring": {
            "host": topo.monitoring.host,
            "port": topo.monitoring.port,
            "probe_interval": topo.monitoring.probe_interval,
            "consistency_sample": topo.monitoring.consistency_sample,
            "consistency_check_after": topo.monitoring.consistency_check_after,
        }
        | ({"consistency_slo": str(topo.monitoring.consistency_slo)} if topo.monitoring.consistency_slo else {}),
        "rules": [
            {"table": r.table, "keys": list(r.keys), "on_truncate": r.on_truncate}
            | ({"codec": r.codec} if r.codec else {})  # for `squealctl verify`
            | ({"when_changed": list(r.when_changed)} if r.when_changed else {})
            | ({"where": r.where.source} if r.where else {})
            | ({"shards": list(r.shards)} if r.shards else {})
            for r in topo.rules
        ],
        "regions": {},
    }
    if topo.zookeeper is not None:
        zk = topo.zookeeper
        doc["zookeeper"] = {
            "servers": [str(a) for a in zk.servers],
            "session_timeout_s": zk.session_timeout_s,
            "root": zk.root,
            "takeover_wait_s": zk.takeover_wait_s,
            "handback_after_s": zk.handback_after_s,
        }
        if zk.peer_ports:
            doc["zookeeper"]["peer_ports"] = [list(p) for p in zk.peer_ports]
        if zk.digest is not None:
            doc["zookeeper"]["digest"] = zk.digest
    if topo.tls is not None:  # absolute paths: the document may be written anywhere
        doc["tls"] = {"require": topo.tls.require} | ({"ca": topo.tls.ca} if topo.tls.ca else {})
        doc["tls"] |= {name: {"cert": ck.cert, "key": ck.key} for name, ck in topo.tls.certs}
    if topo.sharded:  # one [shards.NAME] per shard (a `count` group is written out shard by shard)
        doc["shards"] = {
            sh.name: {"gtid_domain_id": sh.gtid_domain_id, "user": sh.primary.user, "password": sh.primary.password}
            | {d.region: {"host": d.host, "port": d.port, "server_id": d.server_id} for d in sh.copies}
            | (
                {
                    "replicas": {
                        d.name.partition("@")[2]: {
                            "region": d.region,
                            "host": d.host,
                            "port": d.port,
                            "server_id": d.server_id,
                            "replicates_from": d.replicates_from.partition("@")[2],
                        }
                        for d in sh.replicas
                    }
                }
                if sh.replicas
                else {}
            )
            for sh in topo.shards
        }
    for r in topo.regions:
        db = r.database
        body: dict[str, Any] = {"master": r.master}
        if not topo.sharded:
            body["database"] = {
                "role": db.role,
                "host": db.host,
                "port": db.port,
                "server_id": db.server_id,
                "user": db.user,
                "password": db.password,
            }
        body |= {"squeal": {"host": r.squeal_host}, "clusters": {}}
        if r.regional_pool:
            body["regional_pool"] = {
                "servers": [str(a) for a in r.regional_pool.servers],
                "prefixes": list(r.regional_pool.prefixes),
            }
        for c in r.clusters:
            cbody: dict[str, Any] = {"routers": [str(a) for a in c.routers], "pools": {}}
            for p in c.pools:
                pbody: dict[str, Any] = {"kind": p.kind, "servers": [str(a) for a in p.servers]}
                if p.prefixes:
                    pbody["prefixes"] = list(p.prefixes)
                if p.ttl is not None:
                    pbody["ttl"] = p.ttl
                if p.leases is not None:
                    pbody["leases"] = asdict(p.leases)
                cbody["pools"][p.name] = pbody
            if c.cold:
                cbody["cold"] = {"warm_cluster": c.cold.warm_cluster, "exptime": c.cold.exptime}
            body["clusters"][c.name] = cbody
        if r.replicas:
            body["replicas"] = {
                d.name: {
                    "host": d.host,
                    "port": d.port,
                    "server_id": d.server_id,
                    "user": d.user,
                    "password": d.password,
                    "replicates_from": d.replicates_from,
                }
                for d in r.replicas
            }
        if r.squeal_instances:
            body["squeal_instances"] = [
                {"name": s.name, "host": s.host, "metrics_port": s.metrics_port}
                | ({"database": s.prefer} if s.prefer else {} if topo.sharded else {"database": s.database.name})
                for s in r.squeal_instances
            ]
        # (no `squeal_pool`: a region's instances are always a pool, and the key beside none is refused)
        if r.squeal_instances and r.squeal_placement != PoolPlacement():
            body["squeal_placement"] = asdict(r.squeal_placement)
        doc["regions"][r.name] = body
    return doc


def dumps(topo: Topology) -> str:
    """TOML text for `topo`."""
    return tomli_w.dumps(to_document(topo))


def with_cold_cluster(topo: Topology, cluster: str, warm_cluster: str | None, exptime: int = 3600) -> Topology:
    """A copy of `topo` where `cluster` warms up from `warm_cluster` (None: back to normal)."""

    topo.cluster(cluster)  # raises a clear KeyError for an unknown name
    if warm_cluster is not None:
        topo.cluster(warm_cluster)
        if warm_cluster == cluster:
            raise ValueError(f"cluster {cluster} cannot warm up from itself")
    cold = ColdStart(warm_cluster, exptime) if warm_cluster else None
    regions = tuple(
        replace(r, clusters=tuple(replace(c, cold=cold) if c.name == cluster else c for c in r.clusters))
        for r in topo.regions
    )
    return replace(topo, regions=regions)
