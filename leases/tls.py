"""TLS for the web tier's meta-memcache connections (to the routers' TLS ports, or memcached `-Z`).

meta-memcache builds each connection with a `socket_factory_fn`, but its `MemcacheSocket` is native code that
reads and writes the socket's file descriptor itself: an `ssl.SSLSocket` handed to it would be spoken to in
plaintext. So the factory does the TLS handshake itself — the server verified against the topology's CA and
the name dialled, the web tier's certificate presented — and hands meta-memcache one end of a local socket
pair; a relay thread per connection moves bytes between that pair and the TLS socket. The relay ends when
either side closes. Requests and replies are small and one connection carries one request at a time, so a
blocking relay cannot deadlock on full buffers in practice.

A failed handshake (wrong CA, expired certificate, wrong name, a plaintext port) raises `TlsConnectError`
naming the server and the reason, logged once as one WARNING line per server and reason (until a connect
succeeds); meta-memcache marks the server down and `LeaseCache` falls back to the database as for any
unreachable server.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
from collections.abc import Callable

from router_config import handshake_failure_reason

log = logging.getLogger(__name__)

_warned: dict[str, str] = {}  # server -> the reason last reported (one line per server and reason)
_warned_lock = threading.Lock()


class TlsConnectError(ConnectionError):
    """The TLS handshake with a memcached/router failed (the message names the server and the reason)."""


def _report(server: str, reason: str | None) -> None:
    with _warned_lock:
        if reason is None:
            if _warned.pop(server, None) is not None:
                log.warning("TLS to memcache %s works again", server)
            return
        if _warned.get(server) == reason:
            return
        _warned[server] = reason
    log.warning("TLS to memcache %s failed: %s; reads of its keys use the database until it works", server, reason)


def _relay(plain: socket.socket, tls: ssl.SSLSocket) -> None:
    """Move bytes both ways until either side closes, then close both."""
    try:
        plain.settimeout(None)
        # Reads from the TLS side never block: a readable socket may carry only TLS records with no data for
        # the client (TLS 1.3 session tickets), and a blocking read would then wait for the server's answer
        # to a request still sitting on the plaintext side.
        tls.setblocking(False)
        while True:
            readable = [tls] if tls.pending() else select.select([plain, tls], [], [])[0]
            if tls in readable:
                try:
                    data = tls.recv(65536)
                except ssl.SSLWantReadError:
                    data = None
                if data is not None:
                    if not data:
                        return
                    plain.sendall(data)
            if plain in readable:
                data = plain.recv(65536)
                if not data:
                    return
                tls.setblocking(True)  # writes may wait: the server reads what it is sent
                tls.sendall(data)
                tls.setblocking(False)
    except (OSError, ValueError):
        return  # a reset, or a socket closed under us: the client sees its end close
    finally:
        for s in (tls, plain):
            try:
                s.close()
            except OSError:
                pass


def tls_socket_factory(
    host: str,
    port: int,
    context: Callable[[], ssl.SSLContext],
    connect_timeout: float,
    recv_timeout: float,
) -> Callable[[], socket.socket]:
    """A meta-memcache `socket_factory_fn` that connects over TLS (a fresh context per connection: renewed
    certificate files are read at the next connect) and returns the client's end of the relay."""
    server = f"{host}:{port}"

    def build() -> socket.socket:
        try:
            raw = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError:
            raise  # not a TLS problem: meta-memcache's usual "unreachable"
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tls = context().wrap_socket(raw, server_hostname=host)  # the handshake, within connect_timeout
        except (ssl.SSLError, ssl.CertificateError, OSError) as e:
            raw.close()
            reason = handshake_failure_reason(e)
            _report(server, reason)
            raise TlsConnectError(f"TLS to memcache {server} failed: {reason}") from None
        _report(server, None)
        mine, theirs = socket.socketpair()
        threading.Thread(target=_relay, args=(theirs, tls), name=f"tls-relay {server}", daemon=True).start()
        mine.settimeout(recv_timeout)
        return mine

    return build
