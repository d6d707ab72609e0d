"""ZooKeeper 3.8 (Debian's package) for squeal's worker pools: its zoo.cfg, the server, and `srvr`."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from ops.processes.base import HarnessError, ManagedProcess, free_port, require_binary, wait_until

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
    """A ZooKeeper 3.8 server (Debian package) for squeal's worker pools: standalone, or one member of an ensemble
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
