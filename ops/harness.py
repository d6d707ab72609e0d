"""Start and stop the real processes squeal runs against: MariaDB, memcached, the router, ZooKeeper.

Used by `squealctl up` and by the test fixtures alike, so tests exercise exactly what operators run.
Every process gets a free loopback port, its own work directory (logs kept there) and is stopped by
pid: SIGTERM, then SIGKILL after a grace period. A missing binary is a clear error that says which
Debian package to install.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import pymysql

log = logging.getLogger(__name__)

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parent.parent
ROUTER_BIN = Path(os.environ.get("SQUEAL_ROUTER_BIN", REPO_ROOT / "router/target/release/squeal-router"))


class _Reaper:
    """This process's `python -m ops.reaper` (started on first use): told of every server `ManagedProcess.start`
    starts and stops, it kills the ones still running when this process ends without stopping them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = 0  # the pid that started it (a forked child must start its own)

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._owner != os.getpid():
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "ops.reaper"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    env=child_env(),
                    cwd=REPO_ROOT,
                    start_new_session=True,  # a signal to this process group must not end it before its parent
                    text=True,
                )
                self._owner = os.getpid()
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                log.warning("the reaper (pid %s) is gone: servers started from now on outlive a crash", self._proc.pid)

    def started(self, pid: int) -> None:
        from ops.reaper import start_time

        started = start_time(pid)
        if started is not None:
            self._send(f"+{pid} {started}")

    def stopped(self, pid: int) -> None:
        if self._proc is not None:
            self._send(f"-{pid}")


_reaper = _Reaper()


class HarnessError(RuntimeError):
    """A component could not be started (missing binary, failed readiness check)."""


_handed_out: set[int] = set()


def child_env() -> dict[str, str]:
    """The environment for the Python processes we start (squeal, monitoring, the supervisor): this checkout
    first on PYTHONPATH, so a child imports the same code as its parent even when the virtualenv's editable
    install points at another checkout (a git worktree sharing `.venv`)."""
    env = dict(os.environ)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + rest if rest else "")
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel picks it), never one this process handed out before:
    callers often ask for many ports before binding any (a whole topology), and must not get one twice."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def require_binary(name: str, package: str, *, search: tuple[str, ...] = ()) -> str:
    """Absolute path of `name`, or an error telling the operator how to install it."""
    found = shutil.which(name) or next((p for p in search if os.access(p, os.X_OK)), None)
    if not found:
        raise HarnessError(f"{name} not found: install it with `apt-get install {package}` (or run scripts/setup.sh)")
    return found


class Polled(Protocol):
    """What `wait_until` watches for an early exit: a Popen, or the supervisor's `Run`."""

    returncode: int | None

    def poll(self) -> int | None: ...


