"""The web tier's cache connections over TLS (issue 25, item 4): leases and remote markers against memcached
`-Z` (what a router's TLS port looks like to a client), the server verified against the topology's CA and the
web tier's certificate presented. A server from another CA is one WARNING line naming it and the reason, and
the usual fallback (reads from the database), not a traceback per request.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Callable

import pytest
from client_support import next_name, sql_for
from pymemcache.client.base import Client

from leases import LeaseCache, connect
from ops import tls
from ops.harness import ROUTER_BIN, Memcached, free_port
from remote_markers import RemoteMarkers, marker_key
from router_config import CertKey, TlsSettings, client_context
from tests.binaries import needs_binary


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tls.CertPair]:
    d = tmp_path_factory.mktemp("pki")
    ca = tls.make_ca(d)
    other = tls.make_ca(d, name="other-ca", common_name="someone else's CA")
    return {
        "ca": ca,
        "other-ca": other,
        "memcached": tls.issue(ca, d, "memcached"),
        "webtier": tls.issue(ca, d, "webtier"),
    }


def settings(pki: dict[str, tls.CertPair], ca: str = "ca") -> TlsSettings:
    web = pki["webtier"]
    return TlsSettings(ca=str(pki[ca].cert), require=True, certs=(("webtier", CertKey(str(web.cert), str(web.key))),))


def context_fn(pki: dict[str, tls.CertPair], ca: str = "ca") -> Callable[[], ssl.SSLContext]:
    return functools.partial(client_context, settings(pki, ca), "webtier")


@pytest.fixture
def tls_memcached(memcached_factory, pki) -> Memcached:
    m = pki["memcached"]
    return memcached_factory(tls=(m.cert, m.key), ssl_ca=pki["ca"].cert)


def direct(mc: Memcached) -> Client:
    """The test's own TLS client of the server (pymemcache), to see what the web tier stored."""
    return Client((mc.host, mc.port), tls_context=mc.ssl_context(), connect_timeout=2, timeout=2)


def test_a_lease_get_and_fill_over_tls(tls_memcached, pki):
    cache = LeaseCache(connect([tls_memcached.address], tls=context_fn(pki)), name=f"tls-{next_name()}")
    loads: list[int] = []

    def load() -> dict[str, int]:
        loads.append(1)
        return {"id": 7}

    assert cache.get_or_fill("user:7", load, ttl=60) == {"id": 7}  # miss: the lease won, filled with its CAS
    assert cache.get_or_fill("user:7", load, ttl=60) == {"id": 7}  # hit
    assert len(loads) == 1
    assert direct(tls_memcached).get("user:7") is not None  # it really is in the TLS server
    assert cache.stats.errors == 0


def test_a_plaintext_client_is_refused_by_the_tls_server(tls_memcached):
    cache = LeaseCache(connect([tls_memcached.address], connect_timeout=1, recv_timeout=1), name=f"p-{next_name()}")
    assert cache.get_or_fill("user:8", lambda: "db", ttl=60) == "db"  # fell back to the loader
    assert direct(tls_memcached).get("user:8") is None
    assert cache.stats.errors >= 1


def test_a_remote_marker_round_trip_over_tls(tls_memcached, pki, mariadb_pair, client_db):
    primary, replica = mariadb_pair
    cache = LeaseCache(connect([tls_memcached.address], tls=context_fn(pki)), name=f"tls-rm-{next_name()}")
    master, local = sql_for(primary, client_db, "master"), sql_for(replica, client_db, "replica")
    rm = RemoteMarkers(cache, master=master, local=local, is_master_region=False)
    try:
        key = f"user:tls{next_name()}"
        assert rm.has_marker(key) is False and rm.database_for(key) is local
        rm.write_with_marker([key], "UPDATE users SET name = 'tls' WHERE id = 0")
        assert direct(tls_memcached).get(marker_key(key)) is not None  # the marker, set over TLS
        assert rm.has_marker(key) is True and rm.database_for(key) is master  # and read back over TLS
    finally:
        master.close()
        local.close()


def test_a_server_from_another_ca_is_one_warning_and_the_database_answers(tls_memcached, pki, caplog):
    caplog.set_level(logging.DEBUG, logger="leases")
    cache = LeaseCache(
        connect([tls_memcached.address], tls=context_fn(pki, "other-ca"), mark_down_period=0.0),
        name=f"bad-{next_name()}",
    )
    for i in range(5):
        assert cache.get_or_fill(f"user:bad{i}", lambda i=i: {"id": i}, ttl=60) == {"id": i}  # the fallback
    tls_lines = [r for r in caplog.records if "TLS to memcache" in r.getMessage()]
    assert len(tls_lines) == 1, [r.getMessage() for r in caplog.records]
    line = tls_lines[0]
    assert line.levelno == logging.WARNING and tls_memcached.address in line.getMessage()
    assert "certificate verify failed" in line.getMessage(), line.getMessage()
    assert not [r for r in caplog.records if r.exc_info], "no tracebacks"
    assert direct(tls_memcached).get("user:bad0") is None  # the client refused the server: nothing filled


@needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")
def test_a_lease_and_a_remote_marker_through_the_routers_tls_port(memcached_factory, router_factory, pki):
    """The real thing: squeal-router's `--ssl-port` (its TLS listener) in front of a plaintext memcached."""
    mc = memcached_factory()
    router_cert = pki["memcached"]  # any certificate of the CA for 127.0.0.1 will do for the router
    router = router_factory(
        {"pools": {"A": {"servers": [mc.address]}}, "route": "PoolRoute|A"},
        ssl_port=free_port(),
        extra_args=("--pem-cert-path", str(router_cert.cert), "--pem-key-path", str(router_cert.key)),
    )
    tls_address = f"{router.host}:{router.ssl_port}"
    cache = LeaseCache(connect([tls_address], tls=context_fn(pki)), name=f"router-tls-{next_name()}")
    loads: list[int] = []
    assert cache.get_or_fill("user:9", lambda: loads.append(1) or {"id": 9}, ttl=60) == {"id": 9}
    assert cache.get_or_fill("user:9", lambda: loads.append(1) or {"id": 9}, ttl=60) == {"id": 9}
    assert len(loads) == 1 and cache.stats.errors == 0
    assert Client((mc.host, mc.port)).get("user:9") is not None  # through the router into memcached
    assert cache.set(marker_key("user:9"), 1, 60) and cache.exists(marker_key("user:9")) is True
