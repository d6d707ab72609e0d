"""squeal: the binlog invalidation daemon (the paper's mcsqueal, with Wormhole's reliable delivery).

The pipeline, one module per stage, in the order a row meets it:

    reader        binlog events (MariaDB, GTID, annotate rows) as plain events; owns reconnects
    rules         each row event -> keys as it is read (rule templates over before/after images)
    transactions  events -> committed transactions holding their keys (nothing before the XID/commit)
    pipeline      that loop on a read thread; at commit the /* mcd: */ comment keys, split by destination
    flows         one flow per destination: queue, datamarker position, shedding, catch-up
    batcher       `md <key> q` ... `mn` batches over TCP, failover across routers, backoff; acks
    datamarkers   durable per-flow positions (file store; zkstore: the same on ZooKeeper for a pool)
    pool          a region's shards divided among its workers through ZooKeeper, placed by load (`placement`),
                  fenced per shard; a region of one shard and two workers is what HA mode was
    owner         a pool worker's session lease, start-up and rejoin
    daemon        wires them on the Twisted reactor: one shard's pipeline, a Twisted service
    region        a region's shards' pipelines in one process (a MultiService)
    shell         the process of `squeal run`: the status site, signals, exit code; cli: `squeal run` / `replay`
    healthz       the one client of a daemon's /healthz
"""

from squeal.delivery.flows import Committed, Dispatcher, Flow, flow_names, flows_for_region, split_keys
from squeal.keys.rules import KeyExtractor, RuleError, check_rules, comment_keys, delete_line, encode_key
from squeal.markers.datamarkers import DatamarkerStore, FileDatamarkerStore
from squeal.pool.zookeeper import client_options as zookeeper_client_options
from squeal.process.healthz import fetch_health, probe_health
from squeal.process.metrics import CertExpiry, own_certificates
from squeal.read.gtid import GtidError, format_position, parse_gtid, parse_position
from squeal.read.reader import BinlogReader, DataLoss, ReaderConfigError, Source, check_server, current_position
from squeal.read.transactions import Rows, Transaction, TransactionGrouper
from squeal.shard.daemon import Daemon, source_for

__all__ = [
    "BinlogReader",
    "CertExpiry",
    "Committed",
    "DataLoss",
    "Daemon",
    "DatamarkerStore",
    "Dispatcher",
    "FileDatamarkerStore",
    "Flow",
    "GtidError",
    "KeyExtractor",
    "ReaderConfigError",
    "RuleError",
    "Rows",
    "Source",
    "Transaction",
    "TransactionGrouper",
    "check_rules",
    "check_server",
    "comment_keys",
    "current_position",
    "delete_line",
    "encode_key",
    "fetch_health",
    "flow_names",
    "flows_for_region",
    "format_position",
    "parse_gtid",
    "parse_position",
    "own_certificates",
    "probe_health",
    "source_for",
    "split_keys",
    "zookeeper_client_options",
]
