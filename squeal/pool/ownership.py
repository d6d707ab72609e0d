"""`Ownership`: which shards this worker owns, taken and released with the per-shard ZooKeeper multi-operations
(the package docstring's "Ownership and fencing"), and the fencing token each marker write carries.

Blocking kazoo calls, bounded by `call_timeout`: `acquire` and `owner_of` run on the worker's thread, `release` in
the reactor's thread pool (or at shutdown); `may_send` and `fence` are asked from any thread (the flows' gate on
the reactor, the marker store's writes) and only read."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from squeal.pool.owner import SessionLease
from squeal.pool.znodes import read_doc
from squeal.pool.zookeeper import UNAVAILABLE, shard_path

log = logging.getLogger(__name__)


class Ownership:
    """This worker's shards (shard -> fencing token): taken and released with the per-shard multi-operations of
    the module docstring."""

    def __init__(
        self, client: KazooClient, root: str, region: str, worker: str, lease: SessionLease, call_timeout: float = 2.0
    ) -> None:
        self.client = client
        self.root = root
        self.region = region
        self.worker = worker
        self.lease = lease
        self.call_timeout = call_timeout
        self.tokens: dict[str, int] = {}
        self.epochs: dict[str, int] = {}
        self._lock = threading.Lock()

    def _call(self, async_result: Any) -> Any:
        return async_result.get(timeout=self.call_timeout)

    def paths(self, shard: str) -> tuple[str, str]:
        base = shard_path(self.root, self.region, shard)
        return f"{base}/owner", f"{base}/epoch"

    def owner_of(self, shard: str, watch: Callable[[Any], None] | None = None) -> str | None:
        """The shard's owner now (None: nobody); `watch` fires when the `owner` znode changes."""
        owner, _ = self.paths(shard)
        stat = self._call(self.client.exists_async(owner, watch=watch))
        if stat is None:
            return None
        try:
            data, _ = self._call(self.client.get_async(owner))
        except NoNodeError:
            return None
        return str(read_doc(data).get("worker") or "?")

    def acquire(self, shard: str) -> int | None:
        """Take the shard if nobody owns it (and this worker's lease holds): its fencing token, or None."""
        if not self.lease.valid():
            return None
        owner, epoch_path = self.paths(shard)
        try:
            data, stat = self._call(self.client.get_async(epoch_path))
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                self._call(self.client.create_async(epoch_path, json.dumps({"epoch": 0}).encode(), makepath=True))
            data, stat = self._call(self.client.get_async(epoch_path))
        epoch = int(read_doc(data).get("epoch", 0)) + 1
        t = self.client.transaction()
        t.create(
            owner, json.dumps({"worker": self.worker, "epoch": epoch, "since": time.time()}).encode(), ephemeral=True
        )
        t.set_data(epoch_path, json.dumps({"epoch": epoch, "owner": self.worker}).encode(), version=stat.version)
        results = self._call(t.commit_async())
        if any(isinstance(r, Exception) for r in results):
            return None  # someone owns it (or took it a moment ago)
        token = stat.version + 1
        with self._lock:
            self.tokens[shard] = token
            self.epochs[shard] = epoch
        log.info("worker %s owns shard %s (epoch %d, fencing token %d)", self.worker, shard, epoch, token)
        return token

    def may_send(self, shard: str) -> bool:
        return shard in self.tokens and self.lease.valid()

    def window(self, shard: str) -> float:
        """Seconds this worker may still send for `shard` (0: not at all): the rest of its lease, if it owns it."""
        return self.lease.left() if self.may_send(shard) else 0.0

    def fence(self, shard: str) -> int | None:
        token = self.tokens.get(shard)
        return token if token is not None and self.lease.valid() else None

    def release(self, shard: str, reason: str) -> None:
        """Give the shard up (after its pipeline stopped and wrote its markers): from here on nothing of this
        worker is sent or written for it, and the next owner may take it at once."""
        with self._lock:
            token = self.tokens.pop(shard, None)
            epoch = self.epochs.pop(shard, None)
        if token is None:
            return
        owner, epoch_path = self.paths(shard)
        try:
            stat = self._call(self.client.exists_async(owner))
            session = self.client.client_id[0] if self.client.client_id else None
            if stat is None or stat.ephemeralOwner != session:
                return
            t = self.client.transaction()
            t.delete(owner, version=stat.version)
            t.set_data(
                epoch_path,
                json.dumps({"epoch": epoch, "owner": self.worker, "released": reason, "at": time.time()}).encode(),
                version=token,
            )
            results = self._call(t.commit_async())
            if any(isinstance(r, Exception) for r in results):
                log.warning(
                    "worker %s: could not mark shard %s released (%s); deleting its owner znode only",
                    self.worker,
                    shard,
                    results,
                )
                self._call(self.client.delete_async(owner, version=stat.version))
        except (NoNodeError, KazooException, *UNAVAILABLE) as e:
            log.warning(
                "worker %s: could not release shard %s (%s); it is free when this session ends", self.worker, shard, e
            )
            return
        log.info("worker %s released shard %s (%s)", self.worker, shard, reason)
