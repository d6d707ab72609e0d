"""Shared pieces of squeal's integration tests: a test schema, a topology on free ports, memcached probes."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from ops import harness
from ops.harness import MariaDB, Memcached, SquealDaemon, free_port
from squeal import fetch_health
from squeal.read import gtid as g

_counter = itertools.count(1)

SCHEMA = """
CREATE TABLE users (id INT PRIMARY KEY, email VARCHAR(200), name VARCHAR(200)) ENGINE=InnoDB;
CREATE TABLE posts (id INT PRIMARY KEY, author_id INT, title VARCHAR(200)) ENGINE=InnoDB;
CREATE TABLE other (id INT PRIMARY KEY, v VARCHAR(200)) ENGINE=InnoDB;
"""


def accept_data_loss(topology: Path, state_dir: Path, *shard: str) -> subprocess.CompletedProcess:
    """`squeal accept-data-loss TOPOLOGY --region east [--shard S] --state-dir STATE` (the documented recovery of a
    halted daemon) in a process of its own; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "squeal.cli", "accept-data-loss", str(topology), "--region", "east", *shard]
        + ["--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=30,
    )


T = TypeVar("T")


def made_then_stopped(build: Callable[..., T]) -> Iterator[Callable[..., T]]:
    """A factory fixture's body (`yield from` it): yields `make(**kwargs)`, which returns `build(n, **kwargs)` (n: how
    many were made before), and stops every one made once the test is done."""
    made: list = []

    def make(**kwargs) -> T:
        env = build(len(made), **kwargs)
        made.append(env)
        return env

    yield make
    for env in made:
        env.stop()


@contextlib.contextmanager
def all_started(procs: Iterable) -> Iterator[None]:
    """Start each of `procs` (harness processes: databases, ...) for the block; stop each (grace 5 s) after it,
    whatever happened."""
    procs = list(procs)
    try:
        for proc in procs:
            proc.start()
        yield
    finally:
        for proc in procs:
            proc.stop(grace=5)


def unique_db(prefix: str) -> str:
    return f"sq_{prefix}_{next(_counter)}_{int(time.time() * 1000) % 100000}"


def create_schema(db: MariaDB, name: str) -> None:
    db.execute(f"CREATE DATABASE {name}")
    with db.connect(name) as conn, conn.cursor() as cur:
        for stmt in filter(str.strip, SCHEMA.split(";")):
            cur.execute(stmt)


def topology_text(
    db: MariaDB,
    schema: str,
    cluster_ports: list[int],
    *,
    regional: bool = True,
    batch_size: int = 256,
    flush_interval_ms: float = 0.5,
    max_backlog: int = 100000,
    extra_rules: Iterable[tuple[str, list[str]]] = (),
    routers_per_cluster: list[list[int]] | None = None,
    host: str = "127.0.0.1",
    delivery: str | None = None,
) -> str:
    """One region ("east") whose clusters' routers are `cluster_ports` (memcached or squeal-router).

    `host`: where the database and the routers listen (a test's own address, e.g. one reachable from a
    network namespace). `delivery`: `[squeal] delivery` (None: the default)."""
    rules = [
        (f"{schema}.users", ["user:{id}", "user:email:{email}"]),
        (f"{schema}.posts", ["post:{id}", "feed:{author_id}"]),
        *extra_rules,
    ]
    out = [
        f"[squeal]\nbatch_size = {batch_size}\nflush_interval_ms = {flush_interval_ms}\n"
        f'max_backlog = {max_backlog}\ndatamarker_dir = "var/dm"\nmetrics_port_base = {free_port()}\n'
        + (f'delivery = "{delivery}"\n' if delivery is not None else "")
    ]
    for table, keys in rules:
        listed = ", ".join(f'"{k}"' for k in keys)
        out.append(f'[[rules]]\ntable = "{table}"\nkeys = [{listed}]\n')
    out.append(
        "[regions.east]\nmaster = true\n"
        f'database = {{ role = "primary", host = "{host}", port = {db.port}, server_id = {db.server_id},'
        f' user = "{db.user}", password = "{db.password}" }}\n'
    )
    if regional:
        out.append(f'regional_pool = {{ servers = ["127.0.0.1:{free_port()}"], prefixes = ["regional:"] }}\n')
    for i, port in enumerate(cluster_ports):
        routers = routers_per_cluster[i] if routers_per_cluster else [port]
        listed = ", ".join(f'"{host}:{p}"' for p in routers)
        pool = f'"127.0.0.1:{free_port()}"'
        out.append(
            f"[regions.east.clusters.c{i}]\nrouters = [{listed}]\n"
            f'pools.wildcard = {{ kind = "wildcard", servers = [{pool}] }}\n'
        )
    return "\n".join(out)