def wait_until(
    check: Callable[[], T],
    timeout: float,
    what: str = "condition",
    proc: Polled | None = None,
    log_file: Path | None = None,
    *,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (OSError,),
    error: type[Exception] | None = HarnessError,
) -> T | None:
    """Poll `check` every `interval` s until it returns something truthy, and return that: the one poll loop
    of the code base (start-up checks, experiments, drills, test helpers).

    `check` runs at least once, and once more at the deadline. An exception in `ignore` (default: OSError, a
    server not answering yet) counts as not yet. If `proc` (anything with `poll()`/`returncode`) exits, fail
    at once with `log_file`'s tail. Time out: raise `error` (saying `what` and the log tail), or, when
    `error` is None, return the last falsy result (None if `check` raised).
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise (error or HarnessError)(f"{what} exited with code {proc.returncode} during start-up{_tail(log_file)}")
        result = None
        with contextlib.suppress(*ignore):
            result = check()
        if result:
            return result
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(interval, left))
    if error is None:
        return result
    raise error(f"timed out after {timeout:g}s waiting for {what}{_tail(log_file)}")


def _tail(log_file: Path | None, lines: int = 15) -> str:
    if log_file is None or not log_file.exists():
        return ""
    text = log_file.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last lines of {log_file} ---\n" + "\n".join(text)


def memcached_command(
    address: tuple[str, int], command: bytes, timeout: float = 2.0, tls: ssl.SSLContext | None = None
) -> bytes:
    """Send one text command and return the reply up to its first line end (the terminator stripped). `tls`: the
    port speaks TLS (a topology with `[tls]`: `router_config.tls_context`), the server verified with it."""
    with contextlib.ExitStack() as stack:
        s = stack.enter_context(socket.create_connection(address, timeout=timeout))
        if tls is not None:
            s = stack.enter_context(tls.wrap_socket(s, server_hostname=address[0]))
        s.sendall(command)
        buf = b""
        while not buf.endswith(b"\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return buf.rstrip(b"\r\n")


def tls_memcached_command(
    address: tuple[str, int], command: bytes, timeout: float = 2.0, ca: Path | None = None
) -> bytes:
    """`memcached_command` over TLS: the server's certificate is checked against `ca` if given (else not at
    all: a readiness check of a server whose certificate is meant to be bad)."""
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not ca:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return memcached_command(address, command, timeout, tls=ctx)


class ManagedProcess:
    """One child process with a work dir, a log file and a readiness check. Context manager."""

    name = "process"

    def __init__(self, port: int | None = None, workdir: str | Path | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"squeal-{self.name}-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.workdir / f"{self.name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def prepare(self) -> None:
        """Anything to do before the first start (e.g. initialise a datadir)."""

    start_timeout = 30.0

    def start(self) -> ManagedProcess:
        if self.proc and self.proc.poll() is None:
            return self
        self.prepare()
        log_handle = open(self.log_file, "ab")
        log.info("starting %s on %s (log %s)", self.name, self.address, self.log_file)
        self.proc = subprocess.Popen(
            self.command(),
            env=child_env(),
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal must not kill children before we stop them
        )
        log_handle.close()
        _reaper.started(self.proc.pid)  # and if this process dies without stopping it, it goes too
        try:
            wait_until(self.ready, self.start_timeout, f"{self.name} on {self.address}", self.proc, self.log_file)
        except BaseException:
            self.kill()
            raise
        return self

    stop_signal = signal.SIGTERM

    def stop(self, grace: float = 10.0) -> None:
        """`stop_signal` (SIGTERM), wait up to `grace` seconds, then SIGKILL."""
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("%s pid %s ignored SIGTERM for %.0fs; killing", self.name, self.proc.pid, grace)
            self.kill()
        _reaper.stopped(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL: for tests that simulate a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            _reaper.stopped(self.proc.pid)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its port but stops answering (a hung server).

        Returns once every thread is stopped: a signal is delivered asynchronously, and on a busy machine a
        thread already running could still answer a request sent right after the kill."""
        assert self.proc is not None
        pid = self.proc.pid
        os.kill(pid, signal.SIGSTOP)

        def stopped() -> bool:
            try:
                return all(
                    (task / "stat").read_text().rpartition(")")[2].split()[0] in ("T", "t")
                    for task in Path(f"/proc/{pid}/task").iterdir()
                )
            except OSError:  # a thread exited while we looked: look again
                return False

        wait_until(stopped, 5.0, f"{self.name} pid {pid} to stop", interval=0.005)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Memcached(ManagedProcess):
    """memcached 1.6 on loopback, TCP only (`-U 0`).

    TLS (issue 25): `tls` = (certificate, key) starts it with `-Z` (TLS on its one port, Debian's build), what a
    router's TLS port looks like to a client; `ssl_ca` is the CA its readiness check and `ssl_context()` verify
    it against."""

    name = "memcached"
    # A graceful stop waits up to a second for memcached's maintenance threads to wake; a cache has
    # nothing to flush, and tests stop hundreds of them.
    stop_signal = signal.SIGKILL

    def __init__(
        self,
        port: int | None = None,
        workdir: str | Path | None = None,
        memory_mb: int = 64,
        host: str = "127.0.0.1",
        tls: tuple[Path, Path] | None = None,
        ssl_ca: str | Path | None = None,
    ) -> None:
        super().__init__(port, workdir, host)
        self.memory_mb = memory_mb
        self.binary = require_binary("memcached", "memcached")
        # (certificate chain, key) in PEM: the port speaks TLS only (`-Z`), see DESIGN.md "TLS facts"
        self.tls = tls
        self.ssl_ca = ssl_ca  # the CA that signed its certificate: what its clients (and `ready`) verify against

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context for this server (None: plaintext), verifying it against `ssl_ca` if given."""
        if not self.tls:
            return None
        if self.ssl_ca:
            return ssl.create_default_context(cafile=str(self.ssl_ca))
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        return ctx

    def command(self) -> list[str]:
        return [
            self.binary,
            "-l",
            self.host,
            "-p",
            str(self.port),
            "-U",
            "0",
            "-m",
            str(self.memory_mb),
            "-c",
            "4096",
            "-u",
            "root",
        ] + (["-Z", "-o", f"ssl_chain_cert={self.tls[0]},ssl_key={self.tls[1]}"] if self.tls else [])

    def ready(self) -> bool:
        if self.tls:
            ca = Path(self.ssl_ca) if self.ssl_ca else None
            return tls_memcached_command((self.host, self.port), b"version\r\n", ca=ca).startswith(b"VERSION")
        return memcached_command((self.host, self.port), b"version\r\n").startswith(b"VERSION")


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


class Router(ManagedProcess):
    """squeal-router (the Rust binary built by scripts/setup.sh) serving one cluster's config.

    `tls` = (certificate, key, CA) makes `port` a TLS-only port (`--ssl-port`, no plaintext `-p`: what a
    topology with `[tls]` runs): the router serves its certificate there, verifies TLS pools' memcached against
    the CA (`--pem-ca-path`) and presents the same certificate to them; its readiness check verifies it too.
    `ssl_port` instead adds a TLS port beside the plaintext one (its certificate flags in `extra_args`)."""

    name = "router"

    def __init__(
        self,
        config_path: str | Path,
        port: int | None = None,
        workdir: str | Path | None = None,
        metrics_port: int | None = None,
        spool_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        extra_args: tuple[str, ...] = (),
        ssl_port: int | None = None,
        tls: tuple[str | Path, str | Path, str | Path] | None = None,
    ) -> None:
        super().__init__(port, workdir, host)
        # a TLS port beside the plaintext one (`--ssl-port`; its certificate flags go in extra_args)
        self.ssl_port = ssl_port
        self.tls = tls
        if tls is not None and ssl_port is not None:
            raise HarnessError("Router: tls (a TLS-only port) and ssl_port (a TLS port beside -p) exclude each other")
        if not ROUTER_BIN.exists():
            raise HarnessError(f"{ROUTER_BIN} not built: run scripts/setup.sh (cargo build --release in router/)")
        self.config_path = Path(config_path)
        self.metrics_port = metrics_port
        self.spool_dir = Path(spool_dir) if spool_dir else self.workdir / f"spool-{self.port}"
        self.extra_args = extra_args

    def command(self) -> list[str]:
        cmd = [str(ROUTER_BIN), "--config-file", str(self.config_path)]
        if self.tls is None:
            cmd += ["-p", str(self.port)]
        else:
            cert, key, ca = self.tls
            cmd += ["--ssl-port", str(self.port), "--pem-cert-path", str(cert), "--pem-key-path", str(key)]
            cmd += ["--pem-ca-path", str(ca)]
        cmd += ["--listen", self.host, "--spool-dir", str(self.spool_dir)]
        if self.metrics_port:
            cmd += ["--metrics-port", str(self.metrics_port)]
        if self.ssl_port:
            cmd += ["--ssl-port", str(self.ssl_port)]
        return cmd + list(self.extra_args)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context for `port` (None: plaintext), verifying the router against its CA."""
        return ssl.create_default_context(cafile=str(self.tls[2])) if self.tls is not None else None

    def ready(self) -> bool:
        reply = memcached_command((self.host, self.port), b"version\r\n", tls=self.ssl_context())
        return reply.startswith(b"VERSION")


