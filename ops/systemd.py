"""`squealctl render systemd TOPOLOGY --host H --out DIR`: what one host of a real deployment runs.

`squealctl up` runs a whole topology on one machine. A real deployment spreads it over many hosts, each
running its share under systemd. The topology says where every component runs (memcached and router
addresses, `regions.<r>.squeal.host`, each squeal instance's `host`, `zookeeper.servers`,
`monitoring.host`); this module picks the components of one host and writes, into DIR:

    squeal.target                       groups every unit below (`systemctl enable --now squeal.target`)
    squeal-zookeeper-<N>.service        ZooKeeper server N (its myid) of the [zookeeper] ensemble (HA)
    squeal-memcached-*.service          one per memcached instance (pool member or regional pool member)
    squeal-router-*.service             one per router address, with routers/<cluster>.json
    squeal-daemon-<region>.service      the squeal daemon of a region without squeal_instances
    squeal-worker-<name>.service        one per squeal instance (a worker of its region's pool: `squeal run
                                        --instance`)
    squeal-monitoring.service           the dashboard + prober, scraping monitoring/components.json
    topology.toml                       a copy of the topology file the units read
    routers/<cluster>.json              the cluster's router config (router_config.cluster_config)
    zookeeper/zoo-<N>.cfg               server N's zoo.cfg, as `squealctl up` writes it (ops.harness)
    monitoring/components.json          every component of the deployment, for the monitoring server
    mariadb/tls.cnf                     with [tls], on a host with databases: MariaDB's ssl-cert/key/ca settings

With `[tls]` (docs/deploy.md, "Encrypt every link") the units carry the TLS options of what they run: each
ZooKeeper server a TLS-only client port (`secureClientPort`, Netty, a PEM key store built from
`[tls.zookeeper]` at each start), MariaDB's settings in mariadb/tls.cnf (`[tls.mariadb]`; `require = true`
adds `require-secure-transport`); each memcached `-Z` with `[tls.memcached]` (its topology port speaks TLS only)
and each router its topology port as its one TLS port (`--ssl-port`, no plaintext `-p`; `[tls.router]`, the CA
verifying its TLS pools: routers/<cluster>.json says `security_mech: tls` for every pool), as `squealctl up` runs
them; squeal, monitoring and the web tier read `[tls]` from the topology copy.

A region with squeal instances (a pool) never gets a `--region` daemon (`squeal run` refuses one for it), and
`[shards]` add no unit: a region's daemon runs every shard's pipeline itself, a pool's workers the shards its
controller gives each.

Every service restarts on failure, has resource limits (open files; memcached's memory from its `-m`,
ZooKeeper's from its Java heap) and runs sandboxed (read-only system, private /tmp, no home
directories, no new privileges, only IP and Unix sockets, a system-call allow-list); what it must
write (router spools, squeal's datamarkers and request files, ZooKeeper's data and myid) is its own
state directory. MariaDB is not rendered: every database, extra replica and shard copy runs under
Debian's mariadb service with the settings docs/deploy.md lists (`squealctl render` names those of the
host). docs/deploy.md walks through it.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
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
    java_bin: Path = field(default_factory=_default_java)  # runs the [zookeeper] servers (HA mode)
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


@dataclass
class Rendered:
    out: Path
    host: str
    units: list[Path]
    files: list[Path]  # configs: topology copy, router configs, components list
    databases: list[str]  # the MariaDB servers this host runs, described (configured by hand, docs/deploy.md)


# -- what runs on a host -----------------------------------------------------------------------------


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


def zookeeper_files(topo: Topology, host: str, opts: RenderOptions) -> dict[str, str]:
    """The zoo.cfg of every `[zookeeper]` server on `host`, by path relative to DIR (`zookeeper/zoo-N.cfg`, N its
    myid): the same file `squealctl up` writes (ops.harness.zookeeper_config), with its data in the data dir."""
    zk = topo.zookeeper
    if zk is None:
        return {}
    peers = zk.peers()
    return {
        f"zookeeper/zoo-{server_id}.cfg": zookeeper_config(
            where,
            zk.servers[server_id - 1].port,
            zookeeper_data_dir(opts, server_id),
            peers if len(peers) > 1 else (),
            tls=_zookeeper_tls(topo, opts, server_id),
        )
        for server_id, where, _, _ in peers
        if where == host
    }


def _server_cert(topo: Topology, component: str) -> router_config.CertKey:
    """The certificate `[tls.<component>]` a server needs with `[tls]`; RenderError naming the key if missing."""
    try:
        return router_config.server_certificate(topo, component)
    except router_config.TopologyError as e:
        raise RenderError(str(e)) from e


def zookeeper_keystore(opts: RenderOptions, server_id: int) -> Path:
    """ZooKeeper's PEM key store (its key, then its certificate chain, in one file), made at each start."""
    return zookeeper_data_dir(opts, server_id) / "tls-keystore.pem"


