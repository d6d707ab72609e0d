"""`PoolMetrics`: the `squeal_pool_*` series a worker serves on /metrics (its own and, while it is the controller,
the controller's; docs/metrics.md), and `DaemonMetrics`, which serves its shards' pipelines' series beside them.

Set from every thread of the worker (prometheus_client's metrics are thread-safe); collected on the reactor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from squeal.shard.region import RegionDaemon

PAUSE_BUCKETS = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60, 120, 300)  # seconds; the members publish every second


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.owned = Gauge("squeal_pool_shard_owned", "1 for each shard this worker owns", ["shard"], registry=r)
        self.shard_load = Gauge(
            "squeal_pool_shard_load",
            "A shard's smoothed load (rows/s equivalents) as its owner measures it",
            ["shard"],
            registry=r,
        )
        self.shard_rows = Gauge(
            "squeal_pool_shard_rows_per_second",
            "A shard's smoothed rows/s (changed rows of tables with rules) as its owner measures it",
            ["shard"],
            registry=r,
        )
        self.shard_bytes = Gauge(
            "squeal_pool_shard_binlog_bytes_per_second",
            "A shard's smoothed binlog growth "
            "(bytes/s of its copy's binlog, what its reader streams) as its owner measures it",
            ["shard"],
            registry=r,
        )
        self.load = Gauge("squeal_pool_worker_load", "The sum of this worker's shards' loads", registry=r)
        self.controller = Gauge("squeal_pool_controller", "1 while this worker is the pool's controller", registry=r)
        self.owner = Gauge(
            "squeal_pool_owner", "(controller) 1 for each shard's assigned worker", ["shard", "worker"], registry=r
        )
        self.moves = Counter(
            "squeal_pool_moves", "(controller) shards moved by plans, by reason", ["reason"], registry=r
        )
        self.starts = Counter("squeal_pool_shard_starts", "Shard pipelines this worker started", registry=r)
        self.start_seconds = Histogram(
            "squeal_pool_shard_start_seconds",
            "From taking a shard (its owner znode "
            "created) to its pipeline started: the new owner's part of a move's pause",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.stops = Counter("squeal_pool_shard_stops", "Shard pipelines this worker stopped and handed on", registry=r)
        self.zk_connected = Gauge(
            "squeal_pool_zookeeper_connected", "1 while the ZooKeeper session is connected", registry=r
        )
        self.lease_lapses = Counter(
            "squeal_pool_lease_lapses",
            "Times this worker's lease ran out waiting for an answer from ZooKeeper (sending paused, shards kept)",
            registry=r,
        )
        self.lease_resumptions = Counter(
            "squeal_pool_lease_resumptions",
            "Lapsed leases ZooKeeper confirmed: sending resumed, every shard in the same epoch",
            registry=r,
        )
        self.copy_wait = Gauge(
            "squeal_pool_takeover_wait_seconds",
            "How long the shard's last start waited for this worker's copy to apply its datamarkers (while "
            "waiting: so far)",
            ["shard"],
            registry=r,
        )
        self.marker_write = Histogram(
            "squeal_pool_marker_write_seconds",
            "Datamarker writes to ZooKeeper (a compare-and-set multi-operation per shard)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=r,
        )
        self.healthy = Gauge(
            "squeal_pool_worker_healthy",
            "1 while this worker's own copy answers (0: the controller places no shard on it)",
            registry=r,
        )
        self.unowned = Gauge(
            "squeal_pool_shard_unowned_seconds",
            "(controller) How long the shard has run on no "
            "worker (0 while it runs on one), from the workers' published shards",
            ["shard"],
            registry=r,
        )
        self.pauses = Histogram(
            "squeal_pool_unowned_seconds",
            "(controller) Each stretch a shard ran on no worker, "
            "observed when it runs again: a move's or a takeover's pause",
            buckets=PAUSE_BUCKETS,
            registry=r,
        )


class DaemonMetrics:
    """The worker's `RegionDaemon`'s registry (its shards' pipelines) served from the worker's registry."""

    def __init__(self, daemon: RegionDaemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Any]:
        yield from self.daemon.registry.collect()