# ZooKeeper 3.8 as Debian's `zookeeper` package installs it: zookeeper.jar's manifest names its dependencies,
# /etc/zookeeper/conf holds its log4j settings. `squealctl up` and `squealctl render systemd` both start it so.
# It logs through SLF4J, whose binding the manifest leaves out: without one ZooKeeper logs nothing, not even why
# it exits. slf4j-simple (libslf4j-java, a dependency of the package) logs INFO and up to stderr, i.e. the
# process's log file (or the journal). zookeeper.jar stays last: `render systemd` checks it by that position.
ZOOKEEPER_CLASSPATH = "/etc/zookeeper/conf:/usr/share/java/slf4j-simple.jar:/usr/share/java/zookeeper.jar"
ZOOKEEPER_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
# slf4j-simple's settings: a timestamp on each line, and no line per four-letter command (the dashboard's link
# probe and `squealctl status` send `srvr` to every server each time they look).
ZOOKEEPER_LOGGING = (
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss.SSS",
    "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.NIOServerCnxn=warn",
    "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.NettyServerCnxn=warn",
)


def zookeeper_config(
    host: str,
    port: int,
    data_dir: str | Path,
    peers: tuple[tuple[int, str, int, int], ...] = (),
    tls: tuple[str | Path, str | Path] | None = None,
) -> str:
    """A server's zoo.cfg: clients on host:port, data in `data_dir` (which holds the `myid` of an ensemble member),
    the ensemble's `server.N=host:quorum:election` lines (none: standalone). tickTime 500 ms lets ZooKeeper grant
    squeal's session timeouts from 1 s (a server grants 2 to 20 ticks).

    `tls` = (key store PEM: key + certificate chain in one file, trust store PEM: the CA): host:port is then a
    TLS-only client port (`secureClientPort`, Netty's connection factory; no plaintext client port), and a client
    presenting a certificate must present one from the CA (`ssl.clientAuth=want`)."""
    if tls is None:
        text = f"tickTime=500\ndataDir={data_dir}\nclientPort={port}\nclientPortAddress={host}\n"
    else:
        keystore, truststore = tls
        text = (
            f"tickTime=500\ndataDir={data_dir}\nsecureClientPort={port}\nsecureClientPortAddress={host}\n"
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
            f"ssl.keyStore.location={keystore}\nssl.keyStore.type=PEM\n"
            f"ssl.trustStore.location={truststore}\nssl.trustStore.type=PEM\nssl.clientAuth=want\n"
        )
    text += "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,cons\n"
    if peers:
        text += "initLimit=10\nsyncLimit=5\n" + "".join(f"server.{i}={h}:{q}:{e}\n" for i, h, q, e in peers)
    return text


