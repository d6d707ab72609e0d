"""Stage 6: datamarkers, the durable "how far has this destination got" of every flow.

A flow's datamarker is the GTID position (see `squeal.read.gtid`) whose deletes that destination has
acknowledged, never a position inside a transaction. After any crash the flow resumes from it, so some
deletes may be sent twice (harmless: deletes are idempotent) but none are lost.

`DatamarkerStore` is the interface; `FileDatamarkerStore` (one small JSON file per flow, written to a
temporary file, fsync'd, renamed over the old one, directory fsync'd) is the default. The HA mode can
put the same interface on ZooKeeper.

Replay requests (`squeal replay`) are a second, separate record per flow: the daemon takes them on
SIGHUP or at its next checkpoint and rewinds the flow. Keeping them apart from the marker means the
daemon's own checkpoint can never overwrite an operator's request before it has been applied.

Failures: the daemon uses the store from a thread of its own (`StoreThread`), so a slow or hung disk never
blocks the reactor; a failed write leaves the flow's position unsaved and is retried at the next checkpoint,
and `MarkerWatch` keeps, per flow, how long its acknowledged position has waited to become durable and the
current streak of write errors (for the logs, `/healthz` and `/metrics`). A replay request file that does
not parse is logged and set aside as `<flow>.replay.corrupt`.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from twisted.internet import defer
from twisted.python.failure import Failure

from squeal.read import gtid as g

log = logging.getLogger(__name__)

_FLOW_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class DatamarkerDirError(OSError):
    """The datamarker directory cannot be created, read or written (at start-up: a one-line error, exit 2)."""


class DatamarkerStore(Protocol):
    def load(self, flow: str) -> str | None:
        """The flow's last acknowledged position ("0-1-42,..."), or None for a new destination."""

    def save(self, flow: str, position: str) -> None:
        """Durably record `position` as acknowledged by `flow`."""

    def request_replay(self, flow: str, position: str) -> None:
        """Ask the running (or next) daemon to re-send `flow` everything after `position`."""

    def take_replay_requests(self, if_changed: bool = False) -> dict[str, str]:
        """Pending replay requests (flow -> position), removed from the store. `if_changed`: the caller looks
        periodically; a store that can tell nothing changed since its last look (a watch) may answer {} without
        looking. Without it the look is made now."""

    def check_writable(self) -> None:
        """Raise DatamarkerDirError unless markers can be written now (optional: the daemon's start-up check)."""


def check_position(position: object, where: str) -> str:
    """A stored marker's position: a string that parses (a corrupt marker is an error, never silently "now");
    ValueError or GtidError naming `where` otherwise."""
    if not isinstance(position, str):
        raise ValueError(f"{where}: the position is not a string")
    try:
        g.parse_position(position)
    except g.GtidError as e:
        raise g.GtidError(f"{where}: {e}") from e
    return position


def decode_marker(data: bytes, where: str, what: str = "datamarker") -> str:
    """The position of one stored marker document (`{"position": ..., ...}` as JSON: a marker file, a marker or
    replay request znode); ValueError (`where` is not a `what`) or GtidError naming `where` if it is corrupt."""
    try:
        doc = json.loads(data.decode())
        position = doc.get("position") if isinstance(doc, dict) else None
        if not isinstance(position, str):
            raise ValueError('no "position" string')
        g.parse_position(position)  # a corrupt marker is an error, never silently "now"
    except g.GtidError as e:
        raise g.GtidError(f"{where}: {e}") from e
    except ValueError as e:  # (json.JSONDecodeError and UnicodeDecodeError are ValueErrors)
        raise ValueError(f"{where} is not a {what}: {e}") from e
    return position


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # atomic: a reader sees the old marker or the new one, never half of one
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)  # a full disk or a directory in the way must not leave litter behind
        except OSError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself must survive a power loss
    finally:
        os.close(dfd)


