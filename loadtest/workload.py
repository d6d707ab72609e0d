"""What the load looks like: Zipf-distributed keys, the paper's value sizes, and the spec a locust run reads.

A `Spec` is plain data (JSON in the `SQUEAL_LOADTEST_SPEC` environment variable) so the experiment
process, which starts the servers and measures, can hand it to a `locust` subprocess: locust patches the
whole interpreter with gevent on import, which must not happen inside the experiment (or pytest) process.

Value sizes follow the paper's table 3 (item sizes per pool, bytes): we interpolate its quantiles
log-linearly, so a run's sizes have the same median and tail shape as the pool it imitates.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SPEC_ENV = "SQUEAL_LOADTEST_SPEC"

# Paper, table 3: item sizes in bytes per pool at p5, p25, p50, p75, p95, p99 (mean in the comment).
TABLE3: dict[str, tuple[float, ...]] = {
    "wildcard": (77, 102, 169, 363, 3_650, 18_300),  # mean 1.11 K
    "app": (103, 247, 269, 337, 1_680, 10_400),  # mean 881
    "replicated": (62, 68, 68, 68, 68, 68),  # mean 66
    "regional": (231, 824, 5_310, 24_000, 158_000, 381_000),  # mean 31.8 K
}
_QUANTILES = (0.05, 0.25, 0.50, 0.75, 0.95, 0.99)
# The posts.body column is TEXT (at most 65,535 bytes); larger draws are capped there.
MAX_BODY = 60_000


class ValueSizes:
    """Draws item sizes for one pool of table 3 by inverse-CDF interpolation between its quantiles.

    Below p5 and above p99 the curve is extended to half of p5 and twice p99 (the paper gives no
    minimum or maximum); `cap` bounds what the database column can hold.
    """

    def __init__(self, pool: str = "wildcard", cap: int = MAX_BODY) -> None:
        q = TABLE3[pool]
        self.pool = pool
        self.cap = cap
        self._u = (0.0, *_QUANTILES, 1.0)
        self._logs = tuple(math.log(v) for v in (q[0] / 2, *q, q[-1] * 2))

    def size(self, rng: random.Random) -> int:
        u = rng.random()
        i = min(bisect.bisect_right(self._u, u), len(self._u) - 1)
        u0, u1 = self._u[i - 1], self._u[i]
        l0, l1 = self._logs[i - 1], self._logs[i]
        frac = (u - u0) / (u1 - u0) if u1 > u0 else 0.0
        return max(1, min(self.cap, round(math.exp(l0 + frac * (l1 - l0)))))


class Zipf:
    """Ranks 0..n-1 with P(rank k) proportional to 1/(k+1)^s; rank 0 is the hottest key."""

    def __init__(self, n: int, s: float = 1.0) -> None:
        if n < 1:
            raise ValueError(f"Zipf needs at least one key, got n={n}")
        weights = [1.0 / (k + 1) ** s for k in range(n)]
        total = sum(weights)
        acc, cdf = 0.0, []
        for w in weights:
            acc += w
            cdf.append(acc / total)
        cdf[-1] = 1.0
        self.n, self.s, self._cdf = n, s, cdf

    def rank(self, rng: random.Random) -> int:
        return bisect.bisect_left(self._cdf, rng.random())

    def share(self, top: int) -> float:
        """Fraction of draws that land on the `top` hottest ranks."""
        return self._cdf[min(top, self.n) - 1] if top > 0 else 0.0


def body(size: int, seed: int) -> str:
    """A printable post body of exactly `size` bytes (varied so memcached cannot share pages trivially)."""
    unit = f"{seed:x}-lorem ipsum dolor sit amet "
    return (unit * (size // len(unit) + 1))[:size]


@dataclass
class Spec:
    """One locust run, as the locustfile reads it.

    family: "post" (post:{id} through the cluster's wildcard pool), "regional" (regional:post:{id}, the
    region's shared pool) or "feed" (feed:{author_id}, the herd experiment's hot keys).
    ids: the key space (post ids or author ids), ranked hottest first for the Zipf draw.
    clusters: the web servers' clusters; user i serves clusters[i % len(clusters)].
    write_ratio: share of the readers' own tasks that are writes; writer_rate: writes per second of the
    dedicated writer (hot-key churn), 0 for none.
    client: the web servers' memcached client, "lease" (leases.LeaseCache; `leases` turns its leases off) or
    "stock" (loadtest.stockcache: pymemcache's plain get/set; leases only where the topology gives the pool
    them, `leases` unused). Its `recv_timeout` must outlast the router's lease wait (`wait_ms` x `retries`).
    """

    topology: str
    region: str
    clusters: list[str]
    database: str = "app"
    family: str = "post"
    ids: list[int] = field(default_factory=list)
    zipf_s: float = 1.0
    write_ratio: float = 0.0
    writer_rate: float = 0.0
    writer_ids: list[int] = field(default_factory=list)
    leases: bool = True
    client: str = "lease"
    value_pool: str = "wildcard"
    think_time: float = 0.0  # seconds between one user's requests (0: as fast as it can)
    ttl: int = 300
    out: str = ""  # JSON-lines timeline written by the locust process
    interval: float = 0.5  # timeline sampling period
    seed: int = 1
    recv_timeout: float = 1.0

    def to_env(self) -> dict[str, str]:
        return {SPEC_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Spec:
        raw = (environ or os.environ).get(SPEC_ENV)
        if not raw:
            raise RuntimeError(f"{SPEC_ENV} is not set: run this locustfile through `squealctl loadtest`")
        return cls(**json.loads(raw))


def seed_posts(db: Any, count: int, *, pool: str = "wildcard", authors: int = 50, seed: int = 7) -> list[int]:
    """Insert `count` posts whose bodies have table-3 sizes of `pool`; returns their ids, in insert order.

    `db` is a `remote_markers.SqlClient` on the master (writes replicate; squeal sees them like any other), or
    a function from an author id to the master of its shard (`Stack.writer`: posts live with their author).
    """
    rng = random.Random(seed)
    sizes = ValueSizes(pool)
    ids = []
    for i in range(count):
        author = 1 + i % authors
        _, post_id = (db(author) if callable(db) else db).execute(
            "INSERT INTO posts (author_id, body) VALUES (%s, %s)", (author, body(sizes.size(rng), i))
        )
        ids.append(post_id)
    return ids


def cache_client(servers: Any, *, recv_timeout: float = 1.0, read_buffer_size: int = 256 * 1024) -> Any:
    """A meta-memcache client like `leases.connect` makes, with a read buffer that holds a large value.

    Why: meta-memcache's default 4 KB read buffer makes values past ~10 KB (table 3's p95-p99 of the
    wildcard pool and most of the regional pool) take 0.1-2.5 s to read on this machine (measured: a
    40 KB value 0.83 s with 4 KB, 0.12 ms with 64 KB). Reported to the client's owner; until
    `leases.connect` takes a buffer size, the locust users swap this client into their LeaseCache.
    """
    from meta_memcache import CacheClient, ServerAddress, connection_pool_factory_builder

    from leases import JsonSerializer

    return CacheClient.cache_client_from_servers(
        [ServerAddress(a.host, int(a.port)) for a in servers],
        connection_pool_factory_builder(
            initial_pool_size=0,
            max_pool_size=64,
            mark_down_period_s=2.0,
            connection_timeout=0.5,
            recv_timeout=recv_timeout,
            read_buffer_size=read_buffer_size,
        ),
        serializer=JsonSerializer(),
        raise_on_server_error=False,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
