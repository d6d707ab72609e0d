"""Writing DIR: a host's unit files, its target and the configs they read, an earlier render's stale units
removed."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import router_config
from ops.systemd.host import (
    HEADER,
    TARGET,
    RenderError,
    RenderOptions,
    components,
    describe_databases,
    mariadb_tls_cnf,
    processes,
    units,
    zookeeper_files,
)
from ops.systemd.unit_file import target_text, unit_text


@dataclass
class Rendered:
    out: Path
    host: str
    units: list[Path]
    files: list[Path]  # configs: topology copy, router configs, components list
    databases: list[str]  # the MariaDB servers this host runs, described (configured by hand, docs/deploy.md)


def render_systemd(
    topology_path: str | Path, host: str, out: str | Path, opts: RenderOptions | None = None
) -> Rendered:
    """Write `host`'s unit files and configs into `out` (created; stale units of an earlier render removed)."""
    opts = opts or RenderOptions()
    topology_path = Path(topology_path)
    topo = router_config.load(topology_path)
    out = Path(out).resolve()
    config_dir = (opts.config_dir or out).absolute()
    if not opts.data_dir.is_absolute():
        raise RenderError(f"--data-dir must be an absolute path, got {opts.data_dir}")
    for what, path in (("--data-dir", opts.data_dir), ("the config dir", config_dir)):
        if any(c.isspace() for c in str(path)):
            raise RenderError(f"{what} {path} contains whitespace, which unit files cannot carry in a path")
    here = processes(topo, host, opts)
    services = units(topo, here, opts, config_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    topology_copy = out / "topology.toml"
    if topology_path.resolve() != topology_copy:
        shutil.copyfile(topology_path, topology_copy)
    files.append(topology_copy)
    for cluster in dict.fromkeys(p.cluster for p in here if p.kind == "router" and p.cluster):
        path = out / "routers" / f"{cluster}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(router_config.render(router_config.cluster_config(topo, cluster)))
        files.append(path)
    for relative, text in zookeeper_files(here, opts).items():
        path = out / relative
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        files.append(path)
    databases = describe_databases(topo, host)
    tls_cnf = mariadb_tls_cnf(here)
    if tls_cnf is not None:
        path = out / "mariadb" / "tls.cnf"
        path.parent.mkdir(exist_ok=True)
        path.write_text(tls_cnf)
        files.append(path)
    if any(u.kind == "monitoring" for u in services):
        path = out / "monitoring" / "components.json"
        path.parent.mkdir(exist_ok=True)
        doc = components(topo, opts.router_metrics_offset, config_dir / "topology.toml")
        path.write_text(json.dumps(doc, indent=2) + "\n")
        files.append(path)
    written: list[Path] = []
    for unit in services:
        path = out / unit.name
        path.write_text(unit_text(unit, opts, config_dir))
        written.append(path)
    target = out / TARGET
    target.write_text(target_text(host, services))
    written.append(target)
    # A unit an earlier render wrote for a component that no longer runs here must not be installed again.
    for old in out.glob("squeal-*.service"):
        if old not in written and old.read_text(errors="replace").startswith(HEADER):
            old.unlink()
    return Rendered(out=out, host=host, units=written, files=files, databases=databases)
