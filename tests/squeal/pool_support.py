"""Shared pieces of the ZooKeeper and worker pool tests (no tests here): a ZooKeeper ensemble, a TCP link a test can
cut, clients, a region of two workers on two copies (`TwoWorkerPool`: "one shard, two workers", `squeal run
--instance` on a primary and on its replica; what HA mode was before the pool), a network namespace link, a
commit -> invalidated prober."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from kazoo.client import KazooClient
from squeal_helpers import Cache, create_schema, healthz, topology_text, unique_db, wait_until
from test_squeal_faults import post_keys

from ops import harness
from ops.harness import MariaDB, Memcached, SquealDaemon, ZooKeeper, free_port
from router_config.model import IMPLICIT_SHARD
from squeal.markers.zkstore import ShardMarkerStore
from squeal.pool.zookeeper import ha_marker_dir

SESSION_TIMEOUT = 2.0  # seconds: ZooKeeper's floor with the harness's tickTime of 500 ms is 1 s


@contextlib.contextmanager
def ensemble(workdir: Path, size: int = 3, host: str = "127.0.0.1") -> Iterator[list[ZooKeeper]]:
    """A `size`-server ZooKeeper ensemble from the harness on `host`, serving; stopped by pid afterwards."""
    members = ZooKeeper.ensemble(size, workdir=workdir, host=host)
    try:
        for m in members:
            m.start()
        ZooKeeper.wait_serving(members)
        yield members
    finally:
        for m in members:
            with contextlib.suppress(OSError, AssertionError):
                if m.proc is not None and m.proc.poll() is None:
                    m.resume()
            m.stop(grace=5)


def hosts(members: list[ZooKeeper] | list[Link]) -> str:
    return ",".join(f"{getattr(m, 'host', '127.0.0.1')}:{m.port}" for m in members)


def unique_root() -> str:
    return f"/t{uuid.uuid4().hex[:12]}"


def client(connect: str, timeout: float = SESSION_TIMEOUT) -> KazooClient:
    """A started kazoo client (session timeout `timeout`); stop() and close() it when done."""
    c = KazooClient(hosts=connect, timeout=timeout, connection_retry={"max_tries": -1, "delay": 0.05, "max_delay": 0.5})
    c.start(timeout=15)
    return c


def write_ha_markers(
    c: KazooClient, root: str, region: str, shard: str | None, positions: dict[str, str], by: str = ""
) -> None:
    """The markers HA mode's leader left for a region (with [shards]: a shard), one znode per destination
    (`zookeeper.ha_marker_dir`), as it wrote them: what a region upgraded to the pool starts each shard from.
    Nothing in squeal writes this layout any more; the tests of that upgrade make it by hand."""
    base = ha_marker_dir(root, region, shard)
    for flow, position in positions.items():
        doc = {"flow": flow, "position": position, "saved_at": time.time(), **({"by": by} if by else {})}
        if c.exists(f"{base}/{flow}") is None:
            c.create(f"{base}/{flow}", json.dumps(doc).encode(), makepath=True)
        else:
            c.set(f"{base}/{flow}", json.dumps(doc).encode())


def expire_session(c: KazooClient, connect: str) -> None:
    """Make ZooKeeper end `c`'s session now: another connection attaches to it and closes it (the client
    finds its session expired when it next talks to the server: LOST, then a new session)."""
    session_id, password = c.client_id
    other = KazooClient(hosts=connect, client_id=(session_id, password), timeout=SESSION_TIMEOUT)
    other.start(timeout=15)
    other.stop()
    other.close()


class Link:
    """A TCP proxy 127.0.0.1:port -> target that a test can cut: bytes stop flowing both ways while the
    connections stay open (a partition, not a reset: the client notices only by its own time-outs). heal()
    drops the connections held through the cut (their streams lost bytes) and forwards new ones again.
    stall() holds every byte instead (a server that does not answer for a while: frozen, starved of CPU);
    unstall() delivers them, late and in order."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._cut = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=f"link-{self.port}").start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                conn.close()  # (a partitioned client's SYN would hang; refusing is close enough)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                if not self._cut.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._cut.clear()

    def stall(self) -> None:
        self._flowing.clear()

    def unstall(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self.listener.close()
        self.heal()


class NetnsSquealDaemon(SquealDaemon):
    """A squeal daemon started inside network namespace `netns` (`ip netns exec` execs it: same pid)."""

    def __init__(self, netns: str, *args, **kwargs) -> None:
        self.netns = netns
        super().__init__(*args, **kwargs)

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *super().command()]


