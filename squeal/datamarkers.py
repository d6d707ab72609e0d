"""Stage 6: datamarkers, the durable "how far has this destination got" of every flow.

A flow's datamarker is the GTID position (see `squeal.gtid`) whose deletes that destination has
acknowledged, never a position inside a transaction. After any crash the flow resumes from it, so some
deletes may be sent twice (harmless: deletes are idempotent) but none are lost.

`DatamarkerStore` is the interface; `FileDatamarkerStore` (one small JSON file per flow, written to a
temporary file, fsync'd, renamed over the old one, directory fsync'd) is the default. The HA mode can
put the same interface on ZooKeeper.

Replay requests (`squeal replay`) are a second, separate record per flow: the daemon takes them on
SIGHUP or at its next checkpoint and rewinds the flow. Keeping them apart from the marker means the
daemon's own checkpoint can never overwrite an operator's request before it has been applied.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Protocol

from squeal import gtid as g

_FLOW_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class DatamarkerStore(Protocol):
    def load(self, flow: str) -> str | None:
        """The flow's last acknowledged position ("0-1-42,..."), or None for a new destination."""

    def save(self, flow: str, position: str) -> None:
        """Durably record `position` as acknowledged by `flow`."""

    def request_replay(self, flow: str, position: str) -> None:
        """Ask the running (or next) daemon to re-send `flow` everything after `position`."""

    def take_replay_requests(self) -> dict[str, str]:
        """Pending replay requests (flow -> position), removed from the store."""


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)  # atomic: a reader sees the old marker or the new one, never half of one
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself must survive a power loss
    finally:
        os.close(dfd)


class FileDatamarkerStore:
    """`<dir>/<flow>.marker` and `<dir>/<flow>.replay`, JSON `{"flow", "position", "saved_at"}`."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, flow: str, suffix: str) -> Path:
        if not _FLOW_NAME.match(flow):
            raise ValueError(f"flow name {flow!r} cannot be a file name")
        return self.dir / f"{flow}.{suffix}"

    def _read(self, path: Path) -> str | None:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        position = doc["position"]
        g.parse_position(position)  # a corrupt marker is an error, never silently "now"
        return position

    def load(self, flow: str) -> str | None:
        return self._read(self._path(flow, "marker"))

    def save(self, flow: str, position: str) -> None:
        doc = {"flow": flow, "position": position, "saved_at": time.time()}
        _write_atomic(self._path(flow, "marker"), json.dumps(doc).encode() + b"\n")

    def request_replay(self, flow: str, position: str) -> None:
        g.parse_position(position)
        doc = {"flow": flow, "position": position, "saved_at": time.time()}
        _write_atomic(self._path(flow, "replay"), json.dumps(doc).encode() + b"\n")

    def take_replay_requests(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for path in sorted(self.dir.glob("*.replay")):
            position = self._read(path)
            if position is not None:
                out[path.name[: -len(".replay")]] = position
            path.unlink(missing_ok=True)
        return out
