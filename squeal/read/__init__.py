"""Reading the source: a shard's binlog as committed transactions, and how far behind the source it is.

In data-path order:

    gtid          MariaDB GTID positions as plain data (every position squeal reads, writes or compares)
    reader        stage 1: the binlog as squeal's plain events (python-mysql-replication); reconnects, copy
                  fallback, data loss
    native        stage 1 with the Rust decoder (squeal_native) behind the same interface and reconnect loop
    transactions  stage 2: events -> committed transactions (nothing before the XID/commit)
    source        the source database polled for lag (what it has written, whether it still applies)
"""
