"""`squealctl up` supervises what it starts: kill -9 → back, `stop|start|restart NAME`, `down` whatever the pids,
and the chaos drill.

Most tests run against a small deployment (one cluster: a router and two memcached, `up --without
mariadb,squeal,monitoring`), which starts in about a second. The squeal daemon and the drill need MariaDB: one
two-region deployment (primary + replica, a router, a memcached and a squeal daemon per region) is brought up
once for them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.harness import memcached_command, wait_until
from ops.local import Deployment
from squeal import probe_health
from tests.ops.deployments import TWO_REGIONS, squealctl, squealctl_up, write_on_stable_ports
from tests.topologies import USERS_RULE, east_region

BACK_WITHIN = 5.0  # the bound for a killed component to answer again (measured and printed)

# Ports here are placeholders (the loader wants them distinct); every one is reassigned to a free port.
SMALL = USERS_RULE + east_region(1, {"east-a": ("127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4")})
SMALL_WITHOUT = ("--without", "mariadb,squeal,monitoring")
SMALL_NAMES = ["memcached/east-a/wildcard/0", "memcached/east-a/wildcard/1", "router/east-a/0"]


def write_topology(base: Path, text: str) -> Path:
    path = base / "topology.toml"
    write_on_stable_ports(text, path)
    return path


def alive(pid: int) -> bool:
    """/proc has the pid and it is not a zombie (an exited child nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def status(state: Path) -> dict[str, dict]:
    """`squealctl status --json`, by component name."""
    rows = json.loads(squealctl(state, "status", "--json", check=False).stdout)
    return {r["name"]: r for r in rows}


def supervisor_pid(state: Path) -> int:
    return json.loads((state / "components.json").read_text())["supervisors"][0]["pid"]


def answers(row: dict) -> bool:
    host, _, port = row["address"].rpartition(":")
    if row["role"] in ("memcached", "router"):
        try:
            return memcached_command((host, int(port)), b"version\r\n", timeout=0.5).startswith(b"VERSION")
        except OSError:
            return False
    # squeal: /healthz answers (200, or 503 with its problems)
    return probe_health(row["address"], timeout=1)[0] in (200, 503)


def kill_and_wait_back(state: Path, name: str) -> tuple[int, int, float]:
    """kill -9 the component; (old pid, new pid, seconds until the new pid answered). Polls in-process: a
    `squealctl status` per poll would add its own start-up to the measurement."""
    deployment = Deployment(state)
    old = next(r for r in deployment.status() if r["name"] == name)
    assert old["running"] and answers(old), old
    os.kill(old["pid"], signal.SIGKILL)
    t0 = time.monotonic()

    def back() -> dict | None:
        row = next(r for r in deployment.status() if r["name"] == name)
        return row if row["running"] and row["pid"] != old["pid"] and answers(row) else None

    # 30 s: a deadline to fail on, not the bound that is checked
    row = wait_until(back, 30, f"{name} back after kill -9", interval=0.02, error=None)
    assert row, f"{name} not back 30 s after kill -9: {Deployment(state).status()}"
    took = time.monotonic() - t0
    print(f"{name}: kill -9 pid {old['pid']} -> pid {row['pid']} answering after {took:.2f} s")
    return old["pid"], row["pid"], took


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A supervised deployment of a router and two memcached; yields its state dir."""
    base = tmp_path_factory.mktemp("small")
    topology = write_topology(base, SMALL)
    state = base / "state"
    with squealctl_up(state, topology, *SMALL_WITHOUT):
        yield state


@pytest.mark.parametrize("name", ["router/east-a/0", "memcached/east-a/wildcard/0"])
def test_kill_9_is_back_within_5s_and_status_shows_the_new_pid_and_one_restart(small: Path, name: str) -> None:
    old_pid, new_pid, took = kill_and_wait_back(small, name)
    assert took < BACK_WITHIN, f"{name} took {took:.2f} s to answer again"
    row = status(small)[name]
    assert (row["pid"], row["running"], row["answering"], row["restarts"]) == (new_pid, True, True, 1), row
    assert row["uptime"] is not None and row["uptime"] < 30
    assert not alive(old_pid)
    text = squealctl(small, "status").stdout
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    assert f" {new_pid} " in line and line.split()[5] == "1" and line.endswith(" up"), line
    log = (small / "supervisor.log").read_text()
    assert f"{name} (pid {old_pid}) killed by SIGKILL" in log
    assert f"{name} restarted: pid {new_pid} (restart 1)" in log
    # counted where Prometheus scrapes it
    metrics = json.loads((small / "components.json").read_text())["supervisors"][0]["metrics"]
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as resp:
        exposition = resp.read().decode()
    assert f'squeal_component_restarts_total{{cluster="east-a",component="{name}",' in exposition
    sample = next(line for line in exposition.splitlines() if f'component="{name}"' in line and "restarts" in line)
    assert sample.endswith(" 1.0"), sample
    scrape = json.loads(squealctl(small, "prometheus-config").stdout)
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert jobs["squeal-supervisor"]["static_configs"][0]["targets"] == [metrics]


def test_stop_keeps_it_down_until_start_and_restart_gives_a_new_pid(small: Path) -> None:
    name = "memcached/east-a/wildcard/1"
    before = status(small)[name]
    result = squealctl(small, "stop", name)
    assert result.stdout.startswith(f"{name} stopped (pid {before['pid']}"), result.stdout
    # Down, and it stays down: the supervisor decides about an exit when it sees it (component_exited), logging
    # either "stopped" (asked for) or "restarting it in N s" (a restart scheduled). Wait for that decision.
    log, exit_of = small / "supervisor.log", f"{name} (pid {before['pid']})"
    wait_until(lambda: f"{exit_of} stopped: " in log.read_text(), 10, f"the supervisor's decision about {exit_of}")
    restarts = [line for line in log.read_text().splitlines() if exit_of in line and "restart" in line]
    assert restarts == [], restarts  # no restart scheduled
    row = status(small)[name]
    assert (row["running"], row["answering"], row["stopped"], row["restarts"]) == (False, False, True, 0), row
    assert not alive(before["pid"])
    assert "stopped (squealctl start NAME)" in squealctl(small, "status", check=False).stdout
    assert squealctl(small, "status", check=False).returncode == 1  # not everything runs
    assert squealctl(small, "stop", name).stdout.strip() == f"{name} is already stopped"

    result = squealctl(small, "start", name)
    started = status(small)[name]
    assert result.stdout.startswith(f"{name} started: pid {started['pid']}, answering after"), result.stdout
    assert (started["running"], started["answering"], started["stopped"]) == (True, True, False), started
    assert started["pid"] != before["pid"] and started["restarts"] == 0  # asked for: not a restart
    assert squealctl(small, "start", name).stdout.strip() == f"{name} is already running (pid {started['pid']})"

    result = squealctl(small, "restart", name)
    restarted = status(small)[name]
    assert f"{name} stopped (pid {started['pid']}" in result.stdout
    assert f"{name} started: pid {restarted['pid']}" in result.stdout
    assert restarted["pid"] != started["pid"] and restarted["answering"] and restarted["restarts"] == 0
    assert not alive(started["pid"])
    assert squealctl(small, "status").returncode == 0


@pytest.mark.parametrize("action", ["stop", "start", "restart"])
def test_an_unknown_name_is_a_one_line_error_listing_the_valid_names(small: Path, action: str) -> None:
    result = squealctl(small, action, "router/east-a/9", check=False)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip() == (
        f"squealctl: error: unknown component 'router/east-a/9'; valid names: {', '.join(SMALL_NAMES)}"
    )
    names = json.loads(squealctl(small, "status", "--json").stdout)
    assert [r["name"] for r in names] == SMALL_NAMES


def test_down_stops_everything_including_restarted_components_and_the_supervisor(tmp_path: Path) -> None:
    topology = write_topology(tmp_path, SMALL)
    state = tmp_path / "state"
    try:
        squealctl(state, "up", str(topology), *SMALL_WITHOUT)
        first = {r["name"]: r["pid"] for r in status(state).values()}
        supervisor = supervisor_pid(state)
        _, restarted, _ = kill_and_wait_back(state, "memcached/east-a/wildcard/0")
        _, rerestarted, _ = kill_and_wait_back(state, "router/east-a/0")
        pids = {*first.values(), restarted, rerestarted, supervisor}
        assert alive(supervisor) and alive(restarted) and alive(rerestarted)
    finally:
        result = squealctl(state, "down", check=False)
    assert result.stdout.strip() == "squeal: stopped 3 components", result
    assert not [pid for pid in pids if alive(pid)], "processes left behind after down"
    assert not (state / "components.json").exists()
    assert "nothing is running" in squealctl(state, "status", check=False).stdout


def test_down_stops_a_component_restarted_by_hand_after_the_supervisor_died(tmp_path: Path) -> None:
    """The issue's report: restarted by hand from its /proc command line, `status` called it DOWN and `down`
    left it running. Status and down find a component by its command line when the recorded pid is gone."""
    topology = write_topology(tmp_path, SMALL)
    state = tmp_path / "state"
    by_hand: subprocess.Popen | None = None
    try:
        squealctl(state, "up", str(topology), *SMALL_WITHOUT)
        supervisor = supervisor_pid(state)
        os.kill(supervisor, signal.SIGKILL)
        name = "memcached/east-a/wildcard/0"
        row = status(state)[name]
        os.kill(row["pid"], signal.SIGKILL)
        wait_until(lambda: not alive(row["pid"]), 10, f"{name} (pid {row['pid']}) to die", error=None)
        after = squealctl(state, "status", check=False)
        assert after.returncode == 1 and f"supervisor (pid {supervisor}) is NOT RUNNING" in after.stdout
        assert not status(state)[name]["running"]
        cmdline = next(c for c in Deployment(state).components() if c.name == name).cmdline
        by_hand = subprocess.Popen(cmdline, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: status(state)[name]["answering"], 10, f"{name} answering", error=None)
        row = status(state)[name]
        assert (row["pid"], row["running"], row["answering"]) == (by_hand.pid, True, True), row
        result = squealctl(state, "restart", name, check=False)
        assert result.returncode == 2 and "the supervisor of the deployment" in result.stderr
        assert f"is not running (pid {supervisor})" in result.stderr
        others = [r["pid"] for r in status(state).values()]
    finally:
        result = squealctl(state, "down", check=False)
        if by_hand is not None:
            by_hand.wait(timeout=15)  # down stopped it: reap our child
    assert result.stdout.strip() == "squeal: stopped 3 components", result
    assert not [pid for pid in others if alive(pid)], "processes left behind after down"


# -- the squeal daemon and the drill: a deployment with MariaDB ---------------------------------------------------


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Two regions (primary + replica, a router, a memcached and squeal each); yields (topology, state dir)."""
    base = tmp_path_factory.mktemp("platform")
    topology = write_topology(base, TWO_REGIONS)
    state = base / "state"
    with squealctl_up(state, topology, "--without", "monitoring"):
        yield topology, state


def test_kill_9_squeal_is_back_within_5s(platform: tuple[Path, Path]) -> None:
    _, state = platform
    old_pid, new_pid, took = kill_and_wait_back(state, "squeal/east")
    assert took < BACK_WITHIN, f"squeal/east took {took:.2f} s to answer again"
    row = status(state)["squeal/east"]
    assert (row["pid"], row["answering"], row["restarts"]) == (new_pid, True, 1), row
    assert not alive(old_pid)


def test_drill_kills_pauses_and_restarts_then_verifies(platform: tuple[Path, Path]) -> None:
    topology, state = platform
    before = status(state)
    result = squealctl(state, "drill", "--pause", "1", check=False)
    print(result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    for step in (
        "kill -9 squeal/east",
        "kill -9 router/east-a/0",
        "kill -9 memcached/east-a/wildcard/0",
        "SIGSTOP router/west-a/0",
        "restart mariadb/west",
        "SIGSTOP mariadb/west",
        "replication after the stall of mariadb/west",
    ):
        assert any(line.startswith(f"drill: ok     {step}") for line in lines), f"{step}:\n{result.stdout}"
    assert f"drill: squealctl verify {topology}" in lines
    assert "drill: 7 of 7 checks passed" in lines
    assert result.returncode == 0, result.stdout
    after = status(state)
    assert after["router/west-a/0"]["pid"] == before["router/west-a/0"]["pid"]  # paused, not restarted
    assert after["router/east-a/0"]["restarts"] == before["router/east-a/0"]["restarts"] + 1
    assert after["mariadb/west"]["pid"] != before["mariadb/west"]["pid"]
    assert all(r["running"] and r["answering"] for r in after.values()), after
