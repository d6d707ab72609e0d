"""squeal's ZooKeeper: its client's identity, what counts as unavailable, the znode layout, a watched znode.

Shared by the pool (squeal/pool/: membership, ownership, the controller's assignment) and the markers it keeps in
ZooKeeper (squeal/markers/zkstore.py) and by `squeal replay` / `squealctl` on a pooled region. The layout, under
`<root>/regions/<region>/`: `pool/` (`pool_path`: workers, controller, assignment, `shards/<s>/` (`shard_path`));
the HA layout's `markers/` (`ha_marker_dir`), still read for a shard's first markers.

Security (issue 25, `client_options`): with `[tls]` squeal's clients dial the ensemble's TLS client port,
verifying the servers against the topology's CA (and presenting squeal's certificate); with `[zookeeper] digest`
they log in with that credential and create every znode with an ACL that lets only that identity change it
(everyone may read: status tools, monitoring). Znodes created before the digest was set keep their open ACL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import ACL, make_acl, make_digest_acl

from router_config import Topology

# ZooKeeper did not answer in time, or the connection or session is gone (the operation may or may not have
# been applied: a marker write is retried, a replay request taken is re-read).
UNAVAILABLE = (ConnectionLoss, ConnectionClosedError, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)


def squeal_acl(digest: str) -> list[ACL]:
    """The ACL of every znode squeal creates when `[zookeeper] digest = "user:password"` is set: all rights for
    that identity, read for anyone."""
    user, _, password = digest.partition(":")
    return [make_digest_acl(user, password, all=True), make_acl("world", "anyone", read=True)]


def client_options(topo: Topology) -> dict[str, Any]:
    """`KazooClient` keyword arguments for squeal's own identity on the topology's ensemble: TLS when the topology
    has `[tls]` (the server verified against `tls.ca`, host name included; squeal's certificate if it has one),
    the digest login and squeal's ACL when `[zookeeper] digest` is set. Empty for a plaintext, open ensemble."""
    out: dict[str, Any] = {}
    if topo.tls is not None:
        mine = topo.tls.cert("squeal")
        out |= {
            "use_ssl": True,
            "verify_certs": True,
            "check_hostname": True,
            "ca": topo.tls.ca,
            "certfile": mine.cert if mine else None,
            "keyfile": mine.key if mine else None,
        }
    zk = topo.zookeeper
    if zk is not None and zk.digest:
        out |= {"auth_data": [("digest", zk.digest)], "default_acl": squeal_acl(zk.digest)}
    return out


def region_path(root: str, region: str) -> str:
    return f"{root.rstrip('/')}/regions/{region}"


def ha_marker_dir(root: str, region: str, shard: str | None = None) -> str:
    """Where HA mode's elected leader kept a region's (with [shards]: a shard's) markers, one znode per destination
    (read as a shard's first markers after an upgrade to the pool)."""
    base = region_path(root, region)
    return f"{base}/shards/{shard}/markers" if shard else f"{base}/markers"


class Watched:
    """One znode's data (or its children, `children=True`) as last read, read again only after the watch that
    every read leaves fired: a change, or kazoo's connection-lost event, which drops every watch - so a value is
    never trusted across a lost connection. Instead of a read per second, a read per change.

    `value()`: the data (None: no such znode) or the sorted child names ([]: none); `version` and `stat` the
    znode's version and `ZnodeStat` with the data (None: no such znode). `on_change` is called from kazoo's
    thread when the watch fires (set a flag or an event there; nothing blocking)."""

    def __init__(
        self,
        client: KazooClient,
        path: str,
        children: bool = False,
        timeout: float = 5.0,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self.path = path
        self.children = children
        self.timeout = timeout
        self.on_change = on_change
        self.stale = True
        self.version: int | None = None
        self.stat: Any = None
        self._value: Any = [] if children else None

    def _fired(self, _: Any) -> None:
        self.stale = True
        self.on_change()

    def mark_stale(self) -> None:
        self.stale = True

    def wrote(self, data: bytes, version: int) -> None:
        """This client just wrote the znode (`version` from the answer): the value until the watch says more."""
        self._value, self.version = data, version  # (`stat` stays the last one read)

    def value(self) -> Any:
        if not self.stale:
            return self._value
        self.stale = False  # (before the read: a watch that fires during it sets it again)
        try:
            self._read()
        except BaseException:
            self.stale = True
            raise
        return self._value

    def _read(self) -> None:
        get = self.client.get_children_async if self.children else self.client.get_async
        try:
            answer = get(self.path, watch=self._fired).get(timeout=self.timeout)
        except NoNodeError:
            # (no watch is left by a read of a missing znode: an `exists` leaves one for its creation)
            self._value, self.version, self.stat = ([] if self.children else None), None, None
            if self.client.exists_async(self.path, watch=self._fired).get(timeout=self.timeout) is not None:
                self.stale = True  # made in between: read it next time
            return
        if self.children:
            self._value = sorted(answer)
        else:
            self._value, self.stat = answer[0], answer[1]
            self.version = self.stat.version


def pool_path(root: str, region: str) -> str:
    """Where a pooled region's workers, controller, assignment and shards live (squeal/pool/)."""
    return f"{region_path(root, region)}/pool"


def shard_path(root: str, region: str, shard: str) -> str:
    return f"{pool_path(root, region)}/shards/{shard}"