class TwoWorkerPool:
    """A schema on `primary` (replicated to `replica`), memcached clusters, a topology whose region east has two
    workers, east-1 on the primary (ranked first) and east-2 on the replica, and their daemons (not started;
    stopped by pid at teardown).

    `host`: where the primary and the memcacheds listen (the topology's addresses); `instance_hosts` and
    `netns`: where an instance listens for /healthz and the namespace it runs in (default: loopback, here).
    `session_timeout`: the topology's. `zk_servers`: what an instance connects to instead of the ensemble's
    members (e.g. a `Link` to each), in a topology file of its own that differs only there."""

    def __init__(
        self,
        base: Path,
        primary: MariaDB,
        replica: MariaDB,
        zk: list[ZooKeeper],
        memcacheds: list[Memcached],
        processes,
        *,
        instance_hosts: dict[str, str] | None = None,
        netns: dict[str, str] | None = None,
        session_timeout: float = SESSION_TIMEOUT,
        zk_servers: dict[str, list[Link]] | None = None,
    ) -> None:
        self.primary, self.replica = primary, replica
        self.schema = unique_db("pool")
        create_schema(primary, self.schema)
        replica.wait_for_gtid(primary.gtid_binlog_pos())
        self.memcacheds = memcacheds
        self.caches = [Cache(m.port, m.host) for m in self.memcacheds]
        self.root = unique_root()
        ports = {"east-1": free_port(), "east-2": free_port()}
        where = {"east-1": "127.0.0.1", "east-2": "127.0.0.1", **(instance_hosts or {})}
        text = topology_text(primary, self.schema, [m.port for m in self.memcacheds], host=primary.host)
        text += (
            f'\n[regions.east.replicas.east-r1]\nhost = "{replica.host}"\nport = {replica.port}\n'
            f'server_id = {replica.server_id}\nuser = "{replica.user}"\npassword = "{replica.password}"\n'
        )
        for name, copy in (("east-1", "east"), ("east-2", "east-r1")):
            text += (
                f'\n[[regions.east.squeal_instances]]\nname = "{name}"\ndatabase = "{copy}"\n'
                f'host = "{where[name]}"\nmetrics_port = {ports[name]}\n'
            )
        # The ensemble's real quorum/election ports: the defaults (client port + 100, + 200) could name ports
        # this run's other servers got by chance, which the topology check rightly refuses.
        peer_ports = ", ".join(f"[{q}, {e}]" for m in zk for i, _, q, e in m.peers if i == m.server_id)

        def with_servers(members: list) -> str:
            servers = ", ".join(f'"{address}"' for address in hosts(members).split(","))
            return text + (
                f"\n[zookeeper]\nservers = [{servers}]\npeer_ports = [{peer_ports}]\n"
                f"session_timeout_s = {session_timeout}\n"
                f'root = "{self.root}"\ntakeover_wait_s = 30\nhandback_after_s = 2\n'
            )

        self.topology = base / "topology.toml"
        base.mkdir(parents=True, exist_ok=True)
        self.topology.write_text(with_servers(zk))
        self.daemons: dict[str, SquealDaemon] = {}
        for name, port in ports.items():
            kwargs = dict(
                port=port,
                workdir=base / name,
                state_dir=base / name / "state",
                extra_args=("--instance", name),
                host=where[name],
            )
            topology = self.topology
            if name in (zk_servers or {}):  # the same topology, reaching ZooKeeper another way
                topology = base / f"topology-{name}.toml"
                topology.write_text(with_servers(zk_servers[name]))
            ns = (netns or {}).get(name)
            self.daemons[name] = (
                NetnsSquealDaemon(ns, topology, "east", **kwargs) if ns else SquealDaemon(topology, "east", **kwargs)
            )
        self.processes = processes
        for d in self.daemons.values():
            processes.started.append(d)  # stopped by pid at teardown, whatever the test did
        self.zk_client = client(hosts(zk))
        self.markers = ShardMarkerStore(self.zk_client, self.root, "east", IMPLICIT_SHARD)  # the region's one shard

    def state(self, name: str) -> str | None:
        d = self.daemons[name]
        try:
            return healthz(d.port, d.host)[1].get("state")
        except OSError:
            return None

    def health(self, name: str) -> dict:
        d = self.daemons[name]
        return healthz(d.port, d.host)[1]

    def connect(self, **kwargs):
        return self.primary.connect(self.schema, **kwargs)

    def sql(self, *statements: str) -> list[tuple]:
        return self.primary.execute(f"USE {self.schema}", *statements)

    def position(self) -> str:
        """The primary's GTID position now."""
        return self.primary.gtid_binlog_pos()

    def probe(self, n: int, timeout: float) -> float:
        """Commit user n (its key cached in every cluster); seconds until its key is gone everywhere."""
        for c in self.caches:
            c.set(f"user:{n}")
        t0 = time.monotonic()
        self.sql(f"INSERT INTO users VALUES ({n}, NULL, 'probe')")
        wait_until(
            lambda: not any(c.has(f"user:{n}") for c in self.caches), timeout, f"user:{n} deleted", interval=0.01
        )
        return time.monotonic() - t0

    def all_gone(self, ids: list[int], timeout: float) -> None:
        left: dict[int, set[str]] = {}

        def gone() -> bool:
            left.update({c.addr[1]: c.present(post_keys(ids)) for c in self.caches})
            return not any(left.values())

        harness.wait_until(gone, timeout, "keys gone", interval=0.1, error=None)
        assert not any(left.values()), {p: sorted(k)[:10] for p, k in left.items()}

    def deletes_received(self) -> int:
        """Deletes the memcacheds have processed (hits and misses), summed: moves only when someone sends."""
        total = 0
        for c in self.caches:
            with socket.create_connection(c.addr, timeout=5) as s:
                s.sendall(b"stats\r\n")
                buf = b""
                while not buf.endswith(b"END\r\n"):
                    buf += s.recv(65536)
            stats = dict(line.split()[1:3] for line in buf.decode().splitlines() if line.startswith("STAT "))
            total += int(stats["delete_hits"]) + int(stats["delete_misses"])
        return total

    def close(self) -> None:
        for c in self.caches:
            c.close()
        self.zk_client.stop()
        self.zk_client.close()


