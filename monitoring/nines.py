"""Consistency in nines: the consistency inspector's counts and the figures made of them (docs/monitoring.md,
"Consistency in nines").

`Tally` counts the inspector's checks and inconsistencies by minute, region, cluster, shard and window;
`summarize` turns a span of them into figures, each one `nines`. Pure arithmetic: the inspector
(monitoring/inspector.py) feeds it, its report, gauges, the dashboard and `squealctl consistency` read it.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

RETENTION_S = 24 * 3600  # how far back `report(since)` can look (minute buckets)


def nines(checked: int, inconsistent: int) -> dict[str, Any]:
    """One figure: counts, the consistent share and its nines (-log10 of the inconsistent share). With nothing
    inconsistent the nines are unbounded (`nines` None); `nines_at_least` is what the sample size can show."""
    out: dict[str, Any] = {"checked": checked, "inconsistent": inconsistent, "ratio": None, "nines": None}
    if checked:
        out["ratio"] = (checked - inconsistent) / checked
        out["nines"] = -math.log10(inconsistent / checked) if inconsistent else None
        out["nines_at_least"] = math.log10(checked)
    return out


class Tally:
    """Checks and inconsistencies by minute, region, cluster, shard and window (thread-safe, `RETENTION_S`)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str, str, str, str], list[int]] = collections.defaultdict(lambda: [0, 0])

    def add(self, region: str, cluster: str, shard: str, window: str, inconsistent: bool) -> None:
        minute = int(self.clock() // 60)
        with self._lock:
            c = self._counts[(minute, region, cluster, shard, window)]
            c[0] += 1
            c[1] += inconsistent
            if len(self._counts) % 512 == 0:
                oldest = minute - RETENTION_S // 60
                for k in [k for k in self._counts if k[0] < oldest]:
                    del self._counts[k]

    def since(self, seconds: float) -> list[tuple[str, str, str, str, int, int]]:
        """(region, cluster, shard, window, checked, inconsistent) over the minutes that overlap the last
        `seconds` (at minute resolution: a minute that began before counts whole)."""
        first = int((self.clock() - seconds) // 60)
        with self._lock:
            rows = [(k, v) for k, v in self._counts.items() if k[0] >= first]
        out: dict[tuple[str, str, str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
        for (_, region, cluster, shard, window), (checked, bad) in rows:
            o = out[(region, cluster, shard, window)]
            o[0] += checked
            o[1] += bad
        return [(*k, v[0], v[1]) for k, v in sorted(out.items())]


def summarize(rows: Iterable[tuple[str, str, str, str, int, int]], windows: Iterable[str]) -> dict[str, Any]:
    """{region: {"windows": {w: figure}, "clusters": {c: {w: figure}}, "shards": {s: {w: figure}}}}: every
    window of every region, cluster and shard present, 0 checks where nothing was checked."""
    names = list(windows)
    sums: dict[tuple[str, str, str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    regions: dict[str, tuple[set[str], set[str]]] = {}
    for region, cluster, shard, window, checked, bad in rows:
        clusters, shards = regions.setdefault(region, (set(), set()))
        clusters.add(cluster)
        shards.add(shard)
        for scope in (("", ""), (cluster, ""), ("", shard)):
            s = sums[(region, *scope, window)]
            s[0] += checked
            s[1] += bad

    def figures(region: str, cluster: str, shard: str) -> dict[str, Any]:
        return {w: nines(*sums.get((region, cluster, shard, w), (0, 0))) for w in names}

    return {
        region: {
            "windows": figures(region, "", ""),
            "clusters": {c: figures(region, c, "") for c in sorted(clusters)},
            "shards": {s: figures(region, "", s) for s in sorted(shards)},
        }
        for region, (clusters, shards) in sorted(regions.items())
    }
