"""A MariaDB server: a datadir of its own, the squeal account, TLS and GTID replication."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pymysql

from ops.processes.base import HarnessError, ManagedProcess, require_binary

log = logging.getLogger(__name__)


class MariaDB(ManagedProcess):
    """A MariaDB server with the binlog settings squeal needs (ROW, FULL image + metadata, annotations, GTID).

    `user`/`password`: a TCP account (root has no password; the test account is created at start).
    TLS (issue 25): `ssl_cert`/`ssl_key`/`ssl_ca` start the server with `--ssl-cert/--ssl-key/--ssl-ca`;
    `require_ssl` creates the account `REQUIRE SSL`; `secure_transport_only` refuses every plaintext TCP
    connection, whatever the account (`--require-secure-transport`: root's password-less TCP account too; the
    Unix socket still counts as secure); `auth = "ed25519"` creates the account `IDENTIFIED VIA ed25519` (the
    `auth_ed25519` plugin, loaded at start). `connect()` then dials with TLS, verifying against `ssl_ca`, and a
    replica (`replicate_from`) replicates over TLS (`MASTER_SSL`), verifying its primary the same way.
    """

    name = "mariadb"
    start_timeout = 60.0
    user = "squeal"
    password = "squeal"

    def __init__(
        self,
        server_id: int,
        port: int | None = None,
        workdir: str | Path | None = None,
        host: str = "127.0.0.1",
        replica: bool = False,
        gtid_domain_id: int | None = None,
        ssl_cert: str | Path | None = None,
        ssl_key: str | Path | None = None,
        ssl_ca: str | Path | None = None,
        require_ssl: bool = False,
        auth: str = "mysql_native_password",
        secure_transport_only: bool = False,
    ) -> None:
        super().__init__(port, workdir, host)
        if auth not in ("mysql_native_password", "ed25519"):
            raise HarnessError(f"MariaDB auth {auth!r}: expected mysql_native_password or ed25519")
        if (require_ssl or secure_transport_only) and not (ssl_cert and ssl_key):
            raise HarnessError("MariaDB require_ssl and secure_transport_only need ssl_cert and ssl_key")
        self.ssl_cert, self.ssl_key, self.ssl_ca = ssl_cert, ssl_key, ssl_ca
        self.require_ssl, self.secure_transport_only = require_ssl, secure_transport_only
        self.auth = auth
        self.server_id = server_id
        self.replica = replica
        # A shard's domain (router_config Shard): its primary's GTIDs name the shard (D-S-N); None: MariaDB's 0.
        self.gtid_domain_id = gtid_domain_id
        self.datadir = self.workdir / f"data-{self.port}"
        # A tmpdir of its own: a MariaDB server removes the `#sql*` files it finds in its tmpdir when it starts,
        # and with a shared /tmp that was another server's mariadb-install-db at work ("Could not remove
        # temporary table ... ERROR: 1051 Unknown table 'mysql.tmp_user_sys'").
        self.tmpdir = self.workdir / f"tmp-{self.port}"
        self.socket_path = self.workdir / f"mariadb-{self.port}.sock"
        self.mariadbd = require_binary("mariadbd", "mariadb-server", search=("/usr/sbin/mariadbd",))
        self.install_db = require_binary("mariadb-install-db", "mariadb-server")

    def prepare(self) -> None:
        # An existing datadir is reused as is (`squealctl up` after `down` keeps its data and binlogs).
        # mariadb-install-db would not wipe it either (it prints "mysql.user table already exists!" and exits 0),
        # but there is nothing for it to do.
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        if (self.datadir / "mysql").exists():
            return
        self.datadir.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [
                self.install_db,
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--tmpdir={self.tmpdir}",
                "--auth-root-authentication-method=normal",
                "--user=root",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise HarnessError(f"mariadb-install-db failed for {self.datadir}:\n{result.stdout}\n{result.stderr}")

    def command(self) -> list[str]:
        cmd = [
            self.mariadbd,
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--tmpdir={self.tmpdir}",
            f"--port={self.port}",
            f"--bind-address={self.host}",
            f"--socket={self.socket_path}",
            "--user=root",
            f"--server-id={self.server_id}",
            f"--log-bin={self.datadir}/binlog",
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL",
            "--binlog-annotate-row-events=ON",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=16M",
            "--performance-schema=OFF",
            "--max-connections=500",
            f"--pid-file={self.workdir}/mariadb-{self.port}.pid",
            f"--log-error={self.log_file}",
        ]
        if self.gtid_domain_id is not None:
            cmd.append(f"--gtid-domain-id={self.gtid_domain_id}")
        if self.ssl_cert and self.ssl_key:
            cmd += [f"--ssl-cert={self.ssl_cert}", f"--ssl-key={self.ssl_key}"]
            if self.ssl_ca:
                cmd.append(f"--ssl-ca={self.ssl_ca}")
        if self.secure_transport_only:
            cmd.append("--require-secure-transport=ON")
        if self.auth == "ed25519":
            cmd.append("--plugin-load-add=auth_ed25519")
        if self.replica:
            cmd += ["--log-slave-updates", "--read-only=OFF"]
        return cmd

    def ready(self) -> bool:
        try:
            conn = pymysql.connect(unix_socket=str(self.socket_path), user="root", connect_timeout=1)
        except pymysql.err.OperationalError:
            return False
        with conn, conn.cursor() as cur:
            if self.replica:
                # Not binlogged on a replica: a local transaction would take the next sequence number of
                # domain 0 in the replica's binlog, which the primary's next transactions then repeat (0-2-9
                # before 0-1-8 after a restart), and squeal, which compares sequence numbers per domain, would
                # skip those as already done. The primary's own CREATE USER replicates here anyway.
                cur.execute("SET SESSION sql_log_bin = 0")
            # Idempotent: a restarted server keeps its accounts.
            if self.auth == "ed25519":
                identified = f"IDENTIFIED VIA ed25519 USING PASSWORD('{self.password}')"
            else:
                identified = f"IDENTIFIED BY '{self.password}'"
            require = "REQUIRE SSL" if self.require_ssl else "REQUIRE NONE"
            cur.execute(f"CREATE USER IF NOT EXISTS '{self.user}'@'%' {identified} {require}")
            # A reused datadir (`up --tls`, then `up`) keeps the account's old REQUIRE: this start's setting wins.
            cur.execute(f"ALTER USER '{self.user}'@'%' {require}")
            cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{self.user}'@'%' WITH GRANT OPTION")
        return True

    def ssl_settings(self) -> dict | None:
        """PyMySQL's `ssl` argument for a client of this server (None: plaintext): verify against `ssl_ca`."""
        if not (self.ssl_cert and self.ssl_key):
            return None
        return {"ca": str(self.ssl_ca)} if self.ssl_ca else {"check_hostname": False}

    def connect(self, database: str | None = None, **kwargs) -> pymysql.connections.Connection:
        """A PyMySQL connection over TCP as the squeal account, autocommit on by default (TLS if the server
        has a certificate)."""
        kwargs.setdefault("autocommit", True)
        ssl = self.ssl_settings()
        if ssl is not None:
            kwargs.setdefault("ssl", ssl)
        return pymysql.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, database=database, **kwargs
        )

    def execute(self, *statements: str) -> list[tuple]:
        """Run statements in one autocommit session; returns the rows of the last one."""
        with self.connect() as conn, conn.cursor() as cur:
            rows: list[tuple] = []
            for sql in statements:
                cur.execute(sql)
                rows = list(cur.fetchall())
            return rows

    def gtid_binlog_pos(self) -> str:
        return self.execute("SELECT @@gtid_binlog_pos")[0][0]

    def replicate_from(self, primary: MariaDB) -> None:
        """Make this server a GTID replica of `primary` and start replicating.

        Safe to re-run on a replica already set up (a reused datadir: it restarts its replication threads by
        itself): MASTER_USE_GTID=slave_pos resumes from @@gtid_slave_pos, which is stored in the datadir.

        A primary with a certificate is replicated from over TLS (`MASTER_SSL`), its certificate and host name
        verified against its `ssl_ca`, this server presenting its own certificate: the binlog stream between
        regions is encrypted like every other link.
        """
        tls = ", MASTER_SSL=0"  # explicitly: CHANGE MASTER keeps what it is not told (a reused datadir's TLS)
        if primary.ssl_cert and primary.ssl_key:
            if not primary.ssl_ca:
                raise HarnessError(f"replicating over TLS from {primary.address} needs its ssl_ca to verify it")
            tls = f", MASTER_SSL=1, MASTER_SSL_CA='{primary.ssl_ca}', MASTER_SSL_VERIFY_SERVER_CERT=1"
            if self.ssl_cert and self.ssl_key:
                tls += f", MASTER_SSL_CERT='{self.ssl_cert}', MASTER_SSL_KEY='{self.ssl_key}'"
        self.execute(
            "STOP SLAVE",
            f"CHANGE MASTER TO MASTER_HOST='{primary.host}', MASTER_PORT={primary.port}, "
            f"MASTER_USER='{primary.user}', MASTER_PASSWORD='{primary.password}', MASTER_USE_GTID=slave_pos, "
            f"MASTER_CONNECT_RETRY=1{tls}",
            "START SLAVE",
        )

    def wait_for_gtid(self, gtid_pos: str, timeout: float = 30.0) -> None:
        """Block until this replica has applied `gtid_pos` (e.g. the primary's @@gtid_binlog_pos)."""
        result = self.execute(f"SELECT MASTER_GTID_WAIT('{gtid_pos}', {timeout})")[0][0]
        if result != 0:
            status = self.execute("SHOW SLAVE STATUS")
            raise HarnessError(f"replica on {self.address} did not reach {gtid_pos} in {timeout}s: {status}")
