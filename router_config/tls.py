"""The client side of `[tls]` for every package: one place that turns the topology's TLS settings into
what a client library wants (an `ssl.SSLContext`, PyMySQL's connection options) and reads a certificate's
expiry for the metric.

It lives here, at the bottom of the layers, because every package that dials something (squeal, the web
tier's leases and remote markers, monitoring, ops, loadtest) reads the topology and may import
`router_config`, and none of them may import each other in both directions. ZooKeeper's kazoo options stay
with squeal (`squeal.zookeeper_client_options`): only squeal's identity may write there.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from router_config.loader import TopologyError
from router_config.model import CertKey, Database, TlsSettings, Topology


def verifying_context(ca: str | None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client context that verifies the server's certificate and host name against `ca` (None: the
    system's trust store), presenting `cert`/`key` if given. Build one per connection: renewed files count."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    if cert and key:
        ctx.load_cert_chain(cert, key)
    return ctx


def handshake_failure_reason(e: BaseException) -> str:
    """Why a TLS handshake failed, in words: OpenSSL's verify message, or what a protocol error means here
    (every client of a TLS server logs the same reason for the same failure)."""
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {e.verify_message}"
    if isinstance(e, ssl.SSLError):
        if e.reason in ("WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"):
            return f"the server does not answer TLS on this port (a plaintext port?) ({e.reason})"
        return e.reason or str(e)
    return str(e) or type(e).__name__


def client_context(tls: TlsSettings, component: str) -> ssl.SSLContext:
    """A verifying client context from `[tls]`, presenting `component`'s certificate if it has one."""
    mine = tls.cert(component)
    return verifying_context(tls.ca, mine.cert if mine else None, mine.key if mine else None)


def tls_context(tls: TlsSettings | None, component: str) -> ssl.SSLContext | None:
    """What a client of the routers and memcached dials with: `client_context` with `[tls]`, None (plaintext)
    without. Every memcached-protocol client outside squeal's Twisted sender takes it (pymemcache's
    `tls_context`, `ops.harness.memcached_command`): with `[tls]` the topology's router and memcached ports
    speak TLS only."""
    return client_context(tls, component) if tls is not None else None


# The servers a `[tls]` topology starts (`squealctl up`) or renders (`render systemd`) with a certificate of their
# own, and what it serves: the words of the error naming a missing `[tls.<component>]`.
TLS_SERVERS = {
    "zookeeper": "ZooKeeper's TLS client port ([zookeeper] servers)",
    "mariadb": "MariaDB's TLS (the databases of the topology)",
    "memcached": "memcached's TLS port (-Z) on every pool server",
    "router": "the routers' TLS port (--ssl-port) on every router address",
}


def server_certificate(topo: Topology, component: str) -> CertKey:
    """`[tls.<component>]` of a server in `TLS_SERVERS`, which it needs under `[tls]`; a TopologyError naming the
    missing key (`tls.router`, or `tls.ca`) and what it is for."""
    assert topo.tls is not None
    mine = topo.tls.cert(component)
    if mine is None or topo.tls.ca is None:
        missing = f"tls.{component}" if mine is None else "tls.ca"
        raise TopologyError(topo.source, missing, f"[tls] needs it for {TLS_SERVERS[component]}")
    return mine


def mysql_options(db: Database, component: str) -> dict[str, Any]:
    """PyMySQL `connect()` keyword arguments for dialling `db` as `component`: with `[tls]` a verifying context
    (the server's certificate and name checked against the topology's CA; `component`'s certificate
    presented), else plaintext explicitly — PyMySQL would otherwise try unverified TLS with any server that
    offers it."""
    if db.tls is None:
        return {"ssl_disabled": True}
    return {"ssl": client_context(db.tls, component)}


def connect_database(db: Database, component: str, **kwargs: Any) -> Any:
    """A PyMySQL connection to `db` as `component`, dialled as `mysql_options` says (autocommit, a 5 s connect
    timeout unless `kwargs` say otherwise): the one place a topology's database is dialled by its clients."""
    import pymysql  # here: most importers of router_config never dial a database

    options = {"autocommit": True, "connect_timeout": 5, **kwargs, **mysql_options(db, component)}
    return pymysql.connect(host=db.host, port=db.port, user=db.user, password=db.password, **options)


def cert_expiry_timestamp(cert_path: str | Path) -> float:
    """When the (first) certificate in a PEM file stops being valid, as a Unix timestamp (the expiry metric,
    `squeal_tls_cert_expiry_timestamp_seconds`)."""
    from cryptography import x509  # imported here: most clients never read a certificate themselves

    path = Path(cert_path)
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError as e:
        raise ValueError(f"{path}: not a PEM certificate ({e})") from e
    return cert.not_valid_after_utc.timestamp()


def certificate_files(tls: TlsSettings) -> list[tuple[str, str]]:
    """Every certificate `[tls]` names, as (component, path): the CA as component "ca", then each component's."""
    out = [("ca", tls.ca)] if tls.ca else []
    return out + [(name, ck.cert) for name, ck in tls.certs]
