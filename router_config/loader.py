"""Load and validate a topology TOML file into `router_config.model` objects.

Every mistake raises `TopologyError` naming the file, the key path (`regions.east.clusters.east-a.pools`)
and what is wrong, so an operator can fix it without reading this code. Unknown keys are errors too:
a typo such as `serverz` must not silently fall back to a default.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Set
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from router_config import predicate
from router_config.model import (
    COLUMN_NAME,
    DEFAULT_HOST,
    ON_DATA_LOSS,
    ON_TRUNCATE,
    PLACEHOLDER,
    POOL_KINDS,
    READERS,
    TLS_COMPONENTS,
    Address,
    CertKey,
    Cluster,
    ColdStart,
    ConsistencySlo,
    Database,
    Leases,
    MonitoringSettings,
    Pool,
    PoolPlacement,
    Region,
    RegionalPool,
    Rule,
    Shard,
    SquealInstance,
    SquealSettings,
    TlsSettings,
    Topology,
    ZooKeeperSettings,
)

CODEC_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")  # a rule's `codec` (monitoring/verify.py)
# Names of database copies and squeal instances: they become znode and file names.
COPY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# `[monitoring] consistency_slo`: "6 nines within 1s", "4.5 nines within 100ms", "3 nines within 1m"
SLO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+nines?\s+within\s+(\d+(?:\.\d+)?)\s*(ms|s|m)\s*$")
ZNODE_PATH = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")


class TopologyError(ValueError):
    """A topology file is invalid. `str()` is `file: key.path: what is wrong`."""

    def __init__(self, source: str, path: str, message: str) -> None:
        self.source, self.path, self.message = source, path, message
        where = f"{source}: {path}: " if path else f"{source}: "
        super().__init__(where + message)


def load(path: str | Path) -> Topology:
    """Read and validate the topology file at `path`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TopologyError(str(path), "", f"cannot read topology file: {e.strerror}") from e
    return loads(text, source=str(path))


