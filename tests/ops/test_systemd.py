"""`squealctl render systemd`: hosts in the topology, unit files systemd accepts, and 3-host runs.

The 3-host runs render every host of examples/three-hosts.toml (one squeal daemon per region) and
examples/three-hosts-ha.toml (two squeal instances per region, a ZooKeeper server on each host) — 127.0.0.1
and the loopback aliases 127.0.0.2 and 127.0.0.3: all of 127.0.0.0/8 is this machine — and start every
rendered ExecStartPre= and ExecStart= as the unit says (its User=, Environment=, WorkingDirectory=), the way
systemd would, then change rows on the primary and see their keys deleted from memcached servers on hosts
other than the deleting squeal daemon's.
"""

from __future__ import annotations

import itertools
import json
import os
import pwd
import shlex
import shutil
import signal
import ssl
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pymemcache.client.base import Client

import router_config
from ops import systemd, tls
from ops.cli import main as squealctl
from ops.harness import ROUTER_BIN, free_port, memcached_command, wait_until, zookeeper_mode
from router_config import TopologyError
from squeal import probe_health
from tests.binaries import needs_binary, require_binary

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "examples" / "local.toml"
THREE = REPO / "examples" / "three-hosts.toml"
THREE_HA = REPO / "examples" / "three-hosts-ha.toml"
SHARDED = REPO / "examples" / "sharded.toml"
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
# What systemd gives a service before its Environment= lines.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

needs_router = needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")


# -- helpers -----------------------------------------------------------------------------------------


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values in order]}} (no line continuations: the renderer writes none)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


def unescape(word: str) -> str:
    return word.replace("%%", "%").replace("$$", "$")


def exec_start(unit: dict) -> list[str]:
    (line,) = unit["Service"]["ExecStart"]
    return [unescape(w) for w in shlex.split(line)]


def exec_start_pre(unit: dict) -> list[list[str]]:
    return [[unescape(w) for w in shlex.split(line)] for line in unit["Service"].get("ExecStartPre", [])]


def role_of(path: Path) -> str:
    """A rendered service's kind from its name: zookeeper, memcached, router, daemon, worker,
    monitoring."""
    return path.stem.split("-")[1]


def verify(paths: list[Path]) -> None:
    """systemd-analyze verify must accept every unit without a word (it only warns about unknown keys)."""
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", *map(str, paths)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def render(topology: Path, host: str, out: Path, *extra: str) -> None:
    rc = squealctl(["render", "systemd", str(topology), "--host", host, "--out", str(out), *extra])
    assert rc == 0


def services_of(out: Path) -> list[Path]:
    """The services squeal.target wants, in its order; also checks nothing else was rendered."""
    wants = parse_unit(out / "squeal.target")["Unit"]["Wants"]
    assert sorted(wants) == sorted(p.name for p in out.glob("*.service")), "target and service files disagree"
    return [out / name for name in wants]


# -- hosts in the topology ---------------------------------------------------------------------------


def test_topology_hosts_default_to_loopback_and_round_trip():
    local = router_config.load(LOCAL)
    assert local.hosts() == ["127.0.0.1"]
    assert local.monitoring.host == "127.0.0.1" and {r.squeal_host for r in local.regions} == {"127.0.0.1"}

    three = router_config.load(THREE)
    assert three.hosts() == list(HOSTS)
    assert three.region("east").squeal_host == "127.0.0.3" and three.region("west").squeal_host == "127.0.0.2"
    assert three.monitoring.host == "127.0.0.1"
    assert str(three.squeal_address("west")) == "127.0.0.2:29101"
    listeners = {role: [] for role, _, _ in three.listeners()}
    for role, _, a in three.listeners():
        listeners[role].append(str(a))
    assert listeners["squeal"] == ["127.0.0.3:29100", "127.0.0.2:29101"]
    assert listeners["monitoring"] == ["127.0.0.1:29000"]

    again = router_config.loads(router_config.dumps(three))
    assert again.regions == three.regions and again.monitoring == three.monitoring

    text = THREE.read_text()
    for old, new, where in [
        ('squeal = { host = "127.0.0.3" }', 'squeal = { host = "" }', "regions.east.squeal.host"),
        ('squeal = { host = "127.0.0.3" }', 'squeal = { hots = "127.0.0.3" }', "regions.east.squeal.hots"),
        ('host = "127.0.0.1"          #', "host = 7  #", "monitoring.host"),
    ]:
        with pytest.raises(TopologyError) as e:
            router_config.loads(text.replace(old, new, 1), source="t.toml")
        assert e.value.path == where, str(e.value)


