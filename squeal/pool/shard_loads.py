"""`ShardLoads`: each shard a worker runs, measured - rows/s and binlog bytes/s, smoothed, combined into the load
it publishes in its member znode for the controller (`placement.shard_load`) - and `loads_changed`, whether that
publication is out of date.

Runs on the worker's thread (its step, once every `PUBLISH_EVERY_S`); the binlog term comes from `BinlogMeter`'s
thread (`rate`), the rows from the pipelines' counters."""

from __future__ import annotations

import time
from collections.abc import Callable

from squeal.pool import placement
from squeal.pool.binlog_meter import BinlogMeter
from squeal.pool.metrics import PoolMetrics
from squeal.shard.region import RegionDaemon

LOAD_CHANGE = 0.05  # a worker republishes a shard's load when it moved by more than this fraction of itself


def loads_changed(before: dict[str, dict[str, float]], now: dict[str, dict[str, float]]) -> bool:
    """Whether a worker's published shard loads are out of date: a shard came or went, or its load moved by more
    than `LOAD_CHANGE` of itself (0.05 rows/s equivalents at least)."""
    if before.keys() != now.keys():
        return True
    for shard, load in now.items():
        old = before[shard].get("load", 0.0)
        if abs(load.get("load", 0.0) - old) > max(0.05, LOAD_CHANGE * old):
            return True
    return False


class ShardLoads:
    """`loads[shard]`: {"rows_s", "bytes_s", "load"} of each shard measured so far, as the member znode carries
    them; `half_life_s` and `bytes_per_row` are the region's `squeal_placement` settings."""

    def __init__(
        self,
        meter: BinlogMeter,
        metrics: PoolMetrics,
        half_life_s: float,
        bytes_per_row: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.meter = meter
        self.metrics = metrics
        self.half_life_s = half_life_s
        self.bytes_per_row = bytes_per_row
        self.clock = clock
        self.loads: dict[str, dict[str, float]] = {}
        self._rows: dict[str, tuple[float, float]] = {}  # shard -> (rows counted, when)

    def forget(self, shard: str) -> None:
        """The shard was handed on: its figures go with it (a later owner of it measures afresh)."""
        self.loads.pop(shard, None)
        self._rows.pop(shard, None)

    def measure(self, daemon: RegionDaemon) -> None:
        """Each owned shard's rows/s and binlog bytes/s since the last measure, each smoothed (`placement.smooth`,
        the region's `squeal_placement.half_life_s`), combined into its load (`placement.shard_load`)."""
        now = self.clock()
        self.meter.keep(set(daemon.shards))
        for shard, pipeline in list(daemon.shards.items()):
            rows = sum(s.value for m in pipeline.metrics.rows.collect() for s in m.samples if s.name.endswith("_total"))
            before = self._rows.get(shard)
            self._rows[shard] = (rows, now)
            if before is None or now <= before[1]:
                continue
            elapsed = now - before[1]
            previous = self.loads.get(shard, {})
            rows_s = placement.smooth(
                previous.get("rows_s"), max(0.0, (rows - before[0]) / elapsed), elapsed, self.half_life_s
            )
            bytes_s = previous.get("bytes_s", 0.0)
            rate = self.meter.rate.get(shard)
            if rate is not None:  # (None: the binlog's growth is not known yet)
                bytes_s = placement.smooth(
                    previous.get("bytes_s") if "rows_s" in previous else None, max(0.0, rate), elapsed, self.half_life_s
                )
            load = placement.shard_load(rows_s, bytes_s, bytes_per_row=self.bytes_per_row)
            self.loads[shard] = {"rows_s": round(rows_s, 3), "bytes_s": round(bytes_s, 1), "load": round(load, 3)}
            self.metrics.shard_load.labels(shard=shard).set(load)
            self.metrics.shard_rows.labels(shard=shard).set(rows_s)
            self.metrics.shard_bytes.labels(shard=shard).set(bytes_s)
        self.metrics.load.set(sum(v["load"] for s, v in self.loads.items() if s in daemon.shards))
