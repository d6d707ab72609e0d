"""Typed topology objects. Built only by `router_config.loader` (its sections: router_config/loading/); everything
else reads them.

Frozen dataclasses so a topology can be shared across threads and compared in tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from router_config.predicate import Predicate

# A rule template placeholder: `{column_name}`.
# The monitoring prober's canary table (monitoring/prober.py creates it on its first probe; its rule in a topology
# names it before it exists, which is expected, not a mistake).
CANARY_TABLE = "squeal_canary.probe"
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
COLUMN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

POOL_KINDS = ("wildcard", "app", "replicated", "gutter")
ON_TRUNCATE = ("alert", "flush")  # per rule: a change to the table that carries no row images
ON_DATA_LOSS = ("halt", "flush")  # squeal: the binlog a datamarker needs was purged
READERS = ("native", "python")  # squeal's binlog decoder (docs/squeal.md, "The native reader")
# Who sends the deletes and takes the acknowledgements (docs/squeal.md, "The native data plane"): the Rust delivery
# thread, or the flows and senders on the Twisted reactor.
DELIVERIES = ("native", "python")
# Every component runs on a host; a topology that names none runs everything on this machine.
DEFAULT_HOST = "127.0.0.1"


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Pool:
    """A memcached pool inside one frontend cluster.

    kind: `wildcard` (the default, hashed), `app` (hashed, selected by key prefix),
    `replicated` (every server holds every key; reads hit one replica, writes and deletes all),
    `gutter` (failover target with short TTL).
    """

    name: str
    kind: str
    servers: tuple[Address, ...]
    prefixes: tuple[str, ...] = ()
    ttl: int | None = None  # gutter only: cap on the TTL of failover sets (seconds)
    leases: Leases | None = None  # wildcard and app pools: transparent leases for plain get/set clients


@dataclass(frozen=True)
class Leases:
    """A pool's `leases = { ... }` (or `leases = true`): the router gives clients that send plain `get`/`set`
    memcached's leases (its TransparentLeaseRoute; docs/client.md, "Stock clients"). A miss wins a lease held
    `ttl` seconds; a set is stored only if nothing invalidated the key since; readers of a key whose lease is
    held wait `wait_ms`, up to `retries` times; the router remembers at most `max_tokens` leases.
    `stale_ttl` > 0 (stale-while-revalidate): a delete — squeal's included — marks the value stale for at most
    that many seconds instead of removing it; one reader refills it, the others read the stale value meanwhile."""

    ttl: int = 10
    wait_ms: int = 20
    retries: int = 10
    max_tokens: int = 100_000
    stale_ttl: int = 0


@dataclass(frozen=True)
class ColdStart:
    """A cluster being warmed up: misses are read from `warm`'s pools and added here."""

    warm_cluster: str
    exptime: int = 3600


@dataclass(frozen=True)
class Cluster:
    name: str
    region: str
    routers: tuple[Address, ...]
    pools: tuple[Pool, ...]
    cold: ColdStart | None = None

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"cluster {self.name} has no pool {name!r}")

    def pools_of_kind(self, kind: str) -> tuple[Pool, ...]:
        return tuple(p for p in self.pools if p.kind == kind)

    @property
    def wildcard(self) -> Pool:
        return self.pools_of_kind("wildcard")[0]

    @property
    def gutter(self) -> Pool | None:
        found = self.pools_of_kind("gutter")
        return found[0] if found else None


@dataclass(frozen=True)
class RegionalPool:
    """Shared by all clusters of a region; keys with one of `prefixes` live here (and remote markers)."""

    servers: tuple[Address, ...]
    prefixes: tuple[str, ...]


# The components a `[tls]` section can name a certificate for (`[tls.<component>]`, or `<dir>/<component>.crt`).
TLS_COMPONENTS = ("squeal", "mariadb", "zookeeper", "router", "memcached", "monitoring", "webtier")


@dataclass(frozen=True)
class CertKey:
    """A PEM certificate (chain) and its private key, absolute paths."""

    cert: str
    key: str


