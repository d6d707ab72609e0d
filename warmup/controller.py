"""Cold-cluster warm-up (paper 4.3): let a new cluster read its misses from a warm one until it fills.

`start` marks the cluster cold in an overlay kept beside the deployment (`<state>/warmup.json`), regenerates
that cluster's router config (a WarmUpRoute: misses in cold are read from warm and added to cold) and writes
it where the routers watch it, so they reload without dropping connections. `status` compares the cold
cluster's hit rate with the warm one's over a short sample. `finish` turns the route off again once the cold
cluster's hit rate reaches the target share of the warm one's (or when forced).
The topology file itself is never edited: it stays the operator's source of truth.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import router_config
from monitoring.scrape import scrape_memcached

DEFAULT_TARGET = 0.9  # finish when the cold cluster reaches 90% of the warm cluster's hit rate


class WarmupError(RuntimeError):
    pass


@dataclass(frozen=True)
class WarmupStatus:
    cluster: str
    warm_cluster: str
    cold_hit_rate: float | None
    warm_hit_rate: float | None

    @property
    def progress(self) -> float | None:
        """Cold hit rate as a share of warm's (capped at 1); None until both clusters served gets."""
        if self.cold_hit_rate is None or not self.warm_hit_rate:
            return None
        return min(1.0, self.cold_hit_rate / self.warm_hit_rate)

    def bar(self, width: int = 30) -> str:
        p = self.progress
        if p is None:
            return f"{self.cluster}: no gets in the sample yet (is traffic reaching both clusters?)"
        filled = round(p * width)
        return (
            f"{self.cluster} [{'#' * filled}{'.' * (width - filled)}] {p:4.0%} of {self.warm_cluster}'s hit rate "
            f"(cold {self.cold_hit_rate:.2f}, warm {self.warm_hit_rate:.2f})"
        )


class WarmupController:
    """Warm-up of clusters in the deployment whose `squealctl` state lives in `state_dir`."""

    def __init__(
        self,
        state_dir: str | Path,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`sleep` waits out a hit-rate sample window and `clock` stamps when a warm-up started: a test passes
        its own pair and drives time by hand."""
        self.state_dir = Path(state_dir)
        self._sleep = sleep
        self._clock = clock
        self.overlay_file = self.state_dir / "warmup.json"
        components = self.state_dir / "components.json"
        if not components.exists():
            raise WarmupError(f"no deployment in {self.state_dir} (run `squealctl up` first)")
        self.topology_path = Path(json.loads(components.read_text())["topology"])

    # -- overlay ---------------------------------------------------------------------------------

    def overlay(self) -> dict[str, dict]:
        """cluster → {"warm": name, "exptime": seconds, "started": unix time}"""
        return json.loads(self.overlay_file.read_text()) if self.overlay_file.exists() else {}

    def _save(self, overlay: dict[str, dict]) -> None:
        tmp = self.overlay_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(overlay, indent=2))
        os.replace(tmp, self.overlay_file)

    def topology(self) -> router_config.Topology:
        """The topology file with every cluster in the overlay marked cold."""
        topo = router_config.load(self.topology_path)
        for cluster, entry in self.overlay().items():
            topo = router_config.with_cold_cluster(topo, cluster, entry["warm"], entry["exptime"])
        return topo

    def _write_router_config(self, topo: router_config.Topology, cluster: str) -> Path:
        path = self.state_dir / "routers" / f"{cluster}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(router_config.render(router_config.cluster_config(topo, cluster)))
        os.replace(tmp, path)  # atomic: a router never reads half a file
        return path

    # -- commands --------------------------------------------------------------------------------

    def start(self, cluster: str, warm_cluster: str | None = None, exptime: int = 3600) -> Path:
        """Turn the warm-up route on for `cluster` (warm side: another cluster of its region by default)."""
        topo = router_config.load(self.topology_path)
        cold = self._cluster(topo, cluster)
        if warm_cluster is None:
            peers = [c.name for c in topo.region(cold.region).clusters if c.name != cluster]
            if not peers:
                raise WarmupError(f"cluster {cluster} has no other cluster in region {cold.region}; name --warm")
            warm_cluster = peers[0]
        self._cluster(topo, warm_cluster)
        if warm_cluster in self.overlay():
            raise WarmupError(f"{warm_cluster} is itself warming up; pick a warm cluster")
        overlay = self.overlay()
        overlay[cluster] = {"warm": warm_cluster, "exptime": exptime, "started": self._clock()}
        self._save(overlay)
        return self._write_router_config(self.topology(), cluster)

    def status(self, cluster: str, sample_seconds: float = 2.0) -> WarmupStatus:
        entry = self.overlay().get(cluster)
        if entry is None:
            raise WarmupError(f"cluster {cluster} is not warming up (`squealctl warmup start {cluster}` first)")
        topo = self.topology()
        cold, warm = self._cluster(topo, cluster), self._cluster(topo, entry["warm"])
        tls = router_config.tls_context(topo.tls, "monitoring")
        before = {c.name: _hits_misses(c, tls) for c in (cold, warm)}
        self._sleep(sample_seconds)
        after = {c.name: _hits_misses(c, tls) for c in (cold, warm)}

        def rate(name: str) -> float | None:
            hits = after[name][0] - before[name][0]
            gets = hits + after[name][1] - before[name][1]
            return hits / gets if gets > 0 else None

        return WarmupStatus(cluster, warm.name, rate(cold.name), rate(warm.name))

    def finish(
        self, cluster: str, target: float = DEFAULT_TARGET, force: bool = False, sample_seconds: float = 2.0
    ) -> WarmupStatus | None:
        """Turn the warm-up route off once the cold cluster is warm enough (or `force`)."""
        status = None
        if not force:
            status = self.status(cluster, sample_seconds)
            if status.progress is None or status.progress < target:
                raise WarmupError(
                    f"{cluster} is not warm yet: {status.bar()} — target {target:.0%}; wait, or use --force"
                )
        overlay = self.overlay()
        overlay.pop(cluster, None)
        self._save(overlay)
        self._write_router_config(self.topology(), cluster)
        return status

    @staticmethod
    def _cluster(topo: router_config.Topology, name: str) -> router_config.Cluster:
        try:
            return topo.cluster(name)
        except KeyError as e:
            raise WarmupError(str(e).strip("'\"")) from e


def _hits_misses(cluster: router_config.Cluster, tls: ssl.SSLContext | None) -> tuple[float, float]:
    """Summed get hits and misses of the cluster's wildcard pool servers (unreachable servers count 0); `tls`:
    they speak TLS (the topology's `[tls]`)."""
    hits = misses = 0.0
    for addr in cluster.wildcard.servers:
        try:
            stats = {name: value for name, _, value in scrape_memcached(str(addr), tls=tls)}
        except OSError:
            continue
        hits += stats.get("memcached_get_hits", 0.0)
        misses += stats.get("memcached_get_misses", 0.0)
    return hits, misses
