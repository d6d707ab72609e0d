"""Each link's TLS state, as its clients see it (the dashboard's "links" table, `/api/links`).

A link is a server of the topology and who dials it: the routers (squeal's deletes, the web tier, monitoring),
each memcached (its cluster's routers), each MariaDB copy (squeal's binlog readers, the web tier, monitoring),
each replica's stream from the copy it replicates, each ZooKeeper server (squeal). Its state is observed, not
read from the configuration: the monitoring server dials every server as a client of the topology would —
with `[tls]` a verifying TLS handshake (`router_config.tls_context`, `connect_database`), without it plaintext —
and reports what it got: the protocol (`TLSv1.3`), the certificate's expiry, or why it failed. A replica's
stream is what the replica reports (`SHOW SLAVE STATUS`: `Master_SSL_Allowed`, `Master_SSL_Verify_Server_Cert`).
It never tries plaintext against a TLS port (each refused attempt would be a line in that server's log).
"""

from __future__ import annotations

import datetime
import socket
import ssl
from dataclasses import asdict, dataclass
from typing import Any

import pymysql

from monitoring.polling import Poller
from router_config import Database, Topology, connect_database, tls_context

TIMEOUT = 2.0


@dataclass(frozen=True)
class Link:
    """A server and who dials it; `kind` says how to ask it: memcache, mysql, replication, zookeeper."""

    server: str  # "router east-a", "memcached east-a/wildcard", "mariadb east", "zookeeper 1"
    clients: str  # "squeal, web tier, monitoring"
    address: str  # host:port
    kind: str


@dataclass(frozen=True)
class LinkState:
    """`tls`: True encrypted (and verified), False plaintext, None not known (the server did not answer)."""

    link: Link
    tls: bool | None
    detail: str  # "TLSv1.3, certificate valid until 2028-01-01" / "plaintext" / why it failed

    def as_json(self) -> dict[str, Any]:
        return asdict(self.link) | {"tls": self.tls, "detail": self.detail}


def links(topo: Topology) -> list[Link]:
    """Every link of the topology, servers in the order `squealctl up` starts them (ZooKeeper comes last here)."""
    out: list[Link] = []
    copies: dict[str, Database] = {}
    for shard in topo.shards:
        for db in shard.copies:
            copies[db.name] = db
    for region in topo.regions:
        for db in region.replicas:
            copies[db.name] = db
    for name, db in copies.items():
        out.append(Link(f"mariadb {name}", "squeal, web tier, monitoring", str(db.address), "mysql"))
    for shard in topo.shards:
        for db in shard.copies:
            if db.role == "replica":
                source = f"replication from {shard.primary.name}"
                out.append(Link(f"mariadb {db.name}", source, str(db.address), "replication"))
    for region in topo.regions:
        for db in region.replicas:
            source = db.replicates_from or region.database.name
            out.append(Link(f"mariadb {db.name}", f"replication from {source}", str(db.address), "replication"))
        if region.regional_pool is not None:
            for a in region.regional_pool.servers:
                out.append(Link(f"memcached {region.name}/regional", f"routers of {region.name}", str(a), "memcache"))
        for c in region.clusters:
            for a in c.routers:
                out.append(Link(f"router {c.name}", "squeal, web tier, monitoring", str(a), "memcache"))
            for p in c.pools:
                for a in p.servers:
                    out.append(Link(f"memcached {c.name}/{p.name}", f"routers of {c.name}", str(a), "memcache"))
    if topo.zookeeper is not None:
        for i, a in enumerate(topo.zookeeper.servers, 1):
            out.append(Link(f"zookeeper {i}", "squeal", str(a), "zookeeper"))
    return out


def _until(not_after: str | None) -> str:
    """A certificate's `notAfter` (OpenSSL's text: `SSLSocket.getpeercert()`, MariaDB's Ssl_server_not_after) as
    ", certificate valid until YYYY-MM-DD"."""
    if not not_after:
        return ""
    when = datetime.datetime.fromtimestamp(ssl.cert_time_to_seconds(not_after), datetime.UTC)
    return f", certificate valid until {when:%Y-%m-%d}"


