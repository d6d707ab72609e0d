"""`MetaReader` (monitoring/verify/meta.py), the read every checker uses, on a real memcached: a value marked stale
(a pool with `stale_ttl`) reads as invalidated, and the refill win its read took is given back."""

from __future__ import annotations

import socket

import router_config
from monitoring.verify.meta import MetaReader


def ask(port: int, command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(command + b"\r\n")
        got = b""
        while not got.endswith(b"\r\n"):
            got += s.recv(4096)
        return got


def test_a_stale_value_reads_as_invalidated_and_its_refill_win_is_given_back(memcached_factory) -> None:
    mc = memcached_factory()
    with socket.create_connection(("127.0.0.1", mc.port), timeout=5) as s:
        s.sendall(b"set fresh 3 0 1\r\nf\r\nset stale 0 0 3\r\nold\r\nmd stale I T30\r\nset taken 0 0 1\r\nt\r\n")
        s.sendall(b"md taken I T30\r\nmg taken v\r\nmn\r\n")  # a web reader already took taken's refill win
        got = b""
        while not got.endswith(b"MN\r\n"):
            got += s.recv(4096)
    reader = MetaReader(router_config.Address("127.0.0.1", mc.port), None)
    try:
        found = reader.gets_many(["fresh", "stale", "taken", "absent"])
    finally:
        reader.close()
    assert {k: v for k, (v, _) in found.items()} == {"fresh": (b"f", 3)}
    handed_back = ask(mc.port, b"mg stale v t N30")
    assert b" W" in handed_back and b" X" in handed_back, handed_back  # the next reader refills it
    ttl = int(handed_back.split(b" t", 1)[1].split()[0])
    assert 0 < ttl <= 30, handed_back  # still bounded by the stale TTL it had
    assert b" W" not in ask(mc.port, b"mg taken v N30")  # a win another reader holds is left alone
