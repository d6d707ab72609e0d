"""`squealctl render systemd ...`: its arguments (added to squealctl's parser) and its run: render, then say
what was written, what the host lacks and how to install it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ops.harness import ROUTER_BIN, ZOOKEEPER_CLASSPATH
from ops.systemd.host import (
    DEFAULT_DATA_DIR,
    DEFAULT_ROUTER_METRICS_OFFSET,
    DEFAULT_USER,
    DEFAULT_VENV,
    NETTY_CODEC_JAR,
    TARGET,
    RenderError,
    RenderOptions,
    _default_java,
    _default_memcached,
)
from ops.systemd.render import render_systemd
from ops.systemd.unit_file import home_paths


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`squealctl render systemd ...` (called from ops/cli.py's parser)."""
    render = sub.add_parser(
        "render", help="write what one host of a multi-host deployment runs (systemd units and configs)"
    )
    kinds = render.add_subparsers(dest="render_kind", required=True, metavar="KIND")
    sd = kinds.add_parser(
        "systemd",
        help="systemd units + configs for one host of the topology",
        description="Write the systemd unit files and generated configs that one host of the topology runs "
        "(ZooKeeper servers, memcached instances, routers with their JSON configs, squeal daemons or pool "
        "workers, monitoring) and a "
        "squeal.target grouping them. Walk-through: docs/deploy.md.",
        epilog="Example: squealctl render systemd examples/three-hosts.toml --host 127.0.0.2 --out /etc/squeal",
    )
    sd.add_argument("topology", metavar="TOPOLOGY", help="topology TOML file")
    sd.add_argument("--host", required=True, help="the host to render, as the topology names it (e.g. 10.0.0.2)")
    sd.add_argument("--out", required=True, metavar="DIR", help="directory to write units and configs into")
    sd.add_argument(
        "--config-dir",
        metavar="DIR",
        help="where DIR will be on the host, if it is copied there (default: DIR itself)",
    )
    sd.add_argument(
        "--venv",
        "--prefix",
        dest="venv",
        default=str(DEFAULT_VENV),
        help="Python environment with squeal installed: bin/squeal, bin/python (default: %(default)s)",
    )
    sd.add_argument("--router-bin", default=str(ROUTER_BIN), help="squeal-router binary (default: %(default)s)")
    sd.add_argument("--memcached-bin", default=str(_default_memcached()), help="default: %(default)s")
    sd.add_argument(
        "--data-dir",
        default=str(DEFAULT_DATA_DIR),
        help="state (router spools, squeal datamarkers); below /var/lib systemd creates it (default: %(default)s)",
    )
    sd.add_argument("--user", default=DEFAULT_USER, help="account the services run as (default: %(default)s)")
    sd.add_argument("--memcached-mb", type=int, default=64, help="memcached -m; sets MemoryMax (default: %(default)s)")
    sd.add_argument(
        "--router-metrics-offset",
        type=int,
        default=DEFAULT_ROUTER_METRICS_OFFSET,
        help="each router serves /metrics on its port + this (default: %(default)s)",
    )
    sd.add_argument("--java-bin", default=str(_default_java()), help="runs ZooKeeper (default: %(default)s)")
    sd.add_argument(
        "--zookeeper-heap-mb",
        type=int,
        default=512,
        help="ZooKeeper's -Xmx; sets MemoryMax (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """The `render` branch of squealctl's dispatch."""
    opts = RenderOptions(
        venv=Path(args.venv).absolute(),
        router_bin=Path(args.router_bin).absolute(),
        memcached_bin=Path(args.memcached_bin).absolute(),
        data_dir=Path(args.data_dir),
        config_dir=Path(args.config_dir) if args.config_dir else None,
        user=args.user,
        memcached_mb=args.memcached_mb,
        router_metrics_offset=args.router_metrics_offset,
        java_bin=Path(args.java_bin).absolute(),
        zookeeper_heap_mb=args.zookeeper_heap_mb,
    )
    try:
        rendered = render_systemd(args.topology, args.host, args.out, opts)
    except RenderError as e:
        print(f"squealctl render: error: {e}", file=sys.stderr)
        return 2
    needed = [opts.venv / "bin" / "squeal", opts.router_bin, opts.memcached_bin]
    if any(p.parent.name == "zookeeper" for p in rendered.files):
        needed += [opts.java_bin, Path(ZOOKEEPER_CLASSPATH.rsplit(":", 1)[-1])]  # Debian's zookeeper package
        if any(NETTY_CODEC_JAR in p.read_text() for p in rendered.units):
            needed.append(Path(NETTY_CODEC_JAR))
    for path in needed:
        if not path.exists():
            print(f"squealctl render: warning: {path} does not exist here; it must on {args.host}", file=sys.stderr)
    private = home_paths(opts, opts.config_dir or rendered.out) if opts.user != "root" else []
    if private:
        print(
            f"squealctl render: warning: the services need {', '.join(map(str, private))}, in a home directory "
            f"{opts.user} may not be allowed to read: install squeal outside home directories (docs/deploy.md)",
            file=sys.stderr,
        )
    services = len(rendered.units) - 1
    print(f"host {args.host}: {services} services and {TARGET} in {rendered.out}")
    for path in rendered.units + rendered.files:
        print(f"  {path.relative_to(rendered.out)}")
    tls_cnf = rendered.out / "mariadb" / "tls.cnf"
    for database in rendered.databases:
        also = f", with {tls_cnf.relative_to(rendered.out)} in its configuration" if tls_cnf in rendered.files else ""
        print(f"  (MariaDB runs here too, {database}: set it up as docs/deploy.md says{also})")
    print(
        f"install: cp {rendered.out}/squeal*.service {rendered.out}/{TARGET} /etc/systemd/system/ && "
        f"systemctl daemon-reload && systemctl enable --now {TARGET}"
    )
    return 0
