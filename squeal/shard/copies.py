"""Which copy of a shard a pipeline reads: the topology's copies put to `placement.read_order`, and back.

One place for the choice, for every process that reads a shard — a region's daemon, a pool worker
(`Daemon` asks `read_order` for its shard) — and for the pool's controller, whose moves say which copy their
target reads. The policy itself (and why) is `squeal.pool.placement.read_order`; docs/squeal.md, "Which copy".
"""

from __future__ import annotations

from router_config import Database, Topology
from squeal.pool import placement


def placement_shard(topology: Topology, shard: str, region: str, load: float = 1.0) -> placement.Shard:
    """`shard` as placement sees it from `region`: the region's copy and the shard's extra copies there."""
    own = topology.shard_copy(shard, region)
    extra = topology.shard(shard).replicas_in(region) if topology.sharded else ()
    copies = (placement.Copy(own.name, own.host, region_copy=True), *(placement.Copy(d.name, d.host) for d in extra))
    return placement.Shard(shard, load, copies)


def placement_worker(
    topology: Topology,
    region: str,
    instance: str | None = None,
    *,
    alive: bool = True,
    draining: bool = False,
    healthy: bool = True,
    settled: bool = True,
    restarted: bool = False,
) -> placement.Worker:
    """A squeal process of `region` as placement sees it: a pool worker with the copy it names and its rank (its
    place in `squeal_instances`: the first is preferred), or the region's single daemon (`instance` None) on the
    region's squeal host."""
    if instance is None:
        return placement.Worker(region, alive, draining, region, {}, topology.region(region).squeal_host)
    inst = topology.instance(instance)
    prefer = {s.name: f"{s.name}@{inst.prefer}" for s in topology.shards} if inst.prefer else {}
    rank = [i.name for i in topology.region(region).squeal_instances].index(inst.name)
    return placement.Worker(
        inst.name,
        alive,
        draining,
        region,
        prefer,
        inst.host,
        healthy=healthy,
        rank=rank,
        settled=settled,
        restarted=restarted,
    )


def read_order(
    topology: Topology, shard: str, region: str, instance: str | None = None
) -> tuple[tuple[Database, str], ...]:
    """The copies of `shard` that `instance` of `region` (None: the region's single daemon) reads, in the order it
    tries them, each with why; the region's own copy is last. Without [shards], the region's database alone (a pool
    worker's topology has its own copy there, `squeal.pool.worker.own_copy_topology`; another worker takes over
    when it is lost)."""
    if not topology.sharded:
        return ((topology.shard_copy(shard, region), "the region's database"),)
    by_name = {d.name: d for d in (topology.shard_copy(shard, region), *topology.shard(shard).replicas_in(region))}
    order = placement.read_order(placement_worker(topology, region, instance), placement_shard(topology, shard, region))
    return tuple((by_name[name], why) for name, why in order)