class FileDatamarkerStore:
    """`<dir>/<flow>.marker` and `<dir>/<flow>.replay`, JSON `{"flow", "position", "saved_at"}`."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if self.dir.exists() and not self.dir.is_dir():
                raise DatamarkerDirError(f"datamarker directory {self.dir} exists and is not a directory") from e
            raise DatamarkerDirError(f"cannot create the datamarker directory {self.dir}: {e}") from e

    def check_writable(self) -> None:
        """Write (fsync, rename) and remove a probe file: an unwritable directory is found at start-up."""
        probe = self.dir / f".probe.{os.getpid()}"
        try:
            _write_atomic(probe, b"probe\n")
            probe.unlink()
        except OSError as e:
            raise DatamarkerDirError(f"cannot write datamarkers in {self.dir}: {e}") from e

    def _path(self, flow: str, suffix: str) -> Path:
        if not _FLOW_NAME.match(flow):
            raise ValueError(f"flow name {flow!r} cannot be a file name")
        return self.dir / f"{flow}.{suffix}"

    def _read(self, path: Path) -> str | None:
        """The position in `path`; None if there is no such file; ValueError (naming the file) if corrupt."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return decode_marker(data, str(path), "datamarker file")

    def load(self, flow: str) -> str | None:
        return self._read(self._path(flow, "marker"))

    def save(self, flow: str, position: str) -> None:
        doc = {"flow": flow, "position": position, "saved_at": time.time()}
        _write_atomic(self._path(flow, "marker"), json.dumps(doc).encode() + b"\n")

    def request_replay(self, flow: str, position: str) -> None:
        g.parse_position(position)
        doc = {"flow": flow, "position": position, "saved_at": time.time()}
        _write_atomic(self._path(flow, "replay"), json.dumps(doc).encode() + b"\n")

    def take_replay_requests(self, if_changed: bool = False) -> dict[str, str]:
        """(`if_changed` changes nothing here: a directory listing is cheap.) A request that does not parse is
        logged and renamed `<flow>.replay.corrupt` (never blocks the others).
        A request that cannot be removed is left for next time, not returned (it would be applied again and
        again); if nothing could be taken because of that, the OSError is raised."""
        out: dict[str, str] = {}
        error: OSError | None = None
        for path in sorted(self.dir.glob("*.replay")):
            try:
                try:
                    position = self._read(path)
                except ValueError as e:
                    aside = path.with_name(path.name + ".corrupt")
                    os.replace(path, aside)  # (if this fails, the OSError below is logged by the caller)
                    log.error("corrupt replay request %s set aside as %s, not applied: %s", path, aside.name, e)
                    continue
                path.unlink(missing_ok=True)
            except OSError as e:
                error = error or e
                continue
            if position is not None:
                out[path.name[: -len(".replay")]] = position
        if error is not None and not out:
            raise error
        return out


def describe_error(e: BaseException) -> str:
    """An OSError as `[Errno 28] No space left on device: '/path'` (errno and path), anything else with its type."""
    return str(e) if isinstance(e, OSError) else f"{type(e).__name__}: {e}"


@dataclass
class _MarkerState:
    pending_since: float | None = None  # when a position newer than the durable marker was first seen
    failures: int = 0  # failed writes in a row
    last_error: str = ""
    logged_at: float | None = None  # when this failure streak was last logged


class MarkerWatch:
    """Per flow: how long its acknowledged position has waited to be durable, and its write-error streak.

    The age of a flow's marker is `now - pending_since`: the time since a checkpoint first found the flow
    with a position its marker does not have yet (so within one checkpoint interval of the oldest change
    acknowledged but not yet durable), and 0 once that position is written. An idle, caught-up flow is
    never old, however long ago its marker was written. Pure bookkeeping: times are passed in.
    """

    def __init__(self, log_every: float = 60.0) -> None:
        self.log_every = log_every
        self._flows: dict[str, _MarkerState] = {}

    def _state(self, flow: str) -> _MarkerState:
        return self._flows.setdefault(flow, _MarkerState())

    def moved(self, flow: str, now: float) -> None:
        """The flow has a position to write (its marker is behind from now on, if it was not already)."""
        st = self._state(flow)
        if st.pending_since is None:
            st.pending_since = now

    def failed(self, flow: str, error: str, now: float) -> bool:
        """A write failed; True if it should be logged (the first of a streak, then at most every `log_every`)."""
        st = self._state(flow)
        st.failures += 1
        st.last_error = error
        if st.logged_at is None or now - st.logged_at >= self.log_every:
            st.logged_at = now
            return True
        return False

    def written(self, flow: str) -> int:
        """The pending position is durable; returns how many failed writes came before (the streak ended)."""
        st = self._state(flow)
        failures = st.failures
        self._flows[flow] = _MarkerState()
        return failures

    def age(self, flow: str, now: float) -> float:
        st = self._flows.get(flow)
        if st is None or st.pending_since is None:
            return 0.0
        return max(0.0, now - st.pending_since)

    def pending(self, flow: str) -> bool:
        """The flow has a position its durable marker does not have yet."""
        st = self._flows.get(flow)
        return st is not None and st.pending_since is not None

    def failures(self, flow: str) -> int:
        st = self._flows.get(flow)
        return st.failures if st else 0

    def last_error(self, flow: str) -> str:
        st = self._flows.get(flow)
        return st.last_error if st else ""


class StoreThread:
    """Runs store calls one at a time, in order, on a daemon thread of its own; each result (or exception)
    fires a Deferred on the reactor thread. A slow or hung disk never blocks the reactor, and a write that
    never returns cannot keep the process from exiting (the thread is a daemon thread: it is abandoned)."""

    def __init__(self, reactor: Any, name: str = "datamarkers") -> None:
        self.reactor = reactor
        self.name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[..., Any], *args: Any) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._calls.put((fn, args, d))
        return d

    def close(self) -> None:
        """End the thread once the calls queued so far are done (a pipeline handed on: it makes no more)."""
        if self._thread is not None:
            self._calls.put(None)

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, args, d = item
            try:
                result = fn(*args)
            except Exception:  # noqa: BLE001 - handed to the Deferred
                self.reactor.callFromThread(d.errback, Failure())
            else:
                self.reactor.callFromThread(d.callback, result)
