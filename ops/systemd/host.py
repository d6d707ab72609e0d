"""What one host of a topology runs under systemd: the plan's processes there (ops/plan.py), each as a `Unit` —
its command line, state, limits, ordering — and the files they read beside the units: zoo.cfg, MariaDB's tls.cnf,
the monitoring server's components.json. `RenderOptions` says where things are on the host."""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import router_config
from ops.harness import (
    REPO_ROOT,
    ROUTER_BIN,
    ZOOKEEPER_CLASSPATH,
    ZOOKEEPER_LOGGING,
    ZOOKEEPER_MAIN,
    zookeeper_config,
)
from ops.plan import Process, plan
from router_config import Topology

TARGET = "squeal.target"
NETTY_CODEC_JAR = "/usr/share/java/netty-codec.jar"  # Debian's libnetty-java (ZooKeeper's TLS port)
HEADER = "# Rendered by `squealctl render systemd`: edit the topology and render again rather than this file."
DEFAULT_DATA_DIR = Path("/var/lib/squeal")
DEFAULT_VENV = REPO_ROOT / ".venv"
DEFAULT_USER = "squeal"
DEFAULT_ROUTER_METRICS_OFFSET = 50
# Where systemd's StateDirectory= lives: state below it is created (and owned) by systemd itself.
_SYSTEMD_STATE_ROOT = Path("/var/lib")
_HOME_ROOTS = (Path("/home"), Path("/root"), Path("/run/user"))


class RenderError(ValueError):
    """The units cannot be rendered (unknown host, conflicting ports); the message is one line."""


def _default_memcached() -> Path:
    return Path(shutil.which("memcached") or "/usr/bin/memcached")


def _default_java() -> Path:
    # Debian's default-jre-headless links it there (update-alternatives); ZooKeeper 3.8 runs on Java 11 and 17.
    return Path(shutil.which("java") or "/usr/bin/java")


@dataclass(frozen=True)
class RenderOptions:
    """Where things are on the target host, and the knobs the topology does not carry."""

    venv: Path = DEFAULT_VENV  # the Python environment with squeal installed (bin/squeal, bin/python)
    router_bin: Path = ROUTER_BIN
    memcached_bin: Path = field(default_factory=_default_memcached)
    data_dir: Path = DEFAULT_DATA_DIR  # state: router spools, squeal datamarkers
    config_dir: Path | None = None  # where DIR will be on the host (default: DIR itself)
    user: str = DEFAULT_USER  # the account every service runs as
    memcached_mb: int = 64  # memcached -m (item memory, MB); MemoryMax is derived from it
    memcached_connections: int = 4096  # memcached -c
    router_metrics_offset: int = DEFAULT_ROUTER_METRICS_OFFSET  # router /metrics port = router port + this
    java_bin: Path = field(default_factory=_default_java)  # runs the [zookeeper] servers (worker pools)
    zookeeper_heap_mb: int = 512  # ZooKeeper's -Xmx; its MemoryMax is derived from it


@dataclass(frozen=True)
class Unit:
    """One service of the host, before it is written as a unit file."""

    name: str  # file name, e.g. squeal-router-east-a-31100.service
    description: str
    argv: tuple[str, ...]
    kind: str  # zookeeper | memcached | router | squeal | monitoring
    state: tuple[str, ...] = ()  # sub-directories of the data dir the service writes
    environment: tuple[tuple[str, str], ...] = ()
    limit_nofile: int = 65536
    memory_max_mb: int | None = None
    ports: tuple[int, ...] = ()  # ports it listens on (below 1024: CAP_NET_BIND_SERVICE)
    jit_free: bool = True  # no JIT / libffi trampolines: MemoryDenyWriteExecute is safe
    needs_network: bool = False  # talks to other hosts at start-up: ordered after network-online.target
    pre: tuple[tuple[str, ...], ...] = ()  # ExecStartPre= commands (run as the service, in its sandbox)
    after: tuple[str, ...] = ()  # units of the same host to start first (ordering only: After=)


