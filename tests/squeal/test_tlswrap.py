"""squeal's TLS over Twisted (squeal/delivery/tlswrap.py) against an in-memory TLS server: what reaches the inner
protocol, and how many TLS reads a reply costs the reactor (each one releases the GIL). The integration — squeal's
deletes to memcached `-Z` and TLS routers — is tested with real servers in tests/ops/test_tls_deployment.py and
tests/squeal/test_tls_mariadb.py."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from twisted.internet import protocol
from twisted.internet.testing import StringTransport

from ops import tls as pki
from squeal.delivery.tlswrap import READ_SIZE, TlsClientProtocol


class Collect(protocol.Protocol):
    def __init__(self) -> None:
        self.received: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
        self.received.append(data)


class Pair:
    """A TlsClientProtocol on a fake TCP transport, and the server's end as an SSLObject on memory BIOs."""

    def __init__(self, tmp: Path) -> None:
        ca = pki.make_ca(tmp)
        server = pki.issue(ca, tmp, "memcached")
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(server.cert, server.key)
        client_ctx = ssl.create_default_context(cafile=str(ca.cert))
        self.s_in, self.s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.server = server_ctx.wrap_bio(self.s_in, self.s_out, server_side=True)
        self.inner = Collect()
        self.client = TlsClientProtocol(self.inner, client_ctx, "127.0.0.1", "127.0.0.1:11211")
        self.tcp = StringTransport()
        self.client.makeConnection(self.tcp)
        server_done = False
        for _ in range(10):  # the handshake, shuttled both ways
            self.to_server()
            try:
                self.server.do_handshake()
                server_done = True
            except ssl.SSLWantReadError:
                pass
            self.to_client()
            if server_done and self.client.handshaken:
                break
        assert server_done and self.client.ready.called

    def to_server(self) -> None:
        self.s_in.write(self.tcp.value())
        self.tcp.clear()

    def to_client(self, data: bytes | None = None) -> None:
        data = self.s_out.read() if data is None else data
        if data:
            self.client.dataReceived(data)

    def reply(self, plain: bytes) -> bytes:
        """What the server sends on the wire for `plain`."""
        self.server.write(plain)
        return self.s_out.read()


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    return Pair(tmp_path)


def test_a_write_reaches_the_server_encrypted(pair: Pair) -> None:
    pair.client.write_plain(b"md user:1 q\r\nmn\r\n")
    wire = pair.tcp.value()
    assert b"user:1" not in wire
    pair.to_server()
    assert pair.server.read(READ_SIZE) == b"md user:1 q\r\nmn\r\n"


def test_replies_reach_the_inner_protocol_whole_in_pieces_and_together(pair: Pair) -> None:
    first, second = pair.reply(b"MN\r\n"), pair.reply(b"NF\r\nMN\r\n")
    pair.to_client(first[:3])  # a record cut short: nothing yet
    assert pair.inner.received == []
    pair.to_client(first[3:] + second)  # its rest and a whole second record in one read
    assert b"".join(pair.inner.received) == b"MN\r\nNF\r\nMN\r\n"
    big = bytes(range(256)) * 300  # 76,800 bytes: five records, more than one read's worth
    pair.to_client(pair.reply(big))
    assert b"".join(pair.inner.received) == b"MN\r\nNF\r\nMN\r\n" + big


def test_a_one_record_reply_costs_one_tls_read(pair: Pair) -> None:
    calls = 0
    read = pair.client.tls.read

    def counted(n: int = READ_SIZE) -> bytes:
        nonlocal calls
        calls += 1
        return read(n)

    pair.client.tls.read = counted  # type: ignore[method-assign]
    for _ in range(5):
        pair.to_client(pair.reply(b"MN\r\n"))
    assert pair.inner.received == [b"MN\r\n"] * 5
    assert calls == 5  # not a second read per reply that only finds the BIO empty
