"""A tiny in-memory time-series store fed by scraping Prometheus `/metrics` endpoints and memcached `stats`.

The dashboard needs a few minutes of history from a handful of local daemons; a real Prometheus (see
`monitoring/prometheus.yml`) does this in production. Samples are kept per (metric, labels) in bounded
ring buffers, so memory stays flat however long the demo runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import ssl
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheError

log = logging.getLogger(__name__)

HISTORY = 600  # samples kept per series (10 minutes at one scrape a second)


@dataclass(frozen=True)
class Target:
    """Something to scrape: `kind` is `prometheus` (HTTP /metrics) or `memcached` (stats command)."""

    kind: str
    address: str  # host:port
    labels: tuple[tuple[str, str], ...] = ()  # added to every sample (e.g. region, cluster, pool)


@dataclass
class Series:
    name: str
    labels: dict[str, str]
    points: deque = field(default_factory=lambda: deque(maxlen=HISTORY))  # (unix time, value)


class Store:
    """Thread-safe map (name, sorted labels) → Series."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}

    def add(self, name: str, labels: dict[str, str], value: float, at: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = Series(name, dict(labels))
            series.points.append((at, value))

    def select(self, name: str, since: float = 0.0) -> list[dict]:
        """All series of one metric name, as JSON-ready dicts with points newer than `since`."""
        with self._lock:
            found = [s for (n, _), s in self._series.items() if n == name]
            return [{"labels": s.labels, "points": [p for p in s.points if p[0] > since]} for s in found]

    def names(self) -> list[str]:
        with self._lock:
            return sorted({n for n, _ in self._series})


def parse_prometheus(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) for every sample of a Prometheus text exposition (ValueError if malformed).

    Names are the samples' own, as on the wire: a counter `x` gives `x_total` (and `x_created`), a histogram
    `x_bucket{…,le=…}`, `x_count`, `x_sum`. Labels keep the exposition's order (a bucket's `le` last).
    """
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, dict(sample.labels), float(sample.value)


def scrape_prometheus(address: str, timeout: float = 2.0) -> Iterable[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) for every sample an endpoint (host:port) exposes on /metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    return list(parse_prometheus(text))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    """`name{a="1",b="2"}` as the exposition writes the sample (labels in their order), `name` without labels."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def prometheus_values(address: str, timeout: float = 5.0) -> dict[str, float]:
    """An endpoint's samples as {sample_key: value}, e.g. `squeal_deletes_sent_total{flow="east-a"}`."""
    return {sample_key(name, labels): value for name, labels, value in scrape_prometheus(address, timeout)}


# memcached `stats` fields worth charting (hit rate = get_hits / (get_hits + get_misses))
MEMCACHED_FIELDS = (
    "get_hits",
    "get_misses",
    "cmd_get",
    "cmd_set",
    "delete_hits",
    "delete_misses",
    "curr_items",
    "bytes",
    "curr_connections",
)


def memcached_stats(address: str, timeout: float = 1.0, tls: ssl.SSLContext | None = None) -> dict[str, float]:
    """memcached's (or squeal-router's) `stats` as numbers, through pymemcache (non-numeric fields dropped).
    `tls`: the port speaks TLS (a topology with `[tls]`: `router_config.tls_context(topo.tls, "monitoring")`).

    OSError when the server cannot be reached or does not answer `stats` (a timeout, a closed connection, an
    error reply, a failed TLS handshake): every caller counts the server as down then.
    """
    host, _, port = address.rpartition(":")
    client = Client((host, int(port)), connect_timeout=timeout, timeout=timeout, tls_context=tls)
    try:
        raw = client.stats()
    except MemcacheError as e:
        raise OSError(f"memcached stats from {address}: {e!r}") from e
    finally:
        client.close()
    out: dict[str, float] = {}
    for key, value in raw.items():
        with contextlib.suppress(TypeError, ValueError):  # e.g. `version 1.6.21` (pymemcache leaves bytes)
            out[key.decode()] = float(value)
    return out


def scrape_memcached(
    address: str, timeout: float = 1.0, tls: ssl.SSLContext | None = None
) -> Iterable[tuple[str, dict[str, str], float]]:
    stats = memcached_stats(address, timeout, tls)
    for name in MEMCACHED_FIELDS:
        if name in stats:
            yield f"memcached_{name}", {}, stats[name]


class Scraper:
    """Scrapes every target once per `interval` on a daemon thread into `store`.

    `discover`, if given, is called before each round and its targets are added to the fixed ones: components
    started after the monitoring server (the demo web tier) are picked up without a restart. `memcached_tls`
    gives the client context of memcached targets (None: plaintext), asked once per round so renewed
    certificate files count.
    """

    def __init__(
        self,
        targets: list[Target],
        store: Store,
        interval: float = 1.0,
        discover: Callable[[], list[Target]] | None = None,
        memcached_tls: Callable[[], ssl.SSLContext | None] = lambda: None,
    ) -> None:
        self.fixed, self.store, self.interval, self.discover = list(targets), store, interval, discover
        self.memcached_tls = memcached_tls
        self.targets = list(targets)
        self.up: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def scrape_once(self) -> None:
        now = time.time()
        if self.discover is not None:
            try:
                found = self.discover()
                seen = {(t.kind, t.address) for t in found}
                self.targets = [t for t in self.fixed if (t.kind, t.address) not in seen] + found
            except (OSError, ValueError) as e:
                log.warning("target discovery failed, keeping the last list: %s", e)
        memcached = functools.partial(scrape_memcached, tls=self.memcached_tls())
        for target in self.targets:
            fetch = scrape_prometheus if target.kind == "prometheus" else memcached
            try:
                samples = list(fetch(target.address))
            except OSError as e:
                if self.up.get(target.address, True):
                    log.warning("scrape of %s %s failed: %s", target.kind, target.address, e)
                self.up[target.address] = False
                continue
            self.up[target.address] = True
            extra = dict(target.labels)
            for name, labels, value in samples:
                self.store.add(name, {**labels, **extra}, value, now)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scrape_once()
            self._stop.wait(self.interval)
