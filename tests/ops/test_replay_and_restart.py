"""A restarted platform resumes from its datamarkers; `squealctl replay` reaches the daemon `up` started, and
nothing replays into a pid that is not a squeal daemon.

One small two-region topology (a cluster per region, one memcached each) is brought up once, changed, taken
down, changed while down and brought up again; the replay tests run against that second `up`. The memcached
servers belong to the test (`up --without memcached`) so cached values survive the restart and show which
deletes squeal sent after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import router_config
from ops.harness import REPO_ROOT, MariaDB, Memcached, memcached_command, wait_until
from squeal.markers.datamarkers import FileDatamarkerStore
from squeal.read import gtid as g
from tests.ops.deployments import TWO_REGIONS, run_sql, squealctl, stable_port

TOPOLOGY = "[squeal]\nmax_backlog = 10000\n" + TWO_REGIONS

KEY = "user:1"
DELETES_WITHIN = 30.0  # generous: a deadline for something that must happen, not a speed check


def squeal_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "squeal.cli", *args], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )


class Cache:
    """One of the test's memcached servers, the whole wildcard pool of a cluster."""

    def __init__(self, server: Memcached) -> None:
        self.address = (server.host, server.port)

    def set(self, key: str, value: str) -> None:
        data = value.encode()
        reply = memcached_command(self.address, f"set {key} 0 0 {len(data)}\r\n".encode() + data + b"\r\n")
        assert reply == b"STORED", reply

    def has(self, key: str) -> bool:
        return memcached_command(self.address, f"get {key}\r\n".encode()).startswith(b"VALUE")

    def wait_gone(self, key: str, what: str) -> None:
        wait_until(lambda: not self.has(key), DELETES_WITHIN, what)


@dataclass
class Platform:
    topology: Path
    topo: router_config.Topology
    state: Path
    caches: dict[str, Cache]  # region -> its one cluster's cache
    markers_after_down: dict[str, str]  # flow -> position, read after the first `down`
    committed_while_down: str  # the primary's GTID position after the change made while squeal was down
    spools: dict[Path, int]  # the routers' spool dirs after the first `up` -> inode

    def sql(self, *statements: str, region: str = "east") -> list[tuple]:
        return run_sql(self.topo.region(region).database, *statements)

    def gtid(self) -> str:
        return self.sql("SELECT @@gtid_binlog_pos")[0][0]


def _markers(platform_state: Path, topo: router_config.Topology) -> dict[str, str]:
    out = {}
    for cluster in topo.clusters:
        store = FileDatamarkerStore(platform_state / "squeal" / f"markers-{cluster.region}")
        position = store.load(cluster.name)
        assert position is not None, f"no datamarker for {cluster.name} after `down`"
        out[cluster.name] = position
    return out


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """up -> change -> down -> change while down -> up again; yields the second deployment."""
    base = tmp_path_factory.mktemp("restart")
    topo = router_config.reassign_ports(router_config.loads(TOPOLOGY), stable_port)
    path = base / "topology.toml"
    path.write_text(router_config.dumps(topo))
    topo = router_config.load(path)
    state = base / "state"
    # one server per cluster (its wildcard pool), in the order of topo.clusters
    servers = [Memcached(port=c.wildcard.servers[0].port, workdir=base / "memcached") for c in topo.clusters]
    try:
        for server in servers:
            server.start()
        caches = {c.region: Cache(s) for c, s in zip(topo.clusters, servers, strict=True)}
        p = Platform(path, topo, state, caches, {}, "", {})
        without = ("--without", "memcached,monitoring")

        squealctl(state, "up", str(path), *without)
        p.spools = {d: d.stat().st_ino for d in (state / "routers").glob("spool-*")}
        for cache in caches.values():
            cache.set(KEY, "cached-before-insert")
        p.sql("INSERT INTO app.users (id, name, email) VALUES (1, 'first', 'one@example.com')")
        for region, cache in caches.items():
            cache.wait_gone(KEY, f"the first run's squeal to delete {KEY} in {region}")
        squealctl(state, "down")
        p.markers_after_down = _markers(state, topo)

        # squeal is down: a change now is only in the binlog, which the next `up` must read from the markers.
        db = topo.master.database
        primary = MariaDB(db.server_id, port=db.port, host=db.host, workdir=state / f"mariadb-{topo.master.name}")
        with primary:
            primary.execute("UPDATE app.users SET name = 'changed while down' WHERE id = 1")
            p.committed_while_down = primary.gtid_binlog_pos()
        for cache in caches.values():
            cache.set(KEY, "stale: filled before the change made while down")

        squealctl(state, "up", str(path), *without)
        yield p
    finally:
        squealctl(state, "down", check=False)
        for server in servers:
            server.stop()


