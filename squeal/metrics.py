"""squeal's Prometheus metrics, one registry per daemon (so tests can run several side by side).

Names start with `squeal_`; per-destination series carry a `flow` label. The invalidation latency is the
contract's: commit timestamp (the GTID event's, 1 s resolution) -> delete acknowledged (`MN` seen).
`squeal_delivery_latency_seconds` is the same end point measured from the moment squeal read the
transaction (sub-millisecond resolution): it shows squeal's own share of the latency.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # reader / pipeline
        self.transactions = Counter("squeal_transactions", "Committed transactions read from the binlog",
                                    ["reader"], registry=r)
        self.rows = Counter("squeal_rows", "Row changes of tables with rules, read from the binlog", ["reader"],
                            registry=r)
        self.keys = Counter("squeal_keys", "Keys extracted, by source (rule templates or mcd comments)",
                            ["source"], registry=r)
        self.keys_rewritten = Counter("squeal_keys_rewritten",
                                      "Keys sent in memcached's base64 form (encoding=base64) or as the base64 "
                                      "of their BLAKE2b digest (encoding=hashed), as the web tier's client does",
                                      ["encoding"], registry=r)
        self.missing_columns = Counter("squeal_rule_missing_column",
                                       "Row images lacking a column a rule template names (dropped column?)",
                                       ["table", "column"], registry=r)
        self.reader_reconnects = Counter("squeal_reader_reconnects", "Binlog reconnects (resumed from the "
                                         "last committed GTID)", ["reader"], registry=r)
        self.reader_connected = Gauge("squeal_reader_connected", "1 while the binlog stream is connected",
                                      ["reader"], registry=r)
        self.reader_event_time = Gauge("squeal_reader_last_commit_timestamp_seconds",
                                       "Commit timestamp of the last transaction read", ["reader"], registry=r)
        self.rolled_back = Counter("squeal_transactions_rolled_back",
                                   "Transactions that ended in ROLLBACK (nothing sent)", registry=r)
        # flows
        self.backlog = Gauge("squeal_flow_backlog", "Keys queued for a destination, not yet acknowledged",
                             ["flow"], registry=r)
        self.lag = Gauge("squeal_flow_lag_seconds",
                         "Now minus the commit time of the oldest transaction the destination has not "
                         "acknowledged (0 when caught up)", ["flow"], registry=r)
        self.state = Gauge("squeal_flow_state", "1 for the flow's current state", ["flow", "state"], registry=r)
        self.sheds = Counter("squeal_flow_sheds", "Times a flow's backlog passed max_backlog and was dropped "
                             "from memory (to be re-read by a catch-up reader)", ["flow"], registry=r)
        self.catchups = Counter("squeal_flow_catchups", "Catch-up readers started", ["flow"], registry=r)
        self.rejoins = Counter("squeal_flow_rejoins", "Catch-up readers that caught up and rejoined the live "
                               "stream", ["flow"], registry=r)
        self.retries = Counter("squeal_flow_retries", "Failed batches (connect error, timeout, SERVER_ERROR), "
                               "retried with backoff", ["flow"], registry=r)
        self.reply_errors = Counter("squeal_flow_reply_errors", "Error replies to individual deletes",
                                    ["flow", "error"], registry=r)
        self.deletes = Counter("squeal_deletes_sent", "Deletes sent (and acknowledged)", ["flow"], registry=r)
        self.writes = Counter("squeal_delete_writes", "Batches of deletes written (one socket write each)",
                              ["flow"], registry=r)
        self.deletes_per_write = Histogram("squeal_deletes_per_write", "Deletes packed into one write",
                                           ["flow"], buckets=BATCH_BUCKETS, registry=r)
        self.latency = Histogram("squeal_invalidation_latency_seconds",
                                 "Commit timestamp (GTID event, 1 s resolution) to delete acknowledged",
                                 ["flow"], buckets=LATENCY_BUCKETS, registry=r)
        self.delivery_latency = Histogram("squeal_delivery_latency_seconds",
                                          "Transaction read from the binlog to its deletes acknowledged",
                                          ["flow"], buckets=LATENCY_BUCKETS, registry=r)
        self.checkpoints = Counter("squeal_datamarker_writes", "Datamarkers written", ["flow"], registry=r)
