"""Re-check a sample of the deletes squeal really sent (the paper's passive measurement, 7.3).

Each squeal daemon keeps 1 in N acknowledged deletes (`GET /sampled-deletes`). Some seconds after a
delete was acknowledged, this checker reads that key from the flow's cluster (through its router): it must
be absent, or hold what the web tier would cache from the database now (a web server may refill it after
the delete). Anything else is a stale copy that survived its invalidation: logged as an error and counted.
Whether a refilled value agrees with the database is `monitoring.verify`'s judgement (key families from the
topology's rules, values through each rule's codec); keys no rule or codec covers are only checked when absent.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry, Counter

import router_config
from monitoring.verify import ConsistencyChecker, MetaReader, plain_key, shard_databases
from router_config import Topology, tls_context

log = logging.getLogger(__name__)


class SampledDeleteChecker:
    def __init__(
        self,
        topo: Topology,
        registry: CollectorRegistry | None = None,
        recheck_after: float = 2.0,
        database: str = "app",
    ) -> None:
        self.topo, self.recheck_after, self.database = topo, recheck_after, database
        # Every daemon: a region's single one, or each pool worker (only owners have samples; a worker owning
        # nothing answers an empty list, and after a failover the new owner's samples come from its own address).
        self.daemons = {d.name: (d.region, str(d.address)) for d in topo.squeal_daemons()}
        self.since = {name: time.time() for name in self.daemons}
        self.pending: list[tuple[str, dict[str, Any]]] = []  # (region, sample)
        self._clients: dict[str, MetaReader] = {}
        self._judge: ConsistencyChecker | None = None
        self.checked = Counter(
            "squeal_probe_sampled_deletes_checked",
            "Sampled squeal deletes re-checked later",
            ["region", "flow"],
            registry=registry,
        )
        self.stale = Counter(
            "squeal_probe_sampled_deletes_stale",
            "Sampled deletes whose key later held a value the database disagrees with",
            ["region", "flow"],
            registry=registry,
        )

    def _router(self, region: str, flow: str) -> str:
        clusters = self.topo.region(region).clusters
        cluster = next((c for c in clusters if c.name == flow), clusters[0])  # "regional": any router of the region
        return str(cluster.routers[0])

    def _get(self, address: str, key: str) -> tuple[bytes, int] | None:
        """(value, flags) of `key` through the router at `address`, read without taking a lease (`MetaReader`)."""
        reader = self._clients.get(address)
        if reader is None:
            host, _, port = address.rpartition(":")
            tls = tls_context(self.topo.tls, "monitoring")
            reader = self._clients[address] = MetaReader(router_config.Address(host, int(port)), tls, timeout=2)
        try:
            return reader.get_many([key]).get(key)
        except OSError:
            self._clients.pop(address, None)
            reader.close()
            raise

    def fetch(self) -> int:
        """Collect new samples from every daemon; returns how many arrived."""
        new = 0
        for name, (region, address) in self.daemons.items():
            url = f"http://{address}/sampled-deletes?since={self.since[name]}"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    samples = json.loads(resp.read())
            except OSError as e:
                log.debug("sampled deletes of %s unavailable: %s", name, e)
                continue
            for sample in samples:
                self.pending.append((region, sample))
                self.since[name] = max(self.since[name], sample["acked_at"])
                new += 1
        return new

    def check_due(self, now: float | None = None) -> list[str]:
        """Re-check samples acknowledged at least `recheck_after` ago; returns descriptions of stale ones."""
        now = time.time() if now is None else now
        due = [(r, s) for r, s in self.pending if now - s["acked_at"] >= self.recheck_after]
        self.pending = [(r, s) for r, s in self.pending if now - s["acked_at"] < self.recheck_after]
        problems = []
        for region, sample in due:
            key, flow = sample["key"], sample["flow"]
            if not plain_key(key):  # sent base64 or hashed: not read here
                continue
            got = self._get(self._router(region, flow), key)
            self.checked.labels(region, flow).inc()
            if got is None:
                continue
            if self._judge is None:
                self._judge = ConsistencyChecker(self.topo, shard_databases(self.topo), database=self.database)
            verdict = self._judge.judge(key, *got)
            if verdict.state != "differs":
                continue  # agrees, a lease placeholder, or refilled with values no rule's codec can recompute
            self.stale.labels(region, flow).inc()
            problem = (
                f"{flow}: {key} still holds {verdict.cached!r} {now - sample['acked_at']:.1f}s after squeal's "
                f"delete was acknowledged; the database has {verdict.expected!r}"
            )
            log.error("stale copy survived invalidation: %s", problem)
            problems.append(problem)
        return problems
