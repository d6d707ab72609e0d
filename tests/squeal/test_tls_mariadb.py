"""squeal's binlog readers over TLS to a hardened MariaDB (issue 25, item 3).

The server has a certificate from a local CA (ops.tls) and squeal's account is `REQUIRE SSL` and
`IDENTIFIED VIA ed25519`: each reader must stream a committed row's keys, verifying the server. A server the
reader cannot trust (another CA, an expired certificate, a certificate for another name) gives one warning
naming the server and the reason, the reader retries, and its position does not move. The deletes go over
TLS too (the Sender, to memcached `-Z` standing in for a router's TLS port), the server verified alike.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pymysql
import pytest
from squeal_helpers import Cache, create_schema, topology_text, unique_db, wait_gone, wait_until

from ops import tls
from ops.harness import MariaDB, Memcached, SquealDaemon
from router_config import Rule
from squeal.keys.rules import KeyExtractor, delete_line
from squeal.read import gtid as g
from squeal.read.native import NativeBinlogReader, native_module
from squeal.read.reader import BinlogReader, Source
from squeal.read.transactions import CommittedRun, Restart, Rows
from tests.conftest import _Processes
from tests.topologies import tls_section

native_module()  # part of the package: never skipped


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tls.CertPair]:
    d = tmp_path_factory.mktemp("pki")
    ca = tls.make_ca(d)
    other = tls.make_ca(d, name="other-ca", common_name="someone else's CA")
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    return {
        "ca": ca,
        "other-ca": other,
        "mariadb": tls.issue(ca, d, "mariadb"),
        "squeal": tls.issue(ca, d, "squeal"),
        "expired": tls.issue(ca, d, "expired", not_before=past - datetime.timedelta(days=30), not_after=past),
        "elsewhere": tls.issue(ca, d, "elsewhere", hosts=("db.elsewhere.example", "10.9.9.9")),
    }


def tls_server(procs: _Processes, pki: dict[str, tls.CertPair], cert: str, server_id: int) -> MariaDB:
    pair = pki[cert]
    return procs.add(
        MariaDB(
            server_id,
            workdir=procs.base / cert,
            ssl_cert=pair.cert,
            ssl_key=pair.key,
            ssl_ca=pki["ca"].cert,
            require_ssl=True,
            auth="ed25519",
        )
    )


@pytest.fixture(scope="module")
def hardened(tmp_path_factory, pki) -> Iterator[MariaDB]:
    """A MariaDB whose squeal account is REQUIRE SSL and ed25519."""
    procs = _Processes(tmp_path_factory.mktemp("tls-mariadb"))
    try:
        yield tls_server(procs, pki, "mariadb", 31)
    finally:
        procs.stop_all()


def source_of(db: MariaDB, pki: dict[str, tls.CertPair], ca: str = "ca") -> Source:
    return Source(
        db.host,
        db.port,
        db.user,
        db.password,
        tls=True,
        ssl_ca=str(pki[ca].cert),
        ssl_cert=str(pki["squeal"].cert),
        ssl_key=str(pki["squeal"].key),
    )


def reader_for(kind: str, source: Source, start: g.Position, rules: list[Rule]):
    extractor = KeyExtractor(rules)
    if kind == "python":
        return BinlogReader(source, start, extractor.tables, name=f"tls-{kind}", max_backoff=0.2)
    return NativeBinlogReader(source, start, extractor.tables, extractor.templates, name=f"tls-{kind}", max_backoff=0.2)


def test_the_account_really_is_hardened(hardened):
    plugin, ssl_type = hardened.execute("SELECT plugin, ssl_type FROM mysql.user WHERE user = 'squeal'")[0]
    assert (plugin, ssl_type) == ("ed25519", "ANY")
    with pytest.raises(pymysql.err.OperationalError) as e:  # the same account without TLS is refused
        pymysql.connect(
            host=hardened.host, port=hardened.port, user=hardened.user, password=hardened.password, ssl_disabled=True
        )
    assert e.value.args[0] == 1045


@pytest.mark.parametrize("kind", ["python", "native"])
def test_reader_streams_a_committed_rows_keys_over_tls_with_ed25519(hardened, pki, kind):
    schema = unique_db(f"tls{kind}")
    hardened.execute(
        f"CREATE DATABASE {schema}", f"CREATE TABLE {schema}.users (id INT PRIMARY KEY, email VARCHAR(100))"
    )
    start = g.parse_position(hardened.gtid_binlog_pos())
    hardened.execute(f"INSERT INTO {schema}.users VALUES (7, 'seven@example')")
    rules = [Rule(table=f"{schema}.users", keys=("user:{id}",))]
    reader = reader_for(kind, source_of(hardened, pki), start, rules)
    found: list[Rows | CommittedRun] = []
    for ev in reader:
        assert not isinstance(ev, Restart), f"the {kind} reader lost its connection"
        if isinstance(ev, Rows) and ev.table == "users" or isinstance(ev, CommittedRun):
            found.append(ev)
            reader.stop()
    assert len(found) == 1
    if kind == "python":
        assert isinstance(found[0], Rows) and found[0].images == ({"id": 7, "email": "seven@example"},)
    else:  # an ordinary transaction: the native reader hands it on whole, as a run
        run = found[0]
        assert isinstance(run, CommittedRun), run
        lines = (tuple(run.cluster_lines), tuple(run.regional_lines))
        assert (lines, run.transactions) == (((delete_line("user:7")[0],), ()), 1)
    assert reader.errors == 0


BAD = {  # how the reader is let down -> words its one warning must hold (besides the server's address)
    "wrong-ca": ("not signed by the CA squeal trusts", "other-ca.crt", "certificate verify failed"),
    "expired": ("expired", "certificate verify failed"),
    "hostname": ("not valid for", "certificate verify failed"),
}


@pytest.fixture(scope="module")
def untrusted(tmp_path_factory, pki, hardened) -> Iterator[dict[str, Callable[[], Source]]]:
    """For each bad case, the source a reader dials: a server it must not trust."""
    procs = _Processes(tmp_path_factory.mktemp("tls-bad"))
    try:
        expired = tls_server(procs, pki, "expired", 32)
        elsewhere = tls_server(procs, pki, "elsewhere", 33)
        yield {
            "wrong-ca": lambda: source_of(hardened, pki, ca="other-ca"),
            "expired": lambda: source_of(expired, pki),
            "hostname": lambda: source_of(elsewhere, pki),
        }
    finally:
        procs.stop_all()


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("kind", ["python", "native"])
def test_an_untrusted_server_gives_one_clear_error_and_the_reader_retries(untrusted, caplog, kind, case):
    source = untrusted[case]()
    start = {0: (1, 1)}
    reader = reader_for(kind, source, start, [Rule(table="app.users", keys=("user:{id}",))])
    caplog.set_level(logging.WARNING, logger="squeal.read.reader")
    restarts = 0
    for ev in reader:
        assert not isinstance(ev, Rows | CommittedRun)
        if isinstance(ev, Restart):
            restarts += 1
            if restarts == 2:  # it failed, said why, and tried again
                reader.stop()
    warnings = [r.getMessage() for r in caplog.records if r.name == "squeal.read.reader"]
    assert len(warnings) == 2, warnings
    message = warnings[0]
    assert f"TLS to MariaDB {source.host}:{source.port} failed" in message, message
    for words in BAD[case]:
        assert words in message, message
    assert reader.errors == 2
    assert reader.committed == start  # nothing read, nothing to move a datamarker


def test_the_topology_tls_section_reaches_the_reader(tmp_path, hardened, pki):
    import router_config
    from squeal.shard.daemon import source_for

    (tmp_path / "topo.toml").write_text(
        tls_section(pki)
        + f"""[regions.east]