class NetnsLink:
    """A network namespace of the test's own, joined to this one by a veth pair with a /30 of 10.231.0.0/16
    that no interface here uses: `root_ip` on this side, `ns_ip` inside. Processes the test starts listen on
    `root_ip` for what runs inside to reach them. `cut()` takes the root side down: what the namespace sends
    vanishes (its connections time out, as in a partition, rather than being reset), while this side still
    reaches `root_ip` (a local address). `remove()` deletes the namespace and with it both ends."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}{random.randrange(100)}"
        self.ns, self.root_dev, self.ns_dev = f"sqha{tag}", f"sqr{tag}", f"sqn{tag}"
        used = _ip("-4", "-o", "addr").stdout
        while True:
            net = f"10.231.{random.randrange(256)}.{random.randrange(64) * 4}"
            a, b, c, d = net.split(".")
            self.root_ip, self.ns_ip = f"{a}.{b}.{c}.{int(d) + 1}", f"{a}.{b}.{c}.{int(d) + 2}"
            if f" {self.root_ip}/" not in used and f" {self.ns_ip}/" not in used:
                break
        try:
            _ip("netns", "add", self.ns)
            _ip("link", "add", self.root_dev, "type", "veth", "peer", "name", self.ns_dev)
            _ip("link", "set", self.ns_dev, "netns", self.ns)
            _ip("addr", "add", f"{self.root_ip}/30", "dev", self.root_dev)
            _ip("link", "set", self.root_dev, "up")
            _ip("-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_dev)
            _ip("-n", self.ns, "link", "set", self.ns_dev, "up")
            _ip("-n", self.ns, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise

    def cut(self) -> None:
        _ip("link", "set", self.root_dev, "down")

    def heal(self) -> None:
        _ip("link", "set", self.root_dev, "up")

    def remove(self) -> None:
        _ip("netns", "del", self.ns, check=False)
        _ip("link", "del", self.root_dev, check=False)  # gone with its peer already, unless the move failed


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def netns_unavailable() -> str | None:
    """Why this machine cannot run namespace tests (None: it can)."""
    try:
        done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    except OSError as e:
        return f"ip netns unavailable: {e}"
    if done.returncode != 0:
        return f"ip netns unavailable: {done.stderr.strip()}"
    if os.geteuid() != 0:
        return "ip netns needs root"
    return None


class Prober:
    """Commits one `users` row every `every` seconds (its `user:<id>` key cached in every cluster first), on a
    connection of its own, and times each key until it is gone from every cluster: `latencies()` are commit ->
    invalidated, in commit order. The longest is the longest a change waited for delivery (a delivery gap)."""

    def __init__(self, env: TwoWorkerPool, first: int, every: float = 0.1) -> None:
        self.env = env
        self.next_id = first
        self.every = every
        self.caches = [Cache(m.port, m.host) for m in env.memcacheds]
        self.committed: dict[int, float] = {}
        self.gone: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="prober")

    def start(self) -> Prober:
        self._thread.start()
        return self

    def _run(self) -> None:
        conn = self.env.connect(autocommit=True)
        try:
            next_commit = time.monotonic()
            while not self._stop.is_set() or len(self.gone) < len(self.committed):
                now = time.monotonic()
                if not self._stop.is_set() and now >= next_commit:
                    n, self.next_id = self.next_id, self.next_id + 1
                    for c in self.caches:
                        c.set(f"user:{n}")
                    with conn.cursor() as cur:
                        cur.execute(f"INSERT INTO users VALUES ({n}, NULL, 'probe')")
                    self.committed[n] = time.monotonic()
                    next_commit = now + self.every
                pending = [n for n in self.committed if n not in self.gone]
                if pending:
                    keys = [f"user:{n}" for n in pending]
                    left = set().union(*(c.present(keys) for c in self.caches))
                    seen = time.monotonic()
                    for n in pending:
                        if f"user:{n}" not in left:
                            self.gone[n] = seen
                time.sleep(0.01)
        finally:
            conn.close()

    def stop(self, timeout: float = 30) -> None:
        """Stop committing; returns once every probe is gone (or after `timeout`: then some are missing)."""
        self._stop.set()
        self._thread.join(timeout)
        for c in self.caches:
            c.close()

    def latencies(self) -> list[float]:
        return [self.gone[n] - t for n, t in sorted(self.committed.items()) if n in self.gone]
