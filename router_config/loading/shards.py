"""`[shards]`: one replication chain each, a copy per region, extra copies; and the rules scoped to
the shards that hold their tables."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from router_config.loading.base import COPY_NAME, Reader
from router_config.model import DEFAULT_HOST, Database, Rule, Shard


class ShardSections(Reader):
    """`[shards]`, and the rules scoped to them."""

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
