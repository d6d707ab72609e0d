"""squeal's Prometheus metrics, one registry per daemon (so tests can run several side by side).

Names start with `squeal_`; per-destination series carry a `flow` label. The invalidation latency is the
contract's: commit timestamp (the GTID event's, 1 s resolution) -> delete acknowledged (`MN` seen).
`squeal_delivery_latency_seconds` is the same end point measured from the moment squeal read the
transaction (sub-millisecond resolution): it shows squeal's own share of the latency. Both count
transactions: a run of transactions acknowledged together (the native reader's `CommittedRun`) is observed
once per transaction, at the run's oldest commit and read time (`observe_times`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from router_config import TlsSettings, cert_expiry_timestamp, certificate_files

log = logging.getLogger(__name__)


def observe_times(histogram: Any, amount: float, times: int) -> None:
    """`times` observations of `amount` in a histogram (a labelled child), at the cost of one.

    prometheus_client has no weighted observe; this does what its `Histogram.observe` does (0.26.0, pinned),
    with `times` for 1. tests/squeal/test_metrics_weighted.py compares it with `times` calls of `observe`.
    """
    if times == 1:
        histogram.observe(amount)
        return
    histogram._raise_if_not_observable()
    histogram._sum.inc(amount * times)
    for bucket, bound in zip(histogram._buckets, histogram._upper_bounds, strict=True):
        if amount <= bound:
            bucket.inc(times)
            break


def add_counts(histogram: Any, counts: Sequence[int], total: float) -> None:
    """Observations counted elsewhere (the native delivery thread: per bucket, not cumulative, +Inf last, and their
    sum) into a labelled histogram child, as `observe_times` does for one value (prometheus_client 0.26.0, pinned;
    tests/squeal/test_metrics_weighted.py compares it with `observe`)."""
    if not counts:
        return
    histogram._raise_if_not_observable()
    histogram._sum.inc(total)
    for bucket, n in zip(histogram._buckets, counts, strict=True):
        if n:
            bucket.inc(n)


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
# Fine below 64, where the median of a live load lies (the paper reports 18 deletes per packet).
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # reader / pipeline
        self.transactions = Counter(
            "squeal_transactions", "Committed transactions read from the binlog", ["reader"], registry=r
        )
        self.rows = Counter(
            "squeal_rows", "Row changes of tables with rules, read from the binlog", ["reader"], registry=r
        )
        self.keys = Counter(
            "squeal_keys", "Keys extracted, by source (rule templates or mcd comments)", ["source"], registry=r
        )
        self.keys_rewritten = Counter(
            "squeal_keys_rewritten",
            "Keys sent in memcached's base64 form (encoding=base64) or as the base64 "
            "of their BLAKE2b digest (encoding=hashed), as the web tier's client does",
            ["encoding"],
            registry=r,
        )
        self.missing_columns = Counter(
            "squeal_rule_missing_column",
            "Row images lacking a column a rule template names (dropped column?)",
            ["table", "column"],
            registry=r,
        )
        self.rule_filtered = Counter(
            "squeal_rule_filtered",
            "Changed rows a rule's filter kept from sending keys: "
            "an UPDATE changing no when_changed column, or no image matching where",
            ["table", "reason"],
            registry=r,
        )
        self.pieces = Counter(
            "squeal_transaction_pieces",
            "Pieces of huge transactions handed to the flows while "
            "still being read (their deletes start before the whole transaction is read)",
            registry=r,
        )
        self.reader_reconnects = Counter(
            "squeal_reader_reconnects",
            "Binlog reconnects (resumed from the last committed GTID)",
            ["reader"],
            registry=r,
        )
        self.reader_connected = Gauge(
            "squeal_reader_connected", "1 while the binlog stream is connected", ["reader"], registry=r
        )
        self.reader_event_time = Gauge(
            "squeal_reader_last_commit_timestamp_seconds",
            "Commit timestamp of the last transaction read",
            ["reader"],
            registry=r,
        )
        self.rolled_back = Counter(
            "squeal_transactions_rolled_back", "Transactions that ended in ROLLBACK (nothing sent)", registry=r
        )
        # flows
        self.backlog = Gauge(
            "squeal_flow_backlog", "Keys queued for a destination, not yet acknowledged", ["flow"], registry=r
        )
        self.lag = Gauge(
            "squeal_flow_lag_seconds",
            "How far the destination is behind the primary's commits (a lower bound): the larger of "
            "now minus the commit time of the oldest unacknowledged transaction and the time since the "
            "source first showed a position the flow has not acknowledged (docs/squeal.md, Lag)",
            ["flow"],
            registry=r,
        )
        self.state = Gauge("squeal_flow_state", "1 for the flow's current state", ["flow", "state"], registry=r)
        self.sheds = Counter(
            "squeal_flow_sheds",
            "Times a flow's backlog passed max_backlog and was dropped "
            "from memory (to be re-read by a catch-up reader)",
            ["flow"],
            registry=r,
        )
        self.catchups = Counter("squeal_flow_catchups", "Catch-up readers started", ["flow"], registry=r)
        self.rejoins = Counter(
            "squeal_flow_rejoins", "Catch-up readers that caught up and rejoined the live stream", ["flow"], registry=r
        )
        self.retries = Counter(
            "squeal_flow_retries",
            "Failed batches (connect error, timeout, SERVER_ERROR), retried with backoff",
            ["flow"],
            registry=r,
        )
        self.reply_errors = Counter(
            "squeal_flow_reply_errors", "Error replies to individual deletes", ["flow", "error"], registry=r
        )
        self.deletes = Counter("squeal_deletes_sent", "Deletes sent (and acknowledged)", ["flow"], registry=r)
        self.writes, self.deletes_per_write = _write_series(r)
        self.latency = Histogram(
            "squeal_invalidation_latency_seconds",
            "Commit timestamp (GTID event, 1 s resolution) to delete acknowledged",
            ["flow"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.delivery_latency = Histogram(
            "squeal_delivery_latency_seconds",
            "Transaction read from the binlog to its deletes acknowledged",
            ["flow"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.checkpoints = Counter("squeal_datamarker_writes", "Datamarkers written", ["flow"], registry=r)
        self.marker_write_errors = Counter(
            "squeal_datamarker_write_errors",
            "Datamarker writes that failed (retried at the next checkpoint)",
            ["flow"],
            registry=r,
        )
        self.marker_age = Gauge(
            "squeal_datamarker_age_seconds",
            "How long the flow's acknowledged position has waited to be written to its "
            "datamarker (0 while the marker is current, however idle the flow)",
            ["flow"],
            registry=r,
        )
        # the source database (squeal/read/source.py)
        self.source_up = Gauge("squeal_source_up", "1 while the last poll of the source database succeeded", registry=r)
        self.source_replication_lag = Gauge(
            "squeal_source_replication_lag_seconds",
            "How far a replica source's data is behind its primary: "
            "Seconds_Behind_Master, or while replication is stalled the last "
            "known value plus the time stalled (0 for a primary)",
            registry=r,
        )
        # changes that need more than deletes (docs/squeal.md "What squeal guarantees")
        self.flushes = Counter(
            "squeal_flushes",
            'flush_all commands acknowledged by a destination (TRUNCATE policy "flush", or binlog data loss)',
            ["flow"],
            registry=r,
        )
        self.bulk_changes = Counter(
            "squeal_bulk_changes",
            "Changes to a ruled table that carry no row images (TRUNCATE, DROP, RENAME, a "
            "statement-logged change), by the rule's on_truncate policy",
            ["table", "statement", "policy"],
            registry=r,
        )
        self.xa_prepared = Gauge(
            "squeal_xa_prepared",
            "XA transactions prepared and not yet decided (their prepare holds the datamarkers back)",
            registry=r,
        )
        self.xa_unknown = Counter(
            "squeal_xa_unknown_decisions",
            "XA COMMITs whose PREPARE squeal never read "
            "(its rows' keys are unknown: prepared before squeal's start position)",
            registry=r,
        )
        self.data_loss = Counter(
            "squeal_data_loss",
            "Times the binlog a reader needed was purged (error 1236), by the on_data_loss policy applied",
            ["policy"],
            registry=r,
        )
        self.halted = Gauge(
            "squeal_halted",
            '1 while delivery is halted after binlog data loss (on_data_loss = "halt"; see docs/runbooks/data-loss.md)',
            registry=r,
        )


def _write_series(r: CollectorRegistry) -> tuple[Counter, Histogram]:
    writes = Counter(
        "squeal_delete_writes",
        "Writes of deletes to a destination (one socket write each; with "
        "[shards], one write carries every shard's batches that are ready)",
        ["flow"],
        registry=r,
    )
    per_write = Histogram(
        "squeal_deletes_per_write", "Deletes packed into one write", ["flow"], buckets=BATCH_BUCKETS, registry=r
    )
    return writes, per_write


class WriteMetrics:
    """The write-level series alone (`squeal_delete_writes`, `squeal_deletes_per_write`): a RegionDaemon's own,
    per destination for every shard at once (each shard's pipeline has the rest in its own `Metrics`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.writes, self.deletes_per_write = _write_series(self.registry)


class CertExpiry:
    """A collector: `squeal_tls_cert_expiry_timestamp_seconds{component, path}`, when each certificate a
    component loads from `[tls]` stops being valid (Unix time), read from the file at every scrape so a renewed
    file shows at once. `component` is the `[tls.<component>]` whose certificate it is, or `ca`. A file that
    cannot be read is left out of the scrape and logged once (the loader checked it existed at start)."""

    def __init__(self, certs: list[tuple[str, str]]) -> None:
        self.certs = certs
        self._reported: set[str] = set()

    def describe(self) -> list[Any]:
        return []  # registering must not read the files

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "squeal_tls_cert_expiry_timestamp_seconds",
            "When each TLS certificate this process loads expires (Unix time)",
            labels=["component", "path"],
        )
        for component, path in self.certs:
            try:
                family.add_metric([component, path], cert_expiry_timestamp(path))
                self._reported.discard(path)
            except (OSError, ValueError) as e:
                if path not in self._reported:
                    self._reported.add(path)
                    log.warning("[tls] certificate of %s cannot be read for its expiry: %s", component, e)
        yield family


def own_certificates(tls: TlsSettings, component: str) -> list[tuple[str, str]]:
    """The certificates `component` loads from `[tls]`: the CA, and its own certificate if it has one."""
    return [(c, p) for c, p in certificate_files(tls) if c in ("ca", component)]
