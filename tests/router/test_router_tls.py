"""squeal-router over TLS (issue 25, items 1 and 2), with real memcached (`-Z` for the server side) and the
real router binary; certificates from ops.tls.

Client side: `--ssl-port` beside the plaintext port, mcrouter's flag names, optional client certificates
(`--ssl-require-peer-certs`), the same connection code as plaintext (protocol, auth, admin requests, the
connection limit), certificates reloaded on SIGHUP without dropping connections. Server side: pools with
`"security_mech": "tls"` reach memcached -Z, verifying its certificate with `--pem-ca-path`; TKO, probes and
spool replay over TLS. Every refused handshake is one log line naming the peer and the reason.
"""

from __future__ import annotations

import datetime
import json
import signal
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from ops import tls
from ops.harness import ROUTER_BIN, Memcached, Router, free_port, memcached_command, tls_memcached_command
from tests.router.conftest import FAST, Conn, wait_for


class TlsConn(Conn):
    """`Conn` over TLS, verifying the router's certificate against `ca` (and showing `cert` if given)."""

    def __init__(self, address: tuple[str, int], ca: Path, cert: tls.CertPair | None = None, timeout: float = 5.0):
        ctx = ssl.create_default_context(cafile=str(ca))
        if cert:
            ctx.load_cert_chain(str(cert.cert), str(cert.key))
        raw = socket.create_connection(address, timeout=timeout)
        self.sock = ctx.wrap_socket(raw, server_hostname=address[0])
        self.buf = b""

    def peer_serial(self) -> int:
        from cryptography import x509

        der = self.sock.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture
def pki(tmp_path: Path):
    d = tmp_path / "pki"

    class Pki:
        ca = tls.make_ca(d)
        router = tls.issue(ca, d, "router")
        client = tls.issue(ca, d, "client")
        memcached = tls.issue(ca, d, "memcached")
        other_ca = tls.make_ca(d / "other", common_name="not squeal's CA")

    return Pki


def tls_args(pki, *more: str) -> tuple[str, ...]:
    return (
        "--pem-cert-path",
        str(pki.router.cert),
        "--pem-key-path",
        str(pki.router.key),
        "--pem-ca-path",
        str(pki.ca.cert),
        *more,
    )


def start_router(
    processes, config: dict, extra: tuple[str, ...] = (), name: str = "router", ssl: bool = True
) -> Router:
    workdir = processes.base / name
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.json"
    path.write_text(json.dumps(config))
    return processes.add(
        Router(path, workdir=workdir, ssl_port=free_port() if ssl else None, extra_args=(*FAST, *extra))
    )


def plain_pool(mc: Memcached) -> dict:
    return {"pools": {"main": {"servers": [mc.address]}}, "route": "PoolRoute|main"}


def tls_lines(router: Router) -> list[str]:
    return [line for line in router.log_file.read_text(errors="replace").splitlines() if "TLS:" in line]


def stats(conn: Conn) -> dict[str, str]:
    conn.send(b"stats\r\n")
    out = {}
    while (line := conn.line()) != b"END":
        _, k, v = line.decode().split(" ", 2)
        out[k] = v
    return out


# ---- client side ----


