"""`BinlogMeter`: how fast each shard a worker owns grows its binlog, one of the two terms of a shard's load.

Runs on its own daemon thread ("pool-binlog-meter"), started and stopped by the worker; the worker's thread reads
its `rate` and tells it which shards to measure (`keep`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

BINLOG_EVERY_S = 5.0  # how often a worker asks each owned shard's copy for its binlog's size (`BinlogMeter`)
BINLOG_TIMEOUT_S = 5.0  # `BinlogMeter`'s connect/read/write timeout: a frozen copy must not hang its thread


class BinlogMeter:
    """How fast each owned shard's binlog grows: every `every` seconds, `SHOW BINARY LOGS` on the copy the worker
    reads (what its reader streams, whether or not the transactions touch tables with rules). `grown[shard]` is
    the bytes added since the first sample (file by file: a rotation adds the new file's size, a purge subtracts
    nothing), `rate[shard]` the bytes/s between the last two samples (over the meter's own interval, so the load's
    once-a-second smoothing sees a steady figure, not a burst every `every` seconds). A copy that does not answer
    (down, or the account lacks BINLOG MONITOR / REPLICATION CLIENT) keeps its last figure; the load then rests on
    rows/s alone; one that stops answering mid-query (frozen, a cut network) fails the sample after
    `BINLOG_TIMEOUT_S`, so the other shards' figures keep coming. Every `BINLOG_EVERY_S` (5 s), not every
    second: a query per owned shard per second is a cost only a pool worker pays (its fixed cost,
    docs/benchmarks.md), and a load smoothed over a minute does not need it."""

    def __init__(
        self, source: Callable[[str], Any], every: float = BINLOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self.every = every
        self.clock = clock
        self.grown: dict[str, int] = {}
        self.rate: dict[str, float] = {}
        self._sampled_at: dict[str, float] = {}
        self._sizes: dict[str, dict[str, int]] = {}
        self._conns: dict[str, Any] = {}
        self._wanted: set[str] = set()
        self._warned: set[str] = set()
        self._stop = threading.Event()

    def keep(self, shards: set[str]) -> None:
        """Measure these shards (the ones this worker runs now); forget the others."""
        self._wanted = set(shards)

    def start(self) -> None:
        threading.Thread(target=self._run, name="pool-binlog-meter", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            wanted = set(self._wanted)
            for shard in sorted(set(self._conns) - wanted):
                self._forget(shard)
            for shard in sorted(set(self._sizes) - wanted):
                self._sizes.pop(shard, None)
                self.grown.pop(shard, None)
                self.rate.pop(shard, None)
                self._sampled_at.pop(shard, None)
            for shard in sorted(wanted):
                try:
                    self.sample(shard)
                except Exception as e:  # noqa: BLE001 - a copy that does not answer: its last figure stays
                    self._forget(shard)
                    if shard not in self._warned:
                        self._warned.add(shard)
                        log.warning(
                            "pool: cannot read shard %s's binlog size (SHOW BINARY LOGS): %s; its load is "
                            "its rows/s alone until it can",
                            shard,
                            e,
                        )
        for shard in list(self._conns):
            self._forget(shard)

    def _forget(self, shard: str) -> None:
        conn = self._conns.pop(shard, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def sample(self, shard: str) -> int:
        conn = self._conns.get(shard)
        if conn is None:
            t = BINLOG_TIMEOUT_S
            conn = self._conns[shard] = self.source(shard).connect(connect_timeout=t, read_timeout=t, write_timeout=t)
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            sizes = {str(row[0]): int(row[1]) for row in cur.fetchall()}
        now = self.clock()
        before = self._sizes.get(shard)
        self._sizes[shard] = sizes
        if before is None:
            self.grown[shard] = 0
        else:
            added = sum(
                max(0, size - before.get(name, 0 if name > max(before, default="") else size))
                for name, size in sizes.items()
            )
            self.grown[shard] = self.grown.get(shard, 0) + added
            elapsed = now - self._sampled_at.get(shard, now)
            if elapsed > 0:
                self.rate[shard] = added / elapsed
        self._sampled_at[shard] = now
        return self.grown[shard]
