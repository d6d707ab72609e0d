"""`squealctl up` and `squealctl render systemd` run the same processes (ops/plan.py): for every example, plain and
with `[tls]`, what `up` would start (recorded, nothing started) and what the rendered units of all its hosts run
agree on each process's name, address, ports and TLS files."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import tomli_w

import ops.local
import ops.local.start
import router_config
from ops import systemd
from ops import tls as pki
from ops.plan import plan

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))


class Recorded:
    """Stands in for a ManagedProcess class in ops.local.start: records how `up` would make it, starts nothing."""

    kind = ""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs
        self.address = f"{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port')}"
        self.log_file = None

    def tls_files(self) -> tuple[str, ...]:
        """(certificate, key, CA) it serves with, or () in plaintext, whichever way its class takes them."""
        kw = self.kwargs
        if self.kind == "router":
            return tuple(map(str, kw["tls"])) if kw.get("tls") else ()
        if self.kind == "memcached":
            return (*map(str, kw["tls"]), str(kw["ssl_ca"])) if kw.get("tls") else ()
        return tuple(str(kw[k]) for k in ("ssl_cert", "ssl_key", "ssl_ca")) if kw.get("ssl_cert") else ()

    @staticmethod
    def wait_serving(members: list) -> None:
        """(ZooKeeper's: the ensemble has a quorum)"""


def started_by_up(topology: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """What `Deployment.start_components` starts, as status records it plus each process's TLS files."""
    for cls, kind in [
        ("ZooKeeper", "zookeeper"),
        ("MariaDB", "mariadb"),
        ("Memcached", "memcached"),
        ("Router", "router"),
        ("SquealDaemon", "squeal"),
        ("MonitoringServer", "monitoring"),
    ]:
        monkeypatch.setattr(ops.local.start, cls, type(cls, (Recorded,), {"kind": kind}))
    for step in ("_load_demo_schema", "_replicate", "wait_until"):
        monkeypatch.setattr(ops.local.start, step, lambda *args, **kwargs: None)
    rows: list[dict] = []

    def track(proc, name, role, region, cluster=None, pool=None, metrics=None, instance=None, wait=True, shard=None):
        where = dict(role=role, region=region, cluster=cluster, pool=pool, instance=instance, shard=shard)
        rows.append(dict(name=name, kind=proc.kind, address=proc.address, tls=proc.tls_files(), **where))
        return lambda: None

    ops.local.Deployment(state_dir).start_components(topology, frozenset(), False, 1.0, track)
    return rows


def rendered_by_systemd(topology: Path, out: Path) -> tuple[list[dict], list[tuple[str, str, tuple[str, ...]]]]:
    """Every host's units as (kind, address, TLS files), and the monitoring server's list of every process."""
    topo = router_config.load(topology)
    units: list[tuple[str, str, tuple[str, ...]]] = []
    listed: list[dict] = []
    for host in topo.hosts():
        rendered = systemd.render_systemd(topology, host, out / host, systemd.RenderOptions(data_dir=Path("/srv/sq")))
        units += [_unit(path, host) for path in rendered.units if path.suffix == ".service"]
        tls_cnf = out / host / "mariadb" / "tls.cnf"
        for p in plan(topo, host=host, certificates=False):
            if p.kind == "mariadb":  # not a unit: tls.cnf for Debian's service
                units.append(("mariadb", str(p.address), _tls_cnf(tls_cnf) if tls_cnf.exists() else ()))
        components = out / host / "monitoring" / "components.json"
        if components.exists():
            listed = json.loads(components.read_text())["components"]
    return listed, units


def _unit(path: Path, host: str) -> tuple[str, str, tuple[str, ...]]:
    """(kind, the address it serves, its certificate, key and CA) from a unit of `host` and its config."""
    text = path.read_text()
    argv = shlex.split(next(line for line in text.splitlines() if line.startswith("ExecStart="))[len("ExecStart=") :])
    kind = path.name.split("-")[1]

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    if kind == "zookeeper":  # the address is in its zoo.cfg; its key store is built from key + cert
        cfg = dict(line.split("=", 1) for line in Path(argv[-1]).read_text().splitlines() if "=" in line)
        secure = "secureClientPort" in cfg
        address = f"{cfg['secureClientPortAddress' if secure else 'clientPortAddress']}:"
        address += cfg["secureClientPort" if secure else "clientPort"]
        pre = [line for line in text.splitlines() if line.startswith("ExecStartPre=") and "keystore" in line]
        tls: tuple[str, ...] = ()
        if pre:
            key, cert = shlex.split(shlex.split(pre[0].partition("=")[2])[2])[8:10]
            tls = (cert, key, cfg["ssl.trustStore.location"])
        return "zookeeper", address, tls
    if kind == "memcached":
        tls = ()
        if "-Z" in argv:
            chain = dict(kv.split("=") for kv in flag("-o").split(","))
            tls = (chain["ssl_chain_cert"], chain["ssl_key"])
        return "memcached", f"{flag('-l')}:{flag('-p')}", tls
    if kind == "router":
        if "--ssl-port" in argv:
            tls = (flag("--pem-cert-path"), flag("--pem-key-path"), flag("--pem-ca-path"))
            return "router", f"{flag('--listen')}:{flag('--ssl-port')}", tls
        return "router", f"{flag('--listen')}:{flag('-p')}", ()
    if kind in ("daemon", "worker"):  # it serves on its host, which the topology names
        return "squeal", f"{host}:{flag('--metrics-port')}", ()
    return "monitoring", f"{flag('--host')}:{flag('--port')}", ()


def _tls_cnf(path: Path) -> tuple[str, ...]:
    settings = dict(line.split(" = ") for line in path.read_text().splitlines() if " = " in line)
    return settings["ssl-cert"], settings["ssl-key"], settings["ssl-ca"]


def with_tls(topology: Path, tmp_path: Path) -> Path:
    """The example with `[tls]`: certificates for every component, as `squealctl up --tls` issues them."""
    topo = router_config.load(topology)
    zookeepers = [a.host for a in topo.zookeeper.servers] if topo.zookeeper else []
    pki.issue_for_components(tmp_path / "pki", router_config.TLS_COMPONENTS, [*topo.hosts(), *zookeepers])
    out = tmp_path / f"{topology.stem}-tls.toml"
    section = tomli_w.dumps({"tls": {"dir": str(tmp_path / "pki"), "require": True}})
    out.write_text(topology.read_text() + "\n" + section)
    return out


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_up_and_render_systemd_run_the_same_processes(example, tls, tmp_path, monkeypatch):
    topology = with_tls(example, tmp_path) if tls else example
    started = started_by_up(topology, tmp_path / "state", monkeypatch)
    listed, units = rendered_by_systemd(topology, tmp_path / "rendered")
    assert started and units

    # the monitoring server's list of a rendered deployment is what `up` records (but monitoring itself)
    fields = ("role", "region", "cluster", "pool", "instance", "shard", "address")
    key = lambda row: tuple(str(row[f]) for f in fields)  # noqa: E731
    assert sorted(map(key, listed)) == sorted(key(r) for r in started if r["kind"] != "monitoring")

    # every process runs on the same address with the same certificate (memcached's CA is its clients' only)
    def served(row: dict) -> tuple[str, str, tuple[str, ...]]:
        files = row["tls"][:2] if row["kind"] == "memcached" else row["tls"]
        return row["kind"], row["address"], tuple(files)

    assert sorted(map(served, started)) == sorted(units)
    assert all(bool(files) == tls for kind, _, files in units if kind in router_config.TLS_SERVERS)
