"""A whole topology on this machine: `squealctl up` / `status` / `down` / `stop|start|restart NAME`.

`up` starts a supervisor in the background (ops/supervisor.py), which starts every process of the topology's
plan (ops/plan.py, the list `render systemd` writes units for too: the ZooKeeper ensemble of a topology with
workers, every MariaDB copy, memcached per pool member, one router per router address, a region's squeal
workers or its single daemon, monitoring), restarts any that exits without being asked to, and records them —
current pid, restarts, held down by `stop` — in `<state_dir>/components.json`; `status` and `down` read that
file, so they work from any later shell. Processes are stopped by pid, and only if the pid still runs the
command we started (pids get reused); a component whose recorded pid is gone is looked for by its command line
(restarted by hand, or by a supervisor that has since died), so `down` stops it whatever its pid now.

The state dir is durable: `up` never deletes it. MariaDB datadirs, squeal's datamarkers and the routers'
delete spools stay where the previous `up` left them, so a restarted platform resumes where it stopped
(squeal re-sends from each flow's marker what was committed while it was down).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import json
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import tomli_w

import router_config
from ops import tls as pki
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
    _tail,
    child_env,
    free_port,
    mode_of,
    wait_until,
    zookeeper_srvr,
)
from ops.plan import KINDS, Process, plan
from squeal import probe_health

log = logging.getLogger(__name__)

ALL_ROLES = ("zookeeper", "mariadb-primary", "mariadb-replica", "memcached", "router", "squeal", "monitoring", "demo")
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
    name: str = ""  # how `status` lists it and `stop|start|restart` take it: router/east-a/0, squeal/east
    restarts: int = 0  # times the supervisor restarted it after an exit nobody asked for
    stopped: bool = False  # held down by `squealctl stop` until `squealctl start`
    instance: str | None = None  # a pool's worker's name, or the extra replica's (a copy of the region)
    shard: str | None = None  # a MariaDB copy of a topology with [shards]: the shard it holds


def _visible_problems(row: dict) -> dict[str, str]:
    """Why a component without a /healthz of its own is not healthy, as `status` sees it (empty: healthy)."""
    if row.get("stopped"):
        return {"stopped": "held down by `squealctl stop` (`squealctl start NAME`)"}
    if not row["running"]:
        return {"process": f"pid {row['pid']} is not running"}
    if not row["answering"]:
        return {"port": f"{row['address']} does not accept connections"}
    if row["role"] == "zookeeper" and not row.get("serving"):
        return {"quorum": "the server answers but does not serve (no quorum?)"}
    return {}


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

    def supervisor(self) -> Component | None:
        """The supervisor process `up` left running (None before `up` or for a deployment recorded without one)."""
        if not self.state_file.exists():
            return None
        try:
            records = json.loads(self.state_file.read_text()).get("supervisors") or [None]
        except json.JSONDecodeError as e:
            raise HarnessError(f"{self.state_file}: corrupt state file ({e})") from e
        record = records[0]
        if not record:
            return None
        return Component(**{k: v for k, v in record.items() if k in Component.__dataclass_fields__})

    @property
    def control_socket(self) -> Path:
        """The supervisor's control socket (`stop|start|restart NAME`): in the state dir, or in /tmp when that
        path is too long for a Unix socket (108 bytes)."""
        path = self.state_dir / "supervisor.sock"
        if len(os.fsencode(path)) < 100:
            return path
        digest = hashlib.sha1(os.fsencode(self.state_dir)).hexdigest()[:16]
        return Path(f"/tmp/squeal-supervisor-{os.getuid()}-{digest}.sock")

    def component(self, name: str) -> Component:
        """The recorded component called `name` (as `status` lists it), or an error naming the valid ones."""
        components = self.components()
        for c in components:
            if c.name == name:
                return c
        if not components:
            raise HarnessError(f"no deployment in {self.state_dir} (run `squealctl up` first)")
        raise HarnessError(f"unknown component {name!r}; valid names: {', '.join(c.name for c in components)}")

    def recorded_topology(self) -> str | None:
        """The topology file the last `up` recorded, while its components are recorded (until `down`)."""
        if not self.state_file.exists():
            return None
        try:
            return json.loads(self.state_file.read_text()).get("topology")
        except json.JSONDecodeError as e:
            raise HarnessError(f"{self.state_file}: corrupt state file ({e})") from e

    @property
    def tls_topology(self) -> Path:
        """The topology `up --tls` runs: the file it was given plus `[tls]` (`with_tls`)."""
        return self.state_dir / "topology-tls.toml"

    def topology(self, given: str | Path | None) -> str | None:
        """The topology file a command about this deployment reads: `given` (None: the one `up` recorded), except
        that the file `up --tls` was given means the TLS copy made of it, which the deployment runs — a plaintext
        reading of it would dial TLS-only ports in plaintext."""
        recorded = self.recorded_topology()
        if given is None:
            return recorded
        source = self.tls_topology.with_suffix(".source")
        if (
            recorded is not None
            and Path(recorded) == self.tls_topology
            and source.exists()
            and Path(given).resolve() == Path(source.read_text())
        ):
            return recorded
        return str(given)

    def squeal_state_dir(self, region: str, instance: str | None = None) -> Path:
        """Where `up` has the region's squeal daemon keep its datamarkers and pid file (`squealctl replay`); a
        pool's worker keeps only its pid file and requests there (its region's markers are in ZooKeeper)."""
        if instance is not None:
            return self.state_dir / "squeal" / f"instance-{instance}"
        return self.state_dir / "squeal" / f"markers-{region}"

    def save(self, components: list[Component], topology: str, supervisor: dict | None = None) -> None:
        """Rewrite components.json at once (the supervisor does, after every start, exit and stop). The
        supervisor's record is a component-like object in a list of its own (`supervisors`: one, or none), so a
        reader that wants it as a scrape target adds it to `components` with `+` (monitoring/prometheus.py)."""
        doc = {
            "topology": topology,
            "supervisors": [supervisor] if supervisor else [],
            "components": [asdict(c) for c in components],
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, self.state_file)

    @staticmethod
    def is_running(c: Component) -> bool:
        """The pid is alive and still runs the command we started (not a reused pid)."""
        try:
            proc = psutil.Process(c.pid)
            same = _same_command(proc.cmdline(), c.cmdline) if len(c.cmdline) > 1 else True
            return proc.status() != psutil.STATUS_ZOMBIE and same
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def locate(self, components: list[Component]) -> list[int | None]:
        """The pid each component runs as now: the recorded one while it runs the recorded command, else any
        process running exactly that command (restarted by hand, or by a supervisor that has since died)."""
        found: list[int | None] = [c.pid if self.is_running(c) else None for c in components]
        missing = [i for i, pid in enumerate(found) if pid is None and len(components[i].cmdline) > 1]
        if missing:
            for proc in psutil.process_iter(["cmdline", "status"]):
                cmdline, status = proc.info["cmdline"], proc.info["status"]
                if not cmdline or status == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                    continue
                for i in missing:
                    if found[i] is None and _same_command(cmdline, components[i].cmdline):
                        found[i] = proc.pid
                        break
        return found

    # -- up --------------------------------------------------------------------------------------

    def up(
        self,
        topology_path: str | Path,
        without: frozenset[str] = frozenset(),
        demo: bool = False,
        demo_rate: float = 40.0,
        tls: bool = False,
    ) -> list[Component]:
        """Start the supervisor, which starts every component of the topology and keeps it running; returns once
        every component answers. On any failure the supervisor stops what it started and the error is raised.

        With a `[tls]` section (or `tls`: `squealctl up --tls`, which gives the topology one, see `with_tls`)
        every server starts with TLS on its topology port and every client dials it with TLS."""
        topo = router_config.load(topology_path)
        supervisor = self.supervisor()
        if (supervisor and self.is_running(supervisor)) or any(self.locate(self.components())):
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
        if tls and topo.tls is None:
            topology_path = self.with_tls(topology_path, topo)
            topo = router_config.load(topology_path)
        plan(topo, without=without)  # with [tls], a missing certificate: nothing started
        # Never wipe the state dir: it holds durable state a restart must resume from (MariaDB datadirs,
        # reused by MariaDB.prepare; squeal's datamarkers; the routers' delete spools). components.json is
        # rewritten by the supervisor before it starts anything (nothing it names runs: checked above); a squeal
        # pid file left by a crash is overwritten by the daemon, and `squeal replay` checks a pid before
        # signalling it.
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # The only disposable state: warm-up overlays describe the previous run's router configs (and caches,
        # which start empty again); `up` writes every cluster's normal config, so an overlay would be a lie.
        (self.state_dir / "warmup.json").unlink(missing_ok=True)
        self.state_file.unlink(missing_ok=True)
        return self._start_supervisor(topology_path, without, demo, demo_rate)

    def with_tls(self, topology_path: str | Path, topo: router_config.Topology) -> Path:
        """`squealctl up --tls` on a topology without `[tls]`: a local CA and a certificate per component in
        `<state>/tls/` (ops/tls.py; the CA is kept across `up`s), each valid for every host of the topology, and
        `<state>/topology-tls.toml` — the topology file as it is, plus `[tls] dir = <state>/tls, require = true`
        — which every component then reads: the servers take their certificates from it, the clients (squeal,
        monitoring, the demo web tier, `squealctl verify/flush/drill`) their CA and their own certificates."""
        directory = self.state_dir / "tls"
        zookeepers = topo.zookeeper.servers if topo.zookeeper is not None else ()
        hosts = [*topo.hosts(), *(a.host for a in zookeepers), "localhost"]
        pki.issue_for_components(directory, router_config.TLS_COMPONENTS, hosts)
        text = Path(topology_path).read_text()
        section = tomli_w.dumps({"tls": {"dir": str(directory), "require": True}})
        out = self.tls_topology
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.tls_topology.with_suffix(".source").write_text(str(Path(topology_path).resolve()))
        out.write_text(
            text.rstrip("\n")
            + f"\n\n# Added by `squealctl up --tls` to {Path(topology_path).resolve()}: every link over TLS.\n"
            + section
        )
        return out

    def _start_supervisor(
        self, topology_path: str | Path, without: frozenset[str], demo: bool, demo_rate: float
    ) -> list[Component]:
        """`python -m ops.supervisor` in its own session (it outlives this shell); it reports on a pipe once every
        component answers, or why start-up failed once it has stopped what it started."""
        read_fd, write_fd = os.pipe()
        cmd = [sys.executable, "-m", "ops.supervisor", str(self.state_dir), str(topology_path)]
        cmd += ["--ready-fd", str(write_fd), "--demo-rate", str(demo_rate)]
        if without:
            cmd += ["--without", ",".join(sorted(without))]
        if demo:
            cmd.append("--demo")
        log_path = self.state_dir / "supervisor.log"
        try:
            with open(log_path, "ab") as log_file:
                proc = subprocess.Popen(
                    cmd,
                    env=child_env(),  # its components inherit it: this checkout's code everywhere
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # a Ctrl-C in this terminal must not reach it later
                    pass_fds=(write_fd,),
                )
        finally:
            os.close(write_fd)
        try:
            with os.fdopen(read_fd, "rb") as ready:
                line = ready.readline()
        except BaseException:  # Ctrl-C during start-up: stop what was started, as before
            _signal(proc.pid, signal.SIGTERM)
            proc.wait()
            self.state_file.unlink(missing_ok=True)
            raise
        reply = json.loads(line) if line.strip() else {}
        if reply.get("ok"):
            return self.components()
        code = proc.wait()  # it has stopped what it started (or died)
        self.state_file.unlink(missing_ok=True)
        died = f"the supervisor exited during start-up (code {code}){_tail(log_path)}"
        raise HarnessError(reply.get("error") or died)

    def start_components(
        self,
        topology_path: str | Path,
        without: frozenset[str],
        demo: bool,
        demo_rate: float,
        track,
    ) -> None:
        """Start the topology's processes (ops/plan.py) in order (run by the supervisor): `track(proc, name, role,
        region, cluster, pool, metrics, instance, wait=True, shard=None)` starts one ManagedProcess and returns once
        its readiness check passes (with `wait=False` at once, returning a function that waits for it)."""
        topo = router_config.load(topology_path)
        processes = plan(topo, without=without)
        kind = {k: [p for p in processes if p.kind == k] for k in KINDS}
        # ZooKeeper's JVMs take seconds: they start first and come up while the databases and caches do.
        zookeepers = [self._zookeeper(p) for p in kind["zookeeper"]]
        zk_ready = [
            track(zk, p.name, p.role, p.region, wait=False) for zk, p in zip(zookeepers, kind["zookeeper"], strict=True)
        ]
        self._start_databases(topo, kind["mariadb"], track)
        for p in kind["memcached"]:
            memcached = Memcached(
                port=p.address.port,
                host=p.address.host,
                workdir=self.state_dir / "memcached",
                # `-Z`: its topology port speaks TLS only (the routers reach it with `security_mech: tls`)
                tls=(Path(p.tls.cert), Path(p.tls.key)) if p.tls else None,
                ssl_ca=p.tls.ca if p.tls else None,
            )
            track(memcached, p.name, p.role, p.region, p.cluster, p.pool)
        for cluster in dict.fromkeys(p.cluster for p in kind["router"] if p.cluster):
            config = self.state_dir / "routers" / f"{cluster}.json"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(router_config.render(router_config.cluster_config(topo, cluster)))
        for p in kind["router"]:
            metrics_port = free_port(p.address.host)
            router = Router(
                self.state_dir / "routers" / f"{p.cluster}.json",
                port=p.address.port,
                host=p.address.host,
                metrics_port=metrics_port,
                workdir=self.state_dir / "routers",
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
        self._start_squeal(topo, topology_path, kind["squeal"], track)
        for p in kind["monitoring"]:
            monitor = MonitoringServer(
                topology_path,
                self.state_dir,
                port=p.address.port,
                host=p.address.host,
                workdir=self.state_dir / "monitoring",
                extra_args=("--probe-interval", str(topo.monitoring.probe_interval)),
            )
            track(monitor, p.name, p.role, p.region, metrics=monitor.address)
        if demo:
            workload = DemoWorkload(topology_path, workdir=self.state_dir / "demo", rate=demo_rate)
            track(workload, "demo", "demo", topo.master.name, metrics=workload.address)

    def _zookeeper(self, p: Process) -> ZooKeeper:
        """A `[zookeeper]` server. Each keeps its data in `<state>/zookeeper/zkdata-<port>` (durable across `up`s,
        like MariaDB's datadirs)."""
        tls = {"ssl_cert": p.tls.cert, "ssl_key": p.tls.key, "ssl_ca": p.tls.ca} if p.tls else {}
        return ZooKeeper(
            port=p.address.port,
            host=p.address.host,
            workdir=self.state_dir / "zookeeper",
            server_id=p.server_id,
            peers=p.peers,
            **tls,
        )

    def _start_databases(self, topo: router_config.Topology, databases: list[Process], track) -> None:
        """Every chain of MariaDB servers (a shard's; without [shards] the regions' databases and their replicas).
        Chains are independent: each starts on a thread of its own, so all the primaries start at once, then their
        copies (issue 37: one at a time, a 4-shard example's twelve servers took over a minute)."""
        chains: dict[str, list[Process]] = {}
        for p in databases:
            chains.setdefault(p.chain, []).append(p)
        if not chains:
            return
        with concurrent.futures.ThreadPoolExecutor(len(chains), thread_name_prefix="start-shard") as pool:
            started = [pool.submit(self._start_chain, topo, chain, track) for chain in chains.values()]
        for future in started:
            future.result()  # the first failure raises; the supervisor stops every server started, other chains' too

    def _start_chain(self, topo: router_config.Topology, chain: list[Process], track) -> None:
        """One chain in plan order: its primary (in its shard's GTID domain, with the demo schema), then each copy,
        a GTID replica of the copy it names, caught up with it before the next starts."""
        servers: dict[str, MariaDB] = {}  # process name -> its server
        for p in chain:
            server = _mariadb(p, self.state_dir)
            track(server, p.name, p.role, p.region, instance=p.instance, shard=p.shard)
            if p.source is None:
                _load_demo_schema(p.name, server)
            else:
                _replicate(p.name, server, servers[p.source])
            servers[p.name] = server

    def _start_squeal(
        self, topo: router_config.Topology, topology_path: str | Path, processes: list[Process], track
    ) -> None:
        """Every squeal daemon; `up` returns with every shard of a pooled region running on one of its workers."""
        workers: dict[str, list[tuple[str, SquealDaemon]]] = {}  # region -> its daemons, by component name
        for p in processes:
            daemon = SquealDaemon(
                topology_path,
                p.region,
                port=p.address.port,
                host=p.address.host,
                workdir=self.state_dir / "squeal",
                state_dir=self.squeal_state_dir(p.region, p.instance),
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

    # -- status / down / stop|start|restart ------------------------------------------------------------

    def status(self) -> list[dict]:
        """Every recorded component with its current `pid`, `running` (alive), `answering` (port accepts),
        `uptime` (seconds, None when not running), `restarts` and `stopped` (held down by `squealctl stop`); a
        squeal daemon also `healthy` (its /healthz: True on 200, False on 503, None when it did not answer) and
        `problems` (what its /healthz names), a pool's worker `state` (`worker`, `starting`; None when it did not
        answer) and `owns` (the shards it owns now); a ZooKeeper server `serving` (it has a quorum and serves
        clients) and `mode` (`leader`, `follower`, `standalone`; None when not serving)."""
        out = []
        components = self.components()
        zk_tls = self._zookeeper_tls() if any(c.role == "zookeeper" for c in components) else None
        for c, pid in zip(components, self.locate(components), strict=True):
            running = pid is not None
            srvr = zookeeper_srvr(c.address, zk_tls) if running and c.role == "zookeeper" else None
            row = {
                **asdict(c),
                "pid": pid if running else c.pid,
                "running": running,
                # ZooKeeper: its `srvr` answer (a bare connect would put a stack trace in its log each time)
                "answering": srvr is not None if c.role == "zookeeper" else running and _port_open(c.address),
                "uptime": _uptime(pid) if running and pid is not None else None,
            }
            if c.role == "squeal":
                code, body = probe_health(c.address) if row["answering"] else (None, {})
                row["healthy"] = None if code is None else code == 200
                problems = body.get("problems") or {}
                row["problems"] = problems if isinstance(problems, dict) else {"healthz": str(problems)}
                if c.instance:
                    row["state"] = body.get("state")
                    row["owns"] = sorted(str(s) for s in body.get("owns") or [])
                if isinstance(body.get("shards"), dict):  # [shards]: the shards this daemon reads now, and which copy
                    row["shards"] = sorted(body["shards"])
                    row["copies"] = {
                        shard: (st.get("reads") or {}).get("name") for shard, st in sorted(body["shards"].items())
                    }
            if c.role == "zookeeper":
                row["mode"] = mode_of(srvr)
                row["serving"] = row["mode"] is not None
            if c.role != "squeal":  # squeal's come from its /healthz; the others' from what we can see
                row["problems"] = _visible_problems(row)
                row["healthy"] = not row["problems"]
            out.append(row)
        return out

    def _zookeeper_tls(self) -> ssl.SSLContext | None:
        """With the recorded topology's [tls], ZooKeeper's client ports are TLS: `srvr` is asked over TLS,
        verifying the servers against the topology's CA (status presents no certificate of its own)."""
        path = self.recorded_topology()
        if path is None or not Path(path).exists():
            return None
        tls = router_config.load(path).tls
        return router_config.verifying_context(tls.ca) if tls is not None else None

    def supervisor_status(self) -> dict | None:
        """The supervisor's record with `running` and `uptime`, or None when the deployment has none."""
        sup = self.supervisor()
        if sup is None:
            return None
        running = self.is_running(sup)
        return {**asdict(sup), "running": running, "uptime": _uptime(sup.pid) if running else None}

    def down(self, grace: float = 10.0) -> int:
        """Stop the supervisor (it stops its components) and then every component still running, whatever its
        pid now; returns how many components were running."""
        components = self.components()
        running = sum(pid is not None for pid in self.locate(components))
        supervisor = self.supervisor()
        if supervisor and self.is_running(supervisor):
            log.info("stopping the supervisor, pid %d", supervisor.pid)
            _signal(supervisor.pid, signal.SIGCONT)
            _signal(supervisor.pid, signal.SIGTERM)
            # it gives each component `grace` seconds, then SIGKILL
            wait_until(lambda: not self.is_running(supervisor), grace + 5, "the supervisor to exit", error=None)
            if self.is_running(supervisor):
                log.warning("the supervisor (pid %d) did not exit; killing it", supervisor.pid)
                _signal(supervisor.pid, signal.SIGKILL)
        self._stop(components, grace)  # what the supervisor did not stop (or, dead, could not)
        self.state_file.unlink(missing_ok=True)
        return running

    def _stop(self, components: list[Component], grace: float = 10.0) -> int:
        newest_first = list(reversed(components))
        running = [(c, pid) for c, pid in zip(newest_first, self.locate(newest_first), strict=True) if pid]
        for c, pid in running:
            log.info("stopping %s pid %d", c.name or c.role, pid)
            _signal(pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c, pid in running:
            current = Component(**{**asdict(c), "pid": pid})
            left = deadline - time.monotonic()
            wait_until(functools.partial(_stopped, current), left, f"pid {pid} to exit", error=None)
            if self.is_running(current):
                log.warning("%s pid %d ignored SIGTERM; killing", c.name or c.role, pid)
                _signal(pid, signal.SIGKILL)
        return len(running)

    def control(self, action: str, name: str) -> str:
        """`stop`, `start` or `restart` the component called `name`, through the supervisor; returns what it did."""
        self.component(name)
        supervisor = self.supervisor()
        if supervisor is None or not self.is_running(supervisor):
            pid = f" (pid {supervisor.pid})" if supervisor else ""
            raise HarnessError(
                f"the supervisor of the deployment in {self.state_dir} is not running{pid}: nothing can {action} "
                "components by name; `squealctl down`, then `squealctl up` again"
            )
        reply = b""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(300)  # a start waits for the component's readiness check (MariaDB: up to 60 s)
                s.connect(str(self.control_socket))
                s.sendall(json.dumps({"action": action, "name": name}).encode() + b"\n")
                while not reply.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
        except OSError as e:
            raise HarnessError(f"cannot reach the supervisor on {self.control_socket}: {e}") from e
        if not reply:
            raise HarnessError(f"the supervisor closed the connection without answering `{action} {name}`")
        answer = json.loads(reply)
        if not answer["ok"]:
            raise HarnessError(answer["error"])
        return answer["message"]


class StartupError(HarnessError):
    """`up` could not start a component: the message names it (as `status` lists it), its address, what was being
    done and the log to read."""


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


def _same_command(actual: list[str], recorded: list[str]) -> bool:
    """A script's shebang puts its interpreter first, so compare the arguments after the program."""
    return len(actual) >= len(recorded) and actual[len(actual) - len(recorded) + 1 :] == recorded[1:]


def _uptime(pid: int) -> float | None:
    try:
        return max(0.0, time.time() - psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _stopped(c: Component) -> bool:
    return not Deployment.is_running(c)


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
