"""What every experiment shares: a private topology on free ports, a locust subprocess, samplers, reports.

Each experiment starts its own real components (MariaDB, memcached, routers, squeal) with
`ops.local.Deployment` — the code `squealctl up` runs — in a temporary state directory, and stops them
by pid at the end, whatever happened. Locust runs as a subprocess (it monkey-patches the interpreter
with gevent on import); this process starts servers, injects failures, samples the servers' own
counters and writes the report.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import router_config
from loadtest.webtier import shard_master
from loadtest.workload import Spec
from monitoring.scrape import memcached_stats, prometheus_values  # noqa: F401 - memcached_stats: re-exported
from ops.harness import REPO_ROOT, free_port, memcached_command, wait_until
from ops.local import Component, Deployment
from remote_markers import SqlClient
from router_config import Topology

log = logging.getLogger(__name__)

EXAMPLE = REPO_ROOT / "examples" / "local.toml"
LOCUSTFILE = Path(__file__).resolve().parent.parent / "locustfile.py"


# -- topology ---------------------------------------------------------------------------------------


def topology_doc(
    clusters: int = 1,
    *,
    wildcard: int = 2,
    gutter: bool = True,
    gutter_ttl: int = 10,
    regional: bool = True,
    batch_size: int = 256,
    flush_interval_ms: float = 0.5,
) -> dict[str, Any]:
    """One master region ("east") with `clusters` clusters (east-a, east-b, …), from the example's rules.

    Ports are placeholders; `Stack` moves every one to a free port.
    """
    doc = router_config.to_document(router_config.load(EXAMPLE))
    east = doc["regions"]["east"]
    doc["regions"] = {"east": east}
    # One squeal daemon on the primary: the experiments measure the paper's mechanisms, not failover (the
    # example's pool would add a ZooKeeper ensemble, a replica and a second worker to every run).
    doc.pop("zookeeper", None)
    east.pop("replicas", None)
    east.pop("squeal_instances", None)
    doc["squeal"].update(batch_size=batch_size, flush_interval_ms=flush_interval_ms)
    if not regional:
        east.pop("regional_pool", None)
    port = iter(range(40000, 50000))
    names = [f"east-{chr(ord('a') + i)}" for i in range(clusters)]
    east["clusters"] = {}
    for name in names:
        pools: dict[str, Any] = {
            "wildcard": {"kind": "wildcard", "servers": [f"127.0.0.1:{next(port)}" for _ in range(wildcard)]}
        }
        if gutter:
            pools["gutter"] = {"kind": "gutter", "servers": [f"127.0.0.1:{next(port)}"], "ttl": gutter_ttl}
        east["clusters"][name] = {"routers": [f"127.0.0.1:{next(port)}"], "pools": pools}
    return doc


def replace_cluster(topo: Topology, name: str, **changes: Any) -> Topology:
    """A copy of `topo` with cluster `name`'s fields changed (e.g. routers=…, pools=…)."""
    regions = tuple(
        replace(r, clusters=tuple(replace(c, **changes) if c.name == name else c for c in r.clusters))
        for r in topo.regions
    )
    return replace(topo, regions=regions)


