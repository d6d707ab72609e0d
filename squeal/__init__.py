"""squeal: the binlog invalidation daemon (the paper's mcsqueal, with Wormhole's reliable delivery).

One folder per part of the data path, in the order a row meets it (each folder's docstring lists its modules):

    read/      the source: binlog events (MariaDB, GTID, annotate rows) -> committed transactions; owns
               reconnects (reader, or the Rust extension: native); gtid positions; the source's lag (source)
    keys/      transactions -> memcache keys on the read thread: rules, bulk (changes without row images), and
               pipeline, that loop handing `Committed` transactions to the reactor
    delivery/  one flow per destination (queue, position, shedding, catch-up) and the batched `md <key> q` ...
               `mn` deletes over TCP or TLS, failover across routers, acks; the 1-in-N delete sampler
    markers/   durable per-flow positions (a file per flow; zkstore: ZooKeeper for a pool), a shard's
               checkpoints, replay
    shard/     wires them on the Twisted reactor: one shard's pipeline (daemon, its data-loss policy, the copy
               it reads), and a region's shards in one process (region)
    pool/      a region's shards divided among its workers through ZooKeeper, placed by load (`placement`),
               fenced per shard (`owner`: the session lease); a region of one shard and two workers is what HA
               mode was
    process/   the process of `squeal run`: the status site, signals, exit code (shell); /metrics; the one
               client of a daemon's /healthz
    cli        `squeal run` / `squeal replay` (the `squeal` command's entry point)
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