def _zookeeper_tls(topo: Topology, opts: RenderOptions, server_id: int) -> tuple[Path, str] | None:
    """With [tls]: (key store, CA) for a TLS-only client port (`secureClientPort`), as `squealctl up` runs it."""
    if topo.tls is None:
        return None
    _server_cert(topo, "zookeeper")
    assert topo.tls.ca is not None
    return zookeeper_keystore(opts, server_id), topo.tls.ca


def mariadb_tls_cnf(topo: Topology) -> str | None:
    """With [tls], the `[mariadbd]` settings of every MariaDB server of the topology: its certificate, the CA
    that signs its clients', and (`require = true`) no plaintext connection at all."""
    if topo.tls is None:
        return None
    mine = _server_cert(topo, "mariadb")
    lines = [
        "# Rendered by `squealctl render systemd` from the topology's [tls]: include it in every MariaDB server's",
        "# configuration (e.g. /etc/mysql/mariadb.conf.d/90-squeal-tls.cnf), then restart the server.",
        "[mariadbd]",
        f"ssl-cert = {mine.cert}",
        f"ssl-key = {mine.key}",
        f"ssl-ca = {topo.tls.ca}",
    ]
    if topo.tls.require:
        lines += [
            "# [tls] require = true: refuse plaintext clients (accounts may also say REQUIRE SSL)",
            "require-secure-transport = ON",
        ]
    return "\n".join(lines) + "\n"


def describe_databases(topo: Topology, host: str) -> list[str]:
    """The MariaDB servers (each shard's copies, every extra replica) that run on `host`, one phrase each."""
    out: list[str] = []
    for shard in topo.shards:
        for d in shard.copies:
            if d.host == host:
                what = f"region {d.region}'s database" if shard.implicit else f"shard {shard.name}'s copy in {d.region}"
                out.append(f"{what} ({d.role}, {d.address}, server_id {d.server_id})")
        for d in shard.replicas:
            if d.host == host:
                out.append(
                    f"shard {shard.name}'s extra copy {d.name} in {d.region} "
                    f"({d.address}, server_id {d.server_id}, from {d.replicates_from})"
                )
    for r in topo.regions:
        for d in r.replicas:
            if d.host == host:
                source = d.replicates_from or r.database.name
                out.append(f"replica {d.name} of region {r.name} ({d.address}, server_id {d.server_id}, from {source})")
    return out