def loads(text: str, source: str = "<string>") -> Topology:
    """Validate topology TOML given as text; `source` names it in errors."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TopologyError(source, "", f"not valid TOML: {e}") from e
    return _Builder(source).topology(doc)


class _Builder:
    def __init__(self, source: str) -> None:
        self.source = source
        self.ports: dict[tuple[str, int], str] = {}  # (host, port) -> key path that claimed it
        self.tls_settings: TlsSettings | None = None  # [tls], read first: every Database carries it

    def fail(self, path: str, message: str) -> TopologyError:
        return TopologyError(self.source, path, message)

    # -- generic readers ---------------------------------------------------------------------------

    def table(self, value: Any, path: str, allowed: set[str], required: Set[str] = frozenset()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a table, got {type(value).__name__}")
        for key in value:
            if key not in allowed:
                raise self.fail(f"{path}.{key}", f"unknown key (expected one of: {', '.join(sorted(allowed))})")
        for key in sorted(required):
            if key not in value:
                raise self.fail(path, f"missing required key {key!r}")
        return value

    def typed(self, value: Any, path: str, kind: type | tuple[type, ...], what: str) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise self.fail(path, f"must be {what}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(path, f"must be {what}, got {type(value).__name__} {value!r}")
        return value

    def string_list(self, value: Any, path: str, *, non_empty: bool = True) -> tuple[str, ...]:
        self.typed(value, path, list, "a list of strings")
        if non_empty and not value:
            raise self.fail(path, "must not be empty")
        for i, item in enumerate(value):
            self.typed(item, f"{path}[{i}]", str, "a string")
        return tuple(value)

    def port(self, value: Any, path: str) -> int:
        self.typed(value, path, int, "a port number")
        if not 1 <= value <= 65535:
            raise self.fail(path, f"port {value} is out of range 1-65535")
        return value

    def host(self, value: Any, path: str) -> str:
        """A host name or IP address where a component runs (no port)."""
        self.typed(value, path, str, "a host name or IP address")
        if not value or any(c.isspace() for c in value):
            raise self.fail(path, f"{value!r} is not a host name or IP address")
        return value

    def claim(self, host: str, port: int, path: str) -> None:
        """Every listening socket in the topology must be distinct."""
        previous = self.ports.get((host, port))
        if previous is not None:
            raise self.fail(path, f"duplicate port: {host}:{port} is already used by {previous}")
        self.ports[(host, port)] = path

    def address(self, value: Any, path: str) -> Address:
        self.typed(value, path, str, 'a "host:port" string')
        host, sep, port_text = value.rpartition(":")
        if not sep or not host or not port_text.isdigit():
            raise self.fail(path, f'{value!r} is not a "host:port" address')
        port = self.port(int(port_text), path)
        self.claim(host, port, path)
        return Address(host, port)

    def addresses(self, value: Any, path: str) -> tuple[Address, ...]:
        items = self.string_list(value, path)
        return tuple(self.address(v, f"{path}[{i}]") for i, v in enumerate(items))

    # -- the document ------------------------------------------------------------------------------

    def topology(self, doc: dict) -> Topology:
        self.table(doc, "", {"squeal", "monitoring", "rules", "regions", "zookeeper", "shards", "tls"}, {"regions"})
        squeal = self.settings(doc.get("squeal", {}), "squeal")
        monitoring = self.monitoring(doc.get("monitoring", {}), "monitoring")
        zookeeper = self.zookeeper(doc["zookeeper"], "zookeeper") if "zookeeper" in doc else None
        tls = self.tls_settings = self.tls(doc["tls"], "tls") if "tls" in doc else None
        rules = self.rules(doc.get("rules", []), "rules")
        regions_doc = self.typed(doc["regions"], "regions", dict, "a table of regions")
        if not regions_doc:
            raise self.fail("regions", "no regions defined")
        masters = [name for name, body in regions_doc.items() if isinstance(body, dict) and body.get("master") is True]
        shards: tuple[Shard, ...] = ()
        if "shards" in doc:
            if len(masters) != 1:
                found = ", ".join(masters) if masters else "none"
                raise self.fail("regions", f"exactly one region must have master = true (found: {found})")
            shards = self.shards(doc["shards"], "shards", list(regions_doc), masters[0])
        regions = tuple(self.region(name, body, f"regions.{name}", shards) for name, body in regions_doc.items())
        masters = [r.name for r in regions if r.master]
        if len(masters) != 1:
            found = ", ".join(masters) if masters else "none"
            raise self.fail("regions", f"exactly one region must have master = true (found: {found})")
        rules = self.scope_rules(rules, shards, doc.get("rules", []))
        topo = Topology(
            source=self.source,
            regions=regions,
            rules=rules,
            squeal=squeal,
            monitoring=monitoring,
            zookeeper=zookeeper,
            declared_shards=shards,
            tls=tls,
        )
        self.check_cluster_references(topo)
        self.check_copies(topo)
        return topo

    # -- shards --------------------------------------------------------------------------------------------

    SHARD_KEYS = frozenset({"count", "gtid_domain_id", "user", "password", "replicas"})
    REPLICA_KEYS = frozenset({"region", "host", "port", "server_id", "replicates_from"})

    def shards(self, value: Any, path: str, regions: list[str], master: str) -> tuple[Shard, ...]:
        """`[shards.NAME]`: one replication chain each, with a copy per region. `count = N` declares N alike
        shards NAME-0 … NAME-(N-1): copy i listens on the region's `port` + i, with `server_id` + i, and the
        shard's `gtid_domain_id` + i. `[shards.NAME.replicas.R]`: an extra copy of each shard in one region
        (ports and server ids + i alike). Names, ports, server ids and GTID domains must be unique fleet-wide."""
        self.typed(value, path, dict, "a table of shards ([shards.NAME])")
        if not value:
            raise self.fail(path, "no shards defined (leave [shards] out for one database per region)")
        out: list[Shard] = []
        names: dict[str, str] = {}  # shard name -> key path that declared it
        domains: dict[int, str] = {}
        clash = sorted(set(regions) & self.SHARD_KEYS)
        if clash:
            raise self.fail(
                f"regions.{clash[0]}",
                f"a region cannot be named {clash[0]!r} in a topology with [shards] (it is a key of every shard)",
            )
        for group, body in value.items():
            here = f"{path}.{group}"
            if not COPY_NAME.match(group):
                raise self.fail(here, f"shard name {group!r} may use only letters, digits, '_', '.' and '-'")
            self.table(body, here, set(self.SHARD_KEYS) | set(regions), {"gtid_domain_id"})
            for region in regions:
                if region not in body:
                    raise self.fail(
                        here,
                        f"shard {group!r} has no copy in region {region!r}: every shard needs "
                        f"one in every region (`{region} = {{ port = ..., server_id = ... }}`)",
                    )
            count = body.get("count")
            if count is not None:
                self.typed(count, f"{here}.count", int, "a number of shards")
                if not 1 <= count <= 4096:
                    raise self.fail(f"{here}.count", f"must be 1-4096, got {count}")
            domain = self.typed(body["gtid_domain_id"], f"{here}.gtid_domain_id", int, "a GTID domain id")
            if not 1 <= domain <= 0xFFFFFFFF - (count or 1):
                raise self.fail(
                    f"{here}.gtid_domain_id",
                    f"must be 1-4294967295 (0 is MariaDB's default domain, "
                    f"left to topologies without [shards]), got {domain}",
                )
            user = self.typed(body.get("user", "squeal"), f"{here}.user", str, "an account name")
            password = self.typed(body.get("password", "squeal"), f"{here}.password", str, "a password")
            copies_doc = {}
            for region in regions:
                at = f"{here}.{region}"
                c = self.table(body[region], at, {"host", "port", "server_id"}, {"port", "server_id"})
                copies_doc[region] = (
                    self.host(c.get("host", DEFAULT_HOST), f"{at}.host"),
                    self.port(c["port"], f"{at}.port"),
                    self.typed(c["server_id"], f"{at}.server_id", int, "a positive integer"),
                )
            replicas_doc = self.shard_replicas(body.get("replicas", {}), f"{here}.replicas", regions)
            for i in range(count or 1):
                name = f"{group}-{i}" if count is not None else group
                where = f"{here} (shard {i} of {count})" if count is not None else here
                if name in names:
                    raise self.fail(where, f"shard {name!r} is already declared by {names[name]}")
                names[name] = where
                if domain + i in domains:
                    raise self.fail(
                        f"{here}.gtid_domain_id",
                        f"GTID domain {domain + i} (shard {name}) is already "
                        f"used by {domains[domain + i]}: each shard needs its own domain",
                    )
                domains[domain + i] = f"shard {name}"
                spec = (here, count, user, password, domain)
                copies = [
                    self.shard_copy(
                        spec, i, name, region, host, port, server_id, "primary" if region == master else "replica"
                    )
                    for region, (host, port, server_id) in copies_doc.items()
                ]
                replicas = [
                    self.shard_copy(spec, i, name, region, host, port, server_id, "replica", rname, source)
                    for rname, (region, host, port, server_id, source) in replicas_doc.items()
                ]
                out.append(Shard(name, tuple(copies), domain + i, replicas=tuple(replicas)))
        return tuple(out)

    def shard_copy(
        self,
        spec: tuple[str, int | None, str, str, int],
        i: int,
        name: str,
        region: str,
        host: str,
        port: int,
        server_id: int,
        role: str,
        extra: str = "",
        source: str = "",
    ) -> Database:
        """Copy of shard i (`name`) of a [shards.NAME] group (`spec`: its key path, count, account and GTID
        domain) in `region`: the region's copy, or with `extra` the extra copy R replicating from `source`. Its
        port and server id are the group's + i; the port is claimed under the key that gave it."""
        here, count, user, password, domain = spec
        at = f"{here}.{'replicas.' + extra if extra else region}.port"
        at += f" (+{i}, shard {name})" if count is not None else ""
        if port + i > 65535:
            raise self.fail(at, f"port {port + i} is out of range 1-65535")
        self.claim(host, port + i, at)
        return Database(
            role=role,
            host=host,
            port=port + i,
            server_id=server_id + i,
            user=user,
            password=password,
            tls=self.tls_settings,
            name=f"{name}@{extra or region}",
            replicates_from=f"{name}@{source}" if extra else "",
            shard=name,
            region=region,
            gtid_domain_id=domain + i,
        )

    def shard_replicas(self, value: Any, path: str, regions: list[str]) -> dict[str, tuple[str, str, int, int, str]]:
        """`[shards.NAME.replicas.R]`: R -> (region, host, port, server_id, the copy it replicates from: a region
        name for the shard's copy there, or another R of the same region). Only copies of the region's copy: a
        squeal instance reads one to invalidate the region's caches, so it must never be ahead of that copy."""
        self.typed(value, path, dict, "a table of extra copies ([shards.NAME.replicas.R])")
        out: dict[str, tuple[str, str, int, int, str]] = {}
        for rname, body in value.items():
            here = f"{path}.{rname}"
            if not COPY_NAME.match(rname):
                raise self.fail(here, f"replica name {rname!r} may use only letters, digits, '_', '.' and '-'")
            if rname in regions:
                raise self.fail(
                    here, f"{rname!r} names a region (the shard's copy there); give the replica another name"
                )
            self.table(body, here, set(self.REPLICA_KEYS), {"region", "port", "server_id"})
            region = self.typed(body["region"], f"{here}.region", str, "a region name")
            if region not in regions:
                raise self.fail(f"{here}.region", f"unknown region {region!r} (have: {', '.join(regions)})")
            source = self.typed(
                body.get("replicates_from", region), f"{here}.replicates_from", str, "the name of a copy"
            )
            out[rname] = (
                region,
                self.host(body.get("host", DEFAULT_HOST), f"{here}.host"),
                self.port(body["port"], f"{here}.port"),
                self.typed(body["server_id"], f"{here}.server_id", int, "a positive integer"),
                source,
            )
        for rname, (region, *_, source) in out.items():
            here = f"{path}.{rname}.replicates_from"
            if source != region and (source not in out or out[source][0] != region):
                same = [r for r, v in out.items() if v[0] == region and r != rname]
                raise self.fail(
                    here,
                    f"{source!r} is not a copy of this shard in region {region} (have: "
                    f"{', '.join([region, *same])}): an extra copy replicates from its region's copy, or from "
                    "another extra copy of it, never from ahead of what the region's caches are filled from",
                )
            seen = [rname]
            while source != region:
                if source in seen:
                    raise self.fail(here, "replication loop: " + " -> ".join([*seen, source]))
                seen.append(source)
                source = out[source][4]
        return out

    def scope_rules(self, rules: tuple[Rule, ...], shards: tuple[Shard, ...], docs: list) -> tuple[Rule, ...]:
        """A rule's `shards = [...]` (shard names, or a [shards.NAME] group for all its shards) → shard names."""
        out = []
        for i, (rule, body) in enumerate(zip(rules, docs, strict=True)):
            if "shards" not in body:
                out.append(rule)
                continue
            here = f"rules[{i}].shards"
            if not shards:
                raise self.fail(here, "this topology has no [shards]: a rule applies to every region's database")
            known = {s.name for s in shards}
            groups: dict[str, list[str]] = {}
            for s in shards:
                base, _, index = s.name.rpartition("-")
                if base and index.isdigit():
                    groups.setdefault(base, []).append(s.name)
            names: list[str] = []
            for k, item in enumerate(self.string_list(body["shards"], here)):
                if item in known:
                    names.append(item)
                elif item in groups:
                    names += groups[item]
                else:
                    raise self.fail(f"{here}[{k}]", f"unknown shard {item!r} (have: {', '.join(sorted(known))})")
            out.append(replace(rule, shards=tuple(dict.fromkeys(names))))
        return tuple(out)

    # -- tls -----------------------------------------------------------------------------------------------

    def base_dir(self) -> Path:
        """Relative paths in the topology are relative to the file's directory (a `loads` string: the cwd)."""
        source = Path(self.source)
        return source.resolve().parent if source.is_file() else Path.cwd()

    def pem_file(self, value: Any, path: str) -> str:
        self.typed(value, path, str, "a path to a PEM file")
        if not value:
            raise self.fail(path, "must not be empty")
        full = self.base_dir() / value
        if not full.is_file():
            raise self.fail(path, f"{value!r}: no such file ({full})")
        return str(full)

    def tls(self, value: Any, path: str) -> TlsSettings:
        """`[tls]`: `ca`, `require`, `dir` (the convention `<dir>/ca.crt`, `<dir>/<component>.crt` + `.key`, as
        `ops.tls` writes them) and `[tls.<component>]` tables of `cert` + `key` that override the convention."""
        self.table(value, path, {"ca", "require", "dir", *TLS_COMPONENTS})
        require = self.typed(value.get("require", False), f"{path}.require", bool, "true or false")
        directory: Path | None = None
        if "dir" in value:
            self.typed(value["dir"], f"{path}.dir", str, "a directory path")
            directory = self.base_dir() / value["dir"]
            if not directory.is_dir():
                raise self.fail(f"{path}.dir", f"{value['dir']!r}: no such directory ({directory})")
        ca: str | None = None
        if "ca" in value:
            ca = self.pem_file(value["ca"], f"{path}.ca")
        elif directory is not None and (directory / "ca.crt").is_file():
            ca = str(directory / "ca.crt")
        if require and ca is None:
            where = f" (and {path}.dir has no ca.crt)" if directory is not None else ""
            raise self.fail(
                f"{path}.require",
                f"require = true needs {path}.ca, the CA that every peer's certificate is checked against{where}",
            )
        certs: list[tuple[str, CertKey]] = []
        for component in TLS_COMPONENTS:
            at = f"{path}.{component}"
            if component in value:
                body = self.table(value[component], at, {"cert", "key"}, {"cert", "key"})
                certs.append(
                    (
                        component,
                        CertKey(self.pem_file(body["cert"], f"{at}.cert"), self.pem_file(body["key"], f"{at}.key")),
                    )
                )
            elif directory is not None:
                cert, key = directory / f"{component}.crt", directory / f"{component}.key"
                if cert.is_file() != key.is_file():
                    have, missing = (cert, key) if cert.is_file() else (key, cert)
                    raise self.fail(f"{path}.dir", f"{have.name} without {missing.name} in {directory}")
                if cert.is_file():
                    certs.append((component, CertKey(str(cert), str(key))))
        if ca is None and not certs:
            raise self.fail(path, "names no CA and no certificate: set ca (and [tls.<component>] cert/key, or dir)")
        return TlsSettings(ca=ca, require=require, certs=tuple(certs))

    def zookeeper(self, value: Any, path: str) -> ZooKeeperSettings:
        self.table(
            value,
            path,
            {"servers", "session_timeout_s", "root", "takeover_wait_s", "handback_after_s", "peer_ports", "digest"},
            {"servers"},
        )
        digest = value.get("digest")
        if digest is not None:
            self.typed(digest, f"{path}.digest", str, 'a "user:password" string')
            user, sep, password = digest.partition(":")
            if not sep or not user or not password:
                raise self.fail(f"{path}.digest", 'must be "user:password" (both non-empty)')
        servers = self.addresses(value["servers"], f"{path}.servers")
        peer_ports = self.peer_ports(value.get("peer_ports"), servers, f"{path}.peer_ports")
        numbers = {}
        for name in ("session_timeout_s", "takeover_wait_s", "handback_after_s"):
            v = self.typed(
                value.get(name, getattr(ZooKeeperSettings, name)), f"{path}.{name}", (int, float), "a number of seconds"
            )
            if v <= 0:
                raise self.fail(f"{path}.{name}", f"must be greater than 0, got {v}")
            numbers[name] = float(v)
        root = self.typed(value.get("root", ZooKeeperSettings.root), f"{path}.root", str, "a znode path")
        if not ZNODE_PATH.match(root):
            raise self.fail(f"{path}.root", f'{root!r} is not a znode path like "/squeal"')
        return ZooKeeperSettings(servers=servers, root=root, peer_ports=peer_ports, digest=digest, **numbers)

    def peer_ports(self, value: Any, servers: tuple[Address, ...], path: str) -> tuple[tuple[int, int], ...]:
        """`peer_ports = [[quorum, election], ...]`, one pair per server (default: its client port + 100, + 200).
        Claimed like every listening port, so a clash is an error naming the key."""
        if value is None:
            pairs = [(a.port + 100, a.port + 200) for a in servers]
            where = [f"{path} (default for servers[{i}]: its port + 100, + 200)" for i in range(len(servers))]
        else:
            self.typed(value, path, list, "a list of [quorum, election] port pairs, one per server")
            if len(value) != len(servers):
                raise self.fail(
                    path,
                    f"{len(value)} pairs for {len(servers)} servers: one [quorum, election] "
                    "pair per server, in the order of servers",
                )
            pairs, where = [], []
            for i, pair in enumerate(value):
                self.typed(pair, f"{path}[{i}]", list, "a [quorum, election] port pair")
                if len(pair) != 2:
                    raise self.fail(f"{path}[{i}]", f"{pair!r} is not a [quorum, election] port pair")
                pairs.append((self.port(pair[0], f"{path}[{i}][0]"), self.port(pair[1], f"{path}[{i}][1]")))
                where.append(f"{path}[{i}]")
        for a, (quorum, election), at in zip(servers, pairs, where, strict=True):
            for port in (quorum, election):
                if not 1 <= port <= 65535:
                    raise self.fail(at, f"port {port} is out of range 1-65535")
                self.claim(a.host, port, at)
        return tuple(pairs) if value is not None else ()

    def settings(self, value: Any, path: str) -> SquealSettings:
        names = {f.name for f in fields(SquealSettings)}
        self.table(value, path, names)
        defaults = SquealSettings()
        kinds: dict[str, tuple[type | tuple[type, ...], str]] = {
            "batch_size": (int, "a positive integer"),
            "flush_interval_ms": ((int, float), "a number of milliseconds"),
            "max_backlog": (int, "a positive integer"),
            "datamarker_dir": (str, "a directory path"),
            "metrics_port_base": (int, "a port number"),
            "marker_max_age_s": ((int, float), "a number of seconds"),
            "max_lag_s": ((int, float), "a number of seconds"),
            "on_data_loss": (str, " or ".join(f'"{c}"' for c in ON_DATA_LOSS)),
            "reader": (str, " or ".join(f'"{c}"' for c in READERS)),
        }
        out: dict[str, Any] = {}
        for name in names:
            v = value.get(name, getattr(defaults, name))
            kind, what = kinds[name]
            self.typed(v, f"{path}.{name}", kind, what)
            if isinstance(v, int | float) and not isinstance(v, bool) and v <= 0:
                raise self.fail(f"{path}.{name}", f"must be greater than 0, got {v}")
            floats = ("flush_interval_ms", "marker_max_age_s", "max_lag_s")
            out[name] = float(v) if name in floats else v
        if out["on_data_loss"] not in ON_DATA_LOSS:
            choices = " or ".join(f'"{c}"' for c in ON_DATA_LOSS)
            raise self.fail(f"{path}.on_data_loss", f"must be {choices}, got {out['on_data_loss']!r}")
        if out["reader"] not in READERS:
            choices = " or ".join(f'"{c}"' for c in READERS)
            raise self.fail(f"{path}.reader", f"must be {choices}, got {out['reader']!r}")
        return SquealSettings(**out)

    def monitoring(self, value: Any, path: str) -> MonitoringSettings:
        self.table(
            value,
            path,
            {"port", "probe_interval", "host", "consistency_sample", "consistency_check_after", "consistency_slo"},
        )
        host = self.host(value.get("host", DEFAULT_HOST), f"{path}.host")
        port = self.port(value.get("port", MonitoringSettings.port), f"{path}.port")
        self.claim(host, port, f"{path}.port")
        interval = self.typed(
            value.get("probe_interval", MonitoringSettings.probe_interval),
            f"{path}.probe_interval",
            (int, float),
            "seconds",
        )
        if interval <= 0:
            raise self.fail(f"{path}.probe_interval", f"must be greater than 0, got {interval}")
        defaults = MonitoringSettings()
        sample = self.typed(
            value.get("consistency_sample", defaults.consistency_sample), f"{path}.consistency_sample", int, "1 in N"
        )
        if sample < 1:
            raise self.fail(f"{path}.consistency_sample", f"must be 1 or more (1 = every row change), got {sample}")
        after = self.typed(
            value.get("consistency_check_after", defaults.consistency_check_after),
            f"{path}.consistency_check_after",
            (int, float),
            "seconds",
        )
        if after <= 0:
            raise self.fail(f"{path}.consistency_check_after", f"must be greater than 0 seconds, got {after}")
        slo = None
        if "consistency_slo" in value:
            slo = self.consistency_slo(value["consistency_slo"], f"{path}.consistency_slo")
        return MonitoringSettings(
            port=port,
            probe_interval=float(interval),
            host=host,
            consistency_sample=sample,
            consistency_check_after=float(after),
            consistency_slo=slo,
        )

    def consistency_slo(self, value: Any, path: str) -> ConsistencySlo:
        text = self.typed(value, path, str, 'a string like "6 nines within 1s"')
        m = SLO.match(text)
        if m is None:
            raise self.fail(path, f'{text!r} does not read like "6 nines within 1s" (or "4.5 nines within 100ms")')
        nines, amount, unit = float(m.group(1)), float(m.group(2)), m.group(3)
        within = amount / 1000 if unit == "ms" else amount * 60 if unit == "m" else amount
        if nines <= 0 or within <= 0:
            raise self.fail(path, f"{text!r}: the nines and the window must be greater than 0")
        return ConsistencySlo(nines, within)

    def rules(self, value: Any, path: str) -> tuple[Rule, ...]:
        self.typed(value, path, list, "an array of [[rules]] tables")
        rules: list[Rule] = []
        seen: set[str] = set()
        for i, body in enumerate(value):
            here = f"{path}[{i}]"
            self.table(
                body,
                here,
                {"table", "keys", "on_truncate", "codec", "when_changed", "where", "shards"},
                {"table", "keys"},
            )
            table = self.typed(body["table"], f"{here}.table", str, 'a "schema.table" name')
            parts = table.split(".")
            if len(parts) != 2 or not all(COLUMN_NAME.match(p) for p in parts):
                raise self.fail(f"{here}.table", f'{table!r} is not a "schema.table" name')
            if table in seen:
                raise self.fail(f"{here}.table", f"duplicate rule for table {table!r}")
            seen.add(table)
            keys = self.string_list(body["keys"], f"{here}.keys")
            for k, template in enumerate(keys):
                self.template(template, f"{here}.keys[{k}]")
            on_truncate = self.typed(body.get("on_truncate", "alert"), f"{here}.on_truncate", str, '"alert" or "flush"')
            if on_truncate not in ON_TRUNCATE:
                raise self.fail(f"{here}.on_truncate", f'must be "alert" or "flush", got {on_truncate!r}')
            codec = body.get("codec")
            if codec is not None and not CODEC_PATH.match(self.typed(codec, f"{here}.codec", str, "an import path")):
                raise self.fail(f"{here}.codec", f'{codec!r} is not an import path like "package.module:function"')
            when_changed: tuple[str, ...] = ()
            if "when_changed" in body:
                when_changed = self.string_list(body["when_changed"], f"{here}.when_changed")
                for k, name in enumerate(when_changed):
                    if not COLUMN_NAME.match(name):
                        raise self.fail(f"{here}.when_changed[{k}]", f"{name!r} is not a column name like user_id")
            where = None
            if "where" in body:
                text = self.typed(body["where"], f"{here}.where", str, "a predicate like \"status != 'draft'\"")
                try:
                    where = predicate.parse(text)
                except predicate.PredicateError as e:
                    raise self.fail(f"{here}.where", f"{e} (at character {e.offset + 1} of {text!r})") from None
            rules.append(
                Rule(
                    table=table, keys=keys, on_truncate=on_truncate, codec=codec, when_changed=when_changed, where=where
                )
            )
        return tuple(rules)

    def template(self, template: str, path: str) -> None:
        if template.count("{") != template.count("}"):
            raise self.fail(path, f"unbalanced braces in key template {template!r}")
        names = PLACEHOLDER.findall(template)
        if not names:
            raise self.fail(path, f"key template {template!r} names no {{column}}: every row would share one key")
        for name in names:
            if not COLUMN_NAME.match(name):
                raise self.fail(path, f"{{{name}}} in {template!r} is not a column name like {{user_id}}")
        if any(c.isspace() for c in PLACEHOLDER.sub("", template)):
            raise self.fail(path, f"key template {template!r} contains whitespace; memcache keys cannot")

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
        [shards] an instance reads a copy of every shard (squeal/placement.py `read_order`): `database` may name
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

    def check_copies(self, topo: Topology) -> None:
        """Database copies and squeal instances across regions: unique names, replication sources that exist
        and lead to a real database, server ids, and ZooKeeper for instances."""
        copies: dict[str, tuple[Database, str]] = {}  # name -> (copy, key path)
        for r in topo.regions:
            copies[r.name] = (r.database, f"regions.{r.name}.database")
        for r in topo.regions:
            for d in r.replicas:
                here = f"regions.{r.name}.replicas.{d.name}"
                if d.name in copies:
                    raise self.fail(here, f"database name {d.name!r} is already used by {copies[d.name][1]}")
                copies[d.name] = (d, here)
        if topo.sharded:
            server_ids: dict[int, str] = {}
            # every shard's copies, then the extra copies: a clash names the extra copy as the one at fault
            ordered = [(s, d) for s in topo.shards for d in s.copies] + [
                (s, d) for s in topo.shards for d in s.replicas
            ]
            for sh, d in ordered:
                extra = d.name.partition("@")[2]
                if extra == d.region:
                    here, what = f"shards.{sh.name}.{d.region}.server_id", f"region {d.region}"
                else:
                    here, what = f"shards.{sh.name}.replicas.{extra}.server_id", f"replica {extra}"
                if d.server_id in server_ids:
                    raise self.fail(
                        here,
                        f"server_id {d.server_id} (shard {sh.name}, {what}) is "
                        f"already used by {server_ids[d.server_id]} (replication needs distinct ids)",
                    )
                server_ids[d.server_id] = f"shard {sh.name} in {what}"
        else:
            server_ids = {r.database.server_id: f"regions.{r.name}.database" for r in topo.regions}
        for r in topo.regions:
            for d in r.replicas:
                here = f"regions.{r.name}.replicas.{d.name}"
                if d.server_id in server_ids:
                    raise self.fail(
                        f"{here}.server_id",
                        f"server_id {d.server_id} is already used by "
                        f"{server_ids[d.server_id]} (replication needs distinct ids)",
                    )
                server_ids[d.server_id] = here
                if d.replicates_from not in copies:
                    raise self.fail(
                        f"{here}.replicates_from", f"unknown database {d.replicates_from!r} (have: {', '.join(copies)})"
                    )
                seen = [d.name]
                source = d.replicates_from
                while source in copies and copies[source][0].replicates_from:
                    if source in seen:
                        raise self.fail(f"{here}.replicates_from", "replication loop: " + " -> ".join(seen + [source]))
                    seen.append(source)
                    source = copies[source][0].replicates_from
        instances: dict[str, str] = {}
        for r in topo.regions:
            if r.squeal_instances and topo.zookeeper is None:
                raise self.fail(
                    f"regions.{r.name}.squeal_instances",
                    "squeal instances need a [zookeeper] section "
                    '(servers = ["host:port", ...]): their shard ownership and shared datamarkers live '
                    "there",
                )
            for i, s in enumerate(r.squeal_instances):
                here = f"regions.{r.name}.squeal_instances[{i}].name"
                if s.name in instances:
                    raise self.fail(here, f"instance name {s.name!r} is already used by {instances[s.name]}")
                instances[s.name] = here

    def check_cluster_references(self, topo: Topology) -> None:
        seen: dict[str, str] = {}
        for region in topo.regions:
            for c in region.clusters:
                if c.name in seen:
                    raise self.fail(
                        f"regions.{region.name}.clusters.{c.name}", f"cluster name also used in region {seen[c.name]}"
                    )
                seen[c.name] = region.name
        for region in topo.regions:
            for c in region.clusters:
                if c.cold is None:
                    continue
                path = f"regions.{region.name}.clusters.{c.name}.cold.warm_cluster"
                warm = c.cold.warm_cluster
                if warm not in seen:
                    raise self.fail(path, f"unknown cluster {warm!r}")
                if warm == c.name:
                    raise self.fail(path, "a cluster cannot warm up from itself")
                if topo.cluster(warm).cold is not None:
                    raise self.fail(path, f"warm cluster {warm!r} is itself cold")
