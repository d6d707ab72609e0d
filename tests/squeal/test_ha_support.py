"""Shared pieces of the HA tests (no tests here): a ZooKeeper ensemble, a TCP link a test can cut, clients."""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from kazoo.client import KazooClient

from ops.harness import ZooKeeper

SESSION_TIMEOUT = 2.0  # seconds: ZooKeeper's floor with the harness's tickTime of 500 ms is 1 s


@contextlib.contextmanager
def ensemble(workdir: Path, size: int = 3) -> Iterator[list[ZooKeeper]]:
    """A `size`-server ZooKeeper ensemble from the harness, serving; stopped by pid afterwards."""
    members = ZooKeeper.ensemble(size, workdir=workdir)
    try:
        for m in members:
            m.start()
        ZooKeeper.wait_serving(members)
        yield members
    finally:
        for m in members:
            with contextlib.suppress(OSError, AssertionError):
                if m.proc is not None and m.proc.poll() is None:
                    m.resume()
            m.stop(grace=5)


def hosts(members: list[ZooKeeper] | list[Link]) -> str:
    return ",".join(f"127.0.0.1:{m.port}" for m in members)


def unique_root() -> str:
    return f"/t{uuid.uuid4().hex[:12]}"


def client(connect: str, timeout: float = SESSION_TIMEOUT) -> KazooClient:
    """A started kazoo client (session timeout `timeout`); stop() and close() it when done."""
    c = KazooClient(hosts=connect, timeout=timeout, connection_retry={"max_tries": -1, "delay": 0.05,
                                                                       "max_delay": 0.5})
    c.start(timeout=15)
    return c


def expire_session(c: KazooClient, connect: str) -> None:
    """Make ZooKeeper end `c`'s session now: another connection attaches to it and closes it (the client
    finds its session expired when it next talks to the server: LOST, then a new session)."""
    session_id, password = c.client_id
    other = KazooClient(hosts=connect, client_id=(session_id, password), timeout=SESSION_TIMEOUT)
    other.start(timeout=15)
    other.stop()
    other.close()


class Link:
    """A TCP proxy 127.0.0.1:port -> target that a test can cut: bytes stop flowing both ways while the
    connections stay open (a partition, not a reset: the client notices only by its own time-outs). heal()
    drops the connections held through the cut (their streams lost bytes) and forwards new ones again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=f"link-{self.port}").start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                conn.close()  # (a partitioned client's SYN would hang; refusing is close enough)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self._cut.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.listener.close()
        self.heal()
