"""Reading every cluster's copy of the keys through its routers, a grace period for invalidations in flight
(a few times squeal's measured p99), and `verify` itself."""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pymysql
import pymysql.cursors
from pymemcache.exceptions import MemcacheError

import router_config
from monitoring.panels import quantile
from monitoring.scrape import scrape_prometheus
from monitoring.verify.checker import ConsistencyChecker, Verdict
from monitoring.verify.codec import Codec, VerifyError, failure_reason
from monitoring.verify.database import shard_databases
from monitoring.verify.meta import MetaReader, plain_key
from monitoring.verify.report import StaleKey, Unchecked, VerifyReport

log = logging.getLogger(__name__)

DEFAULT_GRACE = 2.0  # seconds, when no squeal daemon's latency histogram can be read
GRACE_FACTOR = 3.0  # grace = this many times the measured p99 invalidation latency ...
GRACE_BOUNDS = (0.5, 30.0)  # ... kept within these bounds (seconds)
LATENCY_METRIC = "squeal_invalidation_latency_seconds"
RECHECK_ROUNDS = 3  # a mismatching copy replaced by another mismatching copy is re-read at most this often
CHUNK = 100  # keys per multi-get

# -- grace: a few times the measured p99 invalidation latency ----------------------------------------------


def squeal_metrics_addresses(topo: router_config.Topology) -> list[str]:
    return [str(address) for role, _, address in topo.listeners() if role == "squeal"]


def measured_grace(topo: router_config.Topology, timeout: float = 1.0) -> tuple[float, str]:
    """(grace seconds, where it came from): GRACE_FACTOR × the worst daemon's p99 invalidation latency."""
    p99s: list[float] = []
    for address in squeal_metrics_addresses(topo):
        buckets: dict[float, float] = {}
        try:
            for name, labels, value in scrape_prometheus(address, timeout):
                if name == f"{LATENCY_METRIC}_bucket":
                    le = float(labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + value  # summed over flows
        except (OSError, ValueError) as e:
            log.debug("verify: no latency histogram from %s: %s", address, e)
            continue
        p99 = quantile(0.99, buckets)
        if p99 is not None:
            p99s.append(p99)
    if not p99s:
        return DEFAULT_GRACE, "default: no squeal daemon's latency histogram was readable"
    low, high = GRACE_BOUNDS
    p99 = max(p99s)
    grace = min(max(GRACE_FACTOR * p99, low), high)
    return grace, f"{GRACE_FACTOR:g} x p99 invalidation latency {p99:.2f}s of {len(p99s)} squeal daemon(s)"


# -- reading the caches ---------------------------------------------------------------------------------


class KeepFlags:
    """pymemcache serde that hands back (raw bytes, client flags): the checker decodes by flag itself."""

    def serialize(self, key: str, value: Any) -> tuple[bytes, int]:
        raise TypeError("the consistency checker never writes")

    def deserialize(self, key: str, value: bytes, flags: int) -> tuple[bytes, int]:
        return value, flags


CACHE_ERRORS = (OSError, MemcacheError)  # OSError includes timeouts


def _client(address: router_config.Address, tls: ssl.SSLContext | None) -> MetaReader:
    """A reader that takes no lease (`meta.MetaReader`): a classic get through a pool with leases would."""
    return MetaReader(address, tls)


def router_tls(topo: router_config.Topology) -> ssl.SSLContext | None:
    """monitoring's client context for the routers with `[tls]` (None: plaintext)."""
    return router_config.tls_context(topo.tls, "monitoring")


def _connect(cluster: router_config.Cluster, tls: ssl.SSLContext | None) -> tuple[MetaReader, router_config.Address]:
    """A reader on the first of the cluster's routers that answers."""
    failures = []
    for router in cluster.routers:
        try:
            client = _client(router, tls)
            client.raw_command(b"mn")  # answers MN: the router serves
            return client, router
        except CACHE_ERRORS as e:
            failures.append(f"router {router} does not answer ({failure_reason(e)})")
    raise ConnectionError("; ".join(failures))


def _ttl_left(client: MetaReader, key: str) -> int | None:
    """Remaining TTL via the meta protocol (`mg K t` → `HD t<seconds>`; -1 means no expiry)."""
    try:
        reply = client.raw_command(f"mg {key} t".encode(), b"\r\n")
    except CACHE_ERRORS:
        return None
    for token in reply.split()[1:]:
        if token.startswith(b"t"):
            return int(token[1:])
    return None


@dataclass
class _Suspect:
    cluster: str
    key: str
    cas: bytes | None
    seen: float
    verdict: Verdict


@dataclass
class FirstLook:
    """What the first look at the clusters found: counts over the clusters checked in full, and the copies that
    disagreed with the database (re-read after the grace: `_recheck`)."""

    checked: int = 0  # (cluster, key) pairs found cached and compared
    absent: int = 0  # (cluster, key) pairs not cached
    placeholders: int = 0  # lease placeholders
    unjudged: int = 0  # values the codec does not read
    suspects: list[_Suspect] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)  # checked in full
    unchecked: dict[str, Unchecked] = field(default_factory=dict)  # cluster -> why not
    routers: dict[str, router_config.Address] = field(default_factory=dict)  # cluster -> the router it answered on
    tls: ssl.SSLContext | None = None  # [tls]: the routers are dialled with it

    def add(self, cluster: str, other: FirstLook) -> None:
        """Count one cluster's look (`_look_at`) in."""
        self.clusters.append(cluster)
        self.checked += other.checked
        self.absent += other.absent
        self.placeholders += other.placeholders
        self.unjudged += other.unjudged
        self.suspects.extend(other.suspects)