class Stack:
    """A deployment of one topology document on free ports, in its own state directory.

    with Stack(topology_doc(2), squeal=True) as stack: …   # stack.topo, stack.master, stack.pid_of(addr)
    """

    def __init__(self, doc: dict[str, Any], *, squeal: bool = True, workdir: str | Path | None = None) -> None:
        self._own = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="squeal-loadtest-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        import tomli_w

        topo = router_config.loads(tomli_w.dumps(doc))
        topo = router_config.reassign_ports(topo, free_port)
        # datamarkers under the state dir, not the repository's var/
        topo = replace(topo, squeal=replace(topo.squeal, datamarker_dir=str(self.workdir / "datamarkers")))
        self.topo: Topology = topo
        self.topology_path = self.workdir / "topology.toml"
        self.topology_path.write_text(router_config.dumps(topo))
        self.state_dir = self.workdir / "state"
        self.deployment = Deployment(self.state_dir)
        self.without = frozenset({"monitoring"} | (set() if squeal else {"squeal"}))
        self.components: list[Component] = []
        self._writers: dict[str, SqlClient] = {}

    def __enter__(self) -> Stack:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Stack:
        self.components = self.deployment.up(self.topology_path, without=self.without)
        return self

    def down(self) -> None:
        with contextlib.suppress(Exception):
            self.deployment.down(grace=5)
        if self._own:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def component(self, address: str) -> Component:
        for c in self.components:
            if c.address == address:
                return c
        raise KeyError(f"no component at {address}")

    def pid_of(self, address: str) -> int:
        return self.component(address).pid

    def by_role(self, role: str) -> list[Component]:
        return [c for c in self.components if c.role == role]

    def sql(self, region: str | None = None, shard: str | None = None) -> SqlClient:
        """The region's copy (default: the master region's) of `shard` (default: the first, the only one
        without [shards])."""
        r = self.topo.region(region) if region else self.topo.master
        db = self.topo.shard_copy(shard or self.topo.shards[0].name, r.name)
        return SqlClient.for_database(db, "app", role=db.role)

    def sqls(self, region: str | None = None) -> list[SqlClient]:
        """The region's copy of every shard (e.g. for `db_selects`: the reads the whole tier made)."""
        return [self.sql(region, s.name) for s in self.topo.shards]

    def writer(self, row_id: int) -> SqlClient:
        """The master of the shard that owns `row_id` (the web tier's shard map): a post seeded for author
        `row_id` goes there, with an id in that shard's series."""
        shard = self.topo.shard_of(row_id).name
        if shard not in self._writers:
            self._writers[shard] = shard_master(self.topo, shard)
        return self._writers[shard]

    def spec(self, clusters: list[str], **kwargs: Any) -> Spec:
        return Spec(topology=str(self.topology_path), region=self.topo.master.name, clusters=clusters, **kwargs)


# -- locust ------------------------------------------------------------------------------------------


