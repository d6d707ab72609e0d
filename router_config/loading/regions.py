"""`[regions.R]`: a region's database and extra replicas, its squeal daemon or worker pool, its regional
pool and its clusters, each cluster's routers and pools (leases, gutter, cold start)."""

from __future__ import annotations

from typing import Any

from router_config.loading.base import COPY_NAME, Reader
from router_config.model import (
    DEFAULT_HOST,
    POOL_KINDS,
    Cluster,
    ColdStart,
    Database,
    Leases,
    Pool,
    PoolPlacement,
    Region,
    RegionalPool,
    Shard,
    SquealInstance,
)


class RegionSections(Reader):
    """`[regions.R]` and everything in a region."""

    def region(self, name: str, body: Any, path: str, shards: tuple[Shard, ...] = ()) -> Region:
        self.table(
            body,
            path,
            {
                "master",
                "database",
                "regional_pool",
                "clusters",
                "squeal",
                "replicas",
                "squeal_instances",
                "squeal_pool",
                "squeal_placement",
            },
            {"clusters"} if shards else {"database", "clusters"},
        )
        master = self.typed(body.get("master", False), f"{path}.master", bool, "true or false")
        if shards:
            for key in ("database", "replicas"):
                if key in body:
                    raise self.fail(
                        f"{path}.{key}",
                        f"a topology with [shards] gives each shard's copies under "
                        f"[shards.NAME]; `{key}` of a region is for one database per region"
                        + (" (a shard's extra copies: [shards.NAME.replicas.R])" if key == "replicas" else ""),
                    )
            extra = tuple(dict.fromkeys(d.name.partition("@")[2] for sh in shards for d in sh.replicas_in(name)))
            return self.region_body(name, body, path, master, shards[0].copy(name), extra)
        db_path = f"{path}.database"
        db = self.table(
            body["database"],
            db_path,
            {"role", "host", "port", "server_id", "user", "password"},
            {"role", "port", "server_id"},
        )
        role = db["role"]
        expected = "primary" if master else "replica"
        if role not in ("primary", "replica"):
            raise self.fail(f"{db_path}.role", f'must be "primary" or "replica", got {role!r}')
        if role != expected:
            raise self.fail(
                f"{db_path}.role",
                f"the {'master' if master else 'non-master'} region needs a {expected} database, got {role!r}",
            )
        host = self.host(db.get("host", DEFAULT_HOST), f"{db_path}.host")
        port = self.port(db["port"], f"{db_path}.port")
        self.claim(host, port, f"{db_path}.port")
        server_id = self.typed(db["server_id"], f"{db_path}.server_id", int, "a positive integer")
        user = self.typed(db.get("user", "squeal"), f"{db_path}.user", str, "an account name")
        password = self.typed(db.get("password", "squeal"), f"{db_path}.password", str, "a password")
        database = Database(
            role=role,
            host=host,
            port=port,
            server_id=server_id,
            user=user,
            password=password,
            name=name,
            tls=self.tls_settings,
        )
        return self.region_body(name, body, path, master, database)

    def region_body(
        self, name: str, body: dict, path: str, master: bool, database: Database, shard_replicas: tuple[str, ...] = ()
    ) -> Region:
        """A region's clusters, pools, squeal placement and instances (`database`: the copy it reads;
        `shard_replicas`: with [shards], the names R of the shards' extra copies in this region)."""
        regional = None
        if "regional_pool" in body:
            rp_path = f"{path}.regional_pool"
            rp = self.table(body["regional_pool"], rp_path, {"servers", "prefixes"}, {"servers", "prefixes"})
            regional = RegionalPool(
                servers=self.addresses(rp["servers"], f"{rp_path}.servers"),
                prefixes=self.prefixes(rp["prefixes"], f"{rp_path}.prefixes"),
            )
        clusters_doc = body["clusters"]
        self.typed(clusters_doc, f"{path}.clusters", dict, "a table of clusters")
        if not clusters_doc:
            raise self.fail(f"{path}.clusters", "a region needs at least one frontend cluster")
        clusters = tuple(
            self.cluster(cname, cbody, name, f"{path}.clusters.{cname}", regional)
            for cname, cbody in clusters_doc.items()
        )
        squeal_host = DEFAULT_HOST
        if "squeal" in body:  # where the region's squeal daemon runs
            sq = self.table(body["squeal"], f"{path}.squeal", {"host"})
            squeal_host = self.host(sq.get("host", DEFAULT_HOST), f"{path}.squeal.host")
        replicas = self.replicas(body.get("replicas", {}), name, f"{path}.replicas")
        sharded = bool(database.shard)
        instances = self.instances(
            body.get("squeal_instances", []),
            name,
            (database, *replicas),
            squeal_host,
            f"{path}.squeal_instances",
            sharded=sharded,
            shard_replicas=shard_replicas,
        )
        # A region's instances are always a pool (the HA election is the pool's "one shard, two workers" now):
        # `squeal_pool` is still read, and redundant.
        flag = self.typed(body.get("squeal_pool", True), f"{path}.squeal_pool", bool, "true or false")
        if flag and "squeal_pool" in body and not instances:
            raise self.fail(
                f"{path}.squeal_pool",
                "a squeal pool needs its workers: [[regions."
                f"{name}.squeal_instances]] (each runs `squeal run --instance NAME`)",
            )
        if not flag and instances:
            raise self.fail(
                f"{path}.squeal_pool",
                "a region's squeal instances always run as a pool of workers (one shard and two workers is what "
                "the old single-owner election was): remove squeal_pool = false",
            )
        pool = bool(instances)
        placement = PoolPlacement()
        if "squeal_placement" in body:
            if not pool:
                raise self.fail(
                    f"{path}.squeal_placement",
                    "placement settings are for a squeal pool: add the region's workers "
                    f"([[regions.{name}.squeal_instances]]) or remove this table",
                )
            placement = self.pool_placement(body["squeal_placement"], f"{path}.squeal_placement")
        return Region(
            name=name,
            master=master,
            database=database,
            regional_pool=regional,
            clusters=clusters,
            squeal_host=squeal_host,
            replicas=replicas,
            squeal_instances=instances,
            squeal_placement=placement,
        )

    def pool_placement(self, value: Any, path: str) -> PoolPlacement:
        """`[regions.R.squeal_placement]`: the pool controller's settings (docs/squeal.md, "Placement settings")."""
        numbers = {"threshold", "persist_s", "cooldown_s", "bytes_per_row", "half_life_s"}
        body = self.table(value, path, numbers | {"max_moves"})
        out: dict[str, Any] = {}
        for key in sorted(numbers):
            v = self.typed(body.get(key, getattr(PoolPlacement, key)), f"{path}.{key}", (int, float), "a number")
            if key == "threshold" and v <= 1:
                raise self.fail(f"{path}.{key}", f"must be greater than 1 (max/mean worker load allowed), got {v}")
            if key in ("persist_s", "cooldown_s") and v < 0:
                raise self.fail(f"{path}.{key}", f"must be 0 or more seconds, got {v}")
            if key in ("bytes_per_row", "half_life_s") and v <= 0:
                raise self.fail(f"{path}.{key}", f"must be greater than 0, got {v}")
            out[key] = float(v)
        moves = self.typed(body.get("max_moves", 0), f"{path}.max_moves", int, "a whole number (0: no cap)")
        if moves < 0:
            raise self.fail(f"{path}.max_moves", f"must be 0 (no cap) or more, got {moves}")
        return PoolPlacement(max_moves=moves, **out)

    def replicas(self, value: Any, region: str, path: str) -> tuple[Database, ...]:
        """`[regions.R.replicas.NAME]`: more copies of the region's data, GTID replicas (log_slave_updates)."""
        self.typed(value, path, dict, "a table of replica databases")
        out = []
        for name, body in value.items():
            here = f"{path}.{name}"
            if not COPY_NAME.match(name):
                raise self.fail(here, f"replica name {name!r} may use only letters, digits, '_', '.' and '-'")
            if name == region:
                raise self.fail(here, f"{name!r} names the region's own database; give the replica another name")
            self.table(
                body, here, {"host", "port", "server_id", "user", "password", "replicates_from"}, {"port", "server_id"}
            )
            host = self.host(body.get("host", DEFAULT_HOST), f"{here}.host")
            port = self.port(body["port"], f"{here}.port")
            self.claim(host, port, f"{here}.port")
            server_id = self.typed(body["server_id"], f"{here}.server_id", int, "a positive integer")
            source = self.typed(
                body.get("replicates_from", region), f"{here}.replicates_from", str, "the name of a database copy"
            )
            out.append(
                Database(
                    role="replica",
                    host=host,
                    port=port,
                    server_id=server_id,
                    user=self.typed(body.get("user", "squeal"), f"{here}.user", str, "an account name"),
                    password=self.typed(body.get("password", "squeal"), f"{here}.password", str, "a password"),
                    name=name,
                    replicates_from=source,
                    tls=self.tls_settings,
                )
            )
        return tuple(out)

    def instances(
        self,
        value: Any,
        region: str,
        copies: tuple[Database, ...],
        default_host: str,
        path: str,
        sharded: bool = False,
        shard_replicas: tuple[str, ...] = (),
    ) -> tuple[SquealInstance, ...]:
        """`[[regions.R.squeal_instances]]`: squeal daemons of the region, each on its own copy of the data. With
        [shards] an instance reads a copy of every shard (squeal/pool/placement.py `read_order`): `database` may name
        the extra copy it prefers (`[shards.NAME.replicas.R]`, by R) or the region (its copy of each shard)."""
        self.typed(value, path, list, "an array of [[squeal_instances]] tables")
        by_name = {d.name: d for d in copies}
        readers: dict[str, str] = {}  # copy name -> the instance reading it
        out = []
        for i, body in enumerate(value):
            here = f"{path}[{i}]"
            self.table(body, here, {"name", "database", "host", "metrics_port"}, {"name", "metrics_port"})
            name = self.typed(body["name"], f"{here}.name", str, "an instance name")
            if not COPY_NAME.match(name):
                raise self.fail(
                    f"{here}.name", f"instance name {name!r} may use only letters, digits, '_', '.' and '-'"
                )
            if sharded:
                prefer = self.typed(body.get("database", ""), f"{here}.database", str, "the name of a copy")
                if prefer and prefer != region and prefer not in shard_replicas:
                    have = ", ".join([region, *shard_replicas])
                    raise self.fail(
                        f"{here}.database",
                        f"unknown copy {prefer!r}: with [shards], an instance names the shards' extra copy it "
                        f"prefers ([shards.NAME.replicas.R], by R) or the region itself (have: {have})",
                    )
                host = self.host(body.get("host", default_host), f"{here}.host")
                port = self.port(body["metrics_port"], f"{here}.metrics_port")
                self.claim(host, port, f"{here}.metrics_port")
                out.append(
                    SquealInstance(
                        name=name, region=region, database=copies[0], metrics_port=port, host=host, prefer=prefer
                    )
                )
                continue
            copy = self.typed(body.get("database", region), f"{here}.database", str, "the name of a database copy")
            if copy not in by_name:
                raise self.fail(
                    f"{here}.database",
                    f"unknown database {copy!r}: an instance reads a copy of its "
                    f"region's data (region {region} has: {', '.join(by_name)})",
                )
            if copy in readers:
                raise self.fail(
                    f"{here}.database",
                    f"instances {readers[copy]!r} and {name!r} both read database "
                    f"{copy!r}: each instance needs a copy of its own (they exist to survive its loss)",
                )
            readers[copy] = name
            host = self.host(body.get("host", default_host), f"{here}.host")
            port = self.port(body["metrics_port"], f"{here}.metrics_port")
            self.claim(host, port, f"{here}.metrics_port")
            out.append(SquealInstance(name=name, region=region, database=by_name[copy], metrics_port=port, host=host))
        return tuple(out)

    def prefixes(self, value: Any, path: str) -> tuple[str, ...]:
        items = self.string_list(value, path)
        for i, p in enumerate(items):
            if not p or any(c.isspace() for c in p):
                raise self.fail(f"{path}[{i}]", f"key prefix {p!r} must be non-empty without whitespace")
        return items

    def cluster(self, name: str, body: Any, region: str, path: str, regional: RegionalPool | None) -> Cluster:
        self.table(body, path, {"routers", "pools", "cold"}, {"routers", "pools"})
        routers = self.addresses(body["routers"], f"{path}.routers")
        pools_doc = self.typed(body["pools"], f"{path}.pools", dict, "a table of pools")
        pools = tuple(self.pool(pname, pbody, f"{path}.pools.{pname}") for pname, pbody in pools_doc.items())
        kinds = [p.kind for p in pools]
        if kinds.count("wildcard") != 1:
            raise self.fail(
                f"{path}.pools", f"a cluster needs exactly one wildcard pool, found {kinds.count('wildcard')}"
            )
        if kinds.count("gutter") > 1:
            raise self.fail(f"{path}.pools", "a cluster has at most one gutter pool")
        owner: dict[str, str] = {
            p: f"{path[: path.index('.clusters')]}.regional_pool" for p in (regional.prefixes if regional else ())
        }
        for p in pools:
            for prefix in p.prefixes:
                if prefix in owner:
                    raise self.fail(
                        f"{path}.pools.{p.name}.prefixes", f"prefix {prefix!r} is already routed by {owner[prefix]}"
                    )
                owner[prefix] = f"{path}.pools.{p.name}"
        cold = None
        if "cold" in body:
            cpath = f"{path}.cold"
            c = self.table(body["cold"], cpath, {"warm_cluster", "exptime"}, {"warm_cluster"})
            exptime = self.typed(c.get("exptime", 3600), f"{cpath}.exptime", int, "seconds")
            cold = ColdStart(
                warm_cluster=self.typed(c["warm_cluster"], f"{cpath}.warm_cluster", str, "a cluster name"),
                exptime=exptime,
            )
        return Cluster(name=name, region=region, routers=routers, pools=pools, cold=cold)

    def pool(self, name: str, body: Any, path: str) -> Pool:
        self.table(body, path, {"kind", "servers", "prefixes", "ttl", "leases"}, {"servers"})
        kind = body.get("kind", "wildcard")
        if kind not in POOL_KINDS:
            raise self.fail(f"{path}.kind", f"unknown pool kind {kind!r} (expected one of: {', '.join(POOL_KINDS)})")
        servers = self.addresses(body["servers"], f"{path}.servers")
        prefixes: tuple[str, ...] = ()
        if kind in ("app", "replicated"):
            if "prefixes" not in body:
                raise self.fail(path, f"a {kind} pool needs `prefixes`: the key prefixes it serves")
            prefixes = self.prefixes(body["prefixes"], f"{path}.prefixes")
        elif "prefixes" in body:
            raise self.fail(f"{path}.prefixes", f"a {kind} pool takes no prefixes")
        ttl = None
        if kind == "gutter":
            ttl = self.typed(body.get("ttl", 10), f"{path}.ttl", int, "seconds")
            if ttl <= 0:
                raise self.fail(f"{path}.ttl", f"must be greater than 0, got {ttl}")
        elif "ttl" in body:
            raise self.fail(f"{path}.ttl", "only a gutter pool takes a ttl")
        leases = None
        if "leases" in body:
            if kind not in ("wildcard", "app"):
                why = (
                    "its replicas each have their own CAS, so a lease won on one cannot guard a set on the others"
                    if kind == "replicated"
                    else "the router sends a gutter only what fails over from the wildcard pool, leases included"
                )
                raise self.fail(f"{path}.leases", f"a {kind} pool takes no leases: {why}")
            leases = self.leases(body["leases"], f"{path}.leases")
        return Pool(name=name, kind=kind, servers=servers, prefixes=prefixes, ttl=ttl, leases=leases)

    def leases(self, value: Any, path: str) -> Leases | None:
        if isinstance(value, bool):
            return Leases() if value else None
        self.table(value, path, {"ttl", "wait_ms", "retries", "max_tokens", "stale_ttl"})
        defaults = Leases()
        out: dict[str, int] = {}
        for name, least in (("ttl", 1), ("wait_ms", 1), ("retries", 0), ("max_tokens", 1), ("stale_ttl", 0)):
            v = self.typed(value.get(name, getattr(defaults, name)), f"{path}.{name}", int, "a whole number")
            if v < least:
                raise self.fail(f"{path}.{name}", f"must be {least} or more, got {v}")
            out[name] = v
        return Leases(**out)
