"""`squealctl flush CLUSTER|REGION [--pool P] [--yes]`: empty caches on purpose, through the routers.

* A cluster: `flush_all` to one of its routers (the first that answers OK; squeal-router takes it only when
  started with `--enable-flush-cmd`, as `squealctl up` starts it). The router sends it to every server of
  every pool in its config and answers OK only if all did. A cluster's config includes the region's
  regional pool (it routes `regional:` / `rmk:` there) and, while the cluster warms up, the warm cluster's
  wildcard pool: the confirmation prompt lists them all.
* A region: every cluster of the region, each through its routers (which covers the regional pool).
* `--pool P`: squeal-router has no per-pool flush, so this sends `flush_all` to the pool's memcached
  servers directly, from the topology: pool P of the cluster, or of every cluster of the region;
  `--pool regional` is the region's regional pool.

With `[tls]` every `flush_all` goes over TLS (router and memcached ports speak nothing else), verifying the
server against the topology's CA and presenting `[tls.monitoring]`'s certificate, as the other operator tools.

Nothing is flushed without a confirmation (typing the name at a terminal) or `--yes`. Exit status: 0 every
target flushed; 1 a router or server refused or failed (each named), or the prompt was declined; 2 nothing
to flush (unknown name or pool) or no terminal to ask and no `--yes`. The runbook: docs/runbooks/data-loss.md.
"""

from __future__ import annotations

import functools
import json
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheError

import router_config
from router_config import Address, Topology

REGIONAL = "regional"  # --pool name of a region's regional pool (also its name in router configs)
TIMEOUT = 10.0  # seconds for one flush_all answer (a router waits for every server of its config)


class FlushError(Exception):
    """Nothing can be flushed as asked (exit 2)."""


@dataclass(frozen=True)
class Target:
    """One thing to flush: a cluster through its routers, or a pool's servers directly."""

    name: str  # "cluster east-a", "pool east-a/gutter", "regional pool of east"
    via_router: bool  # True: `addresses` are routers, tried in order until one answers OK
    addresses: tuple[Address, ...]  # routers to try, or servers each to flush
    empties: tuple[str, ...]  # what it empties, for the prompt


@dataclass(frozen=True)
class Outcome:
    target: Target
    ok: bool
    errors: tuple[str, ...]  # one line each, naming the router or server


def _servers(addresses: Any) -> str:
    return ", ".join(str(a) for a in addresses)


def router_pools(topo: Topology, cluster: str, configs: Path | None = None) -> dict[str, list[str]]:
    """Pool name -> servers of the config the cluster's routers run: the file `squealctl up` wrote
    (`STATE_DIR/routers/CLUSTER.json`, which follows warm-up) when there is one, else the topology's."""
    path = configs / f"{cluster}.json" if configs else None
    if path is not None and path.exists():
        config = json.loads(path.read_text())
    else:
        config = router_config.cluster_config(topo, cluster)
    return {name: list(body.get("servers", [])) for name, body in config.get("pools", {}).items()}


def _describe_pool(topo: Topology, cluster: str, name: str, servers: list[str]) -> str:
    region = topo.region(topo.cluster(cluster).region)
    if name == REGIONAL:
        shared = ", ".join(c.name for c in region.clusters)
        return f"the regional pool of {region.name}, shared by {shared} ({', '.join(servers)})"
    if name.startswith("warm__"):
        warm = name.removeprefix("warm__")
        return f"cluster {warm}'s wildcard pool, the warm-up source of {cluster} ({', '.join(servers)})"
    return f"pool {name} ({', '.join(servers)})"


def plan(topo: Topology, name: str, pool: str | None = None, configs: Path | None = None) -> list[Target]:
    """What `flush NAME [--pool POOL]` flushes, in order (raises FlushError for unknown names)."""
    clusters = {c.name: c for c in topo.clusters}
    regions = {r.name: r for r in topo.regions}
    if name in clusters:
        region, chosen = regions[clusters[name].region], [clusters[name]]
    elif name in regions:
        region, chosen = regions[name], list(regions[name].clusters)
    else:
        raise FlushError(
            f"no cluster or region {name!r} in {topo.source} (clusters: {', '.join(clusters)}; "
            f"regions: {', '.join(regions)})"
        )
    if pool is None:
        targets = []
        for c in chosen:
            pools = router_pools(topo, c.name, configs)
            empties = tuple(_describe_pool(topo, c.name, n, s) for n, s in pools.items())
            targets.append(Target(f"cluster {c.name}", True, c.routers, empties))
        return targets
    if pool == REGIONAL:
        if region.regional_pool is None:
            raise FlushError(f"region {region.name} has no regional pool")
        servers = region.regional_pool.servers
        return [Target(f"regional pool of {region.name}", False, servers, (f"{_servers(servers)}",))]
    targets = []
    for c in chosen:
        found = next((p for p in c.pools if p.name == pool), None)
        if found is None:
            if len(chosen) == 1:
                have = ", ".join([p.name for p in c.pools] + ([REGIONAL] if region.regional_pool else []))
                raise FlushError(f"cluster {c.name} has no pool {pool!r} (pools: {have})")
            continue
        targets.append(Target(f"pool {c.name}/{pool}", False, found.servers, (f"{_servers(found.servers)}",)))
    if not targets:
        raise FlushError(f"no cluster of region {region.name} has a pool {pool!r}")
    return targets


