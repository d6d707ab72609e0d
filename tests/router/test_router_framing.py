"""Framing as memcached 1.6.18 frames it (issue 26, item 1): a value a client sends is data and is
never run as a command. Each case sends the same bytes to a memcached and to a router in front of
another memcached, compares the replies byte for byte, and then compares what each memcached holds.

memcached ignores one extra token on a command line that is not `noreply` (it looks only at the
last token for it); the router used to refuse such a storage line with `CLIENT_ERROR` and then read
its value as the next command: `set inj 0 0 13 x` + `delete victim` deleted `victim`."""

from __future__ import annotations

import socket

import pytest

from ops.harness import Memcached

KEYS = (b"victim", b"inj", b"n", b"t")


def pool(*mcs: Memcached) -> dict:
    return {"pools": {"p": {"servers": [m.address for m in mcs]}}, "route": "PoolRoute|p"}


def exchange(address: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data`, half-close, and read every reply until the server closes."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(1 << 16):
            out += chunk
        return out


def contents(mc: Memcached) -> bytes:
    return exchange(mc.address, b"gets " + b" ".join(KEYS) + b"\r\n")


SMUGGLE = b"set victim 0 0 1\r\nv\r\nset inj 0 0 13 x\r\ndelete victim\r\n"

CASES = {
    # the reproduction: memcached stores the 13 bytes `delete victim` under `inj`
    "set-junk-token": SMUGGLE + b"get victim inj\r\n",
    "add-junk-token": b"set victim 0 0 1\r\nv\r\nadd inj 0 0 13 x\r\ndelete victim\r\nget victim inj\r\n",
    "append-junk-token": (
        b"set victim 0 0 1\r\nv\r\nset inj 0 0 1\r\ni\r\nappend inj 0 0 13 x\r\ndelete victim\r\nget victim inj\r\n"
    ),
    "prepend-junk-token": (
        b"set victim 0 0 1\r\nv\r\nset inj 0 0 1\r\ni\r\nprepend inj 0 0 13 x\r\ndelete victim\r\nget victim inj\r\n"
    ),
    "replace-junk-token": (
        b"set victim 0 0 1\r\nv\r\nset inj 0 0 1\r\ni\r\nreplace inj 0 0 13 x\r\ndelete victim\r\nget victim inj\r\n"
    ),
    "cas-junk-token": (
        b"set victim 0 0 1\r\nv\r\nset inj 0 0 1\r\ni\r\ncas inj 0 0 13 999 x\r\ndelete victim\r\nget victim inj\r\n"
    ),
    # a length memcached reads modulo 2^32 (it keeps a 32-bit int): 2^32 + 13 is a 13-byte value
    "length-over-2^32": b"set victim 0 0 1\r\nv\r\nset inj 0 0 4294967309\r\ndelete victim\r\nget victim inj\r\n",
    "incr-junk-token": b"set n 0 0 1\r\n5\r\nincr n 2 x\r\ndecr n 1 x\r\nget n\r\n",
    "touch-junk-token": b"set t 0 0 1\r\nt\r\ntouch t 1000 x\r\ntouch missing 1000 x\r\n",
    "verbosity-junk-token": b"verbosity 1 x\r\nverbosity 0\r\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_is_data_as_on_memcached(name: str, memcached_factory, router_factory) -> None:
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    stream = CASES[name]
    want = exchange(direct.address, stream)
    got = exchange(router.address, stream)
    assert got == want, f"{name}: router {got!r} != memcached {want!r}"
    assert contents(behind) == contents(direct)


def test_smuggled_delete_is_stored_not_run(memcached_factory, router_factory) -> None:
    """The issue's reproduction, with memcached's answer written out: both values stored."""
    behind = memcached_factory()
    router = router_factory(pool(behind))
    got = exchange(router.address, SMUGGLE + b"get victim inj\r\n")
    assert got == b"STORED\r\nSTORED\r\nVALUE victim 0 1\r\nv\r\nVALUE inj 0 13\r\ndelete victim\r\nEND\r\n"


def test_flush_all_with_a_junk_token_flushes_as_on_memcached(memcached_factory, router_factory) -> None:
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind), extra_args=("--enable-flush-cmd",))
    stream = b"set t 0 0 1\r\nt\r\nflush_all 0 x\r\nget t\r\nflush_all x y\r\n"
    want = exchange(direct.address, stream)
    assert want == b"STORED\r\nOK\r\nEND\r\nCLIENT_ERROR invalid exptime argument\r\n"
    assert exchange(router.address, stream) == want
