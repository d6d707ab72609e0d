"""A whole topology on this machine: `squealctl up` / `status` / `down`.

`up` starts every component the topology names (MariaDB primary and replica, memcached per pool
member, one router per cluster, one squeal daemon per region) as detached processes and records them
in `<state_dir>/components.json`; `status` and `down` read that file, so they work from any later shell.
Processes are stopped by pid, and only if the pid still runs the command we started (pids get reused).

The state dir is durable: `up` never deletes it. MariaDB datadirs, squeal's datamarkers and the routers'
delete spools stay where the previous `up` left them, so a restarted platform resumes where it stopped
(squeal re-sends from each flow's marker what was committed while it was down).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

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
    free_port,
)

log = logging.getLogger(__name__)

ALL_ROLES = ("mariadb-primary", "mariadb-replica", "memcached", "router", "squeal", "monitoring", "demo")
DEMO_SCHEMA = REPO_ROOT / "loadtest" / "schema.sql"


@dataclass
class Component:
    """One running process, as `squealctl status --json` reports it."""

    role: str
    region: str
    cluster: str | None
    pool: str | None
    pid: int
    address: str
    log: str
    cmdline: list[str]
    metrics: str | None = None  # host:port serving Prometheus /metrics, if the component has one


class Deployment:
    """The local processes of one topology, tracked in `state_dir`."""

    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.state_file = self.state_dir / "components.json"

    # -- state -----------------------------------------------------------------------------------

    def components(self) -> list[Component]:
        if not self.state_file.exists():
            return []
        try:
            data = json.loads(self.state_file.read_text())
        except json.JSONDecodeError as e:
            raise HarnessError(f"{self.state_file}: corrupt state file ({e}); stop processes by hand") from e
        return [Component(**c) for c in data["components"]]

    def recorded_topology(self) -> str | None:
        """The topology file the last `up` recorded, while its components are recorded (until `down`)."""
        if not self.state_file.exists():
            return None
        try:
            return json.loads(self.state_file.read_text()).get("topology")
        except json.JSONDecodeError as e:
            raise HarnessError(f"{self.state_file}: corrupt state file ({e})") from e

    def squeal_state_dir(self, region: str) -> Path:
        """Where `up` has the region's squeal daemon keep its datamarkers and pid file (`squealctl replay`)."""
        return self.state_dir / "squeal" / f"markers-{region}"

    def _save(self, components: list[Component], topology: str) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"topology": topology, "components": [asdict(c) for c in components]}, indent=2))
        os.replace(tmp, self.state_file)

    @staticmethod
    def is_running(c: Component) -> bool:
        """The pid is alive and still runs the command we started (not a reused pid)."""
        try:
            proc = psutil.Process(c.pid)
            actual = proc.cmdline()
            # A script's shebang puts its interpreter first, so compare the arguments after the program.
            same = actual[len(actual) - len(c.cmdline) + 1 :] == c.cmdline[1:] if len(c.cmdline) > 1 else True
            return proc.status() != psutil.STATUS_ZOMBIE and same
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    # -- up --------------------------------------------------------------------------------------

    def up(
        self,
        topology_path: str | Path,
        without: frozenset[str] = frozenset(),
        demo: bool = False,
        demo_rate: float = 40.0,
    ) -> list[Component]:
        """Start every component of the topology; on any failure stop what was started and re-raise."""
        topo = router_config.load(topology_path)
        if any(self.is_running(c) for c in self.components()):
            raise HarnessError(f"a topology is already up (state in {self.state_dir}); run `squealctl down` first")
        # A server that cannot bind may look ready anyway when another service answers on its port.
        busy = [
            f"{a} ({where})"
            for role, where, a in topo.listeners()
            if role not in without and not router_config.can_listen(a)
        ]
        if busy:
            more = f" and {len(busy) - 5} more" if len(busy) > 5 else ""
            raise HarnessError(
                f"{topology_path}: {len(busy)} port(s) already in use, nothing started: {', '.join(busy[:5])}{more}; "
                "stop what listens there or change the port in the topology file"
            )
        # Never wipe the state dir: it holds durable state a restart must resume from (MariaDB datadirs,
        # reused by MariaDB.prepare; squeal's datamarkers; the routers' delete spools). components.json is
        # rewritten by the first start below (nothing it names runs: checked above); a squeal pid file left
        # by a crash is overwritten by the daemon, and `squeal replay` checks a pid before signalling it.
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The only disposable state: warm-up overlays describe the previous run's router configs (and caches,
        # which start empty again); `up` writes every cluster's normal config, so an overlay would be a lie.
        (self.state_dir / "warmup.json").unlink(missing_ok=True)
        started: list[Component] = []
        topology_text = str(Path(topology_path).resolve())

        def track(
            proc: ManagedProcess,
            role: str,
            region: str,
            cluster: str | None = None,
            pool: str | None = None,
            metrics: str | None = None,
        ) -> None:
            proc.start()
            started.append(
                Component(
                    role, region, cluster, pool, proc.pid, proc.address, str(proc.log_file), proc.command(), metrics
                )
            )
            self._save(started, topology_text)

        try:
            self._start_databases(topo, without, track)
            self._start_memcached(topo, without, track)
            if "router" not in without:
                for cluster in topo.clusters:
                    config = self.state_dir / "routers" / f"{cluster.name}.json"
                    config.parent.mkdir(parents=True, exist_ok=True)
                    config.write_text(router_config.render(router_config.cluster_config(topo, cluster.name)))
                    for addr in cluster.routers:
                        metrics_port = free_port(addr.host)
                        router = Router(
                            config,
                            port=addr.port,
                            host=addr.host,
                            metrics_port=metrics_port,
                            workdir=self.state_dir / "routers",
                            # squeal flushes a region through its routers (on_truncate/on_data_loss "flush",
                            # `squeal accept-data-loss`); the web tier never sends flush_all.
                            extra_args=("--enable-flush-cmd",),
                        )
                        track(router, "router", cluster.region, cluster.name, metrics=f"{addr.host}:{metrics_port}")
            if "squeal" not in without:
                for i, region in enumerate(topo.regions):
                    daemon = SquealDaemon(
                        topology_path,
                        region.name,
                        port=topo.squeal.metrics_port_base + i,
                        workdir=self.state_dir / "squeal",
                        state_dir=self.squeal_state_dir(region.name),
                    )
                    track(daemon, "squeal", region.name, metrics=daemon.address)
            if "monitoring" not in without:
                monitor = MonitoringServer(
                    topology_path,
                    self.state_dir,
                    port=topo.monitoring.port,
                    workdir=self.state_dir / "monitoring",
                    extra_args=("--probe-interval", str(topo.monitoring.probe_interval)),
                )
                track(monitor, "monitoring", topo.master.name, metrics=monitor.address)
            if demo:
                workload = DemoWorkload(topology_path, workdir=self.state_dir / "demo", rate=demo_rate)
                track(workload, "demo", topo.master.name, metrics=workload.address)
        except BaseException:
            log.error("start-up failed; stopping the %d components already started", len(started))
            self._stop(started)
            self.state_file.unlink(missing_ok=True)
            raise
        return started

    def _start_databases(self, topo: router_config.Topology, without: frozenset[str], track) -> None:
        if "mariadb" in without:
            return
        primary: MariaDB | None = None
        for region in [topo.master] + [r for r in topo.regions if not r.master]:
            db = region.database
            server = MariaDB(
                db.server_id,
                port=db.port,
                host=db.host,
                replica=not region.master,
                workdir=self.state_dir / f"mariadb-{region.name}",
            )
            track(server, f"mariadb-{db.role}", region.name)
            if region.master:
                primary = server
                if DEMO_SCHEMA.exists():
                    # squeal checks rule templates against the schema at start-up, so it must exist first.
                    with server.connect() as conn, conn.cursor() as cur:
                        for statement in _sql_statements(DEMO_SCHEMA.read_text()):
                            cur.execute(statement)
            else:
                assert primary is not None
                server.replicate_from(primary)
                server.wait_for_gtid(primary.gtid_binlog_pos())

    def _start_memcached(self, topo: router_config.Topology, without: frozenset[str], track) -> None:
        if "memcached" in without:
            return
        for region in topo.regions:
            if region.regional_pool:
                for addr in region.regional_pool.servers:
                    track(
                        Memcached(port=addr.port, host=addr.host, workdir=self.state_dir / "memcached"),
                        "memcached",
                        region.name,
                        None,
                        "regional",
                    )
            for cluster in region.clusters:
                for pool in cluster.pools:
                    for addr in pool.servers:
                        track(
                            Memcached(port=addr.port, host=addr.host, workdir=self.state_dir / "memcached"),
                            "memcached",
                            region.name,
                            cluster.name,
                            pool.name,
                        )

    # -- status / down ---------------------------------------------------------------------------

    def status(self) -> list[dict]:
        """Every recorded component with `running` (pid alive) and `answering` (port accepts)."""
        out = []
        for c in self.components():
            running = self.is_running(c)
            out.append({**asdict(c), "running": running, "answering": running and _port_open(c.address)})
        return out

    def down(self, grace: float = 10.0) -> int:
        """Stop every recorded component (reverse start order); returns how many were running."""
        components = self.components()
        stopped = self._stop(components, grace)
        self.state_file.unlink(missing_ok=True)
        return stopped

    def _stop(self, components: list[Component], grace: float = 10.0) -> int:
        running = [c for c in reversed(components) if self.is_running(c)]
        for c in running:
            log.info("stopping %s %s pid %d", c.role, c.cluster or c.region, c.pid)
            _signal(c.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
            _signal(c.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c in running:
            while self.is_running(c) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.is_running(c):
                log.warning("%s pid %d ignored SIGTERM; killing", c.role, c.pid)
                _signal(c.pid, signal.SIGKILL)
        return len(running)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def _sql_statements(text: str) -> list[str]:
    """Split a schema file on `;` line ends (it holds plain DDL, no procedures)."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