def write_topology(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


class Cache:
    """A tiny memcached text-protocol client for one server (tests only)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.addr = (host, port)
        self.sock = socket.create_connection(self.addr, timeout=5)
        self.buf = b""

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def set_many(self, keys: Iterable[str], value: bytes = b"stale") -> None:
        keys = list(keys)
        payload = b"".join(b"ms " + k.encode() + b" %d q\r\n" % len(value) + value + b"\r\n" for k in keys)
        self.sock.sendall(payload + b"mn\r\n")
        while (line := self._line()) != b"MN":
            raise AssertionError(f"set failed: {line!r}")

    def set(self, key: str, value: bytes = b"stale") -> None:
        self.set_many([key], value)

    def present(self, keys: Iterable[str]) -> set[str]:
        """Which of `keys` are cached."""
        keys = list(keys)
        if not keys:
            return set()
        self.sock.sendall(b"".join(b"mg " + k.encode() + b" k q\r\n" for k in keys) + b"mn\r\n")
        found = set()
        while (line := self._line()) != b"MN":
            if line.startswith(b"HD"):
                for tok in line.split()[1:]:
                    if tok.startswith(b"k"):
                        found.add(tok[1:].decode())
        return found

    def has(self, key: str) -> bool:
        return key in self.present([key])

    def close(self) -> None:
        self.sock.close()


def wait_until(check, timeout: float, what: str, interval: float = 0.02):
    """ops.harness.wait_until for assertions: returns check's truthy result, AssertionError on time-out."""
    return harness.wait_until(check, timeout, what, interval=interval, ignore=(), error=AssertionError)


def wait_gone(caches: list[Cache], keys: list[str], timeout: float = 10.0) -> None:
    def gone() -> bool:
        return all(not c.present(keys) for c in caches)

    try:
        wait_until(gone, timeout, f"keys {keys[:5]}... to be deleted")
    except AssertionError:
        left = {f"{c.addr[1]}": sorted(c.present(keys))[:10] for c in caches}
        raise AssertionError(f"keys still cached after {timeout}s: {left}") from None


def healthz(port: int, host: str = "127.0.0.1") -> tuple[int, dict]:
    """(HTTP status, JSON body) of a squeal daemon's /healthz: 200 healthy, 503 with its `problems`."""
    return fetch_health(f"{host}:{port}", timeout=5)


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """/metrics as {"name{labels}": value}."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            # Prometheus refuses a scrape with a series twice (a daemon's shards merged wrongly would do it)
            assert name not in out, f"series {name} served twice on :{port}/metrics"
            out[name] = float(value)
    return out


class SquealEnv:
    """A schema, N memcached "clusters", a topology pointing at them and a squeal daemon."""

    def __init__(
        self, base: Path, db: MariaDB, clusters: int = 2, extra_args: tuple[str, ...] = (), **topo_kwargs
    ) -> None:
        self.base = base
        self.db = db
        self.schema = unique_db(base.name[:8].replace("-", "_"))
        create_schema(db, self.schema)
        self.memcacheds = [Memcached(workdir=base / "memcached").start() for _ in range(clusters)]
        self.topology = write_topology(
            base / "topology.toml", topology_text(db, self.schema, [m.port for m in self.memcacheds], **topo_kwargs)
        )
        self.state_dir = base / "state"
        self.daemon = SquealDaemon(
            self.topology, "east", workdir=base / "squeal", state_dir=self.state_dir, extra_args=extra_args
        )
        self.caches = [Cache(m.port) for m in self.memcacheds]
        self._fence = itertools.count(1_000_000)

    def start(self) -> SquealEnv:
        self.daemon.start()
        return self

    def sql(self, *statements: str) -> list[tuple]:
        return self.db.execute(f"USE {self.schema}", *statements)

    def connect(self, **kwargs):
        return self.db.connect(self.schema, **kwargs)

    def fence(self, timeout: float = 10.0) -> None:
        """Commit one more change and wait for its delete everywhere: everything before it was processed."""
        n = next(self._fence)
        for c in self.caches:
            c.set(f"user:{n}")
        self.sql(f"INSERT INTO users VALUES ({n}, 'fence{n}@x', 'fence')")
        wait_gone(self.caches, [f"user:{n}"], timeout)

    def markers_cover(self, position: str | None = None, timeout: float = 15.0) -> None:
        """Until every flow's datamarker file holds `position` (default: the database's now) or later: a
        checkpoint observed, not slept for."""
        target = g.parse_position(position if position is not None else self.db.gtid_binlog_pos())

        def covered() -> bool:
            files = list(self.state_dir.glob("*.marker"))
            return bool(files) and all(
                g.covers_position(g.parse_position(json.loads(f.read_text())["position"]), target) for f in files
            )

        wait_until(covered, timeout, f"every datamarker in {self.state_dir} to reach {g.format_position(target)}")

    def marker_writes(self) -> dict[str, float]:
        """squeal_datamarker_writes_total per flow, now (a flow that was never checkpointed has none)."""
        return {k: v for k, v in scrape(self.daemon.port).items() if k.startswith("squeal_datamarker_writes_total")}

    def checkpointed(self, since: dict[str, float], timeout: float = 15.0) -> None:
        """Until every flow's datamarker was written again after `since` (`marker_writes()` taken once every flow
        had been checkpointed, before the changes that must be): for markers that are held back (an undecided XA
        prepare) and so cannot be watched by position."""
        assert since, "take marker_writes() after a first checkpoint of every flow (markers_cover)"
        wait_until(
            lambda: all(self.marker_writes().get(k, 0) > v for k, v in since.items()),
            timeout,
            "a checkpoint of every flow",
        )

    def log(self) -> str:
        return self.daemon.log_file.read_text() if self.daemon.log_file.exists() else ""

    def stop(self) -> None:
        for c in self.caches:
            c.close()
        for proc in [self.daemon, *self.memcacheds]:
            if proc.proc is not None and proc.proc.poll() is None:
                try:
                    proc.resume()
                except (OSError, AssertionError):
                    pass
            proc.stop(grace=5)