def plan(topo: Topology, host: str, opts: RenderOptions, config_dir: Path) -> list[Unit]:
    """The services `host` runs, in start order: ZooKeeper, memcached, routers, squeal daemons, monitoring.

    A region with `squeal_instances` (a pool's workers) runs one `squeal run --instance NAME` per instance, never
    a `--region` daemon (`squeal run` refuses that for such a region). With `[shards]` nothing more is rendered: a
    region's daemon or a pool's workers run a pipeline per shard themselves."""
    hosts = topo.hosts()
    if host not in hosts:
        raise RenderError(f"{host} runs nothing in {topo.source}; the hosts it names: {', '.join(hosts)}")
    _check_router_metrics_ports(topo, opts.router_metrics_offset)
    venv = opts.venv
    python_env = (("PYTHONUNBUFFERED", "1"), ("PYTHONDONTWRITEBYTECODE", "1"))
    topology_file = config_dir / "topology.toml"
    units: list[Unit] = []

    zk = topo.zookeeper
    ensemble, clients = (zk.peers(), zk.servers) if zk else ((), ())
    for server_id, where, quorum, election in ensemble:
        if where != host:
            continue
        client = clients[server_id - 1]
        data = zookeeper_data_dir(opts, server_id)
        tls = _zookeeper_tls(topo, opts, server_id)
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
        pre: tuple[tuple[str, ...], ...] = (("/bin/sh", "-c", myid),) if len(ensemble) > 1 else ()
        if tls is not None:  # ZooKeeper's PEM key store is one file: key + chain, rebuilt from [tls] at each start
            mine = _server_cert(topo, "zookeeper")
            keystore = shlex.quote(str(zookeeper_keystore(opts, server_id)))
            pre += (
                (
                    "/bin/sh",
                    "-c",
                    f"mkdir -p {shlex.quote(str(data))} && umask 077 && "
                    f"cat {shlex.quote(mine.key)} {shlex.quote(mine.cert)} > {keystore}",
                ),
            )
        units.append(
            Unit(
                name=f"squeal-zookeeper-{server_id}.service",
                description=f"ZooKeeper server {server_id} of squeal's ensemble on {client} (quorum {quorum}, "
                f"election {election}{'; TLS client port' if tls else ''})",
                argv=argv,
                kind="zookeeper",
                state=(data.name,),
                memory_max_mb=_zookeeper_mem_max(opts.zookeeper_heap_mb),
                ports=(client.port, quorum, election),
                jit_free=False,  # the JVM's JIT writes code
                needs_network=True,  # its peers on other hosts
                pre=pre,
            )
        )
    zookeepers_here = tuple(u.name for u in units)

    def memcached(addr: router_config.Address, where: str, name: str) -> Unit:
        mb = opts.memcached_mb
        argv: tuple[str, ...] = (
            str(opts.memcached_bin),
            "-l", addr.host,
            "-p", str(addr.port),
            "-U", "0",
            "-m", str(mb),
            "-c", str(opts.memcached_connections),
            "-u", opts.user,  # ignored unless started as root (by hand): then it drops to this account
        )  # fmt: skip
        if topo.tls is not None:  # the port speaks TLS only, as under `squealctl up`
            mine = _server_cert(topo, "memcached")
            argv += ("-Z", "-o", f"ssl_chain_cert={mine.cert},ssl_key={mine.key}")
        return Unit(
            name=f"squeal-memcached-{name}-{addr.port}.service",
            description=f"squeal memcached {addr} ({where})",
            argv=argv,
            kind="memcached",
            limit_nofile=opts.memcached_connections + 1024,
            memory_max_mb=_memcached_mem_max(mb),
            ports=(addr.port,),
        )

    for region in topo.regions:
        for addr in region.regional_pool.servers if region.regional_pool else ():
            if addr.host == host:
                units.append(memcached(addr, f"region {region.name}, regional pool", f"{_part(region.name)}-regional"))
        for cluster in region.clusters:
            for pool in cluster.pools:
                for addr in pool.servers:
                    if addr.host == host:
                        where = f"region {region.name}, cluster {cluster.name}, pool {pool.name}"
                        units.append(memcached(addr, where, f"{_part(cluster.name)}-{_part(pool.name)}"))
    for cluster in topo.clusters:
        for addr in cluster.routers:
            if addr.host != host:
                continue
            spool = f"router-{_part(cluster.name)}-{addr.port}"
            metrics = addr.port + opts.router_metrics_offset
            if topo.tls is None:
                port: tuple[str, ...] = ("-p", str(addr.port))
            else:  # the topology port is the router's one port, TLS only; the CA verifies its TLS pools
                mine = _server_cert(topo, "router")
                port = ("--ssl-port", str(addr.port), "--pem-cert-path", mine.cert, "--pem-key-path", mine.key)
                port += ("--pem-ca-path", str(topo.tls.ca))
            argv = (
                str(opts.router_bin),
                "--config-file", str(config_dir / "routers" / f"{cluster.name}.json"),
                *port,
                "--listen", addr.host,
                "--spool-dir", str(opts.data_dir / spool),
                "--metrics-port", str(metrics),
                # squeal flushes a region through its routers (on_truncate/on_data_loss "flush",
                # `squeal accept-data-loss`), as under `squealctl up`.
                "--enable-flush-cmd",
            )  # fmt: skip
            units.append(
                Unit(
                    name=f"squeal-router-{_part(cluster.name)}-{addr.port}.service",
                    description=f"squeal-router {addr} (region {cluster.region}, cluster {cluster.name})",
                    argv=argv,
                    kind="router",
                    state=(spool,),
                    ports=(addr.port, metrics),
                )
            )

    def squeal_unit(
        name: str, description: str, selector: tuple[str, str], port: int, state: str, after: tuple[str, ...] = ()
    ) -> Unit:
        """`squeal run TOPOLOGY --region R` (a region's daemon) or `--instance NAME` (a pool's worker)."""
        argv: tuple[str, ...] = (
            str(venv / "bin" / "squeal"),
            "run", str(topology_file),
            *selector,
            "--metrics-port", str(port),
            "--state-dir", str(opts.data_dir / state),
        )  # fmt: skip
        return Unit(
            name=name,
            description=description,
            argv=argv,
            kind="squeal",
            state=(state,),
            environment=python_env,
            ports=(port,),
            jit_free=False,
            needs_network=True,
            after=after,
        )

    for region in topo.regions:
        for inst in region.squeal_instances:
            if inst.host != host:
                continue
            part = _part(inst.name)  # its state dir: pid file and requests; the markers are in ZooKeeper
            units.append(  # the pool's controller gives it its shards
                squeal_unit(
                    f"squeal-worker-{part}.service",
                    f"squeal worker {inst.name} of region {region.name}'s pool (the shards the pool's controller "
                    f"assigns it, each from its copy in {region.name})",
                    ("--instance", inst.name),
                    inst.metrics_port,
                    f"squeal-worker-{part}",
                    after=zookeepers_here,
                )
            )
        if region.squeal_instances or region.squeal_host != host:
            continue
        units.append(
            squeal_unit(
                f"squeal-daemon-{_part(region.name)}.service",
                f"squeal invalidation daemon, region {region.name} (database {region.database.address})",
                ("--region", region.name),
                topo.squeal_address(region.name).port,
                f"squeal-{_part(region.name)}",
            )
        )
    if topo.monitoring.host == host:
        m = topo.monitoring
        argv = (
            str(venv / "bin" / "python"),
            "-m", "monitoring",
            "serve", str(topology_file),
            "--state-dir", str(config_dir / "monitoring"),
            "--port", str(m.port),
            "--host", m.host,
            "--probe-interval", str(m.probe_interval),
        )  # fmt: skip
        units.append(
            Unit(
                name="squeal-monitoring.service",
                description=f"squeal monitoring: dashboard and canary prober on {m.host}:{m.port}",
                argv=argv,
                kind="monitoring",
                environment=python_env,
                limit_nofile=8192,
                ports=(m.port,),
                jit_free=False,
                needs_network=True,
            )
        )
    names = [u.name for u in units]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise RenderError(f"two components would share the unit name {clash[0]}: rename a cluster, pool or region")
    return units


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
    """The monitoring server's component list (the shape `squealctl up` records): what to scrape, everywhere."""
    out: list[dict] = []

    def add(
        role: str,
        region: str,
        cluster: str | None,
        pool: str | None,
        address: str,
        metrics: str | None,
        instance: str | None = None,
        shard: str | None = None,
    ):
        out.append(
            {
                "role": role,
                "region": region,
                "cluster": cluster,
                "pool": pool,
                "address": address,
                "metrics": metrics,
                "instance": instance,
                "shard": shard,
            }
        )

    if topo.zookeeper is not None:  # recorded as `squealctl up` does: under the master region
        for a in topo.zookeeper.servers:
            add("zookeeper", topo.master.name, None, None, str(a), None)
    for shard in topo.shards:
        for d in shard.copies:
            name = None if shard.implicit else shard.name
            add(f"mariadb-{d.role}", d.region, None, None, str(d.address), None, shard=name)
        for d in shard.replicas:  # (named like `squealctl up` records them: the copy's R as the instance)
            add("mariadb-replica", d.region, None, None, str(d.address), None, d.name.partition("@")[2], shard.name)
    for r in topo.regions:
        for d in r.replicas:
            add("mariadb-replica", r.name, None, None, str(d.address), None, d.name)
    for r in topo.regions:
        for a in r.regional_pool.servers if r.regional_pool else ():
            add("memcached", r.name, None, "regional", str(a), None)
        for c in r.clusters:
            for p in c.pools:
                for a in p.servers:
                    add("memcached", r.name, c.name, p.name, str(a), None)
    for c in topo.clusters:
        for a in c.routers:
            add("router", c.region, c.name, None, str(a), f"{a.host}:{a.port + offset}")
    for daemon in topo.squeal_daemons():  # a region's pool workers, else its single daemon
        address = str(daemon.address)
        add("squeal", daemon.region, None, None, address, address, daemon.instance.name if daemon.instance else None)
    return {"topology": str(topology_file), "rendered": True, "components": out}