@dataclass(frozen=True)
class TlsSettings:
    """`[tls]`: one switch for the whole topology (docs/squeal.md, "TLS").

    With a `[tls]` section every link that can use TLS does, verifying its peer against `ca`: the routers,
    memcached and ZooKeeper serve TLS only on their topology ports; `require = true` also makes MariaDB refuse
    plaintext (accounts `REQUIRE SSL`, `require-secure-transport`). `certs`: each component's own certificate,
    by component name (`TLS_COMPONENTS`); a component without one connects as a client without a certificate.
    Paths are absolute (the loader resolves them against the topology file's directory and checks that each file
    exists)."""

    ca: str | None = None
    require: bool = False
    certs: tuple[tuple[str, CertKey], ...] = ()

    def cert(self, component: str) -> CertKey | None:
        return dict(self.certs).get(component)


@dataclass(frozen=True)
class Database:
    role: str  # "primary" (master region) or "replica"
    host: str
    port: int
    server_id: int
    user: str = "squeal"  # the account squeal and the web tier use (the harness creates it)
    password: str = "squeal"
    # A copy of a region's data, by name: the region's own database is named after the region, another copy
    # (`regions.<region>.replicas.<name>`, a GTID replica with log_slave_updates) by its key.
    name: str = ""
    replicates_from: str = ""  # replicas only: the copy (any region's database or replica) it replicates from
    # A shard's copy ([shards.NAME]): the shard it holds and the region it serves; "" in a topology without
    # [shards] (its one implicit shard). `gtid_domain_id` is the server's own domain (the shard's): None leaves
    # MariaDB's default (0).
    shard: str = ""
    region: str = ""
    gtid_domain_id: int | None = None
    # The topology's [tls] (None: plaintext): clients of this copy (squeal, the web tier) dial it with TLS,
    # verifying its certificate against `tls.ca`, each presenting its own certificate if it has one.
    tls: TlsSettings | None = None

    @property
    def address(self) -> Address:
        return Address(self.host, self.port)


# The one shard of a topology without [shards]: each region's `database` (and its replicas).
IMPLICIT_SHARD = "main"


@dataclass(frozen=True)
class Shard:
    """One replication chain (docs/squeal.md, "Shards"): a primary in the master region and a copy in every other
    region. squeal runs one pipeline per (region, shard); keys are shard-agnostic, so a shard's deletes go to every
    cluster of the region like any other. `gtid_domain_id` names the shard inside every GTID it writes."""

    name: str
    copies: tuple[Database, ...]  # one per region, in region order
    gtid_domain_id: int | None = None  # None: the implicit shard (the servers' default domain)
    implicit: bool = False  # the one shard of a topology without [shards]
    # Extra copies for squeal instances to read (`[shards.NAME.replicas.R]`): GTID replicas (log_slave_updates) of
    # the shard's copy in their region, or of another extra copy there; named `<shard>@<R>`, `region` set.
    replicas: tuple[Database, ...] = ()

    def copy(self, region: str) -> Database:
        for d in self.copies:
            if d.region == region:
                return d
        raise KeyError(f"shard {self.name} has no copy in region {region!r}")

    def replicas_in(self, region: str) -> tuple[Database, ...]:
        """The shard's extra copies that serve `region`, in file order."""
        return tuple(d for d in self.replicas if d.region == region)

    @property
    def primary(self) -> Database:
        return next(d for d in self.copies if d.role == "primary")


@dataclass(frozen=True)
class SquealInstance:
    """One squeal worker of a region's pool (`[[regions.<region>.squeal_instances]]`), reading one copy of the
    region's data (without [shards]) or of each shard. The pool's controller gives each shard to one worker
    (squeal/pool/); earlier in the list is preferred (put the instance on the primary first)."""

    name: str
    region: str
    database: Database  # the copy it reads: the region's database or one of its replicas
    metrics_port: int  # /metrics and /healthz
    host: str = DEFAULT_HOST  # where it runs
    # With [shards]: the extra copy (`[shards.NAME.replicas.R]`, by R) this instance would rather read of each
    # shard that has one ("": none named; squeal/pool/placement.py `read_order` then prefers a copy on its host).
    prefer: str = ""

    @property
    def address(self) -> Address:
        return Address(self.host, self.metrics_port)