def test_tls_and_plaintext_ports_serve_the_same_protocol(processes, memcached_factory, pki):
    mc = memcached_factory()
    router = start_router(processes, plain_pool(mc), tls_args(pki))
    t = TlsConn((router.host, router.ssl_port), pki.ca.cert)
    p = Conn(router.address)
    assert t.call(b"set k 0 0 5\r\nhello\r\n") == b"STORED"
    assert p.call(b"get k\r\n") == b"VALUE k 0 5\r\nhello\r\nEND\r\n"
    assert t.call(b"mg k v\r\n") == b"VA 5\r\nhello\r\n"
    # a pipeline in one TLS record, replies in order
    t.send(b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\nget a b\r\nmn\r\n")
    assert [t.reply() for _ in range(4)] == [
        b"STORED",
        b"STORED",
        b"VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nEND\r\n",
        b"MN",
    ]
    # a value larger than one TLS record (16 KiB) and than the read chunk
    big = b"x" * 100_000
    assert t.call(b"set big 0 0 %d\r\n%s\r\n" % (len(big), big)) == b"STORED"
    assert t.call(b"get big\r\n") == b"VALUE big 0 %d\r\n%s\r\nEND\r\n" % (len(big), big)
    # admin requests answer over TLS as over plaintext
    assert t.call(b"get __mcrouter__.version\r\n") == p.call(b"get __mcrouter__.version\r\n")
    assert t.call(b"version\r\n").startswith(b"VERSION")
    assert int(stats(p)["tls_handshakes"]) == 1
    # the plaintext port stays plaintext: a TLS client there gets no handshake, and one log line
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        TlsConn((router.host, router.port), pki.ca.cert, timeout=5.0).call(b"version\r\n")
    wait_for(lambda: tls_lines(router), what="the router's log line")
    (line,) = tls_lines(router)
    assert "client 127.0.0.1:" in line and "a TLS client on the plaintext port" in line, line
    t.close()
    p.close()


def test_auth_and_the_connection_limit_work_over_tls(processes, memcached_factory, pki, tmp_path):
    mc = memcached_factory()
    auth = tmp_path / "clients"
    auth.write_text("alice:secret\n")
    router = processes.add(
        AuthRouter(
            _config(processes, plain_pool(mc)),
            workdir=processes.base / "router",
            ssl_port=free_port(),
            extra_args=(*tls_args(pki), "--auth-file", str(auth), "-c", "3"),
        )
    )
    t = TlsConn((router.host, router.ssl_port), pki.ca.cert)
    assert t.call(b"get k\r\n") == b"CLIENT_ERROR unauthenticated"
    assert t.call(b"set any 0 0 12\r\nalice secret\r\n") == b"STORED"
    assert t.call(b"get k\r\n") == b"END"
    others = [TlsConn((router.host, router.ssl_port), pki.ca.cert)]
    p = Conn(router.address)
    assert p.call(b"set any 0 0 12\r\nalice secret\r\n") == b"STORED"
    # (the harness's readiness check was a connection too: wait until the router has seen it go)
    wait_for(lambda: stats(p)["curr_connections"] == "3", what="three clients")
    # three clients are in (two TLS, one plaintext): the fourth, on the TLS port, gets memcached's refusal
    # inside TLS and is closed
    over = TlsConn((router.host, router.ssl_port), pki.ca.cert)
    assert over.line() == b"ERROR Too many open connections"
    for c in (t, *others, p, over):
        c.close()


class AuthRouter(Router):
    def ready(self) -> bool:
        return memcached_command((self.host, self.port), b"version\r\n").startswith(b"CLIENT_ERROR unauthenticated")


def _config(processes, config: dict) -> Path:
    path = processes.base / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_client_certificates_when_required(processes, memcached_factory, pki):
    mc = memcached_factory()
    d = pki.ca.cert.parent
    expired = tls.issue(
        pki.ca,
        d,
        "expired-client",
        not_before=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30),
        not_after=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1),
    )
    foreign = tls.issue(pki.other_ca, d / "other", "foreign-client")
    router = start_router(processes, plain_pool(mc), tls_args(pki, "--ssl-require-peer-certs"))
    addr = (router.host, router.ssl_port)
    good = TlsConn(addr, pki.ca.cert, cert=pki.client)
    assert good.call(b"set k 0 0 1\r\nv\r\n") == b"STORED"
    cases = [
        (None, "presented no certificate"),
        (foreign, "not signed by a trusted CA"),
        (expired, "certificate expired"),
    ]
    for n, (cert, why) in enumerate(cases, start=1):
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            # TLS 1.3: the client learns of the refusal at its first read
            TlsConn(addr, pki.ca.cert, cert=cert).call(b"get k\r\n")
        wait_for(lambda n=n: len(tls_lines(router)) >= n, what=f"the router's log line for {why}")
        line = tls_lines(router)[-1]
        assert why in line and "client 127.0.0.1:" in line, line
    assert len(tls_lines(router)) == len(cases), tls_lines(router)
    assert good.call(b"get k\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"


def test_a_plaintext_client_on_the_tls_port_is_one_log_line_and_no_flood(processes, memcached_factory, pki):
    mc = memcached_factory()
    router = start_router(processes, plain_pool(mc), tls_args(pki))
    c = Conn((router.host, router.ssl_port))
    c.send(b"get k\r\n")
    with pytest.raises(ConnectionError):
        c.line()
    wait_for(lambda: len(tls_lines(router)) == 1, what="the router's log line")
    line = tls_lines(router)[0]
    assert "client 127.0.0.1:" in line and "plaintext client on the TLS port" in line and "get k" in line, line
    # many of them: a few lines and a count, not a line each
    for _ in range(60):
        c = Conn((router.host, router.ssl_port))
        c.send(b"version\r\n")
        with pytest.raises(ConnectionError):
            c.line()
    p = Conn(router.address)
    wait_for(lambda: int(stats(p)["tls_handshake_failures"]) == 61, what="failures counted")
    assert len(tls_lines(router)) < 30, len(tls_lines(router))


def test_certificates_rotated_under_load_without_a_client_error(processes, memcached_factory, pki):
    mc = memcached_factory()
    router = start_router(processes, plain_pool(mc), tls_args(pki))
    addr = (router.host, router.ssl_port)
    old_serial = pki.router.load_cert().serial_number
    errors: list[BaseException] = []
    done = threading.Event()
    counts = {"requests": 0, "connections": 0}

    def load() -> None:
        try:
            kept = TlsConn(addr, pki.ca.cert)  # one connection across the rotation
            i = 0
            while not done.is_set():
                i += 1
                assert kept.call(b"set k%d 0 0 1\r\nv\r\n" % (i % 50)) == b"STORED"
                fresh = TlsConn(addr, pki.ca.cert)  # and a new one each round
                assert fresh.call(b"get k%d\r\n" % (i % 50)) == b"VALUE k%d 0 1\r\nv\r\nEND\r\n" % (i % 50)
                fresh.close()
                counts["requests"] += 2
                counts["connections"] += 1
            assert kept.call(b"version\r\n").startswith(b"VERSION")
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    workers = [threading.Thread(target=load) for _ in range(2)]
    for w in workers:
        w.start()
    wait_for(lambda: counts["connections"] >= 20, what="load running")
    # rotate: a new certificate and key written over the files in place, then SIGHUP
    new = tls.issue(pki.ca, pki.router.cert.parent / "new", "router")
    pki.router.cert.write_bytes(new.cert.read_bytes())
    pki.router.key.write_bytes(new.key.read_bytes())
    router.proc.send_signal(signal.SIGHUP)
    new_serial = new.load_cert().serial_number
    assert new_serial != old_serial
    wait_for(lambda: TlsConn(addr, pki.ca.cert).peer_serial() == new_serial, what="new connections get the new cert")
    before = counts["connections"]
    wait_for(lambda: counts["connections"] >= before + 20, what="load after the rotation")
    done.set()
    for w in workers:
        w.join(30)
    assert not errors, errors
    assert "TLS certificate for clients reloaded on SIGHUP" in router.log_file.read_text()


def test_certificate_files_changed_are_picked_up_without_a_signal(processes, memcached_factory, pki):
    mc = memcached_factory()
    router = start_router(processes, plain_pool(mc), tls_args(pki))
    addr = (router.host, router.ssl_port)
    kept = TlsConn(addr, pki.ca.cert)
    assert kept.call(b"set k 0 0 1\r\nv\r\n") == b"STORED"
    new = tls.issue(pki.ca, pki.router.cert.parent / "new", "router")
    pki.router.key.write_bytes(new.key.read_bytes())
    pki.router.cert.write_bytes(new.cert.read_bytes())
    serial = new.load_cert().serial_number
    wait_for(lambda: TlsConn(addr, pki.ca.cert).peer_serial() == serial, what="the new certificate served")
    assert "reloaded (files changed)" in router.log_file.read_text()
    assert kept.call(b"get k\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"


def test_a_bad_certificate_file_on_sighup_keeps_the_old_one(processes, memcached_factory, pki):
    mc = memcached_factory()
    router = start_router(processes, plain_pool(mc), tls_args(pki))
    serial = pki.router.load_cert().serial_number
    pki.router.cert.write_text("not a certificate\n")
    router.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "rejected on SIGHUP" in router.log_file.read_text(), what="the rejection")
    assert str(pki.router.cert) in router.log_file.read_text()
    assert TlsConn((router.host, router.ssl_port), pki.ca.cert).peer_serial() == serial


# ---- server side ----


def tls_memcached(processes, pair: tls.CertPair, name: str = "memcached") -> Memcached:
    return processes.add(Memcached(workdir=processes.base / name, tls=(pair.cert, pair.key)))


def test_a_tls_pool_reaches_memcached_z_and_verifies_it(processes, pki):
    mc = tls_memcached(processes, pki.memcached)
    mc2 = tls_memcached(processes, pki.memcached, "memcached2")
    config = {
        "pools": {
            "secure": {"servers": [mc.address], "security_mech": "tls"},
            "suffix": {"servers": [f"{mc2.address}:ascii:ssl"]},
        },
        "route": {
            "type": "PrefixSelectorRoute",
            "policies": {"s:": "PoolRoute|suffix"},
            "wildcard": "PoolRoute|secure",
        },
    }
    router = start_router(processes, config, ("--pem-ca-path", str(pki.ca.cert)), ssl=False)
    c = Conn(router.address)
    assert c.call(b"set k 0 0 2\r\nhi\r\n") == b"STORED"
    assert c.call(b"set s:k 0 0 2\r\nho\r\n") == b"STORED"
    assert c.call(b"get k\r\n") == b"VALUE k 0 2\r\nhi\r\nEND\r\n"
    assert tls_memcached_command((mc.host, mc.port), b"get k\r\n", ca=pki.ca.cert) == b"VALUE k 0 2\r\nhi\r\nEND"
    assert tls_memcached_command((mc2.host, mc2.port), b"get s:k\r\n", ca=pki.ca.cert).startswith(b"VALUE s:k")


def test_a_tls_pool_without_a_ca_is_refused_at_start(tmp_path, pki):
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps({"pools": {"p": {"servers": ["127.0.0.1:1"], "security_mech": "tls"}}, "route": "PoolRoute|p"})
    )
    out = subprocess.run(
        [str(ROUTER_BIN), "-f", str(config), "-p", str(free_port())], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 1
    assert "pool `p`" in out.stderr and "--pem-ca-path" in out.stderr, out.stderr
    config.write_text(
        json.dumps({"pools": {"p": {"servers": ["127.0.0.1:1"], "security_mech": "quic"}}, "route": "PoolRoute|p"})
    )
    out = subprocess.run(
        [str(ROUTER_BIN), "-f", str(config), "-p", str(free_port()), "--pem-ca-path", str(pki.ca.cert)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and "security_mech `quic` is not supported" in out.stderr, out.stderr


def test_a_killed_tls_server_is_tkod_and_gets_its_spooled_deletes_over_tls(processes, pki):
    mc = tls_memcached(processes, pki.memcached)
    config = {"pools": {"p": {"servers": [mc.address], "security_mech": "tls"}}, "route": "PoolRoute|p"}
    router = start_router(processes, config, ("--pem-ca-path", str(pki.ca.cert)), ssl=False)
    c = Conn(router.address)
    assert c.call(b"set user:1 0 0 1\r\nv\r\n") == b"STORED"
    mc.kill()
    assert c.call(b"delete user:1\r\n") == b"NOT_FOUND"  # spooled, answered as mcrouter does
    wait_for(lambda: int(stats(c)["servers_tko"]) == 1, what="TKO")
    mc.start()  # back empty; give it the stale copy a partitioned server could hold
    assert tls_memcached_command((mc.host, mc.port), b"set user:1 0 0 5\r\nstale\r\n", ca=pki.ca.cert) == b"STORED"
    wait_for(
        lambda: tls_memcached_command((mc.host, mc.port), b"get user:1\r\n", ca=pki.ca.cert) == b"END",
        what="the spooled delete replayed over TLS",
    )
    wait_for(lambda: int(stats(c)["servers_tko"]) == 0, what="TKO cleared")
    assert int(stats(c)["replayed_deletes"]) >= 1
    assert c.call(b"get user:1\r\n") == b"END"
    assert c.call(b"set user:2 0 0 1\r\nw\r\n") == b"STORED"


@pytest.mark.parametrize("case", ["wrong CA", "expired", "hostname mismatch"])
def test_a_bad_server_certificate_is_one_clear_log_line(processes, pki, case):
    d = pki.ca.cert.parent / "bad"
    now = datetime.datetime.now(datetime.UTC)
    pair, why = {
        "wrong CA": (lambda: tls.issue(pki.other_ca, d, "mc"), "not signed by a trusted CA"),
        "expired": (
            lambda: tls.issue(
                pki.ca, d, "mc", not_before=now - datetime.timedelta(days=9), not_after=now - datetime.timedelta(days=1)
            ),
            "certificate expired",
        ),
        "hostname mismatch": (lambda: tls.issue(pki.ca, d, "mc", hosts=("cache.example",)), "hostname mismatch"),
    }[case]
    mc = tls_memcached(processes, pair())
    config = {"pools": {"p": {"servers": [mc.address], "security_mech": "tls"}}, "route": "PoolRoute|p"}
    router = start_router(processes, config, ("--pem-ca-path", str(pki.ca.cert)), ssl=False)
    c = Conn(router.address)
    for _ in range(5):
        assert c.call(b"get k\r\n").startswith(b"SERVER_ERROR")
    lines = [line for line in router.log_file.read_text().splitlines() if "TLS handshake failed" in line]
    assert len(lines) == 1, lines
    assert f"server {mc.address}" in lines[0] and why in lines[0], lines[0]
    # memcached itself is fine over TLS for a client that does not check
    assert tls_memcached_command((mc.host, mc.port), b"version\r\n").startswith(b"VERSION")


class VerifyingMemcached(Memcached):
    """memcached -Z that demands a client certificate signed by `ca` (`ssl_verify_mode=2`)."""

    def __init__(self, ca: Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ca = ca

    def command(self) -> list[str]:
        return super().command() + ["-o", f"ssl_ca_cert={self.ca},ssl_verify_mode=2"]

    def ready(self) -> bool:
        with socket.create_connection((self.host, self.port), timeout=2):
            return True


def test_the_router_shows_its_certificate_to_a_memcached_that_demands_one(processes, pki):
    mc = processes.add(
        VerifyingMemcached(pki.ca.cert, workdir=processes.base / "mc", tls=(pki.memcached.cert, pki.memcached.key))
    )
    config = {"pools": {"p": {"servers": [mc.address], "security_mech": "tls"}}, "route": "PoolRoute|p"}
    with_cert = start_router(processes, config, tls_args(pki), ssl=False)
    c = Conn(with_cert.address)
    assert c.call(b"set k 0 0 1\r\nv\r\n") == b"STORED"
    assert c.call(b"get k\r\n") == b"VALUE k 0 1\r\nv\r\nEND\r\n"
    # without --pem-cert-path memcached refuses the router: the request fails, one TKO line says so
    without = start_router(processes, config, ("--pem-ca-path", str(pki.ca.cert)), name="router2", ssl=False)
    c2 = Conn(without.address)
    assert c2.call(b"get k\r\n").startswith(b"SERVER_ERROR")
    lines = [line for line in without.log_file.read_text().splitlines() if "marked TKO" in line]
    assert len(lines) == 1 and mc.address in lines[0] and "client certificate (--pem-cert-path)" in lines[0], lines


def test_a_plaintext_pool_in_front_of_memcached_z_says_the_server_may_require_tls(processes, pki):
    """memcached -Z resets a plaintext `version`: the router's log says the server may want TLS and how to say so."""
    mc = tls_memcached(processes, pki.memcached)
    config = {"pools": {"p": {"servers": [mc.address]}}, "route": "PoolRoute|p"}
    router = start_router(processes, config, (), ssl=False)
    assert Conn(router.address).call(b"get k\r\n").startswith(b"SERVER_ERROR")
    wait_for(lambda: f"server {mc.address}" in router.log_file.read_text(), what="the failure logged")
    line = next(x for x in router.log_file.read_text().splitlines() if f"server {mc.address}" in x)
    assert "may require TLS" in line and '"security_mech": "tls"' in line, line


def test_a_tls_pool_in_front_of_a_plaintext_memcached_blames_the_server_not_a_client(processes, memcached_factory, pki):
    mc = memcached_factory()
    config = {"pools": {"p": {"servers": [mc.address], "security_mech": "tls"}}, "route": "PoolRoute|p"}
    router = start_router(processes, config, ("--pem-ca-path", str(pki.ca.cert)), ssl=False)
    assert Conn(router.address).call(b"get k\r\n").startswith(b"SERVER_ERROR")
    wait_for(lambda: "TLS handshake failed" in router.log_file.read_text(), what="the handshake failure logged")
    line = next(x for x in router.log_file.read_text().splitlines() if "TLS handshake failed" in x)
    assert "plaintext client" not in line, line
    assert "did not answer in TLS" in line and "-Z" in line, line
