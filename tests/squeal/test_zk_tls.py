"""squeal on ZooKeeper's TLS client port, with ACLs on its root (issue 25, item 5).

A ZooKeeper 3.8 server with only a TLS client port (Netty, PEM key and trust stores): squeal's client, built
from the topology (`[tls]`, `[zookeeper] digest`), connects verifying the server and writes its markers; a
plaintext client, or one that does not trust the server, gets no session; a client without squeal's
credential can read squeal's znodes but neither change nor delete them nor create new ones under the root.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.handlers.threading import KazooTimeoutError

import router_config
from ops import tls
from ops.harness import ZooKeeper
from router_config.model import IMPLICIT_SHARD
from squeal import zookeeper_client_options
from squeal.markers.zkstore import ShardMarkerStore
from squeal.pool.zookeeper import shard_path
from tests.conftest import _Processes
from tests.topologies import tls_section

ROOT = "/squeal-tls"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, tls.CertPair]:
    d = tmp_path_factory.mktemp("zk-pki")
    ca = tls.make_ca(d)
    return {
        "ca": ca,
        "other-ca": tls.make_ca(d, name="other-ca"),
        "zookeeper": tls.issue(ca, d, "zookeeper"),
        "squeal": tls.issue(ca, d, "squeal"),
        "intruder": tls.issue(ca, d, "intruder"),
    }


@pytest.fixture(scope="module")
def secure_zk(tmp_path_factory, pki) -> Iterator[ZooKeeper]:
    procs = _Processes(tmp_path_factory.mktemp("zk-tls"))
    try:
        yield procs.add(
            ZooKeeper(
                workdir=procs.base, ssl_cert=pki["zookeeper"].cert, ssl_key=pki["zookeeper"].key, ssl_ca=pki["ca"].cert
            )
        )
    finally:
        procs.stop_all()


def topology(tmp_path: Path, zk: ZooKeeper, pki: dict[str, tls.CertPair]) -> router_config.Topology:
    path = tmp_path / "topo.toml"
    path.write_text(
        tls_section(pki)
        + f"""[zookeeper]