def _part(name: str) -> str:
    """A topology name as part of a unit name (systemd allows [A-Za-z0-9:_.\\-] without escaping)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _memcached_mem_max(mb: int) -> int:
    # -m bounds item memory only; the hash table, per-connection buffers and threads come on top.
    return mb + mb // 4 + 64


def _zookeeper_mem_max(heap_mb: int) -> int:
    # -Xmx bounds the Java heap only; class metadata, JIT code, thread stacks and direct buffers (up to the heap
    # size again by default) come on top.
    return 2 * heap_mb + 128


def zookeeper_data_dir(opts: RenderOptions, server_id: int) -> Path:
    """Where ZooKeeper server `server_id` (its myid) keeps its snapshots and transaction log on its host."""
    return opts.data_dir / f"zookeeper-{server_id}"


def processes(topo: Topology, host: str, opts: RenderOptions) -> list[Process]:
    """The plan's processes on `host` (ops/plan.py), each router's /metrics on its port + the offset; with `[tls]`
    a RenderError naming a certificate a server of this host lacks."""
    hosts = topo.hosts()
    if host not in hosts:
        raise RenderError(f"{host} runs nothing in {topo.source}; the hosts it names: {', '.join(hosts)}")
    _check_router_metrics_ports(topo, opts.router_metrics_offset)
    try:
        return plan(topo, host=host, router_metrics=lambda a: a.port + opts.router_metrics_offset)
    except router_config.TopologyError as e:
        raise RenderError(str(e)) from e


def zookeeper_files(here: list[Process], opts: RenderOptions) -> dict[str, str]:
    """The zoo.cfg of every ZooKeeper server among a host's processes (`here`), by path relative to DIR
    (`zookeeper/zoo-N.cfg`, N its myid): the same file `squealctl up` writes (ops/processes/zookeeper.py), with
    its data in the data dir."""
    return {
        f"zookeeper/zoo-{p.server_id}.cfg": zookeeper_config(
            p.address.host,
            p.address.port,
            zookeeper_data_dir(opts, p.server_id),
            p.peers,
            tls=(zookeeper_keystore(opts, p.server_id), p.tls.ca) if p.tls else None,
        )
        for p in here
        if p.kind == "zookeeper"
    }


def zookeeper_keystore(opts: RenderOptions, server_id: int) -> Path:
    """ZooKeeper's PEM key store (its key, then its certificate chain, in one file), made at each start."""
    return zookeeper_data_dir(opts, server_id) / "tls-keystore.pem"


def mariadb_tls_cnf(here: list[Process]) -> str | None:
    """With [tls], the `[mariadbd]` settings of the MariaDB servers among a host's processes (`here`; None: none
    there, or plaintext):
    their certificate, the CA that signs their clients', and (`require = true`) no plaintext connection at all."""
    tls = next((p.tls for p in here if p.kind == "mariadb"), None)
    if tls is None:
        return None
    lines = [
        "# Rendered by `squealctl render systemd` from the topology's [tls]: include it in every MariaDB server's",
        "# configuration (e.g. /etc/mysql/mariadb.conf.d/90-squeal-tls.cnf), then restart the server.",
        "[mariadbd]",
        f"ssl-cert = {tls.cert}",
        f"ssl-key = {tls.key}",
        f"ssl-ca = {tls.ca}",
    ]
    if tls.require:
        lines += [
            "# [tls] require = true: refuse plaintext clients (accounts may also say REQUIRE SSL)",
            "require-secure-transport = ON",
        ]
    return "\n".join(lines) + "\n"


def describe_databases(topo: Topology, host: str) -> list[str]:
    """The MariaDB servers (each shard's copies, every extra replica) that run on `host`, one phrase each."""
    out: list[str] = []
    for p in plan(topo, host=host, certificates=False):
        d = p.database
        if d is None:
            continue
        if p.source is not None and p.instance is not None:  # an extra copy
            source = d.replicates_from or topo.region(p.region).database.name
            what = f"shard {p.shard}'s extra copy {d.name} in" if p.shard else f"replica {d.name} of region"
            out.append(f"{what} {p.region} ({d.address}, server_id {d.server_id}, from {source})")
        else:
            what = f"shard {p.shard}'s copy in {p.region}" if p.shard else f"region {p.region}'s database"
            out.append(f"{what} ({d.role}, {d.address}, server_id {d.server_id})")
    return out


def units(topo: Topology, here: list[Process], opts: RenderOptions, config_dir: Path) -> list[Unit]:
    """A service for each of a host's processes (`here`, from `processes()`), in plan order: ZooKeeper, memcached,
    routers, squeal daemons, monitoring. MariaDB gets none: it runs under Debian's own service
    (`describe_databases`).

    A region with `squeal_instances` (a pool's workers) runs one `squeal run --instance NAME` per instance, never
    a `--region` daemon (`squeal run` refuses that for such a region). With `[shards]` nothing more is rendered: a
    region's daemon or a pool's workers run a pipeline per shard themselves."""
    render = {
        "zookeeper": _zookeeper_unit,
        "memcached": _memcached_unit,
        "router": _router_unit,
        "squeal": _squeal_unit,
        "monitoring": _monitoring_unit,
    }
    out: list[Unit] = []
    for p in here:
        if p.kind in render:
            out.append(render[p.kind](topo, p, opts, config_dir))
    # squeal workers start after the host's ZooKeeper servers (ordering only)
    zookeepers_here = tuple(u.name for u in out if u.kind == "zookeeper")
    out = [replace(u, after=zookeepers_here) if u.name.startswith("squeal-worker-") else u for u in out]
    names = [u.name for u in out]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise RenderError(f"two components would share the unit name {clash[0]}: rename a cluster, pool or region")
    return out


