"""memcached 1.6 (optionally TLS-only, `-Z`), and one-line text commands to it or to a router."""

from __future__ import annotations

import contextlib
import signal
import socket
import ssl
from pathlib import Path

from ops.processes.base import ManagedProcess, require_binary


def memcached_command(
    address: tuple[str, int], command: bytes, timeout: float = 2.0, tls: ssl.SSLContext | None = None
) -> bytes:
    """Send one text command and return the reply up to its first line end (the terminator stripped). `tls`: the
    port speaks TLS (a topology with `[tls]`: `router_config.tls_context`), the server verified with it."""
    with contextlib.ExitStack() as stack:
        s = stack.enter_context(socket.create_connection(address, timeout=timeout))
        if tls is not None:
            s = stack.enter_context(tls.wrap_socket(s, server_hostname=address[0]))
        s.sendall(command)
        buf = b""
        while not buf.endswith(b"\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return buf.rstrip(b"\r\n")


def tls_memcached_command(
    address: tuple[str, int], command: bytes, timeout: float = 2.0, ca: Path | None = None
) -> bytes:
    """`memcached_command` over TLS: the server's certificate is checked against `ca` if given (else not at
    all: a readiness check of a server whose certificate is meant to be bad)."""
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not ca:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return memcached_command(address, command, timeout, tls=ctx)


class Memcached(ManagedProcess):
    """memcached 1.6 on loopback, TCP only (`-U 0`).

    TLS (issue 25): `tls` = (certificate, key) starts it with `-Z` (TLS on its one port, Debian's build), what a
    router's TLS port looks like to a client; `ssl_ca` is the CA its readiness check and `ssl_context()` verify
    it against."""

    name = "memcached"
    # A graceful stop waits up to a second for memcached's maintenance threads to wake; a cache has
    # nothing to flush, and tests stop hundreds of them.
    stop_signal = signal.SIGKILL

    def __init__(
        self,
        port: int | None = None,
        workdir: str | Path | None = None,
        memory_mb: int = 64,
        host: str = "127.0.0.1",
        tls: tuple[Path, Path] | None = None,
        ssl_ca: str | Path | None = None,
    ) -> None:
        super().__init__(port, workdir, host)
        self.memory_mb = memory_mb
        self.binary = require_binary("memcached", "memcached")
        # (certificate chain, key) in PEM: the port speaks TLS only (`-Z`), see DESIGN.md "TLS facts"
        self.tls = tls
        self.ssl_ca = ssl_ca  # the CA that signed its certificate: what its clients (and `ready`) verify against

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context for this server (None: plaintext), verifying it against `ssl_ca` if given."""
        if not self.tls:
            return None
        if self.ssl_ca:
            return ssl.create_default_context(cafile=str(self.ssl_ca))
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        return ctx

    def command(self) -> list[str]:
        return [
            self.binary,
            "-l",
            self.host,
            "-p",
            str(self.port),
            "-U",
            "0",
            "-m",
            str(self.memory_mb),
            "-c",
            "4096",
            "-u",
            "root",
        ] + (["-Z", "-o", f"ssl_chain_cert={self.tls[0]},ssl_key={self.tls[1]}"] if self.tls else [])

    def ready(self) -> bool:
        if self.tls:
            ca = Path(self.ssl_ca) if self.ssl_ca else None
            return tls_memcached_command((self.host, self.port), b"version\r\n", ca=ca).startswith(b"VERSION")
        return memcached_command((self.host, self.port), b"version\r\n").startswith(b"VERSION")
