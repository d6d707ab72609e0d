"""`squealctl up / status / down` over the example topology, moved to free ports."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import router_config
from ops.harness import ROUTER_BIN, free_port, memcached_command

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local.toml"


def squealctl(state: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(state), *args], capture_output=True, text=True, timeout=180
    )
    if check and result.returncode != 0:
        raise AssertionError(f"squealctl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def topology_file(tmp_path: Path) -> Path:
    topo = router_config.reassign_ports(router_config.load(EXAMPLE), free_port)
    path = tmp_path / "local.toml"
    path.write_text(router_config.dumps(topo))
    return path


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_up_status_down_leaves_no_process(tmp_path, topology_file):
    state = tmp_path / "state"
    without = [] if ROUTER_BIN.exists() else ["--without", "router,squeal,monitoring"]
    try:
        squealctl(state, "up", str(topology_file), *without)
        rows = json.loads(squealctl(state, "status", "--json").stdout)
        roles = [r["role"] for r in rows]
        # examples/local.toml has two squeal workers per region on two copies: east's primary + a local replica,
        # west's replica + a second one
        assert roles.count("mariadb-primary") == 1 and roles.count("mariadb-replica") == 3
        assert roles.count("zookeeper") == 3
        assert roles.count("memcached") == 22  # 4 clusters x (2 wildcard + 1 gutter + 2 replicated) + 2 regional
        if not without:
            assert (roles.count("router"), roles.count("squeal"), roles.count("monitoring")) == (4, 4, 1)
            # each region's one shard on its preferred worker, the other worker owning nothing
            workers = {r["name"]: r["owns"] for r in rows if r.get("state") == "worker"}
            assert workers == {
                "squeal/east/east-1": ["main"],
                "squeal/east/east-2": [],
                "squeal/west/west-1": ["main"],
                "squeal/west/west-2": [],
            }, workers
        assert all(r["running"] and r["answering"] for r in rows), rows
        assert all(r["healthy"] and r["problems"] == {} for r in rows), rows
        assert all(r["serving"] for r in rows if r["role"] == "zookeeper"), rows
        base = {"name", "role", "region", "cluster", "pool", "pid", "address", "metrics", "running", "answering"}
        base |= {"uptime", "restarts", "stopped", "log", "healthy", "problems"}
        ha = {"squeal": {"instance", "state", "owns"}, "zookeeper": {"serving", "mode"}}
        for r in rows:
            extra = {"instance"} if r["name"].count("/") == 2 and r["role"] == "mariadb-replica" else set()
            if r.get("owns"):  # a worker owning a shard: which shards it reads and from which copy
                extra = {"shards", "copies"}
            assert set(r) == base | ha.get(r["role"], set()) | extra, r
        a_memcached = next(r for r in rows if r["role"] == "memcached")
        host, port = a_memcached["address"].split(":")
        assert memcached_command((host, int(port)), b"version\r\n").startswith(b"VERSION")
        pids = [r["pid"] for r in rows]
    finally:
        squealctl(state, "down")
    assert not [pid for pid in pids if _alive(pid)], "processes left behind after down"
    assert "nothing is running" in squealctl(state, "status", check=False).stdout


def test_up_refuses_a_bad_topology_and_names_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE.read_text().replace('kind = "gutter"', 'kind = "gutterr"', 1))
    result = squealctl(tmp_path / "state", "up", str(bad), check=False)
    assert result.returncode == 2
    assert f"{bad}: regions.east.clusters.east-a.pools.gutter.kind: unknown pool kind 'gutterr'" in result.stderr


def test_up_refuses_ports_in_use_and_starts_nothing(tmp_path, topology_file):
    topo = router_config.load(topology_file)
    busy = topo.clusters[1].pools[0].servers[1]
    with socket.create_server((busy.host, busy.port)):
        result = squealctl(tmp_path / "state", "up", str(topology_file), check=False)
    assert result.returncode != 0
    where = f"regions.{topo.clusters[1].region}.clusters.{topo.clusters[1].name}.pools.{topo.clusters[1].pools[0].name}"
    assert f"1 port(s) already in use, nothing started: {busy} ({where}.servers)" in result.stderr
    assert "nothing is running" in squealctl(tmp_path / "state", "status", check=False).stdout


def test_router_config_all_prints_every_cluster(tmp_path):
    result = squealctl(tmp_path, "router-config", str(EXAMPLE), "--all")
    configs = json.loads(result.stdout)
    assert sorted(configs) == ["east-a", "east-b", "west-a", "west-b"]
    one = json.loads(squealctl(tmp_path, "router-config", str(EXAMPLE), "--cluster", "west-b").stdout)
    assert one == configs["west-b"]


def test_forwarded_commands_get_their_own_help(tmp_path):
    replay = squealctl(tmp_path, "replay", "--help")
    assert "usage: squealctl replay" in replay.stdout and "--from GTID" in replay.stdout
    loadtest = squealctl(tmp_path, "loadtest", "--help")
    assert "herd" in loadtest.stdout and "--short" in loadtest.stdout