_PYTHON_ENV = (("PYTHONUNBUFFERED", "1"), ("PYTHONDONTWRITEBYTECODE", "1"))


def _zookeeper_unit(topo: Topology, p: Process, opts: RenderOptions, config_dir: Path) -> Unit:
    server_id, tls = p.server_id, p.tls
    data = zookeeper_data_dir(opts, server_id)
    quorum, election = p.peer_ports
    argv: tuple[str, ...] = (
        str(opts.java_bin),
        f"-Xmx{opts.zookeeper_heap_mb}m",
        "-XX:+ExitOnOutOfMemoryError",  # a restart beats a server limping on without memory
        *ZOOKEEPER_LOGGING,
        # with [tls], Netty's TLS handler needs its codec, which zookeeper.jar's manifest leaves out
        "-cp", ZOOKEEPER_CLASSPATH + (f":{NETTY_CODEC_JAR}" if tls else ""),
        ZOOKEEPER_MAIN,
        str(config_dir / "zookeeper" / f"zoo-{server_id}.cfg"),
    )  # fmt: skip
    # An ensemble member finds its id in dataDir/myid (systemd creates the state directory, empty).
    myid = f"mkdir -p {shlex.quote(str(data))} && echo {server_id} > {shlex.quote(str(data / 'myid'))}"
    pre: tuple[tuple[str, ...], ...] = (("/bin/sh", "-c", myid),) if p.peers else ()
    if tls is not None:  # ZooKeeper's PEM key store is one file: key + chain, rebuilt from [tls] at each start
        keystore = shlex.quote(str(zookeeper_keystore(opts, server_id)))
        pre += (
            (
                "/bin/sh",
                "-c",
                f"mkdir -p {shlex.quote(str(data))} && umask 077 && "
                f"cat {shlex.quote(tls.key)} {shlex.quote(tls.cert)} > {keystore}",
            ),
        )
    return Unit(
        name=f"squeal-zookeeper-{server_id}.service",
        description=f"ZooKeeper server {server_id} of squeal's ensemble on {p.address} (quorum {quorum}, "
        f"election {election}{'; TLS client port' if tls else ''})",
        argv=argv,
        kind="zookeeper",
        state=(data.name,),
        memory_max_mb=_zookeeper_mem_max(opts.zookeeper_heap_mb),
        ports=p.ports,
        jit_free=False,  # the JVM's JIT writes code
        needs_network=True,  # its peers on other hosts
        pre=pre,
    )


def _memcached_unit(topo: Topology, p: Process, opts: RenderOptions, config_dir: Path) -> Unit:
    mb, addr = opts.memcached_mb, p.address
    argv: tuple[str, ...] = (
        str(opts.memcached_bin),
        "-l", addr.host,
        "-p", str(addr.port),
        "-U", "0",
        "-m", str(mb),
        "-c", str(opts.memcached_connections),
        "-u", opts.user,  # ignored unless started as root (by hand): then it drops to this account
    )  # fmt: skip
    if p.tls is not None:  # the port speaks TLS only, as under `squealctl up`
        argv += ("-Z", "-o", f"ssl_chain_cert={p.tls.cert},ssl_key={p.tls.key}")
    if p.cluster is None:
        where, name = f"region {p.region}, regional pool", f"{_part(p.region)}-regional"
    else:
        where = f"region {p.region}, cluster {p.cluster}, pool {p.pool}"
        name = f"{_part(p.cluster)}-{_part(p.pool or '')}"
    return Unit(
        name=f"squeal-memcached-{name}-{addr.port}.service",
        description=f"squeal memcached {addr} ({where})",
        argv=argv,
        kind="memcached",
        limit_nofile=opts.memcached_connections + 1024,
        memory_max_mb=_memcached_mem_max(mb),
        ports=(addr.port,),
    )


