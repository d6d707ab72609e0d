"""The web tier's cache reads over TLS vs plaintext (not a test: prints figures for docs/benchmarks.md).

    PYTHONPATH=. .venv/bin/python bench/webtier_tls.py [--reads 20000] [--repeat 3] [--connects 200]

One memcached plain and one with `-Z` (a certificate from ops.tls), each read through `leases.connect` and
`LeaseCache.get_or_fill` from one thread: `--reads` hits on warm keys per round, alternating plaintext and TLS
`--repeat` times. Reported per round and as the median: reads/s and this process's CPU per read (all threads:
TLS adds leases/tls.py's relay thread), and the ratios TLS / plaintext. Also the cost of a new connection:
`--connects` connects + first read, each on a fresh client (TLS: the full handshake).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

from leases import LeaseCache, connect
from ops import tls
from ops.harness import Memcached
from router_config import CertKey, TlsSettings, client_context


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def reads(cache: LeaseCache, n: int, keys: int = 100) -> tuple[float, float]:
    """(reads/s, CPU µs per read) for `n` hits."""
    for k in range(keys):
        cache.get_or_fill(f"k{k}", lambda k=k: {"id": k}, ttl=600)
    wall, c = time.perf_counter(), cpu()
    for i in range(n):
        cache.get_or_fill(f"k{i % keys}", lambda: None, ttl=600)
    wall, c = time.perf_counter() - wall, cpu() - c
    assert cache.stats.errors == 0, cache.stats.snapshot()
    return n / wall, c / n * 1e6


def connects(address: str, ctx, n: int) -> float:
    """Wall ms per new connection + first read."""
    start = time.perf_counter()
    for _ in range(n):
        client = connect([address], tls=ctx, connect_timeout=5)
        cache = LeaseCache(client, name="bench-connect")
        cache.get_or_fill("k0", lambda: {"id": 0}, ttl=600)
    return (time.perf_counter() - start) / n * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reads", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--connects", type=int, default=200)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ca = tls.make_ca(d)
        server, web = tls.issue(ca, d, "memcached"), tls.issue(ca, d, "webtier")
        settings = TlsSettings(ca=str(ca.cert), certs=(("webtier", CertKey(str(web.cert), str(web.key))),))
        ctx = functools.partial(client_context, settings, "webtier")
        plain = Memcached(workdir=d / "mc")
        secure = Memcached(workdir=d / "mc", tls=(server.cert, server.key), ssl_ca=ca.cert)
        with plain, secure:
            caches = {
                "plaintext": LeaseCache(connect([plain.address]), name="plain"),
                "tls": LeaseCache(connect([secure.address], tls=ctx), name="tls"),
            }
            rounds: dict[str, list[tuple[float, float]]] = {"plaintext": [], "tls": []}
            print(f"load average {os.getloadavg()[0]:.2f}; {args.reads} hits per round")
            for r in range(args.repeat):
                for name, cache in caches.items():
                    rounds[name].append(reads(cache, args.reads))
                    rate, us = rounds[name][-1]
                    print(f"round {r + 1} {name:9s} {rate:9.0f} reads/s  {us:6.1f} µs CPU/read")
            med = {
                n: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for n, v in rounds.items()
            }
            print(
                f"RATIO tls/plaintext reads/s {med['tls'][0] / med['plaintext'][0]:.2f}, "
                f"CPU per read {med['tls'][1] / med['plaintext'][1]:.2f}"
            )
            plain_ms = connects(plain.address, None, args.connects)
            tls_ms = connects(secure.address, ctx, args.connects)
            print(
                f"new connection + first read: plaintext {plain_ms:.2f} ms, tls {tls_ms:.2f} ms "
                f"(x{tls_ms / plain_ms:.1f})"
            )
            print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
