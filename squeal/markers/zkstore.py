"""Datamarkers in ZooKeeper: the `DatamarkerStore` of a region's squeal pool (Wormhole's MCRD, §3.3.2).

Every worker of a region may read its own copy of the region's data; the flows' positions must outlive any one of
them, so they live in ZooKeeper as *logical positions*: a MariaDB GTID list names the same transactions on the
primary and on every GTID replica (`log_slave_updates`), so a marker written by one owner on one copy is a valid
starting point for the next on another. The pool keeps one znode per (region, shard) (`ShardMarkerStore`, below,
the only writer of markers); `ZooKeeperDatamarkerStore` is its base - the ZooKeeper calls, the fencing check and
the operator requests they share - and reads the layout of the HA election squeal had before (one znode per
destination, no longer written), which a shard without pool markers still starts from (`legacy`). That layout's
znodes, under `<root>/regions/<region>/`:

    markers/<flow>   persistent, JSON {"flow", "position", "saved_at", "by"}: the flow's last position whose
                     deletes its destination acknowledged (never inside a transaction)
    replay/<flow>    persistent, JSON {"flow", "position", "saved_at"}: an operator's replay request, taken
                     (deleted) by the owner, which rewinds the flow; apart from the marker so that the
                     owner's own checkpoint cannot overwrite a request before it has been applied
    epoch            persistent: the fencing token of HA mode's region-wide owner (a pool shard has its own,
                     `pool/shards/<s>/epoch`): its version grows by one with every new owner, and once more when
                     an owner gives it up
    accept-data-loss persistent, JSON {"requested_at"}: `squeal accept-data-loss` for a region halted on binlog
                     data loss; taken (deleted) by the owner, whose daemon then flushes the region and resumes

Fencing: a write is a ZooKeeper multi-operation that (1) checks the `epoch` znode still has the version
this owner set when it took the shard, and (2) sets the marker with the znode version this store last read or
wrote (compare-and-set; a marker that does not exist yet is created, which fails if someone else created it).
So a deposed owner, paused and resumed, partitioned and healed, or simply slow, can never overwrite a newer
marker: its write fails as a whole and raises `FencedError`. A new owner takes the shard (and bumps the epoch)
*before* it reads the markers, so everything the old owner wrote up to then is what the new one starts from.
(The per-destination layout is the one HA mode's elected leader wrote; it is read for a shard's first markers
after an upgrade and written by nothing any more.)

Failures: ZooKeeper unreachable (no quorum, connection lost, session expired, an answer slower than
`timeout`) is `ZooKeeperUnavailable`, an OSError, so the daemon treats it like a marker file that cannot
be written: deletes keep flowing while the lease allows (squeal/pool/), the write is retried at the next
checkpoint, `squeal_datamarker_write_errors_total` counts it.

The client's identity (TLS, digest ACL: `client_options`), the errors that count as unavailable (`UNAVAILABLE`) and
the znode paths are squeal/pool/zookeeper.py's, shared with the pool.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)

from squeal.markers.datamarkers import DatamarkerDirError, check_position, decode_marker
from squeal.pool.zookeeper import UNAVAILABLE, ha_marker_dir, region_path, shard_path
from squeal.read import gtid as g

log = logging.getLogger(__name__)


class FencedError(RuntimeError):
    """A marker write refused by ZooKeeper because this worker no longer owns the shard's flows: another owner
    has taken the shard since (the epoch moved), or the markers changed since this worker read them."""


class ZooKeeperUnavailable(OSError):
    """ZooKeeper did not answer (no quorum, connection lost, session expired, timeout)."""


class ZooKeeperRefused(RuntimeError):
    """ZooKeeper answered and refused a write for a reason that is not fencing: the znode's ACL does not let this
    process write it (NoAuth). Retried at the next checkpoint, like any failed write, until someone fixes it."""


def refused_write(path: str, position: str, failure: Exception) -> ZooKeeperRefused | None:
    """The error of a marker write ZooKeeper refused for a reason other than fencing, None for fencing's."""
    if isinstance(failure, NoAuthError):
        return ZooKeeperRefused(
            f"markers {path} not moved to {position}: ZooKeeper refused the write (NoAuth: the znode's ACL does not "
            "let this process write it; squeal's znodes are written with [zookeeper] digest or x509 credentials, "
            "docs/squeal.md)"
        )
    return None