def _router_unit(topo: Topology, p: Process, opts: RenderOptions, config_dir: Path) -> Unit:
    addr, cluster, metrics = p.address, p.cluster or "", p.metrics_port
    assert metrics is not None  # `processes` chose it
    spool = f"router-{_part(cluster)}-{addr.port}"
    if p.tls is None:
        port: tuple[str, ...] = ("-p", str(addr.port))
    else:  # the topology port is the router's one port, TLS only; the CA verifies its TLS pools
        port = ("--ssl-port", str(addr.port), "--pem-cert-path", p.tls.cert, "--pem-key-path", p.tls.key)
        port += ("--pem-ca-path", p.tls.ca)
    argv = (
        str(opts.router_bin),
        "--config-file", str(config_dir / "routers" / f"{cluster}.json"),
        *port,
        "--listen", addr.host,
        "--spool-dir", str(opts.data_dir / spool),
        "--metrics-port", str(metrics),
        # squeal flushes a region through its routers (on_truncate/on_data_loss "flush",
        # `squeal accept-data-loss`), as under `squealctl up`.
        "--enable-flush-cmd",
    )  # fmt: skip
    return Unit(
        name=f"squeal-router-{_part(cluster)}-{addr.port}.service",
        description=f"squeal-router {addr} (region {p.region}, cluster {cluster})",
        argv=argv,
        kind="router",
        state=(spool,),
        ports=(addr.port, metrics),
    )


def _squeal_unit(topo: Topology, p: Process, opts: RenderOptions, config_dir: Path) -> Unit:
    """`squeal run TOPOLOGY --instance NAME` (a pool's worker: the pool's controller gives it its shards; its state
    dir holds its pid file and requests, the markers are in ZooKeeper) or `--region R` (a region's daemon)."""
    if p.instance is not None:
        part = _part(p.instance)
        name, state, selector = f"squeal-worker-{part}.service", f"squeal-worker-{part}", ("--instance", p.instance)
        description = (
            f"squeal worker {p.instance} of region {p.region}'s pool (the shards the pool's controller "
            f"assigns it, each from its copy in {p.region})"
        )
    else:
        part = _part(p.region)
        name, state, selector = f"squeal-daemon-{part}.service", f"squeal-{part}", ("--region", p.region)
        description = (
            f"squeal invalidation daemon, region {p.region} (database {topo.region(p.region).database.address})"
        )
    argv: tuple[str, ...] = (
        str(opts.venv / "bin" / "squeal"),
        "run", str(config_dir / "topology.toml"),
        *selector,
        "--metrics-port", str(p.address.port),
        "--state-dir", str(opts.data_dir / state),
    )  # fmt: skip
    return Unit(
        name=name,
        description=description,
        argv=argv,
        kind="squeal",
        state=(state,),
        environment=_PYTHON_ENV,
        ports=(p.address.port,),
        jit_free=False,
        needs_network=True,
    )


def _monitoring_unit(topo: Topology, p: Process, opts: RenderOptions, config_dir: Path) -> Unit:
    m = p.address
    argv = (
        str(opts.venv / "bin" / "python"),
        "-m", "monitoring",
        "serve", str(config_dir / "topology.toml"),
        "--state-dir", str(config_dir / "monitoring"),
        "--port", str(m.port),
        "--host", m.host,
        "--probe-interval", str(topo.monitoring.probe_interval),
    )  # fmt: skip
    return Unit(
        name="squeal-monitoring.service",
        description=f"squeal monitoring: dashboard and canary prober on {m.host}:{m.port}",
        argv=argv,
        kind="monitoring",
        environment=_PYTHON_ENV,
        limit_nofile=8192,
        ports=(m.port,),
        jit_free=False,
        needs_network=True,
    )


def _check_router_metrics_ports(topo: Topology, offset: int) -> None:
    """Each router's /metrics port (its port + offset, on its host) must be free in the whole topology."""
    taken = {(a.host, a.port): where for _, where, a in topo.listeners()}
    for cluster in topo.clusters:
        for addr in cluster.routers:
            port = addr.port + offset
            if not 1 <= port <= 65535:
                raise RenderError(
                    f"router {addr} of cluster {cluster.name}: metrics port {port} (router port + "
                    f"--router-metrics-offset {offset}) is out of range; pick another offset"
                )
            if (addr.host, port) in taken:
                raise RenderError(
                    f"router {addr} of cluster {cluster.name}: metrics port {addr.host}:{port} (router port + "
                    f"--router-metrics-offset {offset}) is already {taken[(addr.host, port)]}; pick another offset"
                )


def components(topo: Topology, offset: int, topology_file: Path) -> dict:
    """The monitoring server's component list (the shape `squealctl up` records): what to scrape, everywhere —
    every process of the plan but monitoring itself, a router's /metrics on its port + `offset`."""
    every = plan(topo, certificates=False, router_metrics=lambda a: a.port + offset)
    fields = ("role", "region", "cluster", "pool", "address", "metrics", "instance", "shard")
    out = [
        {f: str(p.address) if f == "address" else getattr(p, f) for f in fields}
        for p in every
        if p.kind != "monitoring"
    ]
    return {"topology": str(topology_file), "rendered": True, "components": out}