# -- unit files ----------------------------------------------------------------------------------------

_PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def exec_quote(arg: str) -> str:
    """One ExecStart= word: `%` and `$` escaped (systemd expands both), quoted when it holds anything else."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _path_setting(path: Path) -> str:
    """A path as the value of WorkingDirectory= / ReadWritePaths= (checked free of whitespace by render)."""
    return str(path).replace("%", "%%")


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def home_paths(opts: RenderOptions, config_dir: Path) -> list[Path]:
    """What the services need that lives in a home directory (then ProtectHome= can only be read-only).

    Symlinks are followed: a venv's bin/python often points at an interpreter in someone's home (pyenv),
    and this repository's venv imports its code from the repository (an editable install)."""
    venv = opts.venv
    paths = [venv / "bin" / "python", opts.router_bin, opts.memcached_bin, config_dir, opts.data_dir]
    if venv.absolute() == DEFAULT_VENV:
        paths.append(REPO_ROOT)
    real = {p.resolve() if p.exists() else p for p in paths}
    return sorted(p for p in real if any(_under(p, root) for root in _HOME_ROOTS))


def unit_text(unit: Unit, opts: RenderOptions, config_dir: Path) -> str:
    in_home = bool(home_paths(opts, config_dir))
    lines = [
        HEADER,
        "[Unit]",
        f"Description={unit.description.replace('%', '%%')}",
        f"PartOf={TARGET}",
        "StartLimitIntervalSec=60",
        "StartLimitBurst=10",
    ]
    if unit.needs_network:
        lines += ["Wants=network-online.target", "After=network-online.target"]
    lines += [f"After={name}" for name in unit.after]
    lines += [
        "",
        "[Service]",
        "Type=exec",
        f"User={opts.user}",
        *(f"ExecStartPre={' '.join(exec_quote(a) for a in pre)}" for pre in unit.pre),
        f"ExecStart={' '.join(exec_quote(a) for a in unit.argv)}",
        f"WorkingDirectory={_path_setting(config_dir)}",
    ]
    lines += [f"Environment={k}={v}" for k, v in unit.environment]
    lines += [
        "Restart=on-failure",
        "RestartSec=2s",
        "TimeoutStopSec=30s",  # squeal flushes queued deletes and writes its datamarkers on SIGTERM
        "",
        "# resource limits",
        f"LimitNOFILE={unit.limit_nofile}",
    ]
    if unit.memory_max_mb is not None:
        lines.append(f"MemoryMax={unit.memory_max_mb}M")
    lines += ["", "# state it writes (everything else is read-only)"]
    for sub in unit.state:
        path = opts.data_dir / sub
        if _under(path, _SYSTEMD_STATE_ROOT) and path != _SYSTEMD_STATE_ROOT:
            lines += [f"StateDirectory={path.relative_to(_SYSTEMD_STATE_ROOT)}", "StateDirectoryMode=0750"]
        else:
            lines.append(f"ReadWritePaths={_path_setting(path)}")
    low_ports = any(p < 1024 for p in unit.ports)
    lines += [
        "",
        "# hardening",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ProtectHome={'read-only' if in_home else 'yes'}",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "RemoveIPC=yes",
        "UMask=0027",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
        f"CapabilityBoundingSet={'CAP_NET_BIND_SERVICE' if low_ports else ''}",
    ]
    if low_ports:
        lines.append("AmbientCapabilities=CAP_NET_BIND_SERVICE")
    if unit.jit_free:
        lines.append("MemoryDenyWriteExecute=yes")
    lines += ["", "[Install]", f"WantedBy={TARGET}", ""]
    return "\n".join(lines)


