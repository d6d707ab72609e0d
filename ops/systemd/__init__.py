"""`squealctl render systemd TOPOLOGY --host H --out DIR`: what one host of a real deployment runs.

`squealctl up` runs a whole topology on one machine. A real deployment spreads it over many hosts, each
running its share under systemd. The topology says where every component runs (memcached and router
addresses, `regions.<r>.squeal.host`, each squeal instance's `host`, `zookeeper.servers`,
`monitoring.host`); this module picks the components of one host and writes, into DIR:

    squeal.target                       groups every unit below (`systemctl enable --now squeal.target`)
    squeal-zookeeper-<N>.service        ZooKeeper server N (its myid) of the [zookeeper] ensemble (pools)
    squeal-memcached-*.service          one per memcached instance (pool member or regional pool member)
    squeal-router-*.service             one per router address, with routers/<cluster>.json
    squeal-daemon-<region>.service      the squeal daemon of a region without squeal_instances
    squeal-worker-<name>.service        one per squeal instance (a worker of its region's pool: `squeal run
                                        --instance`)
    squeal-monitoring.service           the dashboard + prober, scraping monitoring/components.json
    topology.toml                       a copy of the topology file the units read
    routers/<cluster>.json              the cluster's router config (router_config.cluster_config)
    zookeeper/zoo-<N>.cfg               server N's zoo.cfg, as `squealctl up` writes it (ops.harness)
    monitoring/components.json          every component of the deployment, for the monitoring server
    mariadb/tls.cnf                     with [tls], on a host with databases: MariaDB's ssl-cert/key/ca settings

With `[tls]` (docs/deploy.md, "Encrypt every link") the units carry the TLS options of what they run: each
ZooKeeper server a TLS-only client port (`secureClientPort`, Netty, a PEM key store built from
`[tls.zookeeper]` at each start), MariaDB's settings in mariadb/tls.cnf (`[tls.mariadb]`; `require = true`
adds `require-secure-transport`); each memcached `-Z` with `[tls.memcached]` (its topology port speaks TLS only)
and each router its topology port as its one TLS port (`--ssl-port`, no plaintext `-p`; `[tls.router]`, the CA
verifying its TLS pools: routers/<cluster>.json says `security_mech: tls` for every pool), as `squealctl up` runs
them; squeal, monitoring and the web tier read `[tls]` from the topology copy.

A region with squeal instances (a pool) never gets a `--region` daemon (`squeal run` refuses one for it), and
`[shards]` add no unit: a region's daemon runs every shard's pipeline itself, a pool's workers the shards its
controller gives each.

Every service restarts on failure, has resource limits (open files; memcached's memory from its `-m`,
ZooKeeper's from its Java heap) and runs sandboxed (read-only system, private /tmp, no home
directories, no new privileges, only IP and Unix sockets, a system-call allow-list); what it must
write (router spools, squeal's datamarkers and request files, ZooKeeper's data and myid) is its own
state directory. MariaDB is not rendered: every database, extra replica and shard copy runs under
Debian's mariadb service with the settings docs/deploy.md lists (`squealctl render` names those of the
host). docs/deploy.md walks through it.

One module per step: `host.py` (what runs on the host: `RenderOptions`, each process as a `Unit`, the configs
beside them), `unit_file.py` (a `Unit` as a unit file: restarts, limits, the sandbox), `render.py` (writing
DIR: `render_systemd`) and `cli.py` (`squealctl render systemd`'s arguments and output); their public names are
re-exported here.
"""

from ops.systemd.cli import add_parser, run
from ops.systemd.host import (
    DEFAULT_DATA_DIR,
    DEFAULT_ROUTER_METRICS_OFFSET,
    DEFAULT_USER,
    DEFAULT_VENV,
    HEADER,
    NETTY_CODEC_JAR,
    TARGET,
    RenderError,
    RenderOptions,
    Unit,
    components,
    describe_databases,
    mariadb_tls_cnf,
    processes,
    units,
    zookeeper_data_dir,
    zookeeper_files,
    zookeeper_keystore,
)
from ops.systemd.render import Rendered, render_systemd
from ops.systemd.unit_file import exec_quote, home_paths, target_text, unit_text

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_ROUTER_METRICS_OFFSET",
    "DEFAULT_USER",
    "DEFAULT_VENV",
    "HEADER",
    "NETTY_CODEC_JAR",
    "TARGET",
    "RenderError",
    "RenderOptions",
    "Rendered",
    "Unit",
    "add_parser",
    "components",
    "describe_databases",
    "exec_quote",
    "home_paths",
    "mariadb_tls_cnf",
    "processes",
    "render_systemd",
    "run",
    "target_text",
    "unit_text",
    "units",
    "zookeeper_data_dir",
    "zookeeper_files",
    "zookeeper_keystore",
]
