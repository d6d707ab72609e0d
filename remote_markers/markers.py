"""Remote markers: read-your-writes in a non-master region whose replica lags (paper section 5).

Write from a non-master region (`write_with_marker`):
  1. set the marker ``rmk:<k>`` in the region's regional pool (through the router, the ``rmk:`` prefix
     routes there; without a router, `markers` is a client on the regional pool itself);
  2. run the write on the MASTER database with ``/* mcd:<k>,rmk:<k> */`` in the statement, so each
     region's squeal deletes both keys once the write has reached that region's database;
  3. delete ``<k>`` in the local cluster.
Read (`read_through`): on a miss, the lease winner checks ``rmk:<k>``: present → read the master
database (the replica may not have the write yet), absent → read the local replica. The fill still
goes through the lease, so a squeal delete that lands meanwhile refuses it.

In the master region the replica *is* the master: no markers, writes go to the local database with the
keys embedded, and the local delete gives the writer read-after-write.

Known limits (as in the paper): concurrent writes to one key can delete a marker another in-flight write
still needs; an evicted or expired marker (`marker_ttl`) re-opens the stale window; if the regional
pool is down, writes proceed without a marker (counted and logged) and reads go to the master, since
"no answer" must not be read as "no marker".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from leases import LeaseCache, check_key
from remote_markers.sql import SqlClient

log = logging.getLogger(__name__)

T = TypeVar("T")

MARKER_PREFIX = "rmk:"
DEFAULT_MARKER_TTL = 300  # a safety net only: squeal deletes the marker once replication catches up


def marker_key(key: str) -> str:
    """The remote marker of `key` (lives in the regional pool)."""
    return MARKER_PREFIX + key


def mcd_comment(keys: Iterable[str]) -> str:
    """The SQL comment squeal reads from the binlog's annotate-rows event: ``/* mcd:k1,k2 */``."""
    keys = list(keys)
    for k in keys:
        check_key(k)
        if "," in k or "*/" in k:
            raise ValueError(f"key {k!r} cannot be embedded in an mcd comment (contains ',' or '*/')")
    return f"/* mcd:{','.join(keys)} */"


class RemoteMarkers:
    """The write protocol and read path of one region's web servers.

    cache: the local cluster (a `LeaseCache`); markers: where ``rmk:`` keys live (defaults to `cache`,
    right when `cache` talks to the cluster's router); master/local: the master and this region's
    database. `enabled=False` skips markers (reads always use the local replica): the comparison case.
    """

    def __init__(
        self,
        cache: LeaseCache,
        *,
        master: SqlClient,
        local: SqlClient,
        is_master_region: bool,
        markers: LeaseCache | None = None,
        enabled: bool = True,
        marker_ttl: int = DEFAULT_MARKER_TTL,
    ) -> None:
        self.cache = cache
        self.markers = markers or cache
        self.master = master
        self.local = local
        self.is_master_region = is_master_region
        self.enabled = enabled
        self.marker_ttl = marker_ttl

    @property
    def uses_markers(self) -> bool:
        return self.enabled and not self.is_master_region

    def write_with_marker(self, keys: Iterable[str], sql: str, args: Any = None) -> tuple[int, int]:
        """Run one write statement for the keys it affects; returns (rowcount, lastrowid).

        Raises what the master database raises (the write did not happen, or its outcome is unknown);
        memcache failures are counted and logged, never raised.
        """
        keys = list(dict.fromkeys(keys))
        embedded = list(keys)
        if self.uses_markers:
            for k in keys:
                mk = marker_key(k)
                if self.markers.set(mk, 1, self.marker_ttl):
                    self.cache.stats.incr("marker_sets")
                else:
                    log.warning("remote marker %s not set; a read before replication may see old data", mk)
                embedded.append(mk)
        comment = mcd_comment(embedded)
        if args is not None:
            comment = comment.replace("%", "%%")  # PyMySQL formats the statement with `%`
        result = self.master.execute(f"{comment} {sql}", args)
        for k in keys:
            self.cache.delete(k)
        return result

    def mark_and_delete(self, keys: Iterable[str]) -> None:
        """For keys known only after the write (an AUTO_INCREMENT id): set their markers, then delete them
        locally. A reader that filled from the lagging replica before this (say, "no such row") loses its
        value to the delete, and later misses go to the master. squeal cannot learn these markers from the
        statement, so they end by `marker_ttl`; until then a miss on them costs a master read."""
        keys = list(dict.fromkeys(keys))
        if self.uses_markers:
            for k in keys:
                if self.markers.set(marker_key(k), 1, self.marker_ttl):
                    self.cache.stats.incr("marker_sets")
        for k in keys:
            self.cache.delete(k)

    def has_marker(self, key: str) -> bool | None:
        """Whether ``rmk:<key>`` exists; None if the regional pool could not be asked."""
        return self.markers.exists(marker_key(key))

    def reads_master(self, key: str) -> bool:
        """Whether a miss on `key` must be read at the master (a marker says the replica may be behind, or
        the regional pool could not say). One decision per miss, however many databases the read then asks:
        a sharded web tier reading a key from every shard reads all their masters or all their local copies."""
        if not self.uses_markers:
            if not self.is_master_region:
                self.cache.stats.incr("replica_reads")
            return False
        present = self.has_marker(key)
        if present is False:
            self.cache.stats.incr("replica_reads")
            return False
        self.cache.stats.incr("master_reads")
        return True

    def database_for(self, key: str) -> SqlClient:
        """Where a miss on `key` must be read: the master if a marker says the replica may be behind."""
        return self.master if self.reads_master(key) else self.local

    def read_through(self, key: str, query: Callable[[SqlClient], T], ttl: int, *, stale_ok: bool = False) -> T:
        """The cached value of `key`; on a miss `query(db)` against the database `database_for` picks."""
        return self.cache.get_or_fill(key, lambda: query(self.database_for(key)), ttl, stale_ok=stale_ok)