@dataclass(frozen=True)
class ZooKeeperSettings:
    """The ZooKeeper ensemble of a region's squeal pool (`[zookeeper]`): membership, ownership, the datamarkers."""

    servers: tuple[Address, ...]
    # A worker's session expires this long after ZooKeeper last heard from it (the floor of a takeover after a
    # crash); a worker stops sending well before (docs/squeal.md, "Worker pool", fencing).
    session_timeout_s: float = 3.0
    root: str = "/squeal"  # the znode under which squeal keeps its state
    # A shard's new owner waits at most this long for its copy to apply the markers' GTIDs, then releases it.
    takeover_wait_s: float = 30.0
    # A shard alone on its worker is handed back to a better-ranked, empty worker healthy for this long.
    handback_after_s: float = 10.0
    # Each server's (quorum, election) ports, for `squealctl up` to start the ensemble (`peer_ports`; by
    # default the client port + 100 and + 200). Clients never use them.
    peer_ports: tuple[tuple[int, int], ...] = ()
    # `digest = "user:password"`: squeal's ZooKeeper identity. squeal's clients authenticate with it and create
    # every znode under `root` with an ACL that lets only that identity write (anyone may read); None: open ACLs.
    digest: str | None = None

    def peers(self) -> tuple[tuple[int, str, int, int], ...]:
        """The ensemble as ZooKeeper's `server.N=host:quorum:election` lines need it: (N, host, quorum,
        election), N from 1 in the order of `servers`."""
        ports = self.peer_ports or tuple((a.port + 100, a.port + 200) for a in self.servers)
        return tuple((i, a.host, q, e) for i, (a, (q, e)) in enumerate(zip(self.servers, ports, strict=True), 1))

    @property
    def hosts(self) -> str:
        """The connect string: `host:port,host:port`."""
        return ",".join(str(a) for a in self.servers)


@dataclass(frozen=True)
class PoolPlacement:
    """`[regions.R.squeal_placement]` of a pooled region: how its controller balances shard load over the
    workers (squeal/pool/placement.py; docs/squeal.md, "Placement settings"). The defaults suit production; tests
    shorten them."""

    threshold: float = 1.15  # a worker is balanced within [level / threshold, level * threshold]
    persist_s: float = 60.0  # an imbalance must last this long before a rebalance moves anything
    cooldown_s: float = 300.0  # a shard moved this recently is not moved again by a rebalance
    max_moves: int = 0  # at most this many rebalance moves per plan; 0: no cap
    bytes_per_row: float = 500.0  # a shard's load = rows/s + binlog bytes/s / bytes_per_row
    half_life_s: float = 60.0  # the half-life of the owners' smoothing of rows/s and bytes/s


@dataclass(frozen=True)
class SquealEndpoint:
    """One squeal daemon as the other parts reach it: the region's single daemon, or one worker of its pool.

    `name` is the instance's name (a pool's worker) or the region's (a single daemon); `instance` is None for a
    single daemon. Every daemon serves /metrics, /healthz and /sampled-deletes on `address` (a worker owning
    nothing: no flows, no samples).
    """

    region: str
    name: str
    address: Address
    instance: SquealInstance | None = None


@dataclass(frozen=True)
class Region:
    name: str
    master: bool
    database: Database
    regional_pool: RegionalPool | None
    clusters: tuple[Cluster, ...]
    # Where the region's squeal daemon runs (`regions.<name>.squeal.host`); it serves /metrics on
    # squeal.metrics_port_base + the region's index.
    squeal_host: str = DEFAULT_HOST
    replicas: tuple[Database, ...] = ()  # more copies of the region's data (for squeal instances to read)
    # Several squeal daemons (needs [zookeeper]): the workers of the region's pool, which divide its shards among
    # them (squeal/pool/), each shard with one owner; none: the region's single daemon.
    squeal_instances: tuple[SquealInstance, ...] = ()
    squeal_placement: PoolPlacement = field(default_factory=PoolPlacement)  # the pool's controller's settings

    @property
    def squeal_pool(self) -> bool:
        """Whether the region runs a pool of squeal workers: whenever it has `squeal_instances` (the only way to run
        several; the topology's `squeal_pool` key is redundant)."""
        return bool(self.squeal_instances)

    @property
    def copies(self) -> tuple[Database, ...]:
        """Every copy of the region's data: its database, then its replicas."""
        return (self.database, *self.replicas)


