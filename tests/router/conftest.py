"""Helpers for the router suite: a raw memcached-protocol client, furc_hash in Python (to check
placement independently of the Rust code), and the east-a topology wired to real memcached ports."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

import router_config as rc
from ops.harness import wait_until
from tests.binaries import needs_binary

REPO = Path(__file__).resolve().parents[2]
ROUTER_BIN = REPO / "router/target/release/squeal-router"

# Fast failure handling for tests: probes after 300 ms, 300 ms request timeout.
FAST = (
    "--probe-delay-initial-ms",
    "300",
    "--probe-delay-max-ms",
    "1000",
    "--server-timeout-ms",
    "300",
    "--connect-timeout-ms",
    "300",
)


def pytest_collection_modifyitems(config, items):
    needs_router = needs_binary(ROUTER_BIN.exists(), f"{ROUTER_BIN} not built (cargo build --release in router/)")
    for item in items:
        if "tests/router" in str(item.fspath):
            item.add_marker(needs_router)


class Conn:
    """A raw text-protocol connection that reads exactly the replies it expects."""

    def __init__(self, address: str | tuple[str, int], timeout: float = 5.0) -> None:
        if isinstance(address, str):
            host, port = address.rsplit(":", 1)
            address = (host, int(port))
        self.sock = socket.create_connection(address, timeout=timeout)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("connection closed")
        self.buf += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def stat_lines(self) -> list[bytes]:
        """`stats` on this connection: the `STAT name value` lines it answers, up to `END`."""
        self.send(b"stats\r\n")
        lines = []
        while (line := self.line()) != b"END":
            lines.append(line)
        return lines

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def reply(self) -> bytes:
        """One reply of any kind: a line, a meta VA with its data, or classic VALUEs up to END."""
        line = self.line()
        if line.startswith(b"VA "):
            n = int(line.split()[1])
            return line + b"\r\n" + self.exact(n + 2)
        if line.startswith(b"VALUE "):
            out = b""
            while line.startswith(b"VALUE "):
                n = int(line.split()[3])
                out += line + b"\r\n" + self.exact(n + 2)
                line = self.line()
            assert line == b"END", line
            return out + b"END\r\n"
        return line

    def call(self, data: bytes) -> bytes:
        self.send(data)
        return self.reply()


def wait_for(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll until `check()` is true (a bound, not a timing assertion)."""
    wait_until(check, timeout, what, ignore=(), error=AssertionError)


# ---- furc_hash (mcrouter Ch3), independent of the Rust implementation ----
_M = 0xC6A4A7935BD1E995
_MASK = (1 << 64) - 1


def _murmur64a(data: bytes, seed: int = 4193360111) -> int:
    h = (seed ^ (len(data) * _M)) & _MASK
    n = len(data) // 8
    for i in range(n):
        k = int.from_bytes(data[8 * i : 8 * i + 8], "little")
        k = (k * _M) & _MASK
        k ^= k >> 47
        k = (k * _M) & _MASK
        h ^= k
        h = (h * _M) & _MASK
    rest = data[8 * n :]
    if rest:
        h ^= int.from_bytes(rest, "little")
        h = (h * _M) & _MASK
    h ^= h >> 47
    h = (h * _M) & _MASK
    h ^= h >> 47
    return h


def furc_hash(key: bytes, m: int) -> int:
    if m <= 1:
        return 0
    words: list[int] = []

    def bit(i: int) -> int:
        while len(words) <= i >> 6:
            words.append(_murmur64a(key) if not words else _murmur64a(words[-1].to_bytes(8, "little")))
        return (words[i >> 6] >> (i & 63)) & 1

    d = 0
    while m > (1 << d):
        d += 1
    a = d
    for _ in range(32):
        while not bit(a):
            d -= 1
            if d == 0:
                return 0
            a = d
        a += 23
        num = 1
        for _ in range(d - 1):
            num = (num << 1) | bit(a)
            a += 23
        if num < m:
            return num
    return 0


# ---- the example topology's east-a cluster on real ports ----
EAST_A_PORTS = {
    "wildcard0": 31101,
    "wildcard1": 31102,
    "gutter": 31103,
    "sessions0": 31104,
    "sessions1": 31105,
    "regional": 31901,
}


@pytest.fixture
def east_a(memcached_factory, router_factory):
    """east-a's emitted router config with every pool member a real memcached; returns a namespace."""
    text = (REPO / "examples/local.toml").read_text()
    servers = {}
    for name, port in EAST_A_PORTS.items():
        mc = memcached_factory()
        servers[name] = mc
        text = re.sub(rf"127\.0\.0\.1:{port}\b", f"127.0.0.1:{mc.port}", text)
    topo = rc.loads(text)
    config = rc.cluster_config(topo, "east-a")
    router = router_factory(config, extra_args=FAST)

    class EastA:
        pass

    ns = EastA()
    ns.servers = servers
    ns.config = config
    ns.router = router
    wildcard = config["route"]["wildcard"]
    if wildcard["type"] == "TransparentLeaseRoute":  # the example's wildcard pools have leases
        wildcard = wildcard["target"]
    ns.gutter_ttl = wildcard["failover_exptime"]
    return ns
