"""The consistency inspector: how many nines of committed changes every cache holds consistently, measured
without trusting squeal (issue 35; docs/monitoring.md, "Consistency in nines").

It reads each shard's binlog itself, on its own replica connection to the shard's primary, with the python
reader (the reference decoder: squeal reads with the native one by default, so a decode bug in one is seen by
the other). 1 in `consistency_sample` committed row changes is sampled; the keys its table's rules render
from that row are read in every cluster, through the cluster's routers (a regional pool's keys through each
cluster of its region), `consistency_check_after` seconds, 10 s and 60 s after the inspector read the commit.
Each (key, cluster) read is one check, counted in the window it was made for:

* consistent: absent (the next read fills it), a lease placeholder (a 0-byte item), or a value that agrees
  with the database now, as the rule's codec reads it (`monitoring.verify`'s `ConsistencyChecker`);
* a value that disagrees is read again `RECHECK_S` later: a newer write's invalidation in flight deletes or
  replaces it. Still disagreeing, it is inconsistent, logged once (key, cluster, row, GTID, age, value found)
  and listed on the dashboard - unless the inspector has read a newer change of that key since (a hot key):
  then the copy is the newer change's to judge (`superseded`, not counted for this one);
* a value the codec cannot read, or a cluster whose routers do not answer, is not checked (counted apart).

squeal's acks, datamarkers and metrics are never read: a dropped transaction, a flow that skipped a range or a
shard nobody owns shows as inconsistent keys of that shard. What the clock measures: from when the inspector
read the commit (its own lag behind the primary is `squeal_consistency_read_lag_seconds`).

The arithmetic of the figures is monitoring/nines.py; `squealctl consistency`, the client of the report, is
monitoring/consistency_report.py (both re-exported here).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import ssl
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pymysql
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily

import router_config
from monitoring.consistency_report import below_slo, consistency_main, format_report, parse_since
from monitoring.nines import Tally, nines, summarize
from monitoring.verify import ConsistencyChecker, MetaReader, Verdict, plain_key, router_tls, shard_databases
from squeal import BinlogReader, DataLoss, KeyExtractor, Rows, TransactionGrouper, current_position, source_for

__all__ = [
    "Change",
    "Inspector",
    "Tally",
    "below_slo",
    "consistency_main",
    "format_report",
    "nines",
    "parse_since",
    "summarize",
]

log = logging.getLogger(__name__)

RECHECK_S = 0.2  # a disagreeing copy is read again this much later before it counts as inconsistent
MAX_WAITING = 50_000  # checks waiting at most; a sampled change beyond it is skipped (and counted)
GAUGE_SPAN_S = 600.0  # the nines gauges cover the last this many seconds
RECENT = 50  # inconsistencies kept for the dashboard
CHUNK = 100  # keys per multi-get
ROW_CHANGES = ("insert", "update", "delete")


@dataclass(frozen=True)
class Change:
    """A sampled committed row change: the keys its rules render, where it came from, when it was read."""

    shard: str
    table: str
    gtid: str
    row: dict[str, Any]  # the templated columns of its last image (for the log line)
    keys: tuple[str, ...]
    seen: float  # wall clock when the inspector read the commit


@dataclass(order=True)
class _Check:
    due: float  # monotonic
    seq: int
    change: Change = field(compare=False)
    window: float = field(compare=False)
    cluster: str | None = field(default=None, compare=False)  # a recheck: one cluster and key
    key: str | None = field(default=None, compare=False)


class _NinesCollector:
    """`squeal_consistency_ratio` / `_nines` {region, window} over the last `GAUGE_SPAN_S`, computed at scrape."""

    def __init__(self, inspector: Inspector) -> None:
        self.inspector = inspector

    def collect(self) -> Iterable[GaugeMetricFamily]:
        ratio = GaugeMetricFamily(
            "squeal_consistency_ratio",
            "Share of the inspector's checks (sampled keys x clusters) consistent within the window, over the last "
            "10 minutes, per region",
            labels=["region", "window"],
        )
        nine = GaugeMetricFamily(
            "squeal_consistency_nines",
            "-log10 of the inconsistent share of the inspector's checks within the window, over the last 10 "
            "minutes, per region (+Inf: none inconsistent)",
            labels=["region", "window"],
        )
        for region, doc in self.inspector.report(GAUGE_SPAN_S)["regions"].items():
            for window, f in doc["windows"].items():
                if not f["checked"]:
                    continue
                ratio.add_metric([region, window], f["ratio"])
                nine.add_metric([region, window], math.inf if f["nines"] is None else f["nines"])
        yield ratio
        yield nine


class _ShardTail:
    """One shard's binlog, read on a thread of its own: committed row changes, 1 in N of them sampled."""

    def __init__(self, inspector: Inspector, shard: router_config.Shard) -> None:
        self.inspector = inspector
        self.shard = shard.name
        self.database = shard.primary
        topo = inspector.topo
        self.extractor = KeyExtractor([r for r in topo.rules if r.applies_to(shard.name)])
        self.columns = {t: sorted({c for tpl in ts for c in tpl.columns}) for t, ts in self.extractor.templates.items()}
        self.every = topo.monitoring.consistency_sample
        self.changes = 0  # row changes read
        self.reader: BinlogReader | None = None
        self.error = ""
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"inspector-{self.shard}", daemon=True)

    def _start_position(self) -> dict:
        source = source_for(self.database)
        while not self._stop.is_set():
            try:
                conn = source.connect()
                try:
                    return current_position(conn)
                finally:
                    conn.close()
            except pymysql.err.Error as e:
                self.error = f"cannot read the position of {source}: {e}"
                log.warning("consistency inspector, shard %s: %s (retrying)", self.shard, self.error)
                self._stop.wait(2.0)
        return {}

    def _run(self) -> None:
        start = self._start_position()
        if self._stop.is_set():
            return
        self.error = ""
        reader = self.reader = BinlogReader(
            source_for(self.database), start, self.extractor.tables, name=f"inspector-{self.shard}"
        )
        log.info("consistency inspector: reading shard %s from %s", self.shard, self.database.address)
        grouper = TransactionGrouper()
        for ev in reader:
            if self._stop.is_set():
                break
            if isinstance(ev, DataLoss):  # fell behind a purged binlog: what it missed is not sampled
                self.error = f"binlog gone after {ev.lost_range()}: those changes were not sampled"
                log.error("consistency inspector, shard %s: %s", self.shard, self.error)
                reader.resume_from(ev.resume or ev.requested)
                continue
            txn = grouper.feed(ev)
            if txn is None:
                continue
            reader.commit(txn.gtid)
            if txn.xa == "prepare":
                continue
            self._sample(txn)

    def _sample(self, txn: Any) -> None:
        now = time.time()
        self.inspector.metrics_lag.labels(shard=self.shard).set(max(0.0, now - txn.timestamp))
        for rows in txn.rows:
            if rows.kind not in ROW_CHANGES:
                continue
            step = 2 if rows.kind == "update" else 1  # an update is its before and after images
            for i in range(0, len(rows.images), step):
                self.changes += 1
                sample = self.changes % self.every == 0
                if not sample and not self.inspector.watching:
                    continue
                images = rows.images[i : i + step]
                keys, _ = self.extractor.render(Rows(rows.schema, rows.table, rows.kind, images), {})
                if not keys.images:
                    continue  # a row its rule's filters skip
                self.inspector.changed(keys.images, now)
                if not sample:
                    continue
                columns = self.columns.get((rows.schema, rows.table), [])
                row = {c: images[-1].get(c) for c in columns}
                change = Change(self.shard, f"{rows.schema}.{rows.table}", txn.gtid_text, row, keys.images, now)
                self.inspector.sampled(change)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.reader is not None:
            self.reader.stop()
        self.thread.join(5)


