"""`squealctl up TOPOLOGY --demo --tls` (issue 25's acceptance): every hop encrypted.

The topology is a small one, not examples/local.toml (3 ZooKeeper servers, 6 MariaDB, 22 memcached, 4 routers,
4 squeal instances: minutes of start-up for CI) — but it has one of every kind of link local.toml has: an HA
region (two squeal instances, a ZooKeeper server, an extra GTID replica), a replica region with its single
daemon, routers, wildcard and regional pools, the monitoring server and the demo web tier.

`up --tls` makes a local CA and certificates and runs the topology with `[tls]` added. Then a plaintext client
is refused on every TLS port of the deployment — router, memcached, MariaDB, ZooKeeper — while a client
verifying the CA is served; replication runs over TLS; a write deletes its key in both regions through the
routers' TLS ports; the dashboard's links all say TLS; `squealctl flush` and the memcached scrape work over
TLS; the demo load runs and `squealctl verify` finds nothing stale.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pymysql
import pytest

import router_config
from monitoring.scrape import memcached_stats
from ops.harness import ROUTER_BIN, memcached_command, wait_until, zookeeper_mode
from tests.binaries import require_binary
from tests.ops.deployments import EAST_TWO_WORKERS, squealctl, squealctl_up, write_on_stable_ports
from tests.topologies import webtier_rules

WITHIN = 60.0  # a deadline for something that must happen, not a speed check

# Placeholder ports (the loader wants them distinct): every one is moved to a free port.
TOPOLOGY = (
    """
[zookeeper]
servers = ["127.0.0.1:1"]
session_timeout_s = 2

"""
    + webtier_rules("app", canary=True)
    + """
[regions.east]
master = true
database = { role = "primary", port = 2, server_id = 1 }
regional_pool = { servers = ["127.0.0.1:3"], prefixes = ["regional:", "rmk:"] }

[regions.east.clusters.east-a]
routers = ["127.0.0.1:4"]
pools.wildcard = { kind = "wildcard", servers = ["127.0.0.1:5"] }
"""
    + EAST_TWO_WORKERS  # placeholder ports 10-12
    + """
[regions.west]
database = { role = "replica", port = 9, server_id = 2 }
regional_pool = { servers = ["127.0.0.1:13"], prefixes = ["regional:", "rmk:"] }