@dataclass
class Recheck:
    """The mismatches re-read after their grace: stale copies, and how many were invalidations in flight."""

    stale: list[StaleKey] = field(default_factory=list)
    in_flight: int = 0


def _look_at(
    cluster: str,
    client: MetaReader,
    keys: list[str],
    checker: ConsistencyChecker,
    seen: dict[tuple[str, bytes, int], Verdict],
) -> FirstLook:
    """One cluster's cached copies of `keys`, judged against the database (`seen`: verdicts by (key, bytes,
    flags), as clusters mostly hold the same bytes). Raises CACHE_ERRORS when its router fails."""
    look = FirstLook()
    for start in range(0, len(keys), CHUNK):
        chunk = keys[start : start + CHUNK]
        found = client.gets_many(chunk)
        look.absent += len(chunk) - len(found)
        for key, ((value, flags), cas) in found.items():
            v = seen.get((key, value, flags))
            if v is None:
                v = seen[(key, value, flags)] = checker.judge(key, value, flags)
            if v.state == "placeholder":
                look.placeholders += 1
            elif v.state == "unjudged":
                look.unjudged += 1
            else:
                look.checked += 1
                if v.state == "differs":
                    look.suspects.append(_Suspect(cluster, key, cas, time.monotonic(), v))
    return look


def _first_look(topo: router_config.Topology, keys: list[str], checker: ConsistencyChecker) -> FirstLook:
    """Phase 1: every cluster's copies, through one of its routers; a cluster whose routers do not answer (or
    fail mid-check) is `unchecked`, and none of its counts are kept."""
    total = FirstLook(tls=router_tls(topo))
    seen: dict[tuple[str, bytes, int], Verdict] = {}
    for cluster in topo.clusters:
        try:
            client, router = _connect(cluster, total.tls)
        except ConnectionError as e:
            total.unchecked[cluster.name] = Unchecked(cluster.name, str(e))
            continue
        total.routers[cluster.name] = router
        try:
            look = _look_at(cluster.name, client, keys, checker, seen)
        except CACHE_ERRORS as e:
            total.unchecked[cluster.name] = Unchecked(
                cluster.name, f"router {router} failed mid-check ({failure_reason(e)})"
            )
            continue
        finally:
            client.close()
        total.add(cluster.name, look)
    return total


def _grace(topo: router_config.Topology, look: FirstLook, grace: float | None) -> tuple[float | None, str]:
    """Phase 2: how long a mismatch gets before it is re-read, and where that figure came from ("" when no
    mismatch needs one)."""
    if not look.suspects:
        return grace, ""
    if grace is None:
        return measured_grace(topo)
    return grace, "--grace"