@dataclass(frozen=True)
class Rule:
    """Invalidation rule: a change to a row of `table` (schema.table) deletes each rendered key."""

    table: str
    keys: tuple[str, ...]
    # What squeal does when the table changes with no row images (TRUNCATE, DROP, RENAME, a
    # statement-logged change): "alert" (ERROR log, counter, dashboard) or "flush" (flush the region's caches).
    on_truncate: str = "alert"
    # How the web tier encodes these keys' cached values, for `squealctl verify`: an import path
    # "package.module:function" of decode(key_template, value, flags) (monitoring/verify.py). squeal ignores it.
    codec: str | None = None
    # Filters (docs/squeal.md, "Rule filters"): an UPDATE sends this rule's keys only if it changes one of
    # these columns (or a templated one); and only row images matching `where` (router_config.predicate).
    when_changed: tuple[str, ...] = ()
    where: Predicate | None = None
    # The shards whose copies of `table` this rule applies to; () = every shard that has the table.
    shards: tuple[str, ...] = ()

    def applies_to(self, shard: str) -> bool:
        return not self.shards or shard in self.shards

    @property
    def columns(self) -> frozenset[str]:
        return frozenset(m for k in self.keys for m in PLACEHOLDER.findall(k))

    @property
    def watched(self) -> tuple[str, ...]:
        """Columns whose change makes an UPDATE fire the rule; () when the rule has no `when_changed`. The
        templated columns always count: an UPDATE that changes a key's column must delete the old key."""
        if not self.when_changed:
            return ()
        return tuple(dict.fromkeys([*self.when_changed, *sorted(self.columns)]))


@dataclass(frozen=True)
class SquealSettings:
    batch_size: int = 256
    flush_interval_ms: float = 0.5
    max_backlog: int = 100_000
    datamarker_dir: str = "var/datamarkers"
    metrics_port_base: int = 19100
    on_data_loss: str = "halt"  # see ON_DATA_LOSS and docs/squeal.md
    marker_max_age_s: float = 30.0  # /healthz fails while a flow's datamarker waits longer to be written
    max_lag_s: float = 60.0  # /healthz fails while a flow is further behind the primary's commits (a stalled copy)
    reader: str = "native"  # see READERS: the Rust extension (squeal_native) or python-mysql-replication
    delivery: str = "native"  # see DELIVERIES


@dataclass(frozen=True)
class ConsistencySlo:
    """`[monitoring] consistency_slo = "6 nines within 1s"`: at least `nines` (-log10 of the inconsistent share)
    of sampled changes consistent in every cache `within` seconds after their commit."""

    nines: float
    within: float  # seconds

    def __str__(self) -> str:
        return f"{self.nines:g} nines within {window_label(self.within)}"


def window_label(seconds: float) -> str:
    """A check window as the inspector's series and reports name it: 0.1 -> "100ms", 1 -> "1s", 60 -> "60s"."""
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


@dataclass(frozen=True)
class MonitoringSettings:
    port: int = 19000  # the dashboard / monitoring server
    probe_interval: float = 1.0  # seconds between canary probes
    host: str = DEFAULT_HOST  # where the monitoring server runs (and listens)
    # The consistency inspector (monitoring/inspector.py): 1 in `consistency_sample` committed row changes is
    # checked in every cluster `consistency_check_after` seconds after its commit, and again at 10 s and 60 s.
    consistency_sample: int = 1
    consistency_check_after: float = 1.0
    consistency_slo: ConsistencySlo | None = None

    @property
    def consistency_windows(self) -> tuple[float, ...]:
        """Every check window in seconds, ascending: T, 10 s, 60 s, and the SLO's own."""
        slo = (self.consistency_slo.within,) if self.consistency_slo else ()
        return tuple(sorted({self.consistency_check_after, 10.0, 60.0, *slo}))