def test_second_up_keeps_markers_data_and_spools_and_squeal_resumes_from_the_markers(platform: Platform) -> None:
    # The change committed while squeal was down is invalidated in both regions: each daemon started from its
    # marker (a flow without one would start from "now" and never see it), and the west replica reused its
    # datadir and replicated the change from where it had stopped.
    for region, cache in platform.caches.items():
        cache.wait_gone(KEY, f"{KEY} in {region}: the change committed while squeal was down")
    for region in platform.caches:
        assert platform.sql("SELECT name FROM app.users WHERE id = 1", region=region) == [("changed while down",)]
    # The replica's binlog holds only the primary's transactions: a local one (its account, re-created at each
    # start) would take a sequence number the primary's next transaction repeats, and squeal would skip that.
    primary_id = platform.topo.master.database.server_id
    state = platform.sql("SELECT @@gtid_binlog_state", region="west")[0][0]
    assert {g.parse_gtid(e)[1] for e in state.split(",")} == {primary_id}, state
    for flow, position in platform.markers_after_down.items():
        region = platform.topo.cluster(flow).region
        log = (platform.state / "squeal" / f"squeal-{region}.log").read_text()
        assert f"flow {flow} starts after {position} (its datamarker)" in log
    # The markers did not move past the change before the second up (else the test would prove nothing).
    while_down = g.parse_gtid(platform.committed_while_down)
    assert not any(g.covers(g.parse_position(p), while_down) for p in platform.markers_after_down.values())
    assert platform.spools, "the routers made no spool dir"
    assert {d: d.stat().st_ino for d in platform.spools if d.exists()} == platform.spools, "a spool dir was recreated"


def test_replay_finds_the_daemon_up_started_and_resends_one_flow_then_all(platform: Platform) -> None:
    east, west = platform.caches["east"], platform.caches["west"]
    before = platform.gtid()
    for cache in (east, west):
        cache.set(KEY, "cached before the update")
    platform.sql("UPDATE app.users SET name = 'updated' WHERE id = 1")
    east.wait_gone(KEY, "the live delete in east")
    west.wait_gone(KEY, "the live delete in west")
    for cache in (east, west):  # a stale fill that raced the delete: what an operator replays to fix
        cache.set(KEY, "stale: filled after the delete")

    rows = json.loads(squealctl(platform.state, "status", "--json").stdout)
    pid = {r["region"]: r["pid"] for r in rows if r["role"] == "squeal"}
    result = squealctl(platform.state, "replay", "--region", "east", "--flow", "east-a", "--from", before)
    assert f"told the running daemon of region east (pid {pid['east']})" in result.stdout, result.stdout
    assert "flow east-a: datamarker " in result.stdout and f"-> {before}" in result.stdout
    east.wait_gone(KEY, "east-a's replay")
    assert west.has(KEY), "replaying east-a touched west"

    result = squealctl(
        platform.state, "replay", str(platform.topology), "--region", "west", "--flow", "all", "--from", before
    )
    assert f"told the running daemon of region west (pid {pid['west']})" in result.stdout, result.stdout
    west.wait_gone(KEY, "west's replay of every flow")


# -- refusals and failures: no deployment needed -------------------------------------------------------------------


@pytest.fixture
def dead_state(tmp_path: Path) -> tuple[Path, Path]:
    """A deployment state dir with east's marker dir, as `up` leaves it; (topology file, state dir)."""
    topology = tmp_path / "topology.toml"
    topology.write_text(TOPOLOGY)
    state = tmp_path / "state"
    (state / "squeal" / "markers-east").mkdir(parents=True)
    return topology, state


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


FAKE_SQUEAL = """\
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGHUP, lambda *_: Path(os.environ["HUP_FILE"]).write_text("hup"))
Path(os.environ["READY_FILE"]).write_text("ready")
time.sleep(60)
"""


@pytest.fixture
def fake_squeal(tmp_path: Path) -> Iterator:
    """`fake_squeal(*args)`: a process whose command line is `.../squeal ARGS` and that records a SIGHUP."""
    script = tmp_path / "fake" / "squeal"
    script.parent.mkdir()
    script.write_text(FAKE_SQUEAL)
    started: list[tuple[subprocess.Popen, Path]] = []

    def start(*args: str) -> tuple[subprocess.Popen, Path]:
        n = len(started)
        hup, ready = tmp_path / f"hup-{n}", tmp_path / f"ready-{n}"
        env = {**os.environ, "HUP_FILE": str(hup), "READY_FILE": str(ready)}
        proc = subprocess.Popen([sys.executable, str(script), *args], env=env)
        started.append((proc, hup))
        wait_until(ready.exists, 10, "the fake squeal to install its SIGHUP handler", proc)
        return proc, hup

    yield start
    for proc, _ in started:
        proc.kill()
        proc.wait()