class LocustRun:
    """`locust --headless` on the locustfile with `spec`, `users` users for `seconds`, in the background."""

    def __init__(self, spec: Spec, users: int, seconds: float, workdir: Path, classes: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.timeline_path = workdir / f"timeline-{time.monotonic_ns()}.jsonl"
        self.spec = replace(spec, out=str(self.timeline_path))
        self.users, self.seconds = users, seconds
        self.classes = classes or (("WebTierUser", "HotWriter") if spec.writer_rate > 0 else ("WebTierUser",))
        self.log_path = workdir / f"locust-{self.timeline_path.stem}.log"
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def command(self) -> list[str]:
        exe = Path(os.environ.get("VIRTUAL_ENV", REPO_ROOT / ".venv")) / "bin" / "locust"
        return [
            str(exe if exe.exists() else "locust"),
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "-u",
            str(self.users),
            "-r",
            str(self.users),
            "-t",
            f"{max(1, round(self.seconds))}s",
            "--stop-timeout",
            "2",
            "--only-summary",
            "--exit-code-on-error",
            "0",
            "--loglevel",
            "ERROR",
            *self.classes,
        ]

    def start(self) -> LocustRun:
        env = {**os.environ, **self.spec.to_env(), "PYTHONPATH": str(REPO_ROOT)}
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=REPO_ROOT,
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started = time.time()
        return self

    def wait_first_sample(self, timeout: float = 30.0) -> float:
        """Block until the users are running (the first timeline line); returns its wall-clock time."""

        def first_rows() -> list[dict[str, Any]]:
            rows = self.timeline()
            if not rows:
                self._check_alive()
            return rows

        what = f"locust's first timeline line (see {self.log_path})"
        rows = wait_until(first_rows, timeout, what, interval=0.1, ignore=(), error=RuntimeError)
        assert rows is not None  # (wait_until raises on a time-out)
        return rows[0]["t"]

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None and not self.timeline():
            raise RuntimeError(f"locust exited with {self.proc.returncode}: {self._tail()}")

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        return ""

    def wait(self) -> list[dict[str, Any]]:
        """Wait for the run to end (killing it if it overruns); returns the timeline."""
        assert self.proc is not None
        try:
            self.proc.wait(self.seconds + 30)
        except subprocess.TimeoutExpired:
            self.stop()
        rows = self.timeline()
        if not rows:
            raise RuntimeError(f"locust produced no timeline: {self._tail()}")
        return rows

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def timeline(self) -> list[dict[str, Any]]:
        if not self.timeline_path.exists():
            return []
        rows = []
        for line in self.timeline_path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
        return rows


def run_locust(spec: Spec, users: int, seconds: float, workdir: Path) -> list[dict[str, Any]]:
    run = LocustRun(spec, users, seconds, workdir).start()
    try:
        return run.wait()
    finally:
        run.stop()


def cluster_series(timeline: list[dict[str, Any]], cluster: str, counter: str, t0: float) -> list[tuple[float, float]]:
    """Per-second rate of one client counter of one cluster: [(seconds since t0, rate)]."""
    out = []
    prev = None
    for row in timeline:
        value = row["clusters"].get(cluster, {}).get(counter, 0)
        if prev is not None and row["t"] > prev[0]:
            out.append((row["t"] - t0, (value - prev[1]) / (row["t"] - prev[0])))
        prev = (row["t"], value)
    return out


def final_counts(timeline: list[dict[str, Any]], cluster: str | None = None) -> dict[str, int]:
    """The last cumulative counters, for one cluster or summed over all."""
    last = timeline[-1]["clusters"]
    names = [cluster] if cluster else list(last)
    total: dict[str, int] = {}
    for name in names:
        for k, v in last.get(name, {}).items():
            total[k] = total.get(k, 0) + v
    return total


# -- server-side samplers --------------------------------------------------------------------------
# memcached `stats`: monitoring.scrape.memcached_stats (imported above)


def memcached_command_all(servers: Any, command: bytes) -> None:
    """Send one command (e.g. `flush_all`) to every server of a pool; unreachable servers are skipped."""
    for addr in servers:
        with contextlib.suppress(OSError):
            memcached_command((addr.host, addr.port), command)


def scrape(port: int) -> dict[str, float]:
    """squeal's /metrics as {'name{label="value",…}': value} (monitoring.scrape.sample_key)."""
    return prometheus_values(f"127.0.0.1:{port}", timeout=5)


def flow_value(metrics: dict[str, float], name: str, flow: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(name + "{") and f'flow="{flow}"' in k)


def db_selects(db: SqlClient | list[SqlClient]) -> float:
    """The servers' SELECT count, summed (every query the web tier's read path makes is one)."""
    total = 0.0
    for one in db if isinstance(db, list) else [db]:
        row = one.query_one("SHOW GLOBAL STATUS LIKE 'Com_select'")
        total += float(row["Value"]) if row else 0.0
    return total


@dataclass
class Sampler:
    """Calls `probes` every `interval` seconds on a thread: rows of {"t": time, name: value}."""

    probes: Mapping[str, Callable[[], float | None]]
    interval: float = 0.5
    rows: list[dict[str, float | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="loadtest-sampler")

    def _run(self) -> None:
        while not self._stop.is_set():
            row: dict[str, float | None] = {"t": time.time()}
            for name, probe in self.probes.items():
                try:
                    row[name] = probe()
                except Exception:  # noqa: BLE001 - a server we killed on purpose, or one that is busy
                    row[name] = None
            self.rows.append(row)
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def rates(self, name: str, t0: float) -> list[tuple[float, float]]:
        """Per-second rate of a cumulative probe (gaps where the probe failed)."""
        out: list[tuple[float, float]] = []
        prev: tuple[float, float] | None = None
        for row in self.rows:
            v, t = row.get(name), row["t"]
            if v is None or t is None:
                prev = None
                continue
            if prev is not None and t > prev[0] and v >= prev[1] and t >= t0:
                out.append((t - t0, (v - prev[1]) / (t - prev[0])))
            prev = (t, v)
        return out


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    start = time.monotonic()
    yield
    log.info("%s took %.1fs", what, time.monotonic() - start)