def _recheck(look: FirstLook, checker: ConsistencyChecker, grace: float, sleep: Callable[[float], None]) -> Recheck:
    """Phase 3: re-read each mismatch once its grace is over. Gone or agreeing: an invalidation in flight. The
    same copy (same CAS), or any copy in the last round: stale. Replaced by another copy that disagrees too: that
    one gets its grace (at most RECHECK_ROUNDS rounds). A router failing here makes its cluster `unchecked`."""
    result = Recheck()
    suspects = look.suspects
    for last_round in (r == RECHECK_ROUNDS for r in range(1, RECHECK_ROUNDS + 1)):
        if not suspects:
            break
        sleep(max(0.0, max(s.seen for s in suspects) + grace - time.monotonic()))
        again: list[_Suspect] = []
        for name in dict.fromkeys(s.cluster for s in suspects if s.cluster not in look.unchecked):
            mine = [s for s in suspects if s.cluster == name]
            client = None
            try:
                client = _client(look.routers[name], look.tls)
                found = client.gets_many([s.key for s in mine])
                for s in mine:
                    if s.key not in found:
                        result.in_flight += 1  # deleted within the grace: the invalidation was on its way
                        continue
                    (value, flags), cas = found[s.key]
                    v = checker.judge(s.key, value, flags)
                    if v.state != "differs":
                        result.in_flight += 1
                    elif cas == s.cas or last_round:
                        ttl = _ttl_left(client, s.key)
                        result.stale.append(StaleKey(name, s.key, v.cached, v.expected, ttl, v.shards))
                    else:  # replaced by another copy that disagrees too: give that one its grace
                        again.append(_Suspect(name, s.key, cas, time.monotonic(), v))
            except CACHE_ERRORS as e:
                reason = (
                    f"router {look.routers[name]} failed while re-reading {len(mine)} mismatches ({failure_reason(e)})"
                )
                look.unchecked[name] = Unchecked(name, reason)
                look.clusters.remove(name)
                again = [s for s in again if s.cluster != name]
            finally:
                if client is not None:
                    client.close()
        suspects = again
    return result


def verify(
    topo: router_config.Topology,
    *,
    database: str | None = None,
    sample: int | None = 200,
    keys: list[str] | None = None,
    seed: int = 0,
    codec: Codec | str | None = None,
    grace: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> VerifyReport:
    """Compare every cluster's cached copy of the sampled keys with the master database (with [shards]: the
    primaries of the shards that own each key's rows).

    database: only rules of tables in this schema (default: every rule). codec: a callable or import path
    for every rule (default: each rule's `codec`, else `json_rows`). grace: seconds a mismatch gets
    before it is re-read (default: `measured_grace`). Raises VerifyError when nothing can be checked because
    the database does not answer or the codec cannot be loaded; unreachable routers are in the report.

    The phases: the keys (`sample_keys`), the first look at every cluster (`_first_look`), the grace
    (`_grace`), the re-read of the mismatches (`_recheck`).
    """
    dbs = shard_databases(topo)
    checker = ConsistencyChecker(topo, dbs, codec, database)
    try:
        for db in dbs.values():
            db.connect()
        keys = keys if keys is not None else checker.sample_keys(sample, random.Random(seed))
        keys = [k for k in keys if plain_key(k)]  # a row whose key memcached refuses is never cached
        look = _first_look(topo, keys, checker)
        grace, grace_source = _grace(topo, look, grace)
        recheck = _recheck(look, checker, grace, sleep) if grace is not None and grace_source else Recheck()
        if checker.unknown_families:
            log.info("verify: the codec does not read %s", ", ".join(sorted(checker.unknown_families)))
        return VerifyReport(
            look.checked,
            look.absent,
            tuple(recheck.stale),
            placeholders=look.placeholders,
            in_flight=recheck.in_flight,
            unjudged=look.unjudged,
            unchecked=tuple(look.unchecked.values()),
            clusters=tuple(look.clusters),
            grace=grace if grace_source else None,
            grace_source=grace_source,
        )
    except pymysql.err.Error as e:
        failed = next((d for d in dbs.values() if d.lost), next(iter(dbs.values())))
        raise VerifyError(f"{failed.label} failed mid-check ({failure_reason(e)})") from e
    finally:
        for db in dbs.values():
            db.close()