class ZooKeeperDatamarkerStore:
    """What a ZooKeeper marker store shares (`ShardMarkerStore` is the one that writes markers): calls bounded by
    `timeout`, the fencing token, the operator's replay and accept-data-loss requests (taken fenced), and a
    read-only view of the HA layout's per-destination markers (`load`, `positions`).

    `fence()` returns the version of the `epoch` znode this process set when it took ownership (its fencing
    token), or None when it owns nothing: then nothing is taken or written (FencedError). With
    `fence=None` writes are guarded by the znodes' own versions only (tools, tests).
    `on_write(seconds)` is told how long each marker write took (a metric).
    """

    def __init__(
        self,
        client: KazooClient,
        root: str,
        region: str,
        owner: str = "",
        fence: Callable[[], int | None] | None = None,
        timeout: float = 5.0,
        on_write: Callable[[float], None] | None = None,
        shard: str | None = None,
    ) -> None:
        self.client = client
        self.region = region
        self.base = region_path(root, region)  # (HA mode's region-wide `epoch`; `ShardMarkerStore` uses its shard's)
        # The HA layout's markers, replay and accept-data-loss requests (with [shards]: under shards/<name>, fenced
        # by the region's epoch all the same: HA mode's one owner had every shard of the region).
        self.data = ha_marker_dir(root, region, shard).removesuffix("/markers")
        self.dir = f"zookeeper:{self.data}"  # where markers live, for the daemon's messages
        self.owner = owner
        self.fence = fence
        self.timeout = timeout
        self.on_write = on_write
        self.epoch_path = f"{self.base}/epoch"
        # Operator requests are looked for only after a watch said something changed (`if_changed`): a look per
        # checkpoint was two requests per shard per second for nothing. Each flag starts set (never looked yet);
        # a watch's event - any event, also kazoo's "connection lost" one, which drops every watch - sets it again.
        self._replay_changed = True
        self._accept_changed = True

    # -- plumbing ---------------------------------------------------------------------------------------------

    def _marker(self, flow: str) -> str:
        return f"{self.data}/markers/{flow}"

    def _replay(self, flow: str) -> str:
        return f"{self.data}/replay/{flow}"

    def _wait(self, async_result: Any, what: str) -> Any:
        try:
            return async_result.get(timeout=self.timeout)
        except UNAVAILABLE as e:
            hosts = ",".join(f"{h}:{p}" for h, p in (self.client.hosts or ()))
            raise ZooKeeperUnavailable(f"ZooKeeper {hosts}: {what}: {type(e).__name__} {e}".rstrip()) from e

    def ensure_paths(self) -> None:
        for sub in ("markers", "replay"):
            try:
                self._wait(self.client.ensure_path_async(f"{self.data}/{sub}"), f"create {self.data}/{sub}")
            except NodeExistsError:
                pass

    def check_writable(self) -> None:
        """Start-up check: ZooKeeper answers and the region's znodes exist (DatamarkerDirError otherwise)."""
        try:
            self.ensure_paths()
        except ZooKeeperUnavailable as e:
            raise DatamarkerDirError(f"cannot reach the datamarkers in {self.dir}: {e}") from e

    def _fence_token(self, what: str) -> int | None:
        if self.fence is None:
            return None
        token = self.fence()
        if token is None:
            raise FencedError(f"{what}: this process does not own region {self.region}'s flows")
        return token

    # -- the HA layout's markers, read-only ----------------------------------------------------------------------

    def load(self, flow: str) -> str | None:
        """The flow's marker in the per-destination layout (None: it has none)."""
        path = self._marker(flow)
        try:
            data, _ = self._wait(self.client.get_async(path), f"read {path}")
        except NoNodeError:
            return None
        return decode_marker(data, path)

    def positions(self) -> dict[str, str]:
        """Every flow's marker in the region (flow -> position), without remembering versions."""
        out: dict[str, str] = {}
        markers = f"{self.data}/markers"
        try:
            children = self._wait(self.client.get_children_async(markers), f"list {markers}")
        except NoNodeError:
            return out
        for flow in sorted(children):
            try:
                data, _ = self._wait(self.client.get_async(f"{markers}/{flow}"), f"read {markers}/{flow}")
            except NoNodeError:
                continue
            out[flow] = decode_marker(data, f"{markers}/{flow}")
        return out

    def _epoch_is(self, token: int) -> bool:
        try:
            _, stat = self._wait(self.client.get_async(self.epoch_path), f"read {self.epoch_path}")
        except (NoNodeError, ZooKeeperUnavailable):
            return False
        return stat.version == token

    def request_replay(self, flow: str, position: str) -> None:
        """Ask the owner (now, or the next one) to re-send `flow` everything after `position`."""
        g.parse_position(position)
        path = self._replay(flow)
        doc = json.dumps({"flow": flow, "position": position, "saved_at": time.time()}).encode()
        try:
            self._wait(self.client.create_async(path, doc, makepath=True), f"create {path}")
        except NodeExistsError:
            self._wait(self.client.set_async(path, doc), f"write {path}")  # the newer request wins

    def _replays_changed(self, _: Any) -> None:
        self._replay_changed = True  # (kazoo's thread: a flag, nothing else)

    def _acceptance_changed(self, _: Any) -> None:
        self._accept_changed = True

    def take_replay_requests(self, if_changed: bool = False) -> dict[str, str]:
        """Pending requests, each removed with its version (a request replaced meanwhile stays for next time)
        and, when fenced, only while this worker owns the flows (a deposed owner must not swallow one).

        Every look leaves a watch on `replay/`. `if_changed` (the daemon's periodic checkpoint): no request at all
        unless that watch fired since the last look - a request is then taken at the first checkpoint after this
        session's server has it. Without it (start-up, SIGHUP, tools and tests) the look is synchronous: a
        request confirmed to an operator through another server is seen now."""
        if if_changed and not self._replay_changed:
            return {}
        self._replay_changed = False
        try:
            return self._take_replay_requests()
        except BaseException:
            self._replay_changed = True  # not looked at (in full): look again next time
            raise

    def _take_replay_requests(self) -> dict[str, str]:
        out: dict[str, str] = {}
        base = f"{self.data}/replay"
        try:
            # This session's server may be a follower behind the leader: sync first, so a request an operator's
            # client has had confirmed (through another server) is seen now, not a checkpoint later.
            self._wait(self.client.sync_async(base), f"sync {base}")
            children = self._wait(self.client.get_children_async(base, watch=self._replays_changed), f"list {base}")
        except NoNodeError:
            # (no `replay/` yet: watch for it, so that a request creating it is not missed)
            if self._wait(self.client.exists_async(base, watch=self._replays_changed), f"watch {base}") is not None:
                self._replay_changed = True  # made in between: look at the next call
            return out
        if not children:
            return out
        token = self._fence_token(f"replay requests in {base} not taken")
        for flow in sorted(children):
            path = f"{base}/{flow}"
            try:
                data, stat = self._wait(self.client.get_async(path), f"read {path}")
            except NoNodeError:
                continue
            try:
                position = decode_marker(data, path)
            except ValueError as e:
                log.error("corrupt replay request %s removed, not applied: %s", path, e)
                position = None
            t = self.client.transaction()
            if token is not None:
                t.check(self.epoch_path, token)
            t.delete(path, version=stat.version)
            results = self._wait(t.commit_async(), f"take {path}")
            failure = next(
                (r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None
            )
            if isinstance(failure, BadVersionError | NoNodeError | NotEmptyError):
                if token is not None and not self._epoch_is(token):
                    raise FencedError(f"replay request {path} not taken: another owner has taken over since")
                self._replay_changed = True  # (a child's new data fires no watch on `replay/`)
                continue  # replaced by a newer request: taken at the next checkpoint
            if failure is not None:
                raise failure
            if position is not None:
                out[flow] = position
        return out

    # -- operator requests that are not markers -------------------------------------------------------------------

    @property
    def accept_path(self) -> str:
        return f"{self.data}/accept-data-loss"

    def request_loss_acceptance(self) -> None:
        """`squeal accept-data-loss`: the owner (now, or the next one) takes it."""
        doc = json.dumps({"requested_at": time.time()}).encode()
        try:
            self._wait(self.client.create_async(self.accept_path, doc, makepath=True), f"create {self.accept_path}")
        except NodeExistsError:
            self._wait(self.client.set_async(self.accept_path, doc), f"write {self.accept_path}")

    def take_loss_acceptance(self, if_changed: bool = False) -> bool:
        """Whether an operator accepted data loss since the last call: the request is removed with its version
        and, when fenced, only while this worker owns the flows (a deposed owner must not swallow it). `if_changed`:
        as for `take_replay_requests`, no request unless the watch every look leaves on the znode fired."""
        if if_changed and not self._accept_changed:
            return False
        self._accept_changed = False
        try:
            return self._take_loss_acceptance()
        except BaseException:
            self._accept_changed = True
            raise

    def _take_loss_acceptance(self) -> bool:
        path = self.accept_path
        try:
            _, stat = self._wait(self.client.get_async(path, watch=self._acceptance_changed), f"read {path}")
        except NoNodeError:
            if self._wait(self.client.exists_async(path, watch=self._acceptance_changed), f"watch {path}") is not None:
                self._accept_changed = True  # made in between: taken at the next call
            return False
        token = self._fence_token(f"{path} not taken")
        t = self.client.transaction()
        if token is not None:
            t.check(self.epoch_path, token)
        t.delete(path, version=stat.version)
        results = self._wait(t.commit_async(), f"take {path}")
        failure = next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)
        if isinstance(failure, BadVersionError | NoNodeError):
            if token is not None and not self._epoch_is(token):
                raise FencedError(f"{path} not taken: another owner has taken over since")
            self._accept_changed = True
            return False  # renewed meanwhile: taken next time
        if failure is not None:
            raise failure
        return True