def test_unknown_host_is_a_one_line_error(tmp_path, capsys):
    rc = squealctl(["render", "systemd", str(THREE), "--host", "10.9.9.9", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "10.9.9.9" in err and "127.0.0.1, 127.0.0.2, 127.0.0.3" in err, err
    assert not (tmp_path / "out").exists()


def test_router_metrics_port_must_not_collide(tmp_path, capsys):
    # east-a's router listens on 21100 and a memcached of the same host on 21101.
    rc = squealctl(
        ["render", "systemd", str(THREE), "--host", "127.0.0.2", "--out", str(tmp_path), "--router-metrics-offset", "1"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "127.0.0.2:21101" in err and "--router-metrics-offset" in err, err


# -- the rendered units ------------------------------------------------------------------------------


def test_exec_start_words_survive_systemd_quoting():
    words = ["/opt/squeal venv/bin/squeal", "run", "/etc/squeal/100%.toml", "--x", '$HOME "q"', "a\\b"]
    line = " ".join(systemd.exec_quote(w) for w in words)
    assert "%%" in line and "$$HOME" in line
    assert [unescape(w) for w in shlex.split(line)] == words


@needs_router
def test_rendered_units_pass_systemd_analyze_verify(tmp_path):
    out = tmp_path / "local"
    render(LOCAL, "127.0.0.1", out, "--memcached-mb", "100")
    services = services_of(out)
    kinds = [role_of(p) for p in services]
    # examples/local.toml: two workers per region and a 3-server ensemble, never a `--region` daemon.
    assert {k: kinds.count(k) for k in kinds} == {
        "zookeeper": 3,
        "memcached": 22,
        "router": 4,
        "worker": 4,
        "monitoring": 1,
    }
    verify([*services, out / "squeal.target"])

    topo = router_config.load(LOCAL)
    assert (out / "topology.toml").read_text() == LOCAL.read_text()
    # Home directories are hidden from the services, or read-only when the venv's interpreter lives there.
    protect_home = "read-only" if systemd.home_paths(systemd.RenderOptions(), out) else "yes"
    for path in services:
        unit = parse_unit(path)
        service = unit["Service"]
        argv = exec_start(unit)
        assert Path(argv[0]).is_absolute() and os.access(argv[0], os.X_OK), argv
        assert unit["Unit"]["PartOf"] == ["squeal.target"] and unit["Install"]["WantedBy"] == ["squeal.target"]
        assert service["Restart"] == ["on-failure"] and service["User"] == ["squeal"]
        assert int(service["LimitNOFILE"][0]) >= 5000
        for key, value in [
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", protect_home),
            ("PrivateTmp", "yes"),
            ("PrivateDevices", "yes"),
            ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
            ("SystemCallFilter", "@system-service"),
            ("CapabilityBoundingSet", ""),
        ]:
            assert service[key] == [value], (path.name, key)
        if "memcached" in path.name:
            assert argv[argv.index("-m") + 1] == "100" and service["MemoryMax"] == [f"{100 + 25 + 64}M"]
            assert "StateDirectory" not in service
        if "router" in path.name:
            config = Path(argv[argv.index("--config-file") + 1])
            cluster = config.stem
            assert config.read_text() == router_config.render(router_config.cluster_config(topo, cluster))
            spool = argv[argv.index("--spool-dir") + 1]
            assert service["StateDirectory"] == [spool.removeprefix("/var/lib/")]
            assert spool.startswith("/var/lib/squeal/router-")
        if "daemon" in path.name or "worker" in path.name:
            assert argv[1:3] == ["run", str(out / "topology.toml")]
            assert service["StateDirectory"] == [argv[argv.index("--state-dir") + 1].removeprefix("/var/lib/")]
        if "zookeeper" in path.name:
            assert argv[1] == "-Xmx512m" and service["MemoryMax"] == [f"{2 * 512 + 128}M"]
            assert service["StateDirectory"] == [f"squeal/zookeeper-{path.stem.rsplit('-', 1)[1]}"]
            assert "MemoryDenyWriteExecute" not in service  # the JVM's JIT
        elif "memcached" in path.name or "router" in path.name:
            assert service["MemoryDenyWriteExecute"] == ["yes"]
        if "monitoring" in path.name:
            assert argv[1:5] == ["-m", "monitoring", "serve", str(out / "topology.toml")]

    # Rendering again after a component moved away removes its unit, not anything else in DIR.
    (out / "squeal-other.service").write_text("[Service]\nExecStart=/bin/true\n")
    moved = tmp_path / "moved.toml"
    moved.write_text(LOCAL.read_text().replace('"127.0.0.1:32200"', '"127.0.0.9:32200"'))
    render(moved, "127.0.0.1", out)
    assert not (out / "squeal-router-west-b-32200.service").exists()
    assert (out / "squeal-other.service").exists()


def _squeal_argvs(topology: Path, tmp_path: Path) -> dict[str, list[list[str]]]:
    """Every host's squeal units' ExecStart= (`squeal run …`), rendered through squealctl, by host."""
    out = {}
    for host in router_config.load(topology).hosts():
        where = tmp_path / f"{topology.stem}-{host}"
        render(topology, host, where)
        out[host] = [exec_start(parse_unit(p)) for p in services_of(where) if role_of(p) in ("daemon", "worker")]
    return out


def test_a_region_with_instances_never_gets_a_region_daemon(tmp_path):
    # east runs two workers on host C (a standalone ZooKeeper on host A); west keeps its single daemon.
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(
        THREE.read_text()
        + '\n[zookeeper]\nservers = ["127.0.0.1:29181"]\n'
        + '\n[[regions.east.squeal_instances]]\nname = "east-1"\nhost = "127.0.0.3"\nmetrics_port = 29110\n'
        + '\n[[regions.east.squeal_instances]]\nname = "east-2"\nhost = "127.0.0.3"\nmetrics_port = 29111\n'
        + "\n[regions.east.replicas.east-r1]\nport = 23308\nserver_id = 3\n"
    )
    mixed.write_text(mixed.read_text().replace('name = "east-2"\n', 'name = "east-2"\ndatabase = "east-r1"\n'))
    argvs = _squeal_argvs(mixed, tmp_path)
    assert argvs["127.0.0.3"] == [
        [str(systemd.DEFAULT_VENV / "bin" / "squeal"), "run", str(tmp_path / "mixed-127.0.0.3" / "topology.toml"),
         "--instance", name, "--metrics-port", port, "--state-dir", f"/var/lib/squeal/squeal-worker-{name}"]
        for name, port in (("east-1", "29110"), ("east-2", "29111"))
    ]  # fmt: skip
    assert [a[a.index("--region") + 1] for a in argvs["127.0.0.2"]] == ["west"]  # the single daemon stays
    assert argvs["127.0.0.1"] == []

    # A standalone ZooKeeper: no myid, no peers; ordered before the workers of its host (none here).
    zk = parse_unit(tmp_path / "mixed-127.0.0.1" / "squeal-zookeeper-1.service")
    assert "ExecStartPre" not in zk["Service"]
    cfg = (tmp_path / "mixed-127.0.0.1" / "zookeeper" / "zoo-1.cfg").read_text()
    assert "clientPort=29181\nclientPortAddress=127.0.0.1\n" in cfg and "server." not in cfg
    assert "dataDir=/var/lib/squeal/zookeeper-1\n" in cfg

    # Every topology with instances, on every host: workers only, each exactly once, on the host it names.
    for topology in (LOCAL, THREE_HA, SHARDED):
        topo = router_config.load(topology)
        argvs = _squeal_argvs(topology, tmp_path)
        every = [a for host_argvs in argvs.values() for a in host_argvs]
        assert not [a for a in every if "--region" in a], topology
        ran = {a[a.index("--instance") + 1]: host for host, host_argvs in argvs.items() for a in host_argvs}
        expected = {s.name: s.host for r in topo.regions for s in r.squeal_instances}
        assert ran == expected and len(every) == len(expected), topology


def test_sharded_topology_renders_no_unit_per_shard(tmp_path):
    out = tmp_path / "sharded"
    render(SHARDED, "127.0.0.1", out)
    services = services_of(out)
    topo = router_config.load(SHARDED)
    # A region's workers run the shards' pipelines: nothing is named after a shard.
    assert not [p.name for p in services for sh in topo.shards if sh.name in p.name]
    kinds = [role_of(p) for p in services]
    assert (kinds.count("worker"), kinds.count("zookeeper"), kinds.count("daemon")) == (4, 3, 0)
    # The monitoring server's list has every shard copy (MariaDB, not rendered), instance and ZooKeeper server.
    listed = json.loads((out / "monitoring" / "components.json").read_text())["components"]
    copies = {
        (c["shard"], c["region"], c["instance"], c["address"]) for c in listed if c["role"].startswith("mariadb-")
    }
    assert copies == {(sh.name, d.region, None, str(d.address)) for sh in topo.shards for d in sh.copies} | {
        (sh.name, d.region, "east-r", str(d.address)) for sh in topo.shards for d in sh.replicas
    }
    assert len(copies) == 12  # the extra copies ([shards.users.replicas.east-b]) too
    described = systemd.describe_databases(topo, "127.0.0.1")
    assert "shard users-2's extra copy users-2@east-r in east (127.0.0.1:13432, server_id 432, from users-2@east)" in (
        described
    ), described
    assert {c["instance"] for c in listed if c["role"] == "squeal"} == {"east-1", "east-2", "west-1", "west-2"}
    assert [c["address"] for c in listed if c["role"] == "zookeeper"] == [str(a) for a in topo.zookeeper.servers]


# -- three hosts on this machine -------------------------------------------------------------------


def _metrics_offset(topo: router_config.Topology) -> int:
    """An offset putting every router's /metrics on a port that is free now and unused by the topology."""
    used = {a.port for _, _, a in topo.listeners()}
    for offset in itertools.count(50):
        ports = [(a.host, a.port + offset) for c in topo.clusters for a in c.routers]
        if all(p not in used and router_config.can_listen(router_config.Address(h, p)) for h, p in ports):
            return offset
    raise AssertionError("unreachable")


def _port_open(host: str, port: int) -> bool:
    import socket

    with socket.create_connection((host, port), timeout=0.5):
        return True


def _http(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.read().decode()


class _Started:
    """The processes started from unit files; stopped by pid (SIGTERM, then SIGKILL)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.stopped: set[str] = set()  # stopped on purpose (`systemctl stop`): not a failure

    def start(self, unit_path: Path) -> None:
        unit = parse_unit(unit_path)
        service = unit["Service"]
        env = {"PATH": SYSTEMD_PATH}
        env.update(v.split("=", 1) for v in service.get("Environment", []))
        account = pwd.getpwnam(service["User"][0])
        as_service = {
            "cwd": unescape(service["WorkingDirectory"][0]),
            "env": env,
            "user": account.pw_uid,
            "group": account.pw_gid,
            "extra_groups": [],
            "stdin": subprocess.DEVNULL,
        }
        for pre in exec_start_pre(unit):  # systemd runs each to completion first; a failure fails the start
            done = subprocess.run(pre, capture_output=True, text=True, timeout=30, **as_service)
            assert done.returncode == 0, (unit_path.name, pre, done.stdout + done.stderr)
        log = open(self.logs / f"{unit_path.stem}.log", "ab")
        proc = subprocess.Popen(
            exec_start(unit), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **as_service
        )
        log.close()
        self.procs.append((unit_path.name, proc))

    def stop_unit(self, name: str) -> None:
        """`systemctl stop NAME`: SIGTERM, wait."""
        proc = dict(self.procs)[name]
        self.stopped.add(name)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    def exited(self) -> list[str]:
        return [
            f"{name} (exit {p.returncode}): {self._tail(name)}"
            for name, p in self.procs
            if p.poll() is not None and name not in self.stopped
        ]

    def _tail(self, name: str) -> str:
        path = self.logs / f"{Path(name).stem}.log"
        return " | ".join(path.read_text(errors="replace").splitlines()[-5:]) if path.exists() else ""

    def stop(self) -> None:
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _service_account() -> pwd.struct_passwd:
    """The units run as an unprivileged account ("nobody" is refused by systemd) -- unless this machine's venv
    runs an interpreter from root's home (pyenv), which only root may: then they are rendered for root."""
    in_root_home = [p for p in systemd.home_paths(systemd.RenderOptions(), Path("/tmp")) if p.is_relative_to("/root")]
    return pwd.getpwnam("root" if in_root_home else "daemon")


def _render_hosts(topology: Path, base: Path, options: list[str]) -> list[Path]:
    """Every host's units, each host's set checked by systemd-analyze verify; all their services."""
    services: list[Path] = []
    for host in HOSTS:
        out = base / host
        render(topology, host, out, *options)
        services += services_of(out)
        verify([*services_of(out), out / "squeal.target"])
    return services


def _start_in_order(started: _Started, services: list[Path], topo: router_config.Topology) -> None:
    """Start every service, a kind at a time, each kind ready before the next (ZooKeeper serving, ports open).

    systemd starts each host's units in any order and the routers cope (a server that does not answer yet is
    marked down and probed again); here the memcached servers of every host come first, so that no router
    starts by failing over to its gutter pool and the keys cached by the test land where they hash."""
    for role in ("zookeeper", "memcached", "router", "daemon", "worker", "monitoring"):
        of_role = [path for path in services if role_of(path) == role]
        if not of_role:
            continue
        for path in of_role:
            started.start(path)
        if role == "zookeeper":  # only a quorum serves: wait for all of them together
            for a in topo.zookeeper.servers:
                wait_until(lambda a=a: zookeeper_mode(str(a)) is not None, 90, f"ZooKeeper {a} serving")
            continue
        listening = {"daemon": "squeal", "worker": "squeal"}.get(role, role)
        for kind, _, a in topo.listeners():
            if kind == listening:
                wait_until(lambda a=a: _port_open(a.host, a.port), 60, f"{role} on {a}")
        assert not started.exited(), started.exited()


def _invalidated_elsewhere(topo, primary, deleter_host: dict[str, str], round_: int) -> None:
    """Cache users 1..12 in every cluster through its router; a row change on the primary (host 1) must delete
    each key from the memcached that held it, some of them on a host other than the deleting daemon's."""
    holders: dict[str, dict[str, router_config.Address]] = {}
    for cluster in topo.clusters:
        router = Client((cluster.routers[0].host, cluster.routers[0].port), timeout=2)
        for i in range(1, 13):
            assert router.set(f"user:{i}", b"cached row", expire=300, noreply=False)
        holders[cluster.name] = {}
        for server in cluster.wildcard.servers:
            direct = Client((server.host, server.port), timeout=2)
            for i in range(1, 13):
                if direct.get(f"user:{i}") is not None:
                    holders[cluster.name][f"user:{i}"] = server
        assert len(holders[cluster.name]) == 12, holders
        elsewhere = {a.host for a in holders[cluster.name].values()} - {deleter_host[cluster.region]}
        assert elsewhere, f"no key of {cluster.name} is cached on a host other than its squeal daemon's"

    primary.execute(f"UPDATE app.users SET name = CONCAT(name, '{round_}') WHERE id <= 12")

    def all_gone() -> bool:
        return not [
            key
            for keys in holders.values()
            for key, a in keys.items()
            if Client((a.host, a.port), timeout=2).get(key) is not None
        ]

    wait_until(all_gone, 30, f"invalidations in every cluster (round {round_})")


def _probed_everywhere(topo: router_config.Topology) -> None:
    """The monitoring server on host 1 probes every cluster through their routers on hosts 2 and 3."""
    monitor = f"http://{topo.monitoring.host}:{topo.monitoring.port}/metrics"

    def probed() -> bool:
        counts = {
            sample.labels["cluster"]: sample.value
            for family in text_string_to_metric_families(_http(monitor))
            for sample in family.samples
            if sample.name == "squeal_probe_invalidation_seconds_count"
        }
        return all(counts.get(c.name, 0) >= 1 for c in topo.clusters)

    wait_until(probed, 30, "canary probes through every cluster")


def _users_table(primary) -> None:
    primary.execute(
        "CREATE DATABASE app",
        "CREATE TABLE app.users (id BIGINT PRIMARY KEY, name VARCHAR(100) NOT NULL, email VARCHAR(191) NOT NULL)",
        "INSERT INTO app.users VALUES " + ",".join(f"({i}, 'u{i}', 'u{i}@example.com')" for i in range(1, 13)),
    )


@needs_router
def test_three_hosts_run_from_rendered_units(mariadb_factory, tmp_path):
    topo = router_config.reassign_ports(router_config.load(THREE), free_port)  # hosts stay, ports move
    offset = _metrics_offset(topo)
    account = _service_account()
    base = Path(tempfile.mkdtemp(prefix="squeal-3hosts-"))  # readable by that account (tmp_path is not)
    base.chmod(0o755)
    started = _Started(tmp_path)
    try:
        topology = base / "three-hosts.toml"
        topology.write_text(router_config.dumps(topo))
        data = base / "data"  # a data dir outside /var/lib: the operator creates it for the service account
        data.mkdir()
        os.chown(data, account.pw_uid, account.pw_gid)

        # Host 1's databases come from the harness (MariaDB is configured by hand in a real deployment).
        east, west = topo.region("east").database, topo.region("west").database
        primary = mariadb_factory(east.server_id, port=east.port, host=east.host)
        _users_table(primary)
        replica = mariadb_factory(west.server_id, port=west.port, host=west.host, replica=True)
        replica.replicate_from(primary)
        replica.wait_for_gtid(primary.gtid_binlog_pos())

        options = ["--data-dir", str(data), "--user", account.pw_name, "--router-metrics-offset", str(offset)]
        services = _render_hosts(topology, base, options)
        assert len(services) == 13  # 8 memcached + 2 routers + 2 squeal daemons + monitoring

        _start_in_order(started, services, topo)
        for region in topo.regions:
            # squeal serves /healthz on its topology host (regions.R.squeal.host)
            healthy = f"http://{topo.squeal_address(region.name)}/healthz"  # 200 once every flow is healthy
            wait_until(lambda url=healthy: bool(_http(url)), 60, f"squeal {region.name}")
        assert not started.exited(), started.exited()

        _invalidated_elsewhere(topo, primary, {r.name: r.squeal_host for r in topo.regions}, 1)
        _probed_everywhere(topo)
        assert not started.exited(), started.exited()
    finally:
        started.stop()
        shutil.rmtree(base, ignore_errors=True)


def _check_ha_units(topo: router_config.Topology, base: Path, services: list[Path], data: Path) -> None:
    """Every host's share of a topology with squeal instances: one `squeal run --instance` per instance on its
    host (no `--region` daemon), one ZooKeeper unit per server on its host with the same ensemble in every
    zoo.cfg, and the monitoring server's list naming every instance and ZooKeeper server."""
    instances = {s.name: s for r in topo.regions for s in r.squeal_instances}
    seen_instances: dict[str, str] = {}
    seen_zookeepers: dict[int, str] = {}
    ensemble = [f"server.{i}={h}:{q}:{e}" for i, h, q, e in topo.zookeeper.peers()]
    for path in services:
        host, unit = path.parent.name, parse_unit(path)
        argv = exec_start(unit)
        assert role_of(path) != "daemon" and "--region" not in argv, path
        if role_of(path) == "worker":
            name = argv[argv.index("--instance") + 1]
            assert argv[1:3] == ["run", str(path.parent / "topology.toml")]
            assert argv[argv.index("--metrics-port") + 1] == str(instances[name].metrics_port)
            assert name not in seen_instances and instances[name].host == host, (name, host)
            seen_instances[name] = host
            # ordered after the ZooKeeper server of its host, if any
            assert unit["Unit"]["After"][-1].startswith("squeal-zookeeper-"), unit["Unit"]
        if role_of(path) == "zookeeper":
            myid = int(path.stem.rsplit("-", 1)[1])
            assert myid not in seen_zookeepers
            seen_zookeepers[myid] = host
            lines = Path(argv[-1]).read_text().splitlines()
            cfg = dict(line.split("=", 1) for line in lines if not line.startswith("server."))
            servers = [line for line in lines if line.startswith("server.")]
            assert servers == ensemble, (path, servers)
            client = topo.zookeeper.servers[myid - 1]
            assert (
                (cfg["clientPortAddress"], int(cfg["clientPort"])) == (client.host, client.port) == (host, client.port)
            )
            assert cfg["dataDir"] == str(data / f"zookeeper-{myid}")
            assert unit["Service"]["ReadWritePaths"] == [cfg["dataDir"]]
            assert exec_start_pre(unit) == [["/bin/sh", "-c", f"mkdir -p {cfg['dataDir']} && echo {myid} > "
                                                                f"{cfg['dataDir']}/myid"]]  # fmt: skip
            assert Path(argv[0]).is_absolute() and argv[argv.index("-cp") + 1].endswith("/usr/share/java/zookeeper.jar")
    assert seen_instances == {name: s.host for name, s in instances.items()}
    assert seen_zookeepers == {i: h for i, h, _, _ in topo.zookeeper.peers()}
    listed = json.loads((base / topo.monitoring.host / "monitoring" / "components.json").read_text())["components"]
    squeal = {(c["instance"], c["address"], c["metrics"]) for c in listed if c["role"] == "squeal"}
    assert squeal == {(s.name, str(s.address), str(s.address)) for s in instances.values()}
    assert [c["address"] for c in listed if c["role"] == "zookeeper"] == [str(a) for a in topo.zookeeper.servers]
    replicas = {c["instance"]: c["address"] for c in listed if c["role"] == "mariadb-replica" and c["instance"]}
    assert replicas == {d.name: str(d.address) for r in topo.regions for d in r.replicas}


def _owner(topo: router_config.Topology, region: str) -> router_config.SquealInstance | None:
    """The worker that owns the region's one shard now (None: none, or several say they do)."""
    owners = [s for s in topo.region(region).squeal_instances if probe_health(str(s.address))[1].get("owns")]
    return owners[0] if len(owners) == 1 else None


@needs_router
def test_three_hosts_ha_run_from_rendered_units(mariadb_factory, tmp_path):
    """examples/three-hosts-ha.toml from its rendered units: a ZooKeeper server on each host, two squeal
    workers per region on hosts 2 and 3; the owner of each region's shard deletes on the other hosts, and once
    east's owner is stopped the other east worker, on the other host, takes the shard over."""
    topo = router_config.reassign_ports(router_config.load(THREE_HA), free_port)
    offset = _metrics_offset(topo)
    account = _service_account()
    base = Path(tempfile.mkdtemp(prefix="squeal-3hosts-ha-"))
    base.chmod(0o755)
    started = _Started(tmp_path)
    try:
        topology = base / "three-hosts-ha.toml"
        topology.write_text(router_config.dumps(topo))
        data = base / "data"
        data.mkdir()
        os.chown(data, account.pw_uid, account.pw_gid)

        # Host 1's four MariaDB servers (configured by hand in a real deployment, docs/deploy.md section 3).
        east, west = topo.region("east"), topo.region("west")
        primary = mariadb_factory(east.database.server_id, port=east.database.port, host=east.database.host)
        _users_table(primary)
        for db in (west.database, *east.replicas, *west.replicas):
            assert db.replicates_from in ("", "east"), db  # every copy of this example replicates from east
            copy = mariadb_factory(db.server_id, port=db.port, host=db.host, replica=True)
            copy.replicate_from(primary)
            copy.wait_for_gtid(primary.gtid_binlog_pos())

        options = ["--data-dir", str(data), "--user", account.pw_name, "--router-metrics-offset", str(offset)]
        options += ["--zookeeper-heap-mb", "128"]
        services = _render_hosts(topology, base, options)
        kinds = [role_of(p) for p in services]
        assert {k: kinds.count(k) for k in kinds} == {
            "zookeeper": 3, "memcached": 8, "router": 2, "worker": 4, "monitoring": 1
        }  # fmt: skip
        _check_ha_units(topo, base, services, data)

        _start_in_order(started, services, topo)
        for region in topo.regions:
            wait_until(lambda r=region.name: _owner(topo, r) is not None, 60, f"an owner in {region.name}")
        assert not started.exited(), started.exited()

        owners = {r.name: _owner(topo, r.name) for r in topo.regions}
        _invalidated_elsewhere(topo, primary, {r: s.host for r, s in owners.items()}, 1)
        _probed_everywhere(topo)

        # `systemctl stop` of east's owner on its host: the other east worker, on the other host, takes over.
        gone = owners["east"]
        started.stop_unit(f"squeal-worker-{gone.name}.service")
        wait_until(
            lambda: (s := _owner(topo, "east")) is not None and s.name != gone.name,
            60,
            "east's other worker to own the shard",
        )
        successor = _owner(topo, "east")
        assert successor.host != gone.host
        _invalidated_elsewhere(topo, primary, {"east": successor.host, "west": owners["west"].host}, 2)
        assert not started.exited(), started.exited()
    finally:
        started.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_pooled_region_renders_one_unit_per_worker_and_the_ensemble(tmp_path):
    """Issue 24 item 5: a region with squeal instances (`squeal_pool = true` or not: the same) runs one `squeal run
    --instance NAME` per worker (it runs the shards the pool's controller gives it), never a `--region` daemon,
    next to the ZooKeeper servers."""
    pooled = tmp_path / "pooled.toml"
    text = SHARDED.read_text().replace(
        "[regions.east]\nmaster = true\n", "[regions.east]\nmaster = true\nsqueal_pool = true\n"
    )
    text = text.replace(
        "[regions.west]\n",
        '[[regions.east.squeal_instances]]\nname = "east-3"\nhost = "127.0.0.2"\n'
        "metrics_port = 19412\n\n[regions.west]\n",
    )
    pooled.write_text(text)
    topo = router_config.load(pooled)
    assert topo.region("east").squeal_pool and len(topo.region("east").squeal_instances) == 3
    here, there = tmp_path / "here", tmp_path / "there"
    render(pooled, "127.0.0.1", here)
    render(pooled, "127.0.0.2", there)
    kinds = [role_of(p) for p in services_of(here)]
    assert (kinds.count("worker"), kinds.count("zookeeper"), kinds.count("daemon")) == (4, 3, 0)
    assert [p.name for p in services_of(there)] == ["squeal-worker-east-3.service"]
    verify([*services_of(here), here / "squeal.target"])
    for out, name, port in ((here, "east-1", "19410"), (here, "east-2", "19411"), (there, "east-3", "19412")):
        unit = parse_unit(out / f"squeal-worker-{name}.service")
        assert exec_start(unit) == [
            str(systemd.DEFAULT_VENV / "bin" / "squeal"), "run", str(out / "topology.toml"), "--instance", name,
            "--metrics-port", port, "--state-dir", f"/var/lib/squeal/squeal-worker-{name}"]  # fmt: skip
        assert unit["Service"]["StateDirectory"] == [f"squeal/squeal-worker-{name}"]
        (description,) = unit["Unit"]["Description"]
        assert f"worker {name} of region east's pool" in description, description
        # ordered after the ensemble's servers on its host (none on 127.0.0.2)
        zk_after = [a for a in unit["Unit"].get("After", []) if "zookeeper" in a]
        assert zk_after == ([f"squeal-zookeeper-{i}.service" for i in (1, 2, 3)] if out is here else [])
    # the monitoring server scrapes every worker
    listed = json.loads((here / "monitoring" / "components.json").read_text())["components"]
    assert {c["instance"] for c in listed if c["role"] == "squeal"} == {
        "east-1",
        "east-2",
        "east-3",
        "west-1",
        "west-2",
    }


# -- [tls] (issue 25) -----------------------------------------------------------------------------------------


def _tls_topology(
    tmp_path: Path, components: tuple[str, ...] = ("mariadb", "zookeeper", "squeal", "router", "memcached")
) -> Path:
    """examples/three-hosts-ha.toml with `[tls] dir = "tls"` (ops.tls's CA and certificates) and one ZooKeeper
    server on a free port (a standalone server starts quickly on a shared machine)."""
    d = tmp_path / "tls"
    ca = tls.make_ca(d)
    for name in components:
        tls.issue(ca, d, name)
    text = THREE_HA.read_text()
    text = text.replace(
        'servers = ["127.0.0.1:25181", "127.0.0.2:25182", "127.0.0.3:25183"]', f'servers = ["127.0.0.1:{free_port()}"]'
    )
    text = text.replace(
        "peer_ports = [[25281, 25381], [25282, 25382], [25283, 25383]]",
        f"peer_ports = [[{free_port()}, {free_port()}]]",
    )
    path = tmp_path / "tls-ha.toml"
    path.write_text('[tls]\ndir = "tls"\nrequire = true\n\n' + text)
    return path


def test_tls_topology_renders_zookeepers_tls_port_and_mariadbs_ssl_settings(tmp_path):
    topology = _tls_topology(tmp_path)
    topo = router_config.load(topology)
    out, data = tmp_path / "out", tmp_path / "data"
    render(topology, "127.0.0.1", out, "--data-dir", str(data))
    tls_dir = tmp_path / "tls"

    cnf = (out / "mariadb" / "tls.cnf").read_text()
    assert "[mariadbd]" in cnf
    for line in (
        f"ssl-cert = {tls_dir / 'mariadb.crt'}",
        f"ssl-key = {tls_dir / 'mariadb.key'}",
        f"ssl-ca = {tls_dir / 'ca.crt'}",
        "require-secure-transport = ON",
    ):
        assert line in cnf.splitlines(), (line, cnf)

    cfg = (out / "zookeeper" / "zoo-1.cfg").read_text().splitlines()
    port = topo.zookeeper.servers[0].port
    assert f"secureClientPort={port}" in cfg and not any(c.startswith("clientPort=") for c in cfg), cfg
    assert "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory" in cfg
    keystore = data / "zookeeper-1" / "tls-keystore.pem"
    assert f"ssl.keyStore.location={keystore}" in cfg and f"ssl.trustStore.location={tls_dir / 'ca.crt'}" in cfg
    unit = parse_unit(out / "squeal-zookeeper-1.service")
    argv = exec_start(unit)
    assert argv[argv.index("-cp") + 1].endswith(f":{systemd.NETTY_CODEC_JAR}")
    (pre,) = exec_start_pre(unit)  # standalone: no myid, only the key store
    assert pre[:2] == ["/bin/sh", "-c"] and str(keystore) in pre[2] and "umask 077" in pre[2]
    verify([*services_of(out), out / "squeal.target"])

    # and it runs: the pre-command builds the key store, the server answers only over TLS
    require_binary(
        Path(systemd.NETTY_CODEC_JAR).exists() and Path("/usr/share/zookeeper").exists(),
        "ZooKeeper or libnetty-java not installed (scripts/setup.sh)",
    )
    subprocess.run(pre, check=True, timeout=30)
    assert keystore.stat().st_mode & 0o077 == 0
    log = (tmp_path / "zk.log").open("w")
    proc = subprocess.Popen(argv, cwd=out, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        address = str(topo.zookeeper.servers[0])
        ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        assert (
            wait_until(
                lambda: zookeeper_mode(address, ctx),
                90,
                "the rendered ZooKeeper over TLS",
                proc=proc,
                log_file=tmp_path / "zk.log",
            )
            == "standalone"
        )
        assert zookeeper_mode(address) is None  # a plaintext client gets nothing
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_tls_topology_without_a_servers_certificate_is_a_one_line_error(tmp_path, capsys):
    topology = _tls_topology(tmp_path, components=("mariadb", "squeal"))
    rc = squealctl(["render", "systemd", str(topology), "--host", "127.0.0.1", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "tls.zookeeper" in err and str(topology) in err, err


@needs_router
def test_tls_topology_renders_tls_only_routers_and_memcached_that_serve_tls(tmp_path):
    """With [tls] a router's topology port is its one port, TLS only (no plaintext -p), and memcached runs -Z;
    the rendered router reaches the rendered memcached over TLS (its config says security_mech tls)."""
    d = tmp_path / "tls"
    ca = tls.make_ca(d)
    for name in ("mariadb", "zookeeper", "squeal", "router", "memcached"):
        tls.issue(ca, d, name, hosts=HOSTS)
    account = _service_account()
    for key in d.glob("*.key"):  # the services' account reads its keys, as an operator would arrange
        os.chown(key, account.pw_uid, account.pw_gid)
    moved = router_config.reassign_ports(router_config.load(THREE_HA), free_port)
    topology = tmp_path / "tls-ha.toml"
    topology.write_text('[tls]\ndir = "tls"\nrequire = true\n\n' + router_config.dumps(moved))
    topo = router_config.load(topology)
    east_a, regional = topo.cluster("east-a"), topo.region("east").regional_pool
    assert regional is not None
    router, cache = east_a.routers[0], regional.servers[0]  # on 127.0.0.2 and 127.0.0.1
    options = ["--data-dir", str(tmp_path / "data"), "--user", account.pw_name]
    render(topology, router.host, tmp_path / router.host, *options)
    render(topology, cache.host, tmp_path / cache.host, *options)
    router_unit = tmp_path / router.host / f"squeal-router-east-a-{router.port}.service"
    cache_unit = tmp_path / cache.host / f"squeal-memcached-east-regional-{cache.port}.service"
    argv = exec_start(parse_unit(router_unit))
    assert "-p" not in argv and argv[argv.index("--ssl-port") + 1] == str(router.port), argv
    assert [argv[argv.index(f) + 1] for f in ("--pem-cert-path", "--pem-key-path", "--pem-ca-path")] == [
        str(d / "router.crt"),
        str(d / "router.key"),
        str(d / "ca.crt"),
    ]
    argv = exec_start(parse_unit(cache_unit))
    assert argv[-3:] == ["-Z", "-o", f"ssl_chain_cert={d / 'memcached.crt'},ssl_key={d / 'memcached.key'}"], argv
    config = json.loads((tmp_path / router.host / "routers" / "east-a.json").read_text())
    assert {p.get("security_mech") for p in config["pools"].values()} == {"tls"}, config["pools"]

    # and they serve: TLS only, the router reaching memcached over TLS
    started = _Started(tmp_path)
    try:
        started.start(cache_unit)
        started.start(router_unit)
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        for a in (cache, router):
            wait_until(
                lambda a=a: memcached_command((a.host, a.port), b"version\r\n", tls=ctx).startswith(b"VERSION"),
                30,
                f"{a} answering over TLS",
            )
            try:  # a plaintext client gets nothing: the connection is closed (or reset) on it
                reply = memcached_command((a.host, a.port), b"version\r\n", timeout=5)
            except OSError:
                reply = b""
            assert not reply.startswith(b"VERSION"), f"{a} answered a plaintext client"
        to_router = (router.host, router.port)
        assert memcached_command(to_router, b"set regional:k 0 0 2\r\nhi\r\n", tls=ctx) == b"STORED"
        assert memcached_command((cache.host, cache.port), b"get regional:k\r\n", tls=ctx).startswith(b"VALUE")
        assert not started.exited(), started.exited()
    finally:
        started.stop()