[regions.west.clusters.west-a]
routers = ["127.0.0.1:14"]
pools.wildcard = { kind = "wildcard", servers = ["127.0.0.1:15"] }
"""
)


@dataclass
class TlsDeployment:
    source: Path  # the topology file `up --tls` was given (no [tls])
    topo: router_config.Topology  # what runs: the same plus [tls]
    state: Path

    @property
    def ca(self) -> Path:
        return self.state / "tls" / "ca.crt"

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsDeployment]:
    require_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")
    require_binary(Path("/usr/share/java/netty-codec.jar").exists(), "libnetty-java not installed")
    base = tmp_path_factory.mktemp("tls-deployment")
    path = base / "topology.toml"
    write_on_stable_ports(TOPOLOGY, path)
    state = base / "state"
    with squealctl_up(state, path, "--tls", "--demo", "--demo-rate", "10"):
        running = json.loads((state / "components.json").read_text())["topology"]
        yield TlsDeployment(path, router_config.load(running), state)


def _plaintext_answer(address: router_config.Address, command: bytes) -> bytes:
    """What a plaintext client gets for `command`: b"" when the server closes or resets the connection."""
    try:
        return memcached_command((address.host, address.port), command, timeout=5)
    except OSError:
        return b""


def test_up_tls_runs_the_topology_with_tls_and_every_component_answers(deployed: TlsDeployment) -> None:
    assert router_config.load(deployed.source).tls is None  # the file given is left as it was
    tls = deployed.topo.tls
    assert tls is not None and tls.require and tls.ca == str(deployed.ca)
    assert {name for name, _ in tls.certs} == set(router_config.TLS_COMPONENTS)
    rows = json.loads(squealctl(deployed.state, "status", "--json").stdout)
    assert rows and all(r["running"] and r["answering"] for r in rows), rows
    recorded = json.loads((deployed.state / "components.json").read_text())["components"]
    routers = [c["cmdline"] for c in recorded if c["role"] == "router"]
    assert len(routers) == 2 and all("-p" not in c and "--ssl-port" in c for c in routers), routers
    # Every client of the routers verified them and was served: squeal, the web tier, monitoring.
    for cluster in deployed.topo.clusters:
        stats = memcached_stats(str(cluster.routers[0]), timeout=5, tls=deployed.context())
        assert stats["tls_handshakes"] > 0 and stats["tls_handshake_failures"] == 0, (cluster.name, stats)


def test_every_tls_port_refuses_a_plaintext_client_and_serves_one_that_verifies_the_ca(
    deployed: TlsDeployment,
) -> None:
    topo, ctx = deployed.topo, deployed.context()
    caches = [(role, a) for role, _, a in topo.listeners() if role in ("router", "memcached")]
    assert len(caches) == 6  # 2 routers, 2 wildcard + 2 regional memcached
    for role, a in caches:
        assert not _plaintext_answer(a, b"version\r\n").startswith(b"VERSION"), f"{role} {a} answered plaintext"
        reply = memcached_command((a.host, a.port), b"version\r\n", timeout=5, tls=ctx)
        assert reply.startswith(b"VERSION"), f"{role} {a}: {reply!r}"
    databases = [d for s in topo.shards for d in s.copies] + [d for r in topo.regions for d in r.replicas]
    assert len(databases) == 3
    for db in databases:
        for user, password in ((db.user, db.password), ("root", "")):  # root: password-less, TCP from 127.0.0.1
            with pytest.raises(pymysql.err.OperationalError) as refused:
                pymysql.connect(
                    host=db.host, port=db.port, user=user, password=password, ssl_disabled=True, connect_timeout=5
                )
            assert refused.value.args[0] in (1045, 3159), f"{db.name} as {user}: {refused.value}"
        with (
            pymysql.connect(
                host=db.host, port=db.port, user=db.user, password=db.password, ssl=ctx, connect_timeout=5
            ) as conn,
            conn.cursor() as cur,
        ):
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
            assert (cur.fetchone() or ("", ""))[1].startswith("TLSv1"), db.name
    assert topo.zookeeper is not None
    for zk in topo.zookeeper.servers:
        assert zookeeper_mode(str(zk)) is None, f"ZooKeeper {zk} answered srvr in plaintext"
        assert zookeeper_mode(str(zk), ctx) == "standalone"


def test_replication_between_the_copies_runs_over_tls(deployed: TlsDeployment) -> None:
    replicas = [d for s in deployed.topo.shards for d in s.copies if d.role == "replica"]
    replicas += [d for r in deployed.topo.regions for d in r.replicas]
    assert len(replicas) == 2
    for db in replicas:
        with (
            pymysql.connect(
                host=db.host, port=db.port, user=db.user, password=db.password, ssl=deployed.context()
            ) as conn,
            conn.cursor(pymysql.cursors.DictCursor) as cur,
        ):
            cur.execute("SHOW SLAVE STATUS")
            status = cur.fetchone()
        assert status is not None, db.name
        assert (status["Master_SSL_Allowed"], status["Master_SSL_Verify_Server_Cert"]) == ("Yes", "Yes"), db.name
        assert (status["Slave_IO_Running"], status["Slave_SQL_Running"]) == ("Yes", "Yes"), status["Last_IO_Error"]


def test_a_write_deletes_its_key_through_the_tls_routers_of_both_regions(deployed: TlsDeployment) -> None:
    topo, ctx = deployed.topo, deployed.context()
    routers = [(c.routers[0].host, c.routers[0].port) for c in topo.clusters]
    key = "user:987001"
    for router in routers:
        assert memcached_command(router, f"set {key} 0 0 6\r\ncached\r\n".encode(), tls=ctx) == b"STORED"
    primary = topo.master.database
    with (
        pymysql.connect(
            host=primary.host, port=primary.port, user=primary.user, password=primary.password, ssl=ctx, autocommit=True
        ) as conn,
        conn.cursor() as cur,
    ):
        cur.execute(
            "INSERT INTO app.users (id, name, email) VALUES (987001, 'tls', 'tls@example') "
            "ON DUPLICATE KEY UPDATE name = 'tls2'"
        )
    for router in routers:
        wait_until(
            lambda r=router: memcached_command(r, f"get {key}\r\n".encode(), tls=ctx) == b"END",
            WITHIN,
            f"{key} deleted through router {router} (over TLS)",
        )


def test_the_dashboard_shows_every_link_over_tls(deployed: TlsDeployment) -> None:
    monitoring = deployed.topo.monitoring

    def links() -> list[dict]:
        with urllib.request.urlopen(f"http://{monitoring.host}:{monitoring.port}/api/links", timeout=5) as r:
            return json.loads(r.read())

    found = wait_until(links, WITHIN, "the monitoring server's first round of link checks")
    assert found is not None
    servers = {(link["server"], link["address"]) for link in found}
    # 3 MariaDB copies + 2 replication streams + 2 routers + 4 memcached + 1 ZooKeeper
    assert len(found) == 12 and len(servers) == 10, found
    assert all(link["tls"] is True for link in found), [link for link in found if link["tls"] is not True]
    assert all(link["detail"].startswith(("TLSv1", "MASTER_SSL, primary verified")) for link in found), found


def test_flush_and_the_memcached_scrape_work_over_tls(deployed: TlsDeployment) -> None:
    result = squealctl(deployed.state, "flush", "east-a", "--yes", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "flushed cluster east-a" in result.stdout
    monitoring = deployed.topo.monitoring

    def memcached_scraped() -> list[dict]:
        with urllib.request.urlopen(f"http://{monitoring.host}:{monitoring.port}/api/targets", timeout=5) as r:
            targets = [t for t in json.loads(r.read()) if t["kind"] == "memcached"]
        return targets if len(targets) == 4 and all(t["up"] for t in targets) else []

    wait_until(memcached_scraped, WITHIN, "every memcached's stats scraped over TLS by the monitoring server")


def test_the_demo_runs_and_verify_finds_nothing_stale(deployed: TlsDeployment) -> None:
    demo = next(r for r in json.loads(squealctl(deployed.state, "status", "--json").stdout) if r["role"] == "demo")

    def served() -> float:
        with urllib.request.urlopen(f"http://{demo['metrics']}/metrics", timeout=5) as r:
            text = r.read().decode()
        ok = [ln for ln in text.splitlines() if ln.startswith("squeal_demo_requests_total{") and 'outcome="ok"' in ln]
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in ok)

    wait_until(lambda: served() >= 50, WITHIN, "the demo web tier serving requests over TLS")
    # The file `up --tls` was given: squealctl reads the TLS copy the deployment runs.
    result = squealctl(deployed.state, "verify", str(deployed.source), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 stale" in result.stdout + result.stderr