master = true
database = {{ role = "primary", port = {hardened.port}, server_id = 31 }}
[regions.east.clusters.a]
routers = ["127.0.0.1:1"]
pools.wildcard = {{ servers = ["127.0.0.1:2"] }}
"""
    )
    source = source_for(router_config.load(Path(tmp_path / "topo.toml")).region("east"))
    assert source == source_of(hardened, pki)
    with source.connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW STATUS LIKE 'Ssl_version'")
        assert cur.fetchone()[1].startswith("TLSv1.")


@pytest.mark.parametrize("reader", ["native", "python"])
def test_squeal_daemon_invalidates_over_tls_from_a_hardened_account(tmp_path, hardened, pki, reader):
    """End to end: `squeal run` with the topology's [tls] reads the hardened server and deletes the row's keys, over
    TLS too (memcached -Z standing in for a router's TLS port)."""
    schema = unique_db(f"tlsd{reader}")
    create_schema(hardened, schema)
    procs = _Processes(tmp_path)
    try:
        caches = [procs.add(TlsMemcached(pki["mariadb"], pki["ca"], workdir=tmp_path / "mc")) for _ in range(2)]
        text = topology_text(hardened, schema, [m.port for m in caches], regional=False)
        topo = tmp_path / "topology.toml"
        topo.write_text(tls_section(pki) + text.replace("[squeal]\n", f'[squeal]\nreader = "{reader}"\n', 1))
        daemon = procs.add(SquealDaemon(topo, "east", workdir=tmp_path / "squeal", state_dir=tmp_path / "state"))
        clients = [m.cache() for m in caches]
        for c in clients:
            c.set_many(["user:41", "user:email:a@x"])
        hardened.execute(f"INSERT INTO {schema}.users VALUES (41, 'a@x', 'a')")
        wait_gone(clients, ["user:41", "user:email:a@x"])
        log = daemon.log_file.read_text()
        assert ("binlog reader: native" in log) == (reader == "native"), log[-2000:]
        assert "TLS to" not in log
    finally:
        procs.stop_all()


# -- deletes to the routers over TLS (the Sender), against memcached -Z ---------------------------------------


class TlsMemcached(Memcached):
    """memcached 1.6 with TLS on its one port (`-Z`, Debian's build): what a router's TLS port looks like to squeal."""

    def __init__(self, pair: tls.CertPair, ca: tls.CertPair, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pair, self.ca = pair, ca

    def command(self) -> list[str]:
        return [*super().command(), "-Z", "-o", f"ssl_chain_cert={self.pair.cert},ssl_key={self.pair.key}"]

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca.cert))

    def ready(self) -> bool:
        with (
            socket.create_connection((self.host, self.port), timeout=1) as s,
            self.context().wrap_socket(s, server_hostname=self.host) as t,
        ):
            t.sendall(b"version\r\n")
            return t.recv(64).startswith(b"VERSION")

    def cache(self) -> Cache:
        c = Cache(self.port, self.host)
        c.sock = self.context().wrap_socket(c.sock, server_hostname=self.host)
        return c


