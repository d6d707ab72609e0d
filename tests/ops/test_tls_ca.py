"""ops.tls: the certificates it issues pass (and fail) a real TLS handshake the way the platform needs."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path

import pytest

from ops.tls import CertPair, expires_at, issue, make_ca


def _handshake(server: CertPair, ca_for_client: Path, server_hostname: str) -> None:
    """One TLS handshake over a socketpair: `server` serves, the client trusts `ca_for_client`."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(server.cert, server.key)
    client_ctx = ssl.create_default_context(cafile=str(ca_for_client))
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as e:
            errors.append(e)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=server_hostname) as c:
            c.sendall(b"x")
    finally:
        t.join(5)


def test_a_certificate_from_the_ca_verifies_for_its_names(tmp_path) -> None:
    ca = make_ca(tmp_path)
    router = issue(ca, tmp_path, "router", hosts=["localhost", "127.0.0.1"])
    _handshake(router, ca.cert, "localhost")
    assert (router.key.stat().st_mode & 0o777) == 0o600
    assert expires_at(router.cert) > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=800)


@pytest.mark.parametrize("case", ["wrong CA", "expired", "hostname mismatch"])
def test_the_bad_cases_a_test_needs_are_refused(tmp_path, case: str) -> None:
    ca = make_ca(tmp_path)
    trusted = ca.cert
    hostname = "localhost"
    if case == "wrong CA":
        trusted = make_ca(tmp_path / "other", common_name="someone else's CA").cert
        pair = issue(ca, tmp_path, "srv")
    elif case == "expired":
        past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
        pair = issue(ca, tmp_path, "srv", not_before=past - datetime.timedelta(days=1), not_after=past)
    else:
        pair = issue(ca, tmp_path, "srv", hosts=["db.example"])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(pair, trusted, hostname)