def test_replay_refuses_a_pid_file_naming_a_process_that_is_not_squeal(dead_state, sleeper) -> None:
    topology, state = dead_state
    markers = state / "squeal" / "markers-east"
    (markers / "squeal-east.pid").write_text(f"{sleeper.pid}\n")

    result = squeal_cli(
        "replay", str(topology), "--region", "east", "--flow", "east-a", "--from", "0-1-5", "--state-dir", str(markers)
    )
    assert result.returncode == 1, result
    assert f"pid {sleeper.pid} (from {markers / 'squeal-east.pid'}): it runs `sleep 60`" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert sleeper.poll() is None, "the sleep process was signalled"
    assert not list(markers.glob("*.marker")) and not list(markers.glob("*.replay")), "a refused replay wrote"

    # squealctl: the same pid recorded as the deployment's squeal daemon (a reused pid) is refused too.
    component = {
        "role": "squeal",
        "region": "east",
        "cluster": None,
        "pool": None,
        "pid": sleeper.pid,
        "address": "127.0.0.1:1",
        "log": "x",
        "cmdline": ["squeal", "run"],
        "metrics": None,
    }
    (state / "components.json").write_text(json.dumps({"topology": str(topology), "components": [component]}))
    (markers / "squeal-east.pid").unlink()
    result = squealctl(state, "replay", "--region", "east", "--flow", "all", "--from", "0-1-5", check=False)
    assert result.returncode == 1, result
    assert f"pid {sleeper.pid} (from {state / 'components.json'}): it runs `sleep 60`" in result.stderr
    assert sleeper.poll() is None, "the sleep process was signalled"
    assert not list(markers.glob("*.marker")), "a refused replay wrote"


def test_replay_refuses_squeal_daemons_of_another_region_or_state_dir_and_signals_the_right_one(
    dead_state, fake_squeal
) -> None:
    topology, state = dead_state
    markers = state / "squeal" / "markers-east"
    pid_file = markers / "squeal-east.pid"

    def replay() -> subprocess.CompletedProcess:
        return squealctl(
            state, "replay", str(topology), "--region", "east", "--flow", "east-a", "--from", "0-1-5", check=False
        )

    west, west_hup = fake_squeal("run", str(topology), "--region", "west", "--state-dir", str(markers))
    pid_file.write_text(f"{west.pid}\n")
    result = replay()
    assert result.returncode == 1 and "it is the squeal daemon of region west, not east" in result.stderr, result
    elsewhere, elsewhere_hup = fake_squeal("run", str(topology), "--region", "east", "--state-dir", "/elsewhere")
    pid_file.write_text(f"{elsewhere.pid}\n")
    result = replay()
    assert result.returncode == 1 and f"it keeps its datamarkers in /elsewhere, not {markers}" in result.stderr, result
    assert not west_hup.exists() and not elsewhere_hup.exists()

    east, east_hup = fake_squeal("-v", "run", str(topology), "--region=east", "--state-dir", str(markers))
    pid_file.write_text(f"{east.pid}\n")
    result = replay()
    assert result.returncode == 0, result
    assert f"told the running daemon of region east (pid {east.pid})" in result.stdout
    wait_until(east_hup.exists, 10, "the east daemon to get SIGHUP")
    store = FileDatamarkerStore(markers)
    assert store.load("east-a") == "0-1-5" and store.take_replay_requests() == {"east-a": "0-1-5"}


def test_replay_without_a_daemon_records_it_for_the_next_run_and_fails_loudly_on_bad_requests(
    dead_state, tmp_path
) -> None:
    topology, state = dead_state
    markers = state / "squeal" / "markers-east"
    gone = subprocess.Popen(["true"])
    gone.wait()
    (markers / "squeal-east.pid").write_text(f"{gone.pid}\n")  # a stale pid file, its process gone

    result = squealctl(state, "replay", str(topology), "--region", "east", "--flow", "all", "--from", "0-1-9")
    assert f"no squeal daemon of region east is running: the replay is recorded in {markers}" in result.stdout
    store = FileDatamarkerStore(markers)
    assert store.load("east-a") == "0-1-9" and store.take_replay_requests() == {"east-a": "0-1-9"}

    missing = tmp_path / "no-such-dir"
    result = squeal_cli(
        "replay", str(topology), "--region", "east", "--flow", "east-a", "--from", "0-1-9", "--state-dir", str(missing)
    )
    assert result.returncode == 1 and f"marker dir {missing} does not exist" in result.stderr, result
    assert not missing.exists(), "replay created the marker dir it was pointed at"
    result = squealctl(
        state, "replay", str(topology), "--region", "east", "--flow", "east-b", "--from", "0-1-9", check=False
    )
    assert result.returncode == 2 and "region east has no flow 'east-b' (flows: east-a, or all)" in result.stderr
    result = squealctl(
        state, "replay", str(topology), "--region", "west", "--flow", "all", "--from", "0-1-9", check=False
    )
    assert result.returncode == 1 and f"marker dir {state / 'squeal' / 'markers-west'} does not exist" in result.stderr
    (markers / "east-a.marker").unlink()
    (markers / "east-a.marker").mkdir()  # a marker that cannot be replaced (a read-only dir would not stop root)
    result = squeal_cli(
        "replay", str(topology), "--region", "east", "--flow", "east-a", "--from", "0-1-9", "--state-dir", str(markers)
    )
    assert result.returncode == 1, result
    assert f"cannot write the datamarker of flow east-a in {markers}: Is a directory" in result.stderr, result.stderr