def _stream(link: Link, ctx: ssl.SSLContext | None, hello: bytes) -> tuple[bytes, str]:
    """Dial `link`, TLS if `ctx`, send `hello`, read the answer; (answer, the TLS description or "")."""
    host, _, port = link.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as raw:
        sock: socket.socket = raw
        described = ""
        if ctx is not None:
            tls = ctx.wrap_socket(raw, server_hostname=host)
            not_after = (tls.getpeercert() or {}).get("notAfter")
            described = f"{tls.version()}{_until(not_after if isinstance(not_after, str) else None)}"
            sock = tls
        sock.sendall(hello)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
            if answer.endswith(b"\r\n") and hello != b"srvr":
                break
        return answer, described


def _mysql(db: Database) -> pymysql.connections.Connection:
    return connect_database(db, "monitoring", connect_timeout=TIMEOUT)


def check(link: Link, topo: Topology) -> LinkState:
    """Dial one link as its clients do and say what it is."""
    try:
        if link.kind in ("memcache", "zookeeper"):
            hello, expect = (b"version\r\n", b"VERSION") if link.kind == "memcache" else (b"srvr", b"Mode:")
            answer, described = _stream(link, tls_context(topo.tls, "monitoring"), hello)
            if expect not in answer:
                return LinkState(link, None, f"no {expect.decode()} answer ({answer[:40]!r})")
            return LinkState(link, topo.tls is not None, described or "plaintext")
        db = _database(topo, link)
        with _mysql(db) as conn, conn.cursor(pymysql.cursors.DictCursor) as cur:
            if link.kind == "mysql":
                cur.execute("SHOW SESSION STATUS LIKE 'Ssl_version'")
                row = cur.fetchone() or {}
                version = row.get("Value") or ""
                cur.execute("SHOW SESSION STATUS LIKE 'Ssl_server_not_after'")
                until = (cur.fetchone() or {}).get("Value") or ""
                if not version:
                    return LinkState(link, False, "plaintext")
                return LinkState(link, True, f"{version}{_until(until)}")
            cur.execute("SHOW SLAVE STATUS")
            status = cur.fetchone()
            if not status:
                return LinkState(link, None, "not replicating (no SHOW SLAVE STATUS row)")
            if status.get("Master_SSL_Allowed") != "Yes":
                return LinkState(link, False, "plaintext (MASTER_SSL = 0)")
            verified = status.get("Master_SSL_Verify_Server_Cert") == "Yes"
            running = status.get("Slave_IO_Running")
            return LinkState(
                link, True, f"MASTER_SSL, {'primary verified' if verified else 'primary NOT verified'}, IO {running}"
            )
    except ssl.SSLError as e:
        return LinkState(link, None, f"TLS handshake failed: {getattr(e, 'verify_message', None) or e.reason or e}")
    except (OSError, pymysql.MySQLError) as e:
        return LinkState(link, None, f"does not answer: {e}")


def _database(topo: Topology, link: Link) -> Database:
    name = link.server.removeprefix("mariadb ")
    for shard in topo.shards:
        for db in shard.copies:
            if db.name == name:
                return db
    for region in topo.regions:
        for db in region.replicas:
            if db.name == name:
                return db
    raise KeyError(f"{topo.source}: no database copy {name!r}")


class LinkWatch(Poller):
    """`check` on every link every `interval` seconds on a thread of its own; `snapshot()` is the last round."""

    thread_name = "links"
    failure = "checking the links' TLS failed"

    def __init__(self, topo: Topology, interval: float = 10.0) -> None:
        super().__init__(topo, interval)

    def look(self) -> list[dict[str, Any]]:
        return [check(link, self.topo).as_json() for link in links(self.topo)]