servers = ["{zk.host}:{zk.port}"]
root = "{ROOT}"
digest = "squeal:s3cret"
[regions.east]
master = true
database = {{ role = "primary", port = 1, server_id = 1 }}
[regions.east.clusters.a]
routers = ["127.0.0.1:2"]
pools.wildcard = {{ servers = ["127.0.0.1:3"] }}
"""
    )
    return router_config.load(path)


def started(zk: ZooKeeper, **options) -> KazooClient:
    client = KazooClient(hosts=f"{zk.host}:{zk.port}", timeout=5, connection_retry={"max_tries": 0}, **options)
    try:
        client.start(timeout=5)  # a deadline for a refusal, not a speed check
    except Exception:
        client.close()
        raise
    return client


def test_squeal_writes_markers_over_tls_and_a_foreign_client_cannot(tmp_path, secure_zk, pki):
    topo = topology(tmp_path, secure_zk, pki)
    options = zookeeper_client_options(topo)
    assert options["use_ssl"] and options["check_hostname"] and options["ca"] == str(pki["ca"].cert)
    squeal = started(secure_zk, **options)
    try:
        store = ShardMarkerStore(squeal, ROOT, "east", "main", owner="test")
        store.check_writable()
        assert store.load("east-a") is None
        store.save("east-a", "0-1-5")
        assert store.load("east-a") == "0-1-5"

        # Someone with a certificate from the same CA, over TLS, but without squeal's credential.
        intruder = started(
            secure_zk,
            use_ssl=True,
            ca=str(pki["ca"].cert),
            certfile=str(pki["intruder"].cert),
            keyfile=str(pki["intruder"].key),
            check_hostname=True,
        )
        try:
            marker = store.markers_path
            assert b"0-1-5" in intruder.get(marker)[0]  # reading is allowed
            with pytest.raises(NoAuthError):
                intruder.set(marker, b'{"positions": {"east-a": "0-1-999999"}}')
            with pytest.raises(NoAuthError):
                intruder.delete(marker)
            with pytest.raises(NoAuthError):
                intruder.create(f"{store.data}/replay/east-a", b"{}")  # (a replay request of its own)
            with pytest.raises(NoAuthError):
                intruder.create(f"{ROOT}/regions/west", b"")
            # not even with a digest of its own
            intruder.add_auth("digest", "squeal:guessed")
            with pytest.raises(NoAuthError):
                intruder.set(marker, b"{}")
        finally:
            intruder.stop()
            intruder.close()
        assert store.load("east-a") == "0-1-5"
        store.save("east-a", "0-1-6")  # squeal still can
        assert store.load("east-a") == "0-1-6"
    finally:
        squeal.stop()
        squeal.close()


def test_a_plaintext_client_gets_no_session_on_the_tls_port(secure_zk):
    with pytest.raises(KazooTimeoutError):
        started(secure_zk)


def test_a_client_that_does_not_trust_the_server_gets_no_session(secure_zk, pki):
    with pytest.raises(Exception) as e:
        started(secure_zk, use_ssl=True, ca=str(pki["other-ca"].cert), check_hostname=True)
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value) or isinstance(e.value, KazooTimeoutError), e.value


def test_a_pool_worker_owns_and_invalidates_over_tls_everywhere(tmp_path, secure_zk, pki):
    """`squeal run --instance` with [tls] and a digest: ZooKeeper over TLS (ownership, markers with squeal's ACL),
    MariaDB over TLS with an ed25519 REQUIRE SSL account, deletes over TLS to memcached -Z."""
    from squeal_helpers import create_schema, topology_text, unique_db, wait_gone, wait_until

    from ops.harness import MariaDB, SquealDaemon, free_port
    from tests.squeal.test_tls_mariadb import TlsMemcached

    procs = _Processes(tmp_path)
    try:
        db = procs.add(
            MariaDB(
                41,
                workdir=tmp_path / "db",
                ssl_cert=pki["zookeeper"].cert,
                ssl_key=pki["zookeeper"].key,
                ssl_ca=pki["ca"].cert,
                require_ssl=True,
                auth="ed25519",
            )
        )
        schema = unique_db("hatls")
        create_schema(db, schema)
        caches = [procs.add(TlsMemcached(pki["zookeeper"], pki["ca"], workdir=tmp_path / "mc")) for _ in range(2)]
        root = f"{ROOT}-ha"
        port = free_port()
        text = topology_text(db, schema, [m.port for m in caches], regional=False)
        text += (
            f'\n[[regions.east.squeal_instances]]\nname = "east-1"\ndatabase = "east"\nmetrics_port = {port}\n'
            f'\n[zookeeper]\nservers = ["{secure_zk.host}:{secure_zk.port}"]\nroot = "{root}"\n'
            'digest = "squeal:s3cret"\nsession_timeout_s = 3\n'
        )
        topo = tmp_path / "topology.toml"
        topo.write_text(tls_section(pki) + text)
        daemon = procs.add(
            SquealDaemon(
                topo,
                "east",
                port=port,
                workdir=tmp_path / "east-1",
                state_dir=tmp_path / "east-1" / "state",
                instance="east-1",
            )
        )
        # owning the region's shard and delivering: its flows start at the binlog's "now" (no datamarker yet)
        wait_until(lambda: f"shard {IMPLICIT_SHARD} delivering" in daemon.log_file.read_text(), 30, "east-1 to deliver")
        clients = [m.cache() for m in caches]
        for c in clients:
            c.set("user:71")
        db.execute(f"INSERT INTO {schema}.users VALUES (71, 'h@x', 'h')")
        wait_gone(clients, ["user:71"])

        intruder = started(secure_zk, use_ssl=True, ca=str(pki["ca"].cert), check_hostname=True)
        try:
            shard = shard_path(root, "east", IMPLICIT_SHARD)
            wait_until(lambda: intruder.exists(f"{shard}/markers") is not None, 30, "east-1's first marker")
            for path in (root, f"{shard}/epoch", f"{shard}/markers"):
                acls, _ = intruder.get_acls(path)
                assert {(a.id.scheme, a.perms) for a in acls} == {("digest", 31), ("world", 1)}, (path, acls)
            with pytest.raises(NoAuthError):
                intruder.set(f"{shard}/markers", b"{}")
        finally:
            intruder.stop()
            intruder.close()
    finally:
        procs.stop_all()
