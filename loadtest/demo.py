"""The demo workload `squealctl up --demo` runs: one demo web server per cluster, at a modest rate.

    python -m loadtest.demo TOPOLOGY --rate 40 --metrics-port 39050

Reads (users, feeds) follow a skewed popularity so caches warm up and hit; a tenth of requests are writes
(renames, new posts) made in both regions — the master region writes locally, the other region through
remote markers — so squeal always has invalidations to deliver and the dashboard always has data.
Serves the web tier's Prometheus counters (`squeal_client_*`) and its own `squeal_demo_requests_total`.
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
import threading
import time

from prometheus_client import Counter, start_http_server

import router_config
from loadtest.webtier import WebServer

log = logging.getLogger("squeal.demo")
USERS = 200
REQUESTS = Counter("squeal_demo_requests", "Demo web tier requests", ["region", "cluster", "op", "outcome"])


def _popular(rng: random.Random, n: int) -> int:
    """A skewed pick in 1..n: low ids are much hotter (roughly Zipf-like, as real workloads are)."""
    return min(n, int(rng.paretovariate(1.2)))


def seed(web: WebServer, users: int = USERS) -> None:
    """Create the demo users (idempotent: existing rows are kept)."""
    existing = web.master.query_one("SELECT COUNT(*) AS n FROM users", ())
    for i in range((existing or {}).get("n", 0) + 1, users + 1):
        web.create_user(f"user{i}", f"user{i}@demo.example")


def run_one(web: WebServer, rng: random.Random) -> str:
    user = _popular(rng, USERS)
    roll = rng.random()
    if roll < 0.6:
        web.get_user(user)
        return "get_user"
    if roll < 0.9:
        web.get_feed(user)
        return "get_feed"
    if roll < 0.95:
        web.update_user(user, name=f"user{user}-{rng.randrange(1000)}")
        return "update_user"
    web.create_post(user, f"post at {time.time():.3f}")
    return "create_post"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("topology")
    p.add_argument("--rate", type=float, default=40.0, help="requests per second per cluster (default %(default)s)")
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    topo = router_config.load(args.topology)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    seed(WebServer(topo, topo.master.name))
    start_http_server(args.metrics_port, addr=args.host)
    log.info(
        "demo web tier: %d clusters at %.0f req/s each; metrics on %s:%d",
        len(topo.clusters),
        args.rate,
        args.host,
        args.metrics_port,
    )

    def serve(cluster: router_config.Cluster, rng: random.Random) -> None:
        web = WebServer(topo, cluster.region, cluster.name)
        interval = 1.0 / args.rate
        while not stop.is_set():
            started = time.monotonic()
            try:
                op = run_one(web, rng)
                REQUESTS.labels(cluster.region, cluster.name, op, "ok").inc()
            except Exception as e:  # noqa: BLE001 - a demo request failing must not end the demo
                REQUESTS.labels(cluster.region, cluster.name, "any", "error").inc()
                log.warning("%s: request failed: %s", cluster.name, e)
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
        web.close()

    threads = [
        threading.Thread(target=serve, args=(c, random.Random(args.seed + i)), name=c.name, daemon=True)
        for i, c in enumerate(topo.clusters)
    ]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
