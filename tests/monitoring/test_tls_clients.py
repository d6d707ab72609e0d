"""monitoring's and the web tier's clients of MariaDB honour `[tls]` (issue 25, item 6).

The same checks run twice: against a plaintext MariaDB, and against a hardened one (certificate from a local
CA, the account `REQUIRE SSL` and `IDENTIFIED VIA ed25519`, the topology's `[tls] require = true`). The web
tier writes and fills the caches, `squealctl verify` finds the one planted stale value, and the prober's canary
reaches every cluster through a running squeal — with the same answers on both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
from pymemcache.client.base import Client

import router_config
from loadtest.webtier import WebServer, schema_statements
from monitoring.prober import Prober
from monitoring.scrape import scrape_prometheus
from monitoring.verify import EXIT_STALE, verify
from ops import cli, tls
from ops.harness import MariaDB, MonitoringServer, SquealDaemon, free_port
from tests.conftest import _Processes
from tests.topologies import east_region, webtier_rules

GRACE = 0.3


def topology(*, metrics: int, tls: str, port: int, ma: str, mb: str, pa: int, pb: int) -> str:
    """`tls` (a `[tls]` section or nothing), the web tier's rules for tls_app and the prober's canary; region
    east's primary on `port`, its clusters a and b memcacheds standing in for their routers (`ma`, `mb`; their
    wildcard pools on ports `pa`, `pb`)."""
    return (
        f"[squeal]\nmetrics_port_base = {metrics}\n{tls}"
        + webtier_rules("tls_app", canary=True)
        + east_region(port, {"a": (ma, f"127.0.0.1:{pa}"), "b": (mb, f"127.0.0.1:{pb}")})
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tls.CertPair]:
    d = tmp_path_factory.mktemp("pki")
    ca = tls.make_ca(d)
    return {"ca": ca, **{name: tls.issue(ca, d, name) for name in ("mariadb", "squeal", "monitoring", "webtier")}}


@pytest.fixture(scope="module", params=["plaintext", "tls"])
def server(request, tmp_path_factory, pki) -> Iterator[tuple[str, MariaDB]]:
    procs = _Processes(tmp_path_factory.mktemp(f"mariadb-{request.param}"))
    try:
        if request.param == "plaintext":
            yield request.param, procs.add(MariaDB(41, workdir=procs.base / "db"))
        else:
            m = pki["mariadb"]
            yield (
                request.param,
                procs.add(
                    MariaDB(
                        42,
                        workdir=procs.base / "db",
                        ssl_cert=m.cert,
                        ssl_key=m.key,
                        ssl_ca=pki["ca"].cert,
                        require_ssl=True,
                        auth="ed25519",
                    )
                ),
            )
    finally:
        procs.stop_all()


def tls_section(pki: dict[str, tls.CertPair]) -> str:
    out = f'[tls]\nca = "{pki["ca"].cert}"\nrequire = true\n'
    for name in ("squeal", "monitoring", "webtier"):
        out += f'[tls.{name}]\ncert = "{pki[name].cert}"\nkey = "{pki[name].key}"\n'
    return out


@pytest.fixture
def world(server, pki, memcached_factory, processes, tmp_path):
    kind, db = server
    # each memcached stands in for its cluster's router (with [tls]: memcached -Z for the router's TLS port)
    mc = {}
    if kind == "tls":
        mc = {"tls": (pki["mariadb"].cert, pki["mariadb"].key), "ssl_ca": pki["ca"].cert}
    caches = {"a": memcached_factory(**mc), "b": memcached_factory(**mc)}
    path = tmp_path / "topology.toml"
    path.write_text(
        topology(
            metrics=free_port(),
            tls=tls_section(pki) if kind == "tls" else "",
            port=db.port,
            ma=caches["a"].address,
            mb=caches["b"].address,
            pa=free_port(),
            pb=free_port(),
        )
    )
    topo = router_config.load(path)
    assert (topo.master.database.tls is not None) == (kind == "tls")
    db.execute("DROP DATABASE IF EXISTS tls_app", *schema_statements("tls_app"))
    clients = {c: Client(("127.0.0.1", m.port), tls_context=m.ssl_context()) for c, m in caches.items()}
    return kind, db, topo, path, clients


def test_only_the_hardened_server_refuses_a_plaintext_client(server):
    kind, db = server

    def plaintext() -> None:
        pymysql.connect(host=db.host, port=db.port, user=db.user, password=db.password, ssl_disabled=True).close()

    if kind == "plaintext":
        plaintext()  # the baseline takes it, so the refusal below is the hardening's doing
    else:
        with pytest.raises(pymysql.err.OperationalError):
            plaintext()


def test_web_tier_and_verify_give_the_same_answers_over_tls(world, capsys):
    kind, db, topo, path, clients = world
    web = WebServer(topo, "east", "a", database="tls_app")
    try:
        ids = [web.create_user(f"u{i}", f"u{i}@tls.example") for i in range(4)]
        for user_id in ids:
            web.get_user(user_id)  # fill cluster a through the real read path (TLS to MariaDB if [tls])
        report = verify(topo, sample=None, grace=GRACE)
        assert report.ok and report.checked == len(ids) and report.unchecked == (), (kind, report)

        row = web.master.query_one("SELECT id, name, email FROM users WHERE id = %s", (ids[0],))
        clients["b"].set(f"user:{ids[0]}", json.dumps({**row, "name": "old"}).encode(), expire=300, flags=64)
        report = verify(topo, sample=None, grace=GRACE)
        assert {(s.cluster, s.key) for s in report.stale} == {("b", f"user:{ids[0]}")}, (kind, report)
        assert report.exit_code == EXIT_STALE

        code = cli.main(["verify", str(path), "--all", "--grace", str(GRACE)])
        out, err = capsys.readouterr()
        assert code == EXIT_STALE and f"b: user:{ids[0]} is stale" in out and "1 stale" in out, (kind, out, err)
    finally:
        web.close()


def test_the_prober_canary_reaches_every_cluster_over_tls(world, processes, tmp_path: Path):
    kind, db, topo, path, _ = world
    probe = Prober(topo, deadline=20.0)
    probe.ensure_canary_table()  # over TLS when [tls]: the hardened account refuses anything else
    processes.add(SquealDaemon(path, "east", workdir=tmp_path / "squeal", state_dir=tmp_path / "state"))
    results = [probe.probe_once() for _ in range(2)]
    for r in results:
        assert set(r.latencies) == {"a", "b"} and None not in r.latencies.values(), (kind, r)


def expiry_series(address: str) -> dict[tuple[str, str], float]:
    return {
        (labels["component"], labels["path"]): value
        for name, labels, value in scrape_prometheus(address)
        if name == "squeal_tls_cert_expiry_timestamp_seconds"
    }


def test_every_component_exports_its_certificates_expiry(world, pki, processes, tmp_path: Path):
    """squeal exports the CA's and its own certificate's expiry; the monitoring server every certificate [tls]
    names (MariaDB, ZooKeeper and memcached have no /metrics of their own). Plaintext: no such series."""
    kind, db, topo, path, _ = world
    Prober(topo).ensure_canary_table()
    daemon = processes.add(SquealDaemon(path, "east", workdir=tmp_path / "squeal", state_dir=tmp_path / "state"))
    mon = processes.add(
        MonitoringServer(path, tmp_path / "state", workdir=tmp_path / "mon", extra_args=("--no-prober",))
    )
    squeal_addr = daemon.address  # ready: its /healthz (and /metrics) answer
    got_squeal, got_mon = expiry_series(squeal_addr), expiry_series(mon.address)
    if kind == "plaintext":
        assert got_squeal == {} and got_mon == {}
        return
    when = {name: tls.expires_at(pair.cert).timestamp() for name, pair in pki.items()}
    assert got_squeal == {("ca", str(pki["ca"].cert)): when["ca"], ("squeal", str(pki["squeal"].cert)): when["squeal"]}
    assert got_mon == {
        ("ca", str(pki["ca"].cert)): when["ca"],
        **{(n, str(pki[n].cert)): when[n] for n in ("squeal", "monitoring", "webtier")},
    }