def describe(targets: list[Target]) -> str:
    lines = []
    for t in targets:
        how = f"through router {t.addresses[0]}" if t.via_router else "directly, server by server"
        if t.via_router and len(t.addresses) > 1:
            how += f" (or {_servers(t.addresses[1:])})"
        lines.append(f"  {t.name} {how}:")
        lines += [f"    {e}" for e in t.empties]
    return "\n".join(lines)


def flush_one(address: Address, timeout: float = TIMEOUT, tls: ssl.SSLContext | None = None) -> str | None:
    """`flush_all` to one router or memcached: None if it answered OK, else why not (one line). `tls`: the
    port speaks TLS (`router_config.tls_context`)."""
    client = Client((address.host, address.port), connect_timeout=2, timeout=timeout, tls_context=tls)
    try:
        client.flush_all(noreply=False)
        return None
    except MemcacheError as e:
        detail = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        return f"{type(e).__name__.removeprefix('Memcache')}: {detail.strip() or type(e).__name__}"
    except TimeoutError:
        return f"no answer within {timeout:g}s"
    except ssl.SSLError as e:  # before OSError, its base: say why the handshake failed
        return f"TLS handshake failed ({getattr(e, 'verify_message', None) or e.reason or e})"
    except OSError as e:
        return f"does not answer ({e.strerror or type(e).__name__})"
    finally:
        client.close()


def run(targets: list[Target], flush: Callable[[Address], str | None] = flush_one) -> list[Outcome]:
    outcomes = []
    for t in targets:
        errors: list[str] = []
        if t.via_router:
            ok = False
            for router in t.addresses:  # one router flushes the whole cluster: the first that can
                problem = flush(router)
                if problem is None:
                    ok = True
                    break
                errors.append(f"{t.name}: router {router}: {problem}")
        else:
            for server in t.addresses:  # every server of the pool
                problem = flush(server)
                if problem is not None:
                    errors.append(f"{t.name}: server {server}: {problem}")
            ok = not errors
        outcomes.append(Outcome(t, ok, tuple(errors)))
    return outcomes


def confirm(name: str, targets: list[Target], stdin: TextIO, out: TextIO) -> bool:
    out.write(
        f"squealctl flush {name} empties:\n{describe(targets)}\n"
        "Every read of these caches misses until they refill; the databases take that load.\n"
        f"Type {name!r} to flush, anything else to stop: "
    )
    out.flush()
    return stdin.readline().strip() == name


def main(
    topo: Topology,
    name: str,
    pool: str | None = None,
    *,
    yes: bool = False,
    configs: Path | None = None,
    stdin: TextIO | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """`squealctl flush`: plan, confirm, flush, report. Returns the exit status."""
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    try:
        targets = plan(topo, name, pool, configs)
    except FlushError as e:
        print(f"squealctl flush: error: {e}", file=err)
        return 2
    if not yes:
        if not stdin.isatty():
            print(
                f"squealctl flush: error: not flushing {name} without confirmation: stdin is not a terminal "
                "(add --yes)",
                file=err,
            )
            return 2
        if not confirm(name, targets, stdin, out):
            print("squealctl flush: not confirmed; nothing flushed", file=err)
            return 1
    outcomes = run(targets, functools.partial(flush_one, tls=router_config.tls_context(topo.tls, "monitoring")))
    for o in outcomes:
        for line in o.errors:
            print(f"squealctl flush: {'warning' if o.ok else 'error'}: {line}", file=err)
        if o.ok:
            print(f"flushed {o.target.name}", file=out)
    failed = [o.target.name for o in outcomes if not o.ok]
    if failed:
        hint = ""
        if any("disabled" in line for o in outcomes for line in o.errors):
            hint = "; a router refuses flush_all unless started with --enable-flush-cmd"
        print(
            f"squealctl flush: error: NOT flushed: {', '.join(failed)} (servers that answered OK were "
            f"flushed; run it again once the named ones answer{hint})",
            file=err,
        )
        return 1
    return 0
