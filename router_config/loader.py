"""Load and validate a topology TOML file into `router_config.model` objects.

Every mistake raises `TopologyError` naming the file, the key path (`regions.east.clusters.east-a.pools`)
and what is wrong, so an operator can fix it without reading this code. Unknown keys are errors too:
a typo such as `serverz` must not silently fall back to a default.

Each section has a module of its own in router_config/loading/ (the shared readers in `base`, then `settings`,
`shards`, `regions`); this module puts them together into the whole document and checks what spans sections
(database copies and server ids, instance names, cluster references).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from router_config.loading.base import TopologyError
from router_config.loading.regions import RegionSections
from router_config.loading.settings import SettingsSections
from router_config.loading.shards import ShardSections
from router_config.model import Database, Shard, Topology

__all__ = ["TopologyError", "load", "loads"]


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


class _Builder(SettingsSections, ShardSections, RegionSections):
    """The whole document, from its sections; then the checks across them."""

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