def tls_daemon(
    tmp_path: Path,
    db: MariaDB,
    pki,
    schema: str,
    caches: list[Memcached],
    procs: _Processes,
    delivery: str | None = None,
):
    topo = tmp_path / "topology.toml"
    text = topology_text(db, schema, [m.port for m in caches], regional=False, delivery=delivery)
    topo.write_text(tls_section(pki) + text)
    return procs.add(SquealDaemon(topo, "east", workdir=tmp_path / "squeal", state_dir=tmp_path / "state"))


@pytest.mark.parametrize("delivery", ["native", "python"])
def test_a_router_that_is_untrusted_or_plaintext_gets_no_deletes_and_its_flow_waits(tmp_path, hardened, pki, delivery):
    schema = unique_db("tlsbad")
    create_schema(hardened, schema)
    procs = _Processes(tmp_path)
    try:
        good = procs.add(TlsMemcached(pki["mariadb"], pki["ca"], workdir=tmp_path / "mc"))
        # a certificate from our CA, but for another host: the name check must refuse it
        bad = TlsMemcached(pki["elsewhere"], pki["ca"], workdir=tmp_path / "mc")
        bad.context = lambda: _no_name_check(pki)  # the test's own client only: squeal checks the name
        procs.add(bad)
        plain = procs.add(Memcached(workdir=tmp_path / "mc"))  # a plaintext port: TLS must not fall back
        daemon = tls_daemon(tmp_path, hardened, pki, schema, [good, bad, plain], procs, delivery)
        clients = [good.cache(), bad.cache(), Cache(plain.port)]
        for c in clients:
            c.set("user:61")
        hardened.execute(f"INSERT INTO {schema}.users VALUES (61, 'c@x', 'c')")
        wait_gone(clients[:1], ["user:61"])
        message = f"TLS to 127.0.0.1:{bad.port} failed: certificate verify failed"
        wait_until(lambda: message in daemon.log_file.read_text(), 30, "the flow's TLS warning")
        assert "mismatch" in daemon.log_file.read_text().split(message, 1)[1].split("\n", 1)[0]
        message = f"TLS to 127.0.0.1:{plain.port} failed: the server does not answer TLS on this port"
        wait_until(lambda: message in daemon.log_file.read_text(), 30, "the plaintext flow's TLS warning")
        assert clients[1].has("user:61") and clients[2].has("user:61")  # nothing was sent to either
        flows = json.loads(_healthz(daemon.port))["flows"]
        end = g.parse_position(hardened.gtid_binlog_pos())
        acked = {name: g.covers_position(g.parse_position(f["acked"]), end) for name, f in flows.items()}
        assert acked == {"c0": True, "c1": False, "c2": False}, flows
    finally:
        procs.stop_all()


def _no_name_check(pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"].cert))
    ctx.check_hostname = False
    return ctx


def _healthz(port: int) -> bytes:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
    except urllib.error.HTTPError as e:  # 503 while a flow cannot deliver: the body is the same JSON
        return e.read()
