"""Invalidation-latency prober: commit → key gone, per cluster, in every region.

Each probe (paper 7.3's measurement, done actively):
  1. fill the canary row's key in every cluster of every region (through the cluster's router),
  2. commit an UPDATE of that row on the master database (time taken just before COMMIT),
  3. poll every cluster until the key is gone; the elapsed time is that cluster's invalidation latency.
Replica regions see the change after replication, so their latency includes replication lag.
A key still cached after `deadline` seconds is logged as an error and counted: that is a lost invalidation
or a stalled flow, exactly what operators must hear about.

Sharded topologies (`[shards]`): each probe commits on the next shard's primary in turn (every shard the canary
rule applies to), so every shard's pipeline is measured; its canary rows are ids the web tier's shard map gives
that shard (`Topology.shard_of`), and the prober's series carry a `shard` label. Without [shards] the series
are as they always were (no `shard` label).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import pymysql
from prometheus_client import CollectorRegistry, Counter, Histogram
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheError

from router_config import CANARY_TABLE, Topology, connect_database, tls_context

log = logging.getLogger(__name__)

CANARY_SCHEMA = CANARY_TABLE.split(".")[0]
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class ProberError(RuntimeError):
    pass


@dataclass
class ProbeResult:
    key: str
    latencies: dict[str, float | None] = field(default_factory=dict)  # cluster → seconds (None: deadline passed)
    shard: str = ""  # the shard whose primary committed the canary


class Prober:
    """Runs probes against a live topology. `probe_once()` for tests; `start()` for a background loop."""

    def __init__(
        self,
        topo: Topology,
        registry: CollectorRegistry | None = None,
        interval: float = 1.0,
        deadline: float = 5.0,
        canary_rows: int = 16,
    ) -> None:
        rule = topo.rule_for(CANARY_TABLE)
        if rule is None:
            raise ProberError(
                f"{topo.source}: no invalidation rule for {CANARY_TABLE}; add "
                f'[[rules]] table = "{CANARY_TABLE}" keys = ["squeal:canary:{{id}}"]'
            )
        self.template = rule.keys[0]
        self.topo, self.interval, self.deadline, self.rows = topo, interval, deadline, canary_rows
        self.registry = registry
        self.sharded = topo.sharded
        # the shards probed, in turn (those the canary rule applies to), and each one's canary row ids
        self.shards = [s.name for s in topo.shards if rule.applies_to(s.name)]
        self.canary_ids = {name: self._ids_of(name) for name in self.shards}
        self.master = topo.shard_copy(self.shards[0], topo.master.name)  # the first probed shard's primary
        self.clusters = [(c.region, c.name, str(c.routers[0])) for c in topo.clusters]
        self._clients: dict[str, Client] = {}
        self._turn = 0  # probes so far: the next shard is shards[_turn % len(shards)]
        self._next = dict.fromkeys(self.shards, 0)  # per shard: index of the canary row last probed
        self.last_shard = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        shard = ["shard"] if self.sharded else []
        self.latency = Histogram(
            "squeal_probe_invalidation_seconds",
            "Canary commit to key gone, per cluster (and shard, with [shards])",
            ["region", "cluster", *shard],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.missed = Counter(
            "squeal_probe_deadline_missed_total",
            "Canary keys still cached after the deadline (lost or late invalidations)",
            ["region", "cluster", *shard],
            registry=registry,
        )
        self.failures = Counter(
            "squeal_probe_errors_total",
            "Probes that could not run (database or router down)",
            ["stage", *shard],
            registry=registry,
        )

    def _ids_of(self, shard: str) -> list[int]:
        """`rows` canary ids the shard map gives `shard` (shard i of n: i+1, i+1+n, ...; 1..rows without shards)."""
        names = [s.name for s in self.topo.shards]
        n, first = len(names), names.index(shard) + 1
        return [first + n * k for k in range(self.rows)]

    def _labels(self, *values: str, shard: str) -> tuple[str, ...]:
        return (*values, shard) if self.sharded else values

    # -- set-up ------------------------------------------------------------------------------------

    def _db(self, shard: str | None = None) -> pymysql.connections.Connection:
        """A connection to `shard`'s primary (default: the first probed shard's)."""
        db = self.topo.shard_copy(shard, self.topo.master.name) if shard else self.master
        return connect_database(db, "monitoring", connect_timeout=3)

    def ensure_canary_table(self) -> None:
        """The canary table and this prober's rows on every probed shard's primary."""
        for shard in self.shards:
            with self._db(shard) as conn, conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {CANARY_SCHEMA}")
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {CANARY_TABLE} (id INT PRIMARY KEY, seq BIGINT NOT NULL, "
                    "committed_at DOUBLE NOT NULL)"
                )
                cur.executemany(
                    f"INSERT IGNORE INTO {CANARY_TABLE} VALUES (%s, 0, 0)", [(i,) for i in self.canary_ids[shard]]
                )

    def _client(self, address: str) -> Client:
        client = self._clients.get(address)
        if client is None:
            host, _, port = address.rpartition(":")
            tls = tls_context(self.topo.tls, "monitoring")
            client = Client((host, int(port)), connect_timeout=1, timeout=1, tls_context=tls)
            self._clients[address] = client
        return client

    # -- one probe ---------------------------------------------------------------------------------

    def probe_once(self) -> ProbeResult:
        """One probe on the next shard in turn (its next canary row): commit there, wait for every cluster."""
        shard = self.last_shard = self.shards[self._turn % len(self.shards)]
        self._turn += 1
        self._next[shard] = self._next[shard] % self.rows + 1
        row_id = self.canary_ids[shard][self._next[shard] - 1]
        key = self.template.format(id=row_id)
        result = ProbeResult(key, shard=shard)
        for _, _, address in self.clusters:
            self._client(address).set(key, b"canary", expire=60)
        with self._db(shard) as conn, conn.cursor() as cur:
            conn.begin()
            cur.execute(
                f"UPDATE {CANARY_TABLE} SET seq = seq + 1, committed_at = %s WHERE id = %s", (time.time(), row_id)
            )
            committed = time.monotonic()
            conn.commit()
        pending = {cluster: (region, address) for region, cluster, address in self.clusters}
        while pending:
            now = time.monotonic()
            for cluster, (region, address) in list(pending.items()):
                if self._client(address).get(key) is None:
                    result.latencies[cluster] = now - committed
                    self.latency.labels(*self._labels(region, cluster, shard=shard)).observe(now - committed)
                    del pending[cluster]
                elif now - committed > self.deadline:
                    log.error(
                        "canary key %s%s still cached in cluster %s %.1fs after commit: invalidation lost or "
                        "stalled (check `squealctl status` and squeal's flow backlog)",
                        key,
                        f" (shard {shard})" if self.sharded else "",
                        cluster,
                        now - committed,
                    )
                    self.missed.labels(*self._labels(region, cluster, shard=shard)).inc()
                    result.latencies[cluster] = None
                    del pending[cluster]
            if pending:
                time.sleep(0.0005)
        return result

    # -- background loop ---------------------------------------------------------------------------

    def start(self) -> None:
        self.ensure_canary_table()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        from monitoring.sampled import SampledDeleteChecker

        sampled = SampledDeleteChecker(self.topo, self.registry)
        while not self._stop.is_set():
            try:
                sampled.fetch()
                sampled.check_due()
            except (OSError, MemcacheError, pymysql.MySQLError) as e:
                self.failures.labels(*self._labels("sampled", shard="")).inc()
                log.warning("re-check of sampled deletes failed: %s", e)
            try:
                self.probe_once()
            except (OSError, MemcacheError, pymysql.MySQLError) as e:
                self.failures.labels(*self._labels("probe", shard=self.last_shard)).inc()
                log.warning("probe failed%s: %s", f" on shard {self.last_shard}" if self.sharded else "", e)
                for client in self._clients.values():
                    client.close()
                self._clients.clear()
            self._stop.wait(self.interval)
