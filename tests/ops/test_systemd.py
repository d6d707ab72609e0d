"""`squealctl render systemd`: hosts in the topology, unit files systemd accepts, and a 3-host run.

The 3-host run renders every host of examples/three-hosts.toml (127.0.0.1, and the loopback aliases
127.0.0.2 and 127.0.0.3: all of 127.0.0.0/8 is this machine) and starts every rendered ExecStart= as the
unit says (its User=, Environment=, WorkingDirectory=), the way systemd would, then changes rows on the
primary and sees their keys deleted from memcached servers on hosts other than the squeal daemon's.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pymemcache.client.base import Client

import router_config
from ops import systemd
from ops.cli import main as squealctl
from ops.harness import ROUTER_BIN, free_port, wait_until
from router_config import TopologyError
from tests.binaries import needs_binary

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "examples" / "local.toml"
THREE = REPO / "examples" / "three-hosts.toml"
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
    kinds = [p.stem.split("-")[1] for p in services]
    assert (kinds.count("memcached"), kinds.count("router"), kinds.count("daemon"), kinds.count("monitoring")) == (
        22,
        4,
        2,
        1,
    )
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
        if "daemon" in path.name:
            assert argv[1:3] == ["run", str(out / "topology.toml")]
            assert service["StateDirectory"] == [argv[argv.index("--state-dir") + 1].removeprefix("/var/lib/")]
        if "monitoring" in path.name:
            assert argv[1:5] == ["-m", "monitoring", "serve", str(out / "topology.toml")]

    # Rendering again after a component moved away removes its unit, not anything else in DIR.
    (out / "squeal-other.service").write_text("[Service]\nExecStart=/bin/true\n")
    moved = tmp_path / "moved.toml"
    moved.write_text(LOCAL.read_text().replace('"127.0.0.1:32200"', '"127.0.0.9:32200"'))
    render(moved, "127.0.0.1", out)
    assert not (out / "squeal-router-west-b-32200.service").exists()
    assert (out / "squeal-other.service").exists()


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

    def start(self, unit_path: Path) -> None:
        unit = parse_unit(unit_path)
        service = unit["Service"]
        env = {"PATH": SYSTEMD_PATH}
        env.update(v.split("=", 1) for v in service.get("Environment", []))
        account = pwd.getpwnam(service["User"][0])
        log = open(self.logs / f"{unit_path.stem}.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            exec_start(unit),
            cwd=unescape(service["WorkingDirectory"][0]),
            env=env,
            user=account.pw_uid,
            group=account.pw_gid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append((unit_path.name, proc))

    def exited(self) -> list[str]:
        return [f"{name} (exit {p.returncode}): {self._tail(name)}" for name, p in self.procs if p.poll() is not None]

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


@needs_router
def test_three_hosts_run_from_rendered_units(mariadb_factory, tmp_path):
    topo = router_config.reassign_ports(router_config.load(THREE), free_port)  # hosts stay, ports move
    offset = _metrics_offset(topo)
    # The units run as an unprivileged account ("nobody" is refused by systemd) -- unless this machine's venv
    # runs an interpreter from root's home (pyenv), which only root may: then they are rendered for root.
    in_root_home = [p for p in systemd.home_paths(systemd.RenderOptions(), Path("/tmp")) if p.is_relative_to("/root")]
    account = pwd.getpwnam("root" if in_root_home else "daemon")
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
        primary.execute(
            "CREATE DATABASE app",
            "CREATE TABLE app.users (id BIGINT PRIMARY KEY, name VARCHAR(100) NOT NULL, email VARCHAR(191) NOT NULL)",
            "INSERT INTO app.users VALUES " + ",".join(f"({i}, 'u{i}', 'u{i}@example.com')" for i in range(1, 13)),
        )
        replica = mariadb_factory(west.server_id, port=west.port, host=west.host, replica=True)
        replica.replicate_from(primary)
        replica.wait_for_gtid(primary.gtid_binlog_pos())

        options = ["--data-dir", str(data), "--user", account.pw_name, "--router-metrics-offset", str(offset)]
        services: list[Path] = []
        for host in HOSTS:
            out = base / host
            render(topology, host, out, *options)
            services += services_of(out)
            verify([*services_of(out), out / "squeal.target"])
        assert len(services) == 13  # 8 memcached + 2 routers + 2 squeal daemons + monitoring

        # systemd starts each host's units in any order and the routers cope (a server that does not answer
        # yet is marked down and probed again); here the memcached servers of every host come first, so that
        # no router starts by failing over to its gutter pool and the keys below land where they hash.
        for role in ("memcached", "router", "daemon", "monitoring"):
            for path in services:
                if path.stem.split("-")[1] == role:
                    started.start(path)
            for kind, _, a in topo.listeners():
                if kind == role:
                    wait_until(lambda a=a: _port_open(a.host, a.port), 30, f"{role} on {a}")
        for region in topo.regions:
            # squeal serves /healthz on its topology host (regions.R.squeal.host)
            healthy = f"http://{topo.squeal_address(region.name)}/healthz"  # 200 once every flow is healthy
            wait_until(lambda url=healthy: bool(_http(url)), 60, f"squeal {region.name}")
        assert not started.exited(), started.exited()

        # Cache users 1..12 in every cluster, through its router; note which memcached holds each key.
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
            elsewhere = {a.host for a in holders[cluster.name].values()} - {topo.region(cluster.region).squeal_host}
            assert elsewhere, f"no key of {cluster.name} is cached on a host other than its squeal daemon's"

        # A row change on the primary (host 1) → each key gone from its memcached, on other hosts.
        primary.execute("UPDATE app.users SET name = CONCAT(name, '!') WHERE id <= 12")

        def all_gone() -> bool:
            return not [
                key
                for keys in holders.values()
                for key, a in keys.items()
                if Client((a.host, a.port), timeout=2).get(key) is not None
            ]

        wait_until(all_gone, 30, "invalidations in both clusters")

        # The monitoring server on host 1 probes both clusters through their routers on hosts 2 and 3.
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
        assert not started.exited(), started.exited()
    finally:
        started.stop()
        shutil.rmtree(base, ignore_errors=True)
