"""Locust users that act as web servers of the demo web tier (loadtest.webtier.WebServer).

Run through `squealctl loadtest …` (the experiments start the servers and pass a `loadtest.workload.Spec`
in $SQUEAL_LOADTEST_SPEC), or by hand against a running deployment:

    SQUEAL_LOADTEST_SPEC='{"topology": "t.toml", "region": "east", "clusters": ["east-a"], "ids": [1, 2, 3]}' \
        locust -f loadtest/locustfile.py --headless -u 20 -r 20 -t 30s WebTierUser

Each user owns one WebServer (its own cache connection and database connection), so a memcache failure
is attributed to the request that met it: it is reported to locust as a failed request, the
client-visible error of the paper's gutter numbers (the web server itself falls back to the database).
Every `interval` seconds the process appends the summed client counters per cluster to `Spec.out`.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import gevent
from locust import User, constant, constant_throughput, events, task

import router_config
from leases import LeaseCache
from loadtest.webtier import WebServer
from loadtest.workload import Spec, ValueSizes, Zipf, body, cache_client

SPEC = Spec.from_env()
TOPOLOGY = router_config.load(SPEC.topology)
ZIPF = Zipf(max(1, len(SPEC.ids)), SPEC.zipf_s)
SIZES = ValueSizes(SPEC.value_pool)
_index = itertools.count()
_servers: list[WebServer] = []
_requests: dict[str, int] = defaultdict(int)  # cluster -> requests made
_failures: dict[str, int] = defaultdict(int)  # cluster -> requests that met a memcache error
_ops: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # cluster -> op name -> count
POST_QUERY = "SELECT id, author_id, body FROM posts WHERE id = %s"


def read(ws: WebServer, family: str, item: int) -> Any:
    """One page view's cache read of `item` in `family` (see Spec)."""
    if family == "post":
        return ws.get_post(item)
    if family == "feed":
        return ws.get_feed(item)
    if family == "regional":
        key = f"regional:post:{item}"
        return ws.rm_for(item).read_through(key, lambda db: db.query_one(POST_QUERY, (item,)), ws.ttl)
    raise ValueError(f"unknown key family {family!r}")


def write(ws: WebServer, family: str, item: int, rng: random.Random) -> None:
    """One write that invalidates `item`: the web tier's write path (mcd comment, local delete)."""
    if family == "feed":
        ws.create_post(item, body(SIZES.size(rng), rng.randrange(1 << 30)))
        return
    key = f"regional:post:{item}" if family == "regional" else f"post:{item}"
    ws.rm_for(item).write_with_marker(  # on the post's shard (the web tier's shard map)
        [key], "UPDATE posts SET body = %s WHERE id = %s", (body(SIZES.size(rng), item), item)
    )


class _WebServerUser(User):
    abstract = True

    def on_start(self) -> None:
        i = next(_index)
        self.cluster = SPEC.clusters[i % len(SPEC.clusters)]
        self.rng = random.Random(SPEC.seed * 100_003 + i)
        self.ws = WebServer(
            TOPOLOGY,
            SPEC.region,
            self.cluster,
            database=SPEC.database,
            leases=SPEC.leases,
            ttl=SPEC.ttl,
            recv_timeout=SPEC.recv_timeout,
            client=SPEC.client,
        )
        if isinstance(self.ws.cache, LeaseCache):
            # Large values need a bigger read buffer than leases.connect gives (see workload.cache_client).
            self.ws.cache.client = cache_client(self.ws.cluster.routers, recv_timeout=SPEC.recv_timeout)
        _servers.append(self.ws)

    def on_stop(self) -> None:
        self.ws.close()

    def _call(self, name: str, fn: Callable[[], Any]) -> None:
        errors = self.ws.stats.errors
        start = time.perf_counter()
        exc: BaseException | None = None
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a database error: the page failed (reported to locust)
            exc = e
        failed = self.ws.stats.errors - errors
        if exc is None and failed:
            exc = RuntimeError(f"{failed} memcache request(s) failed; served from the database")
        _requests[self.cluster] += 1
        _ops[self.cluster][name] += 1
        if exc is not None:
            _failures[self.cluster] += 1
        events.request.fire(
            request_type=self.cluster,
            name=name,
            response_time=(time.perf_counter() - start) * 1000,
            response_length=0,
            exception=exc,
            context={},
        )


class WebTierUser(_WebServerUser):
    """A web server: Zipf reads of `Spec.ids`, a `write_ratio` share of writes to the same keys."""

    wait_time = constant(SPEC.think_time)

    @task
    def page(self) -> None:
        item = SPEC.ids[ZIPF.rank(self.rng)] if SPEC.ids else 1
        if SPEC.write_ratio and self.rng.random() < SPEC.write_ratio:
            self._call("write", lambda: write(self.ws, SPEC.family, item, self.rng))
        else:
            self._call("read", lambda: read(self.ws, SPEC.family, item))


class HotWriter(_WebServerUser):
    """Churn on the hot keys: `writer_rate` writes per second, round-robin over `Spec.writer_ids`."""

    fixed_count = 1
    wait_time = constant_throughput(SPEC.writer_rate or 1.0)

    def on_start(self) -> None:
        super().on_start()
        self._next = itertools.cycle(SPEC.writer_ids or SPEC.ids[:1] or [1])

    @task
    def churn(self) -> None:
        item = next(self._next)
        self._call("churn", lambda: write(self.ws, SPEC.family, item, self.rng))


# -- the timeline the experiment reads ------------------------------------------------------------


def snapshot() -> dict[str, Any]:
    """Summed client counters per cluster (requests, failures and every ClientStats counter)."""
    per: dict[str, dict[str, int]] = {}
    for ws in list(_servers):
        acc = per.setdefault(ws.cluster.name, defaultdict(int))
        for k, v in ws.stats.snapshot().items():
            acc[k] += v
    for cluster in set(_requests) | set(per):
        acc = per.setdefault(cluster, defaultdict(int))
        acc["requests"] = _requests[cluster]
        acc["failures"] = _failures[cluster]
        for op, n in _ops[cluster].items():
            acc[f"op_{op}"] = n
    return {"t": time.time(), "clusters": {c: dict(v) for c, v in per.items()}}


def _timeline() -> None:
    with open(SPEC.out, "a") as f:
        while True:
            f.write(json.dumps(snapshot()) + "\n")
            f.flush()
            gevent.sleep(SPEC.interval)


_writer: list[gevent.Greenlet] = []


@events.test_start.add_listener
def _start_timeline(**_: Any) -> None:
    if SPEC.out and not _writer:
        _writer.append(gevent.spawn(_timeline))


@events.quitting.add_listener
def _final_snapshot(**_: Any) -> None:
    for g in _writer:
        g.kill()
    if SPEC.out:
        with open(SPEC.out, "a") as f:
            f.write(json.dumps({**snapshot(), "final": True}) + "\n")
