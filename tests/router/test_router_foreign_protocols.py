"""squeal-router against real memcached: what arrives in another protocol (issue 14, items 7 and 8a).

- A binary-protocol client (first byte 0x80) gets one binary "Not supported" response and the
  connection closes, so it fails at once. (memcached 1.6.18 with `-B ascii` never answers it: the
  client waits for its own timeout; that is what the router did too.)
- An HTTP request line closes the connection without a reply, as on memcached 1.6.18 (an unknown
  command whose last token starts with `HTTP/`), so a browser's cross-protocol POST whose body
  carries `set k 0 0 1` stores nothing.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from tests.router.conftest import Conn


def pool_config(mc) -> dict:
    return {"pools": {"main": {"servers": [mc.address]}}, "route": "PoolRoute|main"}


def addr(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def read_until_closed(address: str, data: bytes, timeout: float = 3.0) -> tuple[bytes, bool]:
    """Send `data`, read until the peer closes or `timeout` passes: (bytes read, closed?)."""
    s = socket.create_connection(addr(address), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                return out, False
            except ConnectionResetError:
                return out, True
            if not chunk:
                return out, True
            out += chunk
    finally:
        s.close()


def binary_request(opcode: int, key: bytes = b"", opaque: int = 0) -> bytes:
    # magic, opcode, key length, extras length, data type, vbucket, total body, opaque, cas
    return struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), 0, 0, 0, len(key), opaque, 0) + key


@pytest.mark.parametrize("opcode, key", [(0x00, b"k"), (0x0B, b""), (0x09, b"k")])  # get, version, getq
def test_a_binary_client_is_answered_not_supported_and_closed(memcached_factory, router_factory, opcode, key) -> None:
    mc = memcached_factory()
    router = router_factory(pool_config(mc))
    started = time.monotonic()
    out, closed = read_until_closed(router.address, binary_request(opcode, key, opaque=0xDEADBEEF))
    assert closed, f"binary client left hanging (read {out!r})"
    assert time.monotonic() - started < 2.0
    assert len(out) >= 24, out
    magic, op, keylen, extlen, _dtype, status, body, opaque, cas = struct.unpack(">BBHBBHIIQ", out[:24])
    assert (magic, op, keylen, extlen, status, opaque, cas) == (0x81, opcode, 0, 0, 0x0083, 0xDEADBEEF, 0)
    assert out[24:] == b"squeal-router speaks the memcached ascii protocol only"
    assert body == len(out) - 24
    # the router itself is fine, and a text client is served as usual
    c = Conn(router.address)
    assert c.call(b"set k 0 0 1\r\nv\r\n") == b"STORED"
    assert c.call(b"get k\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"


def test_a_binary_header_sent_in_pieces_is_answered_once_complete(memcached_factory, router_factory) -> None:
    mc = memcached_factory()
    router = router_factory(pool_config(mc))
    s = socket.create_connection(addr(router.address), timeout=3)
    req = binary_request(0x0B, opaque=7)
    s.sendall(req[:10])
    time.sleep(0.2)
    s.sendall(req[10:])
    out = b""
    while chunk := s.recv(4096):
        out += chunk
    s.close()
    assert out[:2] == b"\x81\x0b" and out[6:8] == b"\x00\x83" and out[12:16] == b"\x00\x00\x00\x07"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\nContent-Length: 18\r\n\r\n"
        b"set k 0 0 1\r\nx\r\n",
        b"PUT /k HTTP/1.0\r\n\r\nset k 0 0 1\r\nx\r\n",
        b"GET /?q=%0d%0aset HTTP/1.1\r\nset k 0 0 1\r\nx\r\n",
        b"HEAD / HTTP/1.1\r\nset k 0 0 1\r\nx\r\n",
        # after a valid command too, as on memcached
        b"version\r\nPOST / HTTP/1.1\r\n\r\nset k 0 0 1\r\nx\r\n",
    ],
)
def test_an_http_request_closes_the_connection_and_stores_nothing(
    memcached_factory, router_factory, request_bytes
) -> None:
    mc = memcached_factory()
    router = router_factory(pool_config(mc))
    out, closed = read_until_closed(router.address, request_bytes)
    assert closed, f"connection left open after an HTTP request line (read {out!r})"
    assert b"STORED" not in out and b"ERROR" not in out, out
    c = Conn(router.address)
    assert c.call(b"get k\r\n") == b"END"
    # and memcached itself closes on the same bytes (the behaviour the router copies)
    out, closed = read_until_closed(mc.address, request_bytes)
    assert closed and b"STORED" not in out
    assert Conn(mc.address).call(b"get k\r\n") == b"END"


def test_http_like_lines_memcached_reads_as_commands_still_work(memcached_factory, router_factory) -> None:
    mc = memcached_factory()
    router = router_factory(pool_config(mc))
    for target in (router.address, mc.address):
        c = Conn(target)
        assert c.call(b"GET /\r\n") == b"ERROR"  # no HTTP/ version: an unknown command
        assert c.call(b"GET / http/1.1\r\n") == b"ERROR"  # memcached matches `HTTP/` exactly
        assert c.call(b"get / HTTP/1.1\r\n") == b"END"  # a known command: a two-key get
        assert c.call(b"version\r\n").startswith(b"VERSION 1.6.18")