def target_text(host: str, units: list[Unit]) -> str:
    lines = [
        HEADER,
        "[Unit]",
        f"Description=squeal: every component of host {host}",
    ]
    lines += [f"Wants={u.name}" for u in units]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


# -- writing DIR -------------------------------------------------------------------------------------


def render_systemd(
    topology_path: str | Path, host: str, out: str | Path, opts: RenderOptions | None = None
) -> Rendered:
    """Write `host`'s unit files and configs into `out` (created; stale units of an earlier render removed)."""
    opts = opts or RenderOptions()
    topology_path = Path(topology_path)
    topo = router_config.load(topology_path)
    out = Path(out).resolve()
    config_dir = (opts.config_dir or out).absolute()
    if not opts.data_dir.is_absolute():
        raise RenderError(f"--data-dir must be an absolute path, got {opts.data_dir}")
    for what, path in (("--data-dir", opts.data_dir), ("the config dir", config_dir)):
        if any(c.isspace() for c in str(path)):
            raise RenderError(f"{what} {path} contains whitespace, which unit files cannot carry in a path")
    units = plan(topo, host, opts, config_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    topology_copy = out / "topology.toml"
    if topology_path.resolve() != topology_copy:
        shutil.copyfile(topology_path, topology_copy)
    files.append(topology_copy)
    for cluster in topo.clusters:
        if any(a.host == host for a in cluster.routers):
            path = out / "routers" / f"{cluster.name}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(router_config.render(router_config.cluster_config(topo, cluster.name)))
            files.append(path)
    for relative, text in zookeeper_files(topo, host, opts).items():
        path = out / relative
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        files.append(path)
    databases = describe_databases(topo, host)
    tls_cnf = mariadb_tls_cnf(topo) if databases else None
    if tls_cnf is not None:
        path = out / "mariadb" / "tls.cnf"
        path.parent.mkdir(exist_ok=True)
        path.write_text(tls_cnf)
        files.append(path)
    if any(u.kind == "monitoring" for u in units):
        path = out / "monitoring" / "components.json"
        path.parent.mkdir(exist_ok=True)
        doc = components(topo, opts.router_metrics_offset, config_dir / "topology.toml")
        path.write_text(json.dumps(doc, indent=2) + "\n")
        files.append(path)
    written: list[Path] = []
    for unit in units:
        path = out / unit.name
        path.write_text(unit_text(unit, opts, config_dir))
        written.append(path)
    target = out / TARGET
    target.write_text(target_text(host, units))
    written.append(target)
    # A unit an earlier render wrote for a component that no longer runs here must not be installed again.
    for old in out.glob("squeal-*.service"):
        if old not in written and old.read_text(errors="replace").startswith(HEADER):
            old.unlink()
    return Rendered(out=out, host=host, units=written, files=files, databases=databases)


# -- squealctl render ----------------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`squealctl render systemd ...` (called from ops/cli.py's parser)."""
    render = sub.add_parser(
        "render", help="write what one host of a multi-host deployment runs (systemd units and configs)"
    )
    kinds = render.add_subparsers(dest="render_kind", required=True, metavar="KIND")
    sd = kinds.add_parser(
        "systemd",
        help="systemd units + configs for one host of the topology",
        description="Write the systemd unit files and generated configs that one host of the topology runs "
        "(ZooKeeper servers, memcached instances, routers with their JSON configs, squeal daemons or pool "
        "workers, monitoring) and a "
        "squeal.target grouping them. Walk-through: docs/deploy.md.",
        epilog="Example: squealctl render systemd examples/three-hosts.toml --host 127.0.0.2 --out /etc/squeal",
    )
    sd.add_argument("topology", metavar="TOPOLOGY", help="topology TOML file")
    sd.add_argument("--host", required=True, help="the host to render, as the topology names it (e.g. 10.0.0.2)")
    sd.add_argument("--out", required=True, metavar="DIR", help="directory to write units and configs into")
    sd.add_argument(
        "--config-dir",
        metavar="DIR",
        help="where DIR will be on the host, if it is copied there (default: DIR itself)",
    )
    sd.add_argument(
        "--venv",
        "--prefix",
        dest="venv",
        default=str(DEFAULT_VENV),
        help="Python environment with squeal installed: bin/squeal, bin/python (default: %(default)s)",
    )
    sd.add_argument("--router-bin", default=str(ROUTER_BIN), help="squeal-router binary (default: %(default)s)")
    sd.add_argument("--memcached-bin", default=str(_default_memcached()), help="default: %(default)s")
    sd.add_argument(
        "--data-dir",
        default=str(DEFAULT_DATA_DIR),
        help="state (router spools, squeal datamarkers); below /var/lib systemd creates it (default: %(default)s)",
    )
    sd.add_argument("--user", default=DEFAULT_USER, help="account the services run as (default: %(default)s)")
    sd.add_argument("--memcached-mb", type=int, default=64, help="memcached -m; sets MemoryMax (default: %(default)s)")
    sd.add_argument(
        "--router-metrics-offset",
        type=int,
        default=DEFAULT_ROUTER_METRICS_OFFSET,
        help="each router serves /metrics on its port + this (default: %(default)s)",
    )
    sd.add_argument("--java-bin", default=str(_default_java()), help="runs ZooKeeper (default: %(default)s)")
    sd.add_argument(
        "--zookeeper-heap-mb",
        type=int,
        default=512,
        help="ZooKeeper's -Xmx; sets MemoryMax (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """The `render` branch of squealctl's dispatch."""
    opts = RenderOptions(
        venv=Path(args.venv).absolute(),
        router_bin=Path(args.router_bin).absolute(),
        memcached_bin=Path(args.memcached_bin).absolute(),
        data_dir=Path(args.data_dir),
        config_dir=Path(args.config_dir) if args.config_dir else None,
        user=args.user,
        memcached_mb=args.memcached_mb,
        router_metrics_offset=args.router_metrics_offset,
        java_bin=Path(args.java_bin).absolute(),
        zookeeper_heap_mb=args.zookeeper_heap_mb,
    )
    try:
        rendered = render_systemd(args.topology, args.host, args.out, opts)
    except RenderError as e:
        print(f"squealctl render: error: {e}", file=sys.stderr)
        return 2
    needed = [opts.venv / "bin" / "squeal", opts.router_bin, opts.memcached_bin]
    if any(p.parent.name == "zookeeper" for p in rendered.files):
        needed += [opts.java_bin, Path(ZOOKEEPER_CLASSPATH.rsplit(":", 1)[-1])]  # Debian's zookeeper package
        if any(NETTY_CODEC_JAR in p.read_text() for p in rendered.units):
            needed.append(Path(NETTY_CODEC_JAR))
    for path in needed:
        if not path.exists():
            print(f"squealctl render: warning: {path} does not exist here; it must on {args.host}", file=sys.stderr)
    private = home_paths(opts, opts.config_dir or rendered.out) if opts.user != "root" else []
    if private:
        print(
            f"squealctl render: warning: the services need {', '.join(map(str, private))}, in a home directory "
            f"{opts.user} may not be allowed to read: install squeal outside home directories (docs/deploy.md)",
            file=sys.stderr,
        )
    services = len(rendered.units) - 1
    print(f"host {args.host}: {services} services and {TARGET} in {rendered.out}")
    for path in rendered.units + rendered.files:
        print(f"  {path.relative_to(rendered.out)}")
    tls_cnf = rendered.out / "mariadb" / "tls.cnf"
    for database in rendered.databases:
        also = f", with {tls_cnf.relative_to(rendered.out)} in its configuration" if tls_cnf in rendered.files else ""
        print(f"  (MariaDB runs here too, {database}: set it up as docs/deploy.md says{also})")
    print(
        f"install: cp {rendered.out}/squeal*.service {rendered.out}/{TARGET} /etc/systemd/system/ && "
        f"systemctl daemon-reload && systemctl enable --now {TARGET}"
    )
    return 0
