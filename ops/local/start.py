"""Starting the plan's processes on this machine, in order (run by the supervisor, ops/supervisor.py).

ops/plan.py decides what runs where; this module makes each process of it a ManagedProcess (ops/processes/)
with this machine's layout — work dirs under the state dir, the routers' config files — and the steps between
them: a database's demo schema or replication, the ZooKeeper quorum, every shard of a pool running. A failed
step raises a StartupError naming the component, its address, the step and its log (`doing`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Iterator
from pathlib import Path

import router_config
from ops.harness import (
    REPO_ROOT,
    DemoWorkload,
    HarnessError,
    ManagedProcess,
    MariaDB,
    Memcached,
    MonitoringServer,
    Router,
    SquealDaemon,
    ZooKeeper,
    free_port,
    wait_until,
)
from ops.local.state import StateDir
from ops.plan import KINDS, Process, plan
from squeal import probe_health

DEMO_SCHEMA = REPO_ROOT / "loadtest" / "schema.sql"


class StartupError(HarnessError):
    """`up` could not start a component: the message names it (as `status` lists it), its address, what was being
    done and the log to read."""


def start_components(
    state: StateDir,
    topology_path: str | Path,
    without: frozenset[str],
    demo: bool,
    demo_rate: float,
    track,
) -> None:
    """Start the topology's processes (ops/plan.py) in order: `track(proc, name, role, region, cluster, pool,
    metrics, instance, wait=True, shard=None)` starts one ManagedProcess and returns once its readiness check
    passes (with `wait=False` at once, returning a function that waits for it)."""
    state_dir = state.state_dir
    topo = router_config.load(topology_path)
    processes = plan(topo, without=without)
    kind = {k: [p for p in processes if p.kind == k] for k in KINDS}
    # ZooKeeper's JVMs take seconds: they start first and come up while the databases and caches do.
    zookeepers = [_zookeeper(p, state_dir) for p in kind["zookeeper"]]
    zk_ready = [
        track(zk, p.name, p.role, p.region, wait=False) for zk, p in zip(zookeepers, kind["zookeeper"], strict=True)
    ]
    _start_databases(kind["mariadb"], state_dir, track)
    for p in kind["memcached"]:
        memcached = Memcached(
            port=p.address.port,
            host=p.address.host,
            workdir=state_dir / "memcached",
            # `-Z`: its topology port speaks TLS only (the routers reach it with `security_mech: tls`)
            tls=(Path(p.tls.cert), Path(p.tls.key)) if p.tls else None,
            ssl_ca=p.tls.ca if p.tls else None,
        )
        track(memcached, p.name, p.role, p.region, p.cluster, p.pool)
    for cluster in dict.fromkeys(p.cluster for p in kind["router"] if p.cluster):
        config = state_dir / "routers" / f"{cluster}.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(router_config.render(router_config.cluster_config(topo, cluster)))
    for p in kind["router"]:
        metrics_port = free_port(p.address.host)
        router = Router(
            state_dir / "routers" / f"{p.cluster}.json",
            port=p.address.port,
            host=p.address.host,
            metrics_port=metrics_port,
            workdir=state_dir / "routers",
            # squeal flushes a region through its routers (on_truncate/on_data_loss "flush",
            # `squeal accept-data-loss`); the web tier never sends flush_all.
            extra_args=("--enable-flush-cmd",),
            # the topology port as the router's one TLS port; the CA verifies its TLS pools
            tls=(p.tls.cert, p.tls.key, p.tls.ca) if p.tls else None,
        )
        track(router, p.name, p.role, p.region, p.cluster, metrics=f"{p.address.host}:{metrics_port}")
    for ready in zk_ready:
        ready()
    if zookeepers:
        ZooKeeper.wait_serving(zookeepers)  # a quorum: the pools' workers can take their shards
    _start_squeal(topo, topology_path, kind["squeal"], state, track)
    for p in kind["monitoring"]:
        monitor = MonitoringServer(
            topology_path,
            state_dir,
            port=p.address.port,
            host=p.address.host,
            workdir=state_dir / "monitoring",
            extra_args=("--probe-interval", str(topo.monitoring.probe_interval)),
        )
        track(monitor, p.name, p.role, p.region, metrics=monitor.address)
    if demo:
        workload = DemoWorkload(topology_path, workdir=state_dir / "demo", rate=demo_rate)
        track(workload, "demo", "demo", topo.master.name, metrics=workload.address)


def _zookeeper(p: Process, state_dir: Path) -> ZooKeeper:
    """A `[zookeeper]` server. Each keeps its data in `<state>/zookeeper/zkdata-<port>` (durable across `up`s,
    like MariaDB's datadirs)."""
    tls = {"ssl_cert": p.tls.cert, "ssl_key": p.tls.key, "ssl_ca": p.tls.ca} if p.tls else {}
    return ZooKeeper(
        port=p.address.port,
        host=p.address.host,
        workdir=state_dir / "zookeeper",
        server_id=p.server_id,
        peers=p.peers,
        **tls,
    )


def _start_databases(databases: list[Process], state_dir: Path, track) -> None:
    """Every chain of MariaDB servers (a shard's; without [shards] the regions' databases and their replicas).
    Chains are independent: each starts on a thread of its own, so all the primaries start at once, then their
    copies (issue 37: one at a time, a 4-shard example's twelve servers took over a minute)."""
    chains: dict[str, list[Process]] = {}
    for p in databases:
        chains.setdefault(p.chain, []).append(p)
    if not chains:
        return
    with concurrent.futures.ThreadPoolExecutor(len(chains), thread_name_prefix="start-shard") as pool:
        started = [pool.submit(_start_chain, chain, state_dir, track) for chain in chains.values()]
    for future in started:
        future.result()  # the first failure raises; the supervisor stops every server started, other chains' too


def _start_chain(chain: list[Process], state_dir: Path, track) -> None:
    """One chain in plan order: its primary (in its shard's GTID domain, with the demo schema), then each copy,
    a GTID replica of the copy it names, caught up with it before the next starts."""
    servers: dict[str, MariaDB] = {}  # process name -> its server
    for p in chain:
        server = _mariadb(p, state_dir)
        track(server, p.name, p.role, p.region, instance=p.instance, shard=p.shard)
        if p.source is None:
            _load_demo_schema(p.name, server)
        else:
            _replicate(p.name, server, servers[p.source])
        servers[p.name] = server


def _start_squeal(
    topo: router_config.Topology, topology_path: str | Path, processes: list[Process], state: StateDir, track
) -> None:
    """Every squeal daemon; returns with every shard of a pooled region running on one of its workers."""
    workers: dict[str, list[tuple[str, SquealDaemon]]] = {}  # region -> its daemons, by component name
    for p in processes:
        daemon = SquealDaemon(
            topology_path,
            p.region,
            port=p.address.port,
            host=p.address.host,
            workdir=state.state_dir / "squeal",
            state_dir=state.squeal_state_dir(p.region, p.instance),
            instance=p.instance,
        )
        track(daemon, p.name, p.role, p.region, metrics=daemon.address, instance=p.instance)
        workers.setdefault(p.region, []).append((p.name, daemon))
    for region in topo.regions:
        if region.squeal_pool and region.name in workers:
            addresses = [str(s.address) for s in region.squeal_instances]
            want = {s.name for s in topo.shards}

            def every_shard_runs(addresses: list[str] = addresses, want: set[str] = want) -> bool:
                return want <= {s for a in addresses for s in (probe_health(a)[1].get("shards") or {})}

            named = "; ".join(f"{n} ({d.address}, log {d.log_file})" for n, d in workers[region.name])
            wait_until(
                every_shard_runs,
                60,
                f"every shard of region {region.name} running on one of its squeal workers: {named}",
                error=StartupError,
            )


def failure_reason(e: BaseException) -> str:
    """An exception in one line: a MySQL error as `code: message`, others as their text."""
    if isinstance(e, HarnessError):
        return str(e)
    if e.args and isinstance(e.args[0], int) and len(e.args) > 1:
        return f"{type(e).__name__} {e.args[0]}: {e.args[1]}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


@contextlib.contextmanager
def doing(name: str, proc: ManagedProcess, what: str) -> Iterator[None]:
    """Run a start-up step of component `name`; a failure names the component, its address, the step and its log."""
    try:
        yield
    except StartupError:
        raise  # (already named: the step of a component inside this one's)
    except Exception as e:
        raise StartupError(f"{name} ({proc.address}, log {proc.log_file}): {what} failed: {failure_reason(e)}") from e


def _load_demo_schema(name: str, server: MariaDB) -> None:
    """The demo schema on a primary: squeal checks rule templates against it at start-up, so it must exist first."""
    if not DEMO_SCHEMA.exists():
        return
    with doing(name, server, f"loading the demo schema ({DEMO_SCHEMA.name})"):
        with server.connect() as conn, conn.cursor() as cur:
            for statement in _sql_statements(DEMO_SCHEMA.read_text()):
                cur.execute(statement)


def _replicate(name: str, server: MariaDB, source: MariaDB) -> None:
    """`server` a GTID replica of `source`, caught up with it before anything reads it."""
    with doing(name, server, f"replicating from {source.address} and catching up with it"):
        server.replicate_from(source)
        server.wait_for_gtid(source.gtid_binlog_pos())


def _mariadb(p: Process, state_dir: Path) -> MariaDB:
    """The one way `up` makes a MariaDB server of the plan: every copy (a primary, a region's copy, an extra copy)
    gets the plan's TLS — with `require = true` accounts REQUIRE SSL and no plaintext TCP at all, as `render
    systemd`'s tls.cnf; a replica of a TLS primary replicates over TLS (`MariaDB.replicate_from`) — and its
    shard's GTID domain (None outside [shards]). Its datadir is `<state>/mariadb-<copy>`, durable across `up`s."""
    assert p.database is not None
    db, tls = p.database, p.tls
    return MariaDB(
        db.server_id,
        port=db.port,
        host=db.host,
        replica=p.source is not None,
        workdir=state_dir / f"mariadb-{db.name}",
        gtid_domain_id=db.gtid_domain_id,
        ssl_cert=tls.cert if tls else None,
        ssl_key=tls.key if tls else None,
        ssl_ca=tls.ca if tls else None,
        require_ssl=bool(tls and tls.require),
        secure_transport_only=bool(tls and tls.require),
    )


def _sql_statements(text: str) -> list[str]:
    """Split a schema file on `;` line ends (it holds plain DDL, no procedures)."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
