"""TLS for squeal's Twisted connections with the standard library's `ssl` (memory BIOs), not pyOpenSSL.

Twisted's own TLS needs pyOpenSSL and service_identity; squeal has one TLS client connection kind (the
Sender's, to routers or memcached `-Z`), so it drives an `ssl.SSLObject` itself: bytes from the socket go into
one memory BIO, the TLS engine's output is written to the transport. `connect_tls` hands back the inner
protocol only once the handshake succeeded — the server's certificate verified against the CA and the name
dialled — or fails with `TlsError` naming the peer and the reason, so the Sender treats a TLS failure like
any failed connect (the batch stays queued, the next router is tried after the back-off).
"""

from __future__ import annotations

import ssl
from typing import Any, cast

from twisted.internet import defer, protocol
from twisted.internet.interfaces import ITCPTransport
from twisted.python.failure import Failure

from router_config import TlsSettings, handshake_failure_reason
from router_config import client_context as _client_context

READ_SIZE = 1 << 14  # one TLS record's plaintext at most; replies are small (`MN`, an error line)


class TlsError(ConnectionError):
    """The TLS handshake failed (the message names the peer and the reason)."""


def client_context(tls: TlsSettings, component: str = "squeal") -> ssl.SSLContext:
    """A verifying client context from the topology's [tls] (read afresh per connection: renewed files count)."""
    return _client_context(tls, component)


class _InnerTransport:
    """What the inner protocol sees as its transport: plaintext in, TLS records out."""

    def __init__(self, outer: TlsClientProtocol) -> None:
        self.outer = outer

    def write(self, data: bytes) -> None:
        self.outer.write_plain(data)

    def writeSequence(self, data: list[bytes]) -> None:  # noqa: N802 - Twisted's name
        self.outer.write_plain(b"".join(data))

    def loseConnection(self) -> None:  # noqa: N802
        self.outer.tcp.loseConnection()

    def abortConnection(self) -> None:  # noqa: N802
        self.outer.tcp.abortConnection()

    def getPeer(self) -> Any:  # noqa: N802
        return self.outer.tcp.getPeer()

    def getHost(self) -> Any:  # noqa: N802
        return self.outer.tcp.getHost()


class TlsClientProtocol(protocol.Protocol):
    """Runs `inner` over TLS on this connection; `ready` fires with `inner` after the handshake."""

    def __init__(self, inner: protocol.Protocol, context: ssl.SSLContext, hostname: str, peer: str) -> None:
        self.inner = inner
        self.peer = peer
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=False, server_hostname=hostname)
        self.ready: defer.Deferred = defer.Deferred()
        self.handshaken = False

    @property
    def tcp(self) -> ITCPTransport:
        """The TCP connection under the TLS (Twisted sets it before connectionMade)."""
        assert self.transport is not None
        return cast(ITCPTransport, self.transport)

    def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.tcp.write(data)

    def _fail(self, reason: str) -> None:
        if not self.ready.called:
            self.ready.errback(Failure(TlsError(f"TLS to {self.peer} failed: {reason}")))
        self.tcp.abortConnection()

    def _handshake(self) -> None:
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except ssl.SSLError as e:
            self._flush()
            self._fail(handshake_failure_reason(e))
            return
        self._flush()
        self.handshaken = True
        self.inner.makeConnection(_InnerTransport(self))
        self.ready.callback(self.inner)

    def connectionMade(self) -> None:  # noqa: N802
        self._handshake()

    def dataReceived(self, data: bytes) -> None:  # noqa: N802
        self.incoming.write(data)
        if not self.handshaken:
            self._handshake()
            if not self.handshaken:
                return
        chunks = []
        # Read while a whole record may be waiting: each `read` releases the GIL, and on the reactor thread
        # every release lets the binlog read loop take it for up to the switch interval, so
        # the usual reply (one record: `MN`) takes one call, not a second one that only finds nothing.
        while self.incoming.pending or self.tls.pending():
            try:
                chunk = self.tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                break  # the rest of a record is still on its way
            except ssl.SSLZeroReturnError:
                self.tcp.loseConnection()
                break
            except ssl.SSLError as e:
                self._fail(handshake_failure_reason(e))
                return
            if not chunk:
                break
            chunks.append(chunk)
        self._flush()  # TLS 1.3 may answer (key updates, tickets)
        if chunks:
            self.inner.dataReceived(b"".join(chunks))

    def write_plain(self, data: bytes) -> None:
        self.tls.write(data)
        self._flush()

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802
        if not self.ready.called:
            why = str(reason.value) if reason is not None else "closed"
            self.ready.errback(
                Failure(TlsError(f"TLS to {self.peer} failed: the connection closed during the handshake ({why})"))
            )
        if self.handshaken:
            self.inner.connectionLost(reason)


def connect_tls(
    endpoint: Any, inner: protocol.Protocol, context: ssl.SSLContext, hostname: str, peer: str
) -> defer.Deferred:
    """Connect `endpoint` and run `inner` over TLS; fires with `inner` once the server is verified."""
    outer = TlsClientProtocol(inner, context, hostname, peer)
    d = endpoint.connect(protocol.Factory.forProtocol(lambda: outer))
    d.addCallback(lambda _: outer.ready)
    return d