class ZooKeeper(ManagedProcess):
    """A ZooKeeper 3.8 server (Debian package) for squeal's HA mode: standalone, or one member of an ensemble
    (`ZooKeeper.ensemble(3)`: each member with its `myid` and the peers' quorum and election ports)."""

    name = "zookeeper"

    def __init__(
        self,
        port: int | None = None,
        workdir: str | Path | None = None,
        host: str = "127.0.0.1",
        server_id: int = 0,
        peers: tuple[tuple[int, str, int, int], ...] = (),
        ssl_cert: str | Path | None = None,
        ssl_key: str | Path | None = None,
        ssl_ca: str | Path | None = None,
    ) -> None:
        super().__init__(port, workdir, host)
        if bool(ssl_cert) != bool(ssl_key) or (ssl_cert and not ssl_ca):
            raise HarnessError("ZooKeeper TLS needs ssl_cert, ssl_key and ssl_ca")
        # TLS (issue 25): the client port is TLS only; clients verify the server against ssl_ca.
        self.ssl_cert, self.ssl_key, self.ssl_ca = ssl_cert, ssl_key, ssl_ca
        self.server_id = server_id
        self.peers = peers  # ensemble members: (server id, host, quorum port, election port), this one included
        self.java = require_binary("java", "default-jre-headless")
        self.lib = Path("/usr/share/zookeeper")
        if not self.lib.exists():
            raise HarnessError("ZooKeeper not found: install it with `apt-get install zookeeper`")

    @classmethod
    def ensemble(cls, size: int = 3, workdir: str | Path | None = None, host: str = "127.0.0.1") -> list[ZooKeeper]:
        """`size` members of one ensemble on free ports (not started: start them all, then `wait_serving`)."""
        peers = tuple((i, host, free_port(host), free_port(host)) for i in range(1, size + 1))
        return [cls(workdir=workdir, host=host, server_id=i, peers=peers) for i, *_ in peers]

    def command(self) -> list[str]:
        conf = self.workdir / f"zoo-{self.port}.cfg"
        data = self.workdir / f"zkdata-{self.port}"
        data.mkdir(exist_ok=True)
        if self.peers:
            (data / "myid").write_text(f"{self.server_id}\n")
        tls = None
        if self.ssl_cert and self.ssl_key and self.ssl_ca:
            keystore = self.workdir / f"zk-{self.port}-keystore.pem"  # ZooKeeper's PEM key store: key + chain
            keystore.touch(mode=0o600)
            keystore.write_bytes(Path(self.ssl_key).read_bytes() + Path(self.ssl_cert).read_bytes())
            tls = (keystore, self.ssl_ca)
        conf.write_text(zookeeper_config(self.host, self.port, data, self.peers, tls))
        classpath = ZOOKEEPER_CLASSPATH
        if tls is not None:  # Netty's TLS handler needs its codec, which zookeeper.jar's manifest leaves out
            codec = Path("/usr/share/java/netty-codec.jar")
            if not codec.exists():
                raise HarnessError(f"ZooKeeper TLS needs {codec}: install it with `apt-get install libnetty-java`")
            classpath += f":{codec}"
        return [self.java, *ZOOKEEPER_LOGGING, "-cp", classpath, ZOOKEEPER_MAIN, str(conf)]

    def ready(self) -> bool:
        """Standalone: serving clients. An ensemble member: answering (it serves only once a quorum of members
        is up, so start them all, then `wait_serving`)."""
        if not self.peers:
            return self.serving()
        with self._dial() as s:
            s.sendall(b"ruok")
            return s.recv(16) == b"imok"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context for the TLS port (verifying the server against ssl_ca); None: plaintext."""
        if not self.ssl_cert:
            return None
        return ssl.create_default_context(cafile=str(self.ssl_ca))

    def _dial(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=1)
        ctx = self.ssl_context()
        return ctx.wrap_socket(sock, server_hostname=self.host) if ctx is not None else sock

    def serving(self) -> bool:
        """The server serves clients (standalone, or in an ensemble with a quorum: leader or follower)."""
        return zookeeper_mode(f"{self.host}:{self.port}", self.ssl_context()) is not None

    @staticmethod
    def wait_serving(members: list[ZooKeeper], timeout: float = 60.0) -> None:
        wait_until(lambda: all(m.serving() for m in members), timeout, "the ZooKeeper ensemble to serve")


def zookeeper_mode(address: str, tls: ssl.SSLContext | None = None) -> str | None:
    """A ZooKeeper server's `Mode:` from the `srvr` four-letter word (`leader`, `follower`, `standalone`);
    None when it does not serve (no quorum yet, or not answering). `tls`: the port is a TLS client port."""
    return mode_of(zookeeper_srvr(address, tls))


def mode_of(srvr: str | None) -> str | None:
    """The `Mode:` of a `srvr` answer (None: no answer, or not serving)."""
    for line in (srvr or "").splitlines():
        if line.startswith("Mode: "):
            return line.removeprefix("Mode: ").strip()
    return None


def zookeeper_srvr(address: str, tls: ssl.SSLContext | None = None) -> str | None:
    """A ZooKeeper server's answer to `srvr` (a server without a quorum answers that it is not serving); None
    when nothing answered. A probe that only connects and closes would cost the server a WARN with a stack
    trace in its log (EndOfStreamException) every time: ask it something instead."""
    host, _, port = address.rpartition(":")
    try:
        with (
            socket.create_connection((host, int(port)), timeout=1) as plain,
            tls.wrap_socket(plain, server_hostname=host) if tls is not None else plain as s,
        ):
            s.settimeout(2)
            s.sendall(b"srvr")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
    except OSError:
        return None
    return reply.decode(errors="replace") if reply else None


class SquealDaemon(ManagedProcess):
    """`squeal run TOPOLOGY --region R`: the invalidation daemon for one region's database.

    Ready when its `/healthz` answers 200 on `metrics_port` (this object's `port`).
    """

    name = "squeal"

    def __init__(
        self,
        topology_path: str | Path,
        region: str,
        port: int | None = None,
        workdir: str | Path | None = None,
        state_dir: str | Path | None = None,
        extra_args: tuple[str, ...] = (),
        host: str = "127.0.0.1",
        instance: str | None = None,
    ) -> None:
        super().__init__(port, workdir, host)
        self.topology_path = Path(topology_path)
        self.region = region
        self.instance = instance  # a pool's worker: `--instance NAME` (it owns what the controller gives it)
        me = instance or region
        self.state_dir = Path(state_dir) if state_dir else self.workdir / f"state-{me}"
        self.extra_args = (("--instance", instance) if instance else ()) + tuple(extra_args)
        self.log_file = self.workdir / f"squeal-{me}.log"

    def command(self) -> list[str]:
        exe = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "squeal"
        return [
            str(exe if exe.exists() else "squeal"),
            "run",
            str(self.topology_path),
            "--region",
            self.region,
            "--metrics-port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            *self.extra_args,
        ]

    def ready(self) -> bool:
        # Serving /healthz is "started": a daemon that starts halted (binlog data loss, on_data_loss = "halt")
        # answers 503 with its reason, and must stay up for the operator to see it and recover.
        return _http_ok(f"http://{self.host}:{self.port}/healthz", unhealthy_ok=True)


class MonitoringServer(ManagedProcess):
    """`python -m monitoring serve`: scrapes the deployment, runs the prober, serves the dashboard."""

    name = "monitoring"
    start_timeout = 60.0  # its imports alone take seconds; on a loaded box, while squeal starts, tens of them

    def __init__(
        self,
        topology_path: str | Path,
        state_dir: str | Path,
        port: int | None = None,
        workdir: str | Path | None = None,
        extra_args: tuple[str, ...] = (),
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(port, workdir, host)
        self.topology_path, self.state_dir, self.extra_args = Path(topology_path), Path(state_dir), extra_args

    def command(self) -> list[str]:
        python = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "python"
        return [
            str(python if python.exists() else sys.executable),
            "-m",
            "monitoring",
            "serve",
            str(self.topology_path),
            "--state-dir",
            str(self.state_dir),
            "--port",
            str(self.port),
            "--host",
            self.host,
            *self.extra_args,
        ]

    def ready(self) -> bool:
        return _http_ok(f"http://{self.host}:{self.port}/healthz")


class DemoWorkload(ManagedProcess):
    """`python -m loadtest.demo`: the demo web tier driving every cluster at a modest rate."""

    name = "demo"
    start_timeout = 60.0

    def __init__(
        self,
        topology_path: str | Path,
        port: int | None = None,
        workdir: str | Path | None = None,
        rate: float = 40.0,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(port, workdir, host)
        self.topology_path, self.rate = Path(topology_path), rate

    def command(self) -> list[str]:
        python = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "python"
        return [
            str(python if python.exists() else sys.executable),
            "-m",
            "loadtest.demo",
            str(self.topology_path),
            "--rate",
            str(self.rate),
            "--metrics-port",
            str(self.port),
            "--host",
            self.host,
        ]

    def ready(self) -> bool:
        return _http_ok(f"http://{self.host}:{self.port}/metrics")


def _http_ok(url: str, unhealthy_ok: bool = False) -> bool:
    """True once `url` answers 200 (or, with `unhealthy_ok`, 503 with a JSON body: a daemon up but unhealthy)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as e:
        return unhealthy_ok and e.code == 503 and e.headers.get("content-type", "").startswith("application/json")
    except urllib.error.URLError:
        return False
