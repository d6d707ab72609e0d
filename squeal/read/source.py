"""How far behind is the data? The source database as squeal's lag needs it, polled on a thread of its own.

A flow's queue only knows what squeal has read. When the source stops producing — a replica whose SQL
thread stopped, a stalled relay — nothing is queued and a queue-based lag reads 0 while the region serves
stale data. So a `SourcePoller` asks the source itself, every `interval` seconds, on its own blocking
connection (reconnecting on errors):

* `@@gtid_binlog_pos`: what the source has written. Each new position is remembered with the time the
  poller first saw it (`SourceLag.observe_binlog`). A flow whose acknowledged position does not cover a
  remembered position is at least `now - first seen` behind (`SourceLag.behind`): a lower bound, so an
  idle caught-up flow stays at 0 and a fresh commit after a long quiet spell does not jump to the age of
  the commit before it. A flow that keeps up under load covers each sample within milliseconds.
* For a replica source (`role = "replica"`): `SHOW SLAVE STATUS` (needs the `SLAVE MONITOR` privilege) and
  `@@gtid_slave_pos`. The replica's own data is `Seconds_Behind_Master` behind the primary. That is NULL
  when a replication thread is not running; then (`SourceLag.replication_lag`):
  - IO thread running, SQL thread not, and `Gtid_IO_Pos` (received) not covered by `@@gtid_slave_pos`
    (applied): the replica is stalled with work waiting. Lag = the last known `Seconds_Behind_Master` plus
    the time since the poller first saw it stalled that way.
  - IO thread running and nothing waiting: the replica has applied all it received: 0.
  - IO thread not running (stopped, or `Connecting` to an unreachable primary), or replication not
    configured at all: nobody knows what the primary has written since; the same last known value plus
    time since first seen, so a region cut off from its primary shows as falling behind.
  A flow's source lag is its own binlog lag plus the replication lag (`SourceLag.behind`).

`squeal_source_up` (1 while the last poll succeeded) and `squeal_source_replication_lag_seconds` (0 for a
primary) are the poller's gauges; `snapshot()` is what `/healthz` shows. Nothing here touches flows:
the daemon hands each flow `SourcePoller.behind`, which only reads this module's locked state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import pymysql

from squeal.process.metrics import Metrics
from squeal.read import gtid as g
from squeal.read.reader import Source

log = logging.getLogger(__name__)

Clock = Callable[[], float]


class SourceLag:
    """What the poller has seen of the source, with first-seen times; plain logic, thread-safe."""

    def __init__(self, replica: bool, max_history: int = 4096) -> None:
        self.replica = replica
        self.max_history = max(2, max_history)
        self._lock = threading.Lock()
        # (first seen, binlog position), oldest first; positions only grow, so "covers sample i" implies
        # "covers every sample before i". Samples every flow covers are pruned.
        self._history: deque[tuple[float, g.Position]] = deque()
        self.binlog_pos: g.Position | None = None
        # replica state
        self.io_running: str | None = None
        self.sql_running: str | None = None
        self.seconds_behind_master: int | None = None
        self.gtid_io_pos = ""
        self.gtid_slave_pos = ""
        self.configured = False
        self._last_known = 0.0  # last non-NULL Seconds_Behind_Master (0 until one is seen)
        self._stalled_since: float | None = None  # first seen stalled (see the module doc), else None
        self._observed = False  # replication observed at least once

    # -- the poller's side ------------------------------------------------------------------------------

    def observe_binlog(self, pos: g.Position, now: float) -> None:
        with self._lock:
            self.binlog_pos = dict(pos)
            if self._history and self._history[-1][1] == pos:
                return
            self._history.append((now, dict(pos)))
            if len(self._history) > self.max_history:
                # Thin out: drop every other sample but the oldest. The oldest uncovered sample can only get
                # younger by this, so `behind` stays a lower bound, just coarser for a flow stalled for long.
                kept = list(self._history)
                self._history = deque(kept[:1] + kept[2:-1:2] + kept[-1:])

    def observe_replication(self, status: dict[str, Any] | None, slave_pos: str, now: float) -> None:
        """`status`: the `SHOW SLAVE STATUS` row as a dict (None: replication not configured)."""
        with self._lock:
            self._observed = True
            self.configured = status is not None
            status = status or {}
            self.io_running = status.get("Slave_IO_Running")
            self.sql_running = status.get("Slave_SQL_Running")
            sbm = status.get("Seconds_Behind_Master")
            self.seconds_behind_master = None if sbm is None else int(sbm)
            self.gtid_io_pos = status.get("Gtid_IO_Pos") or ""
            self.gtid_slave_pos = slave_pos or ""
            if sbm is not None:
                self._last_known = float(sbm)
                self._stalled_since = None
                return
            waiting = not g.covers_position(g.parse_position(self.gtid_slave_pos), g.parse_position(self.gtid_io_pos))
            if self.configured and self.io_running == "Yes" and not waiting:
                self._last_known = 0.0  # everything received is applied
                self._stalled_since = None
            elif self._stalled_since is None:
                self._stalled_since = now

    def prune(self, positions: Iterable[g.Position]) -> None:
        """Forget samples that every one of `positions` (the flows' acknowledged positions) covers."""
        positions = list(positions)
        with self._lock:
            h = self._history
            while len(h) > 1 and all(g.covers_position(p, h[0][1]) for p in positions):
                h.popleft()

    # -- readers (any thread) -----------------------------------------------------------------------------

    def replication_lag(self, now: float) -> float:
        """Seconds the source's data is behind the primary (0 for a primary)."""
        with self._lock:
            return self._replication_lag(now)

    def _replication_lag(self, now: float) -> float:
        if not self.replica or not self._observed:
            return 0.0
        if self._stalled_since is not None:
            return self._last_known + max(0.0, now - self._stalled_since)
        return float(self.seconds_behind_master or 0)

    def _binlog_lag(self, acked: g.Position, now: float) -> float:
        """Seconds since the poller first saw a source position that `acked` does not cover (0 if none)."""
        for seen, pos in self._history:
            if not g.covers_position(acked, pos):
                return max(0.0, now - seen)
        return 0.0

    def behind(self, acked: g.Position, now: float) -> float:
        """A flow acknowledged up to `acked`: how far behind the primary's commits is it, at least."""
        with self._lock:
            return self._binlog_lag(acked, now) + self._replication_lag(now)

    def snapshot(self, now: float) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                "binlog_pos": g.format_position(self.binlog_pos) if self.binlog_pos is not None else None,
            }
            if self.replica:
                out["replication_lag"] = round(self._replication_lag(now), 3)
                out["replication"] = {
                    "configured": self.configured,
                    "io_running": self.io_running,
                    "sql_running": self.sql_running,
                    "seconds_behind_master": self.seconds_behind_master,
                    "gtid_io_pos": self.gtid_io_pos,
                    "gtid_slave_pos": self.gtid_slave_pos,
                    "stalled_since": self._stalled_since,
                }
            return out