@dataclass(frozen=True)
class Topology:
    source: str  # the file it was loaded from (for error messages and relative paths)
    regions: tuple[Region, ...]
    rules: tuple[Rule, ...]
    squeal: SquealSettings = field(default_factory=SquealSettings)
    monitoring: MonitoringSettings = field(default_factory=MonitoringSettings)
    zookeeper: ZooKeeperSettings | None = None  # only for squeal's worker pools
    # [shards]: the declared shards; () for a topology of one database per region (then `shards` is the one
    # implicit shard made of the regions' databases). With [shards], `Region.database` is the region's copy of
    # the first shard (for parts that read one database: the demo web tier's schema, the prober's canary).
    declared_shards: tuple[Shard, ...] = ()
    tls: TlsSettings | None = None  # [tls]: None = every link in plaintext

    @property
    def sharded(self) -> bool:
        """Whether the topology declares [shards] (else it has one implicit shard)."""
        return bool(self.declared_shards)

    @property
    def shards(self) -> tuple[Shard, ...]:
        """Every shard, in file order; a topology without [shards] has one (`IMPLICIT_SHARD`)."""
        if self.declared_shards:
            return self.declared_shards
        copies = tuple(replace(r.database, region=r.name) for r in self.regions)
        return (Shard(IMPLICIT_SHARD, copies, None, implicit=True),)

    def shard(self, name: str) -> Shard:
        for s in self.shards:
            if s.name == name:
                return s
        raise KeyError(f"{self.source}: no shard {name!r} (have: {', '.join(s.name for s in self.shards)})")

    def shard_copy(self, shard: str, region: str) -> Database:
        """The copy of `shard` that region `region` reads (without [shards]: the region's database)."""
        if not self.declared_shards:
            return self.region(region).database
        return self.shard(shard).copy(region)

    def shard_of(self, row_id: int) -> Shard:
        """The web tier's shard map: which shard owns the row (and everything keyed by it) with this id.

        Shard i of n (in file order) owns ids with (id - 1) % n == i. A writer allocates ids there with MariaDB's
        `auto_increment_increment = n` and `auto_increment_offset = i + 1` (`auto_increment_for`), so ids stay
        unique across shards and map back to their shard. One shard (no [shards]) owns every id."""
        shards = self.shards
        return shards[(int(row_id) - 1) % len(shards)]

    def auto_increment_for(self, shard: str) -> tuple[int, int]:
        """(auto_increment_increment, auto_increment_offset) for a session inserting on `shard` (`shard_of`)."""
        names = [s.name for s in self.shards]
        return len(names), names.index(self.shard(shard).name) + 1

    def rules_for(self, shard: str) -> tuple[Rule, ...]:
        """The rules that apply to `shard` (a rule without `shards` applies to every shard)."""
        return tuple(r for r in self.rules if r.applies_to(shard))

    @property
    def master(self) -> Region:
        return next(r for r in self.regions if r.master)

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(f"{self.source}: no region {name!r} (have: {', '.join(r.name for r in self.regions)})")

    @property
    def clusters(self) -> tuple[Cluster, ...]:
        return tuple(c for r in self.regions for c in r.clusters)

    def cluster(self, name: str) -> Cluster:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"{self.source}: no cluster {name!r} (have: {', '.join(c.name for c in self.clusters)})")

    def listeners(self) -> list[tuple[str, str, Address]]:
        """Every address a component of this topology listens on, as (role, key path in the topology
        file, address). Roles are the component names `squealctl up --without` takes."""
        out: list[tuple[str, str, Address]] = []
        for sh in self.declared_shards:
            out += [("mariadb", f"shards.{sh.name}.{d.region}.port", d.address) for d in sh.copies]
            out += [
                ("mariadb", f"shards.{sh.name}.replicas.{d.name.partition('@')[2]}.port", d.address)
                for d in sh.replicas
            ]
        for r in self.regions:
            at = f"regions.{r.name}"
            if not self.declared_shards:
                out.append(("mariadb", f"{at}.database.port", Address(r.database.host, r.database.port)))
            if r.regional_pool:
                out += [("memcached", f"{at}.regional_pool.servers", a) for a in r.regional_pool.servers]
            for c in r.clusters:
                out += [("router", f"{at}.clusters.{c.name}.routers", a) for a in c.routers]
                for p in c.pools:
                    out += [("memcached", f"{at}.clusters.{c.name}.pools.{p.name}.servers", a) for a in p.servers]
        for i, r in enumerate(self.regions):
            at = f"regions.{r.name}"
            out += [("mariadb", f"{at}.replicas.{d.name}.port", d.address) for d in r.replicas]
            if r.squeal_instances:  # a pool: its workers instead of the region's single daemon
                out += [
                    ("squeal", f"{at}.squeal_instances[{k}].metrics_port", s.address)
                    for k, s in enumerate(r.squeal_instances)
                ]
            else:
                where = f"squeal.metrics_port_base (+{i}, region {r.name})"
                out.append(("squeal", where, self.squeal_address(r.name)))
        out.append(("monitoring", "monitoring.port", Address(self.monitoring.host, self.monitoring.port)))
        if self.zookeeper is not None:
            out += [("zookeeper", f"zookeeper.servers[{i}]", a) for i, a in enumerate(self.zookeeper.servers)]
            for i, (_, host, quorum, election) in enumerate(self.zookeeper.peers()):
                out += [("zookeeper", f"zookeeper.peer_ports[{i}]", Address(host, p)) for p in (quorum, election)]
        return out

    def instance(self, name: str) -> SquealInstance:
        """A squeal instance (a pool's worker) by name; a KeyError naming the instances there are."""
        every = [s for r in self.regions for s in r.squeal_instances]
        for s in every:
            if s.name == name:
                return s
        have = ", ".join(s.name for s in every) or "none: no region has [[regions.<name>.squeal_instances]]"
        raise KeyError(f"{self.source}: no squeal instance {name!r} (have: {have})")

    def squeal_address(self, region: str) -> Address:
        """Where the region's single squeal daemon serves /metrics and /healthz: its host, metrics_port_base +
        index. A region with squeal instances (a pool of workers) has several daemons: use `squeal_daemons`."""
        index = [r.name for r in self.regions].index(self.region(region).name)
        return Address(self.region(region).squeal_host, self.squeal.metrics_port_base + index)

    def squeal_daemons(self, region: str | None = None) -> tuple[SquealEndpoint, ...]:
        """Every squeal daemon of the topology (or of one region), in region order: a region's pool workers (in
        order of preference), else its single daemon. What monitoring scrapes and
        `squealctl up` starts."""
        out: list[SquealEndpoint] = []
        for r in self.regions if region is None else (self.region(region),):
            if r.squeal_instances:
                out += [SquealEndpoint(r.name, s.name, s.address, s) for s in r.squeal_instances]
            else:
                out.append(SquealEndpoint(r.name, r.name, self.squeal_address(r.name)))
        return tuple(out)

    def hosts(self) -> list[str]:
        """Every host a component of this topology runs on (databases, memcached, routers, squeal, monitoring)."""
        found = {self.monitoring.host}
        for r in self.regions:
            found |= {r.database.host, r.squeal_host}
            found |= {d.host for sh in self.declared_shards for d in (*sh.copies, *sh.replicas)}
            found |= {d.host for d in r.replicas} | {s.host for s in r.squeal_instances}
            found |= {a.host for a in (r.regional_pool.servers if r.regional_pool else ())}
            for c in r.clusters:
                found |= {a.host for a in c.routers} | {a.host for p in c.pools for a in p.servers}
        found |= {a.host for a in (self.zookeeper.servers if self.zookeeper else ())}
        return sorted(found)

    def rule_for(self, table: str) -> Rule | None:
        for r in self.rules:
            if r.table == table:
                return r
        return None