class Inspector:
    """Every shard's tail and the thread that checks the sampled keys when they are due; `report()` the figures."""

    def __init__(self, topo: router_config.Topology, registry: CollectorRegistry | None = None) -> None:
        self.topo = topo
        settings = topo.monitoring
        self.windows = settings.consistency_windows
        self.labels = {w: router_config.window_label(w) for w in self.windows}
        self.slo = settings.consistency_slo
        self.tally = Tally()
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT)
        self._reported: set[tuple[str, str, str]] = set()  # (key, cluster, value found) logged already
        self._waiting: list[_Check] = []
        # Keys with checks waiting (-> until when) and, of those, when a change of them was last read: a copy
        # that disagrees after a newer change of its key is not blamed on the older one (`_superseded`).
        self._watched: dict[str, float] = {}
        self._last_change: dict[str, float] = {}
        self._changes_lock = threading.Lock()
        self._pruned = time.monotonic()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._clients: dict[str, MetaReader] = {}
        self._tls: ssl.SSLContext | None = router_tls(topo)
        self.tails = [_ShardTail(self, s) for s in topo.shards]
        self._checker: ConsistencyChecker | None = None
        self.thread = threading.Thread(target=self._run, name="inspector-checks", daemon=True)
        registry = registry if registry is not None else CollectorRegistry()
        labels = ["region", "cluster", "shard", "window"]
        self.metrics_checks = Counter(
            "squeal_consistency_checks",
            "The inspector's checks: a sampled change's key read in one cluster, at one window after its commit",
            labels,
            registry=registry,
        )
        self.metrics_inconsistent = Counter(
            "squeal_consistency_inconsistent",
            "Checks that found a copy disagreeing with the database (after a re-read RECHECK_S later)",
            labels,
            registry=registry,
        )
        self.metrics_unchecked = Counter(
            "squeal_consistency_unchecked",
            "Checks not made: the cluster's routers or the database did not answer, or the codec cannot read it",
            ["region", "cluster", "reason"],
            registry=registry,
        )
        self.metrics_sampled = Counter(
            "squeal_consistency_sampled", "Committed row changes the inspector sampled", ["shard"], registry=registry
        )
        self.metrics_skipped = Counter(
            "squeal_consistency_skipped",
            f"Sampled changes not checked: over {MAX_WAITING} checks were waiting (raise consistency_sample)",
            ["shard"],
            registry=registry,
        )
        self.metrics_lag = Gauge(
            "squeal_consistency_read_lag_seconds",
            "How far behind its commit the inspector read the shard's last transaction",
            ["shard"],
            registry=registry,
        )
        slo = Gauge(
            "squeal_consistency_slo_nines",
            "The topology's consistency_slo: nines wanted within the window (the alert compares with it)",
            ["window"],
            registry=registry,
        )
        if self.slo is not None:
            slo.labels(window=router_config.window_label(self.slo.within)).set(self.slo.nines)
        registry.register(_NinesCollector(self))

    # -- sampling (the tails' threads) --------------------------------------------------------------------------

    @property
    def watching(self) -> bool:
        """Whether any sampled key waits for a check (then every change's keys matter: `changed`)."""
        return bool(self._watched)

    def changed(self, keys: Iterable[str], seen: float) -> None:
        """A committed change of `keys` was read at `seen` (wall clock): sampled or not."""
        with self._changes_lock:
            for k in keys:
                if k in self._watched:
                    self._last_change[k] = seen

    def _superseded(self, key: str, change: Change) -> bool:
        """A change of `key` was read after `change`: its invalidation may still be in flight, so a disagreeing
        copy is that change's to judge (when it is sampled), not this one's."""
        return self._last_change.get(key, 0.0) > change.seen

    def _prune(self, now: float) -> None:
        with self._changes_lock:
            for k in [k for k, until in self._watched.items() if until < now]:
                del self._watched[k]
                self._last_change.pop(k, None)
        self._pruned = now

    def sampled(self, change: Change) -> None:
        self.metrics_sampled.labels(shard=change.shard).inc()
        now = time.monotonic()
        until = now + max(self.windows) + 5 * RECHECK_S
        with self._changes_lock:
            for k in change.keys:
                self._watched[k] = until
        with self._cond:
            if len(self._waiting) + len(self.windows) > MAX_WAITING:
                self.metrics_skipped.labels(shard=change.shard).inc()
                return
            for w in self.windows:
                heapq.heappush(self._waiting, _Check(now + w, next(self._seq), change, w))
            self._cond.notify()

    # -- checking (one thread) -----------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._stop.is_set():
                    wait = self._waiting[0].due - time.monotonic() if self._waiting else 1.0
                    if self._waiting and wait <= 0:
                        break
                    self._cond.wait(min(wait, 1.0))
                due: list[_Check] = []
                now = time.monotonic()
                while self._waiting and self._waiting[0].due <= now:
                    due.append(heapq.heappop(self._waiting))
            if time.monotonic() - self._pruned > 10:
                self._prune(time.monotonic())
            if due:
                try:
                    self._check(due)
                except Exception:
                    log.exception("consistency inspector: checking %d keys failed", len(due))

    def _check(self, due: list[_Check]) -> None:
        wanted: dict[str, list[tuple[_Check, str]]] = {c.name: [] for c in self.topo.clusters}
        for check in due:
            if check.cluster is not None and check.key is not None:
                wanted[check.cluster].append((check, check.key))
            else:
                for pairs in wanted.values():
                    pairs.extend((check, k) for k in check.change.keys if plain_key(k))
        for cluster in self.topo.clusters:
            pairs = wanted[cluster.name]
            if pairs:
                self._check_cluster(cluster, pairs)

    def _check_cluster(self, cluster: router_config.Cluster, pairs: list[tuple[_Check, str]]) -> None:
        keys = list(dict.fromkeys(k for _, k in pairs))
        try:
            found = self._read(cluster, keys)
        except OSError as e:  # (`_read` dropped the connection)
            self.metrics_unchecked.labels(region=cluster.region, cluster=cluster.name, reason="router").inc(len(pairs))
            log.warning("consistency inspector: cluster %s not checked: %s", cluster.name, e)
            return
        verdicts: dict[str, Verdict] = {}
        for check, key in pairs:
            got = found.get(key)
            if got is None:
                self._count(cluster, check, key, None)
                continue
            value, flags = got
            v = verdicts.get(key)
            if v is None:
                try:
                    v = verdicts[key] = self.checker.judge(key, value, flags)
                except pymysql.err.Error as e:
                    self._checker = None  # connect again next time
                    self.metrics_unchecked.labels(region=cluster.region, cluster=cluster.name, reason="database").inc()
                    log.warning("consistency inspector: the database did not answer: %s", e)
                    continue
            if v.state == "unjudged":
                self.metrics_unchecked.labels(region=cluster.region, cluster=cluster.name, reason="codec").inc()
            elif v.state == "differs" and check.cluster is None:  # a first look: read again a moment later
                with self._cond:
                    heapq.heappush(
                        self._waiting,
                        _Check(
                            time.monotonic() + RECHECK_S, next(self._seq), check.change, check.window, cluster.name, key
                        ),
                    )
                    self._cond.notify()
            elif v.state == "differs" and self._superseded(key, check.change):
                self.metrics_unchecked.labels(region=cluster.region, cluster=cluster.name, reason="superseded").inc()
            else:
                self._count(cluster, check, key, v if v.state == "differs" else None)

    @property
    def checker(self) -> ConsistencyChecker:
        if self._checker is None:
            self._checker = ConsistencyChecker(self.topo, shard_databases(self.topo))
        return self._checker

    def _read(self, cluster: router_config.Cluster, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        reader = self._clients.get(cluster.name)
        if reader is None:
            reader = self._clients[cluster.name] = self._connect(cluster)
        out: dict[str, tuple[bytes, int]] = {}
        try:
            for i in range(0, len(keys), CHUNK):
                out.update(reader.get_many(keys[i : i + CHUNK]))
        except OSError as e:
            self._clients.pop(cluster.name, None)
            reader.close()
            raise OSError(f"router {reader.address} failed mid-read: {e}") from e
        return out

    def _connect(self, cluster: router_config.Cluster) -> MetaReader:
        failures = []
        for router in cluster.routers:
            try:
                return MetaReader(router, self._tls)
            except OSError as e:
                failures.append(f"router {router}: {e}")
        raise OSError("; ".join(failures) or "no routers")

    def _count(self, cluster: router_config.Cluster, check: _Check, key: str, stale: Verdict | None) -> None:
        change, window = check.change, self.labels[check.window]
        labels = {"region": cluster.region, "cluster": cluster.name, "shard": change.shard, "window": window}
        self.metrics_checks.labels(**labels).inc()
        self.tally.add(cluster.region, cluster.name, change.shard, window, stale is not None)
        if stale is None:
            return
        self.metrics_inconsistent.labels(**labels).inc()
        age = time.time() - change.seen
        copy = (key, cluster.name, str(stale.cached))  # one stale copy, whichever sampled changes find it
        if copy not in self._reported:
            self._reported.add(copy)
            if len(self._reported) > 10 * MAX_WAITING:
                self._reported.clear()
            log.warning(
                "inconsistent: %s in cluster %s still holds %s %.1fs after the commit of %s (GTID %s, row %s) "
                "changed it; the database has %s",
                key,
                cluster.name,
                stale.cached,
                age,
                change.table,
                change.gtid,
                change.row,
                stale.expected,
            )
        self.recent.append(
            {
                "at": time.time(),
                "key": key,
                "region": cluster.region,
                "cluster": cluster.name,
                "shard": change.shard,
                "table": change.table,
                "row": {k: str(v) for k, v in change.row.items()},
                "gtid": change.gtid,
                "window": window,
                "age_s": round(age, 3),
                "found": str(stale.cached),
                "expected": str(stale.expected),
            }
        )

    # -- the figures -------------------------------------------------------------------------------------------

    def report(self, since: float = GAUGE_SPAN_S) -> dict[str, Any]:
        """The figures over the last `since` seconds (see `summarize`), the recent inconsistencies, and how each
        shard's reading goes."""
        return {
            "since_s": since,
            "windows": list(self.labels.values()),
            "slo": None
            if self.slo is None
            else {
                "text": str(self.slo),
                "nines": self.slo.nines,
                "window": router_config.window_label(self.slo.within),
            },
            "regions": summarize(self.tally.since(since), self.labels.values()),
            "recent": list(self.recent)[::-1],
            "shards": {
                t.shard: {
                    "rows_read": t.changes,
                    "reading": bool(t.reader and t.reader.connected.is_set()),
                    "error": t.error,
                }
                for t in self.tails
            },
        }

    def start(self) -> Inspector:
        for t in self.tails:
            t.start()
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify()
        for t in self.tails:
            t.stop()
        self.thread.join(5)
        for c in self._clients.values():
            c.close()