class SourcePoller:
    """Polls the source every `interval` seconds on a daemon thread; see the module doc.

    `positions()`: the flows' acknowledged positions (read on the poller thread, to prune the history).
    `on_problem(text | None)`: called from the poller thread when the source could not be polled for
    `problem_after` seconds (a message), and again with None once a poll succeeds.
    """

    def __init__(
        self,
        source: Source,
        replica: bool,
        metrics: Metrics | None = None,
        interval: float = 1.0,
        positions: Callable[[], Iterable[g.Position]] = lambda: (),
        on_problem: Callable[[str | None], None] = lambda problem: None,
        problem_after: float = 30.0,
        timeout: float = 5.0,
        clock: Clock = time.time,
    ) -> None:
        self.source = source
        self.replica = replica
        self.interval = interval
        self.positions = positions
        self.on_problem = on_problem
        self.problem_after = problem_after
        self.timeout = timeout
        self.clock = clock
        self.state = SourceLag(replica)
        self.up = False
        self.error: str | None = None
        self.polled_at: float | None = None  # last successful poll (clock time)
        self._failing_since: float | None = None
        self._problem = False
        self._stop = threading.Event()
        self._conn: Any = None
        self.thread: threading.Thread | None = None
        if metrics is not None:
            metrics.source_up.set_function(lambda: int(self.up))
            metrics.source_replication_lag.set_function(lambda: self.state.replication_lag(self.clock()))

    # -- what flows and /healthz read ----------------------------------------------------------------------

    def behind(self, acked: g.Position, now: float | None = None) -> float:
        return self.state.behind(acked, self.clock() if now is None else now)

    def snapshot(self) -> dict[str, Any]:
        out = {
            "up": self.up,
            "role": "replica" if self.replica else "primary",
            "polled_at": self.polled_at,
            "error": self.error,
        }
        out.update(self.state.snapshot(self.clock()))
        return out

    # -- the thread -------------------------------------------------------------------------------------------

    def start(self) -> threading.Thread:
        self.thread = threading.Thread(target=self.run, name="squeal-source-poller", daemon=True)
        self.thread.start()
        return self.thread

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.interval)
        self._close()

    def tick(self) -> bool:
        """One poll; False if it failed (then the next one reconnects)."""
        try:
            self.poll_once()
            return True
        except Exception as e:  # noqa: BLE001 - any failure: reconnect next time, report if it lasts
            self._failed(e)
            return False

    def _connect(self) -> Any:
        # Source.connect() has no read timeout: a hung server would hang this thread (and its reports) forever.
        return self.source.connect(connect_timeout=self.timeout, read_timeout=self.timeout, write_timeout=self.timeout)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                pass

    def poll_once(self) -> None:
        """One poll. Raises on failure."""
        if self._conn is None:
            self._conn = self._connect()
        with self._conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("SELECT @@GLOBAL.gtid_binlog_pos AS binlog_pos, @@GLOBAL.gtid_slave_pos AS slave_pos")
            row = cur.fetchone()
            status = None
            if self.replica:
                cur.execute("SHOW SLAVE STATUS")
                status = cur.fetchone()
        now = self.clock()
        self.state.observe_binlog(g.parse_position(row["binlog_pos"] or ""), now)
        if self.replica:
            self.state.observe_replication(status, row["slave_pos"] or "", now)
        self.state.prune(self.positions())
        if not self.up and self.error is not None:
            log.info("source %s:%d: polled again", self.source.host, self.source.port)
        self.up, self.error, self.polled_at, self._failing_since = True, None, now, None
        if self._problem:
            self._problem = False
            self.on_problem(None)

    def _failed(self, e: Exception) -> None:
        self._close()
        now = self.clock()
        if self.error is None:
            log.warning(
                "source %s:%d: cannot poll (%s); retrying every %.0fs",
                self.source.host,
                self.source.port,
                e,
                self.interval,
            )
        self.up, self.error = False, f"{type(e).__name__}: {e}"
        if self._failing_since is None:
            self._failing_since = self.polled_at if self.polled_at is not None else now
        if not self._problem and now - self._failing_since >= self.problem_after:
            self._problem = True
            self.on_problem(
                f"cannot poll the database {self.source.host}:{self.source.port} for "
                f"{now - self._failing_since:.0f}s: {self.error}"
            )