class ShardMarkerStore(ZooKeeperDatamarkerStore):
    """One znode per (region, shard) holding every destination's GTID: the datamarkers of a pooled region.

    `<root>/regions/<region>/pool/shards/<shard>/markers` is JSON `{"positions": {flow: position}, "saved_at",
    "by", "token"}` ("token": the writer's fencing token, the epoch znode's version), written by the shard's owner
    at most once per checkpoint for all of its flows at once (`save_many`,
    which the daemon's checkpoint uses), so ZooKeeper's write rate is bounded by shards × 1/interval, not by
    shards × destinations. Compare-and-set: each write is one
    multi-operation that checks the *shard's* `epoch` znode still has the version this owner set when it took the
    shard (its fencing token, from `fence()`), and sets the markers znode with the version this store last read or
    wrote. A deposed or released owner's write fails as a whole (`FencedError`): no marker ever goes back.
    Replay and accept-data-loss requests live beside it (`replay/<flow>`, `accept-data-loss`), fenced the same way.

    `legacy`: the HA layout's marker znodes of the same shard (`ha_marker_dir`: one znode per destination), read
    when the shard has no markers znode yet - a region whose HA leader wrote markers and that runs on the pool now
    starts each shard where the leader left it, not from "now". The first write makes the shard's znode, which
    alone counts from then on; the old znodes are left as they were (nothing writes them any more).
    """

    def __init__(
        self,
        client: KazooClient,
        root: str,
        region: str,
        shard: str,
        owner: str = "",
        fence: Callable[[], int | None] | None = None,
        timeout: float = 5.0,
        on_write: Callable[[float], None] | None = None,
        legacy: str | None = None,
    ) -> None:
        super().__init__(client, root, region, owner=owner, fence=fence, timeout=timeout, on_write=on_write)
        self.shard = shard
        self.legacy = legacy
        self.data = shard_path(root, region, shard)
        self.dir = f"zookeeper:{self.data}"  # the shard's znode: `markers`, `replay/`, `accept-data-loss` below it
        self.epoch_path = f"{self.data}/epoch"
        self.markers_path = f"{self.data}/markers"
        self._positions: dict[str, str] = {}
        self._version: int | None = None
        self._read = False
        self._paths_made = False
        # A write whose answer never came (ConnectionLoss, timeout): (the bytes sent, the positions they hold).
        # ZooKeeper may have applied it, moving the znode's version without this owner knowing; the next write
        # first looks (`_settle_unanswered`), else every compare-and-set after it would be refused for good.
        self._unanswered: tuple[bytes, dict[str, str]] | None = None

    def ensure_paths(self) -> None:
        """The shard's znodes exist (persistent: once made, later calls of this store do not ask again)."""
        if self._paths_made:
            return
        try:
            self._wait(self.client.ensure_path_async(f"{self.data}/replay"), f"create {self.data}/replay")
        except NodeExistsError:
            pass
        self._paths_made = True

    def _read_doc(self) -> tuple[dict[str, str], int | None]:
        path = self.markers_path
        try:
            data, stat = self._wait(self.client.get_async(path), f"read {path}")
        except NoNodeError:
            return self._read_legacy(), None  # (version None: the first write creates the znode, compare-and-set)
        try:
            doc = json.loads(data.decode())
            positions = doc["positions"]
            if not isinstance(positions, dict):
                raise ValueError('"positions" is not an object')
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a shard's datamarkers: {e}") from e
        for flow, position in positions.items():
            check_position(position, f"{path}: flow {flow}")
        return dict(positions), stat.version

    def _read_legacy(self) -> dict[str, str]:
        """The HA layout's markers of this shard (flow -> position), {} without any; ValueError naming the znode
        for a corrupt one (never silently "now")."""
        if self.legacy is None:
            return {}
        try:
            flows = self._wait(self.client.get_children_async(self.legacy), f"list {self.legacy}")
        except NoNodeError:
            return {}
        out: dict[str, str] = {}
        for flow in sorted(flows):
            path = f"{self.legacy}/{flow}"
            try:
                data, _ = self._wait(self.client.get_async(path), f"read {path}")
            except NoNodeError:
                continue
            out[flow] = decode_marker(data, path)
        if out:
            log.warning(
                "shard %s of region %s has no markers in %s yet: starting from the HA layout's in %s (%s)",
                self.shard,
                self.region,
                self.markers_path,
                self.legacy,
                ", ".join(f"{f} {p}" for f, p in out.items()),
            )
        return out

    def load(self, flow: str) -> str | None:
        """The flow's marker. The first call reads the shard's znode (and its version, for the compare-and-set of
        the next write); later calls answer from what was read or written since."""
        if not self._read:
            self._positions, self._version = self._read_doc()
            self._read = True
        return self._positions.get(flow)

    def positions(self) -> dict[str, str]:
        """Every flow's marker of the shard, read now (versions not remembered)."""
        return self._read_doc()[0]

    def read(self) -> dict[str, str]:
        """Every flow's marker of the shard, read now and remembered with the znode's version, as `load`'s first
        call does: a new owner reads them once, after it took the shard, for its copy check and its flows."""
        self._positions, self._version = self._read_doc()
        self._read = True
        return dict(self._positions)

    def save(self, flow: str, position: str) -> None:
        self.save_many({flow: position})

    def save_many(self, moved: dict[str, str]) -> None:
        """Write the shard's markers with `moved` applied, in one multi-operation (see the class docstring);
        FencedError if this worker no longer owns the shard or the znode changed since it read it."""
        for position in moved.values():
            g.parse_position(position)
        path = self.markers_path
        if not self._read:
            raise FencedError(
                f"{path}: written before it was read (load() first: the compare-and-set needs the "
                "version this owner started from)"
            )
        token = self._fence_token(f"markers {path} not written")
        self._settle_unanswered()
        positions = {**self._positions, **moved}
        doc: dict[str, Any] = {"positions": positions, "saved_at": time.time()}
        if self.owner:
            doc["by"] = self.owner
        if token is not None:
            doc["token"] = token  # the writer's fencing token: one owner per token (what the pool's tests check)
        data = json.dumps(doc, sort_keys=True).encode()
        version = self._version
        t = self.client.transaction()
        if token is not None:
            t.check(self.epoch_path, token)
        if version is None:
            t.create(path, data)
        else:
            t.set_data(path, data, version=version)
        started = time.monotonic()
        try:
            results = self._wait(t.commit_async(), f"write {path}")
        except ZooKeeperUnavailable:
            self._unanswered = (data, positions)
            raise
        if self.on_write is not None:
            self.on_write(time.monotonic() - started)
        failure = next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)
        if failure is None:
            stat = results[-1]
            self._version = 0 if version is None else getattr(stat, "version", version + 1)
            self._positions = positions
            return
        raise self._fenced(path, ",".join(sorted(moved)), json.dumps(moved), token, version, failure)

    def _settle_unanswered(self) -> None:
        """After a write whose answer was lost: if the znode holds exactly the bytes it sent (each write's
        `saved_at` makes them unique), it was applied: take its version and positions. Anything else (not
        applied, or another owner wrote since) leaves the compare-and-set to decide, as before."""
        if self._unanswered is None:
            return
        sent, positions = self._unanswered
        path = self.markers_path
        try:
            data, stat = self._wait(self.client.get_async(path), f"read {path}")
        except NoNodeError:
            data, stat = None, None
        self._unanswered = None
        if data == sent and stat is not None:
            log.info("shard %s: the markers write whose answer was lost had been applied (%s)", self.shard, path)
            self._version, self._positions = stat.version, positions

    def _fenced(
        self, path: str, flow: str, position: str, token: int | None, version: int | None, failure: Exception
    ) -> FencedError | ZooKeeperRefused:
        refused = refused_write(path, position, failure)
        if refused is not None:
            return refused
        if token is not None and isinstance(failure, BadVersionError | NoNodeError) and not self._epoch_is(token):
            why = (
                f"shard {self.shard} has had another owner since this one took it (epoch version {token}), or "
                "this owner released it"
            )
        elif isinstance(failure, NodeExistsError):
            why = "the markers were created by someone else after this owner found none"
        else:
            why = f"the markers changed since this owner read them (version {version}; {type(failure).__name__})"
        return FencedError(f"markers {path} not moved to {position}: {why}")

    def _fence_token(self, what: str) -> int | None:
        if self.fence is None:
            return None
        token = self.fence()
        if token is None:
            raise FencedError(
                f"{what}: this worker does not own shard {self.shard} of region {self.region} (or its lease ran out)"
            )
        return token
