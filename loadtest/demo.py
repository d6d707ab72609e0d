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


def seed(web: WebServer, users: int = USERS) -> list[int]:
    """Create the demo users (idempotent: existing rows are kept); returns every demo user's id.

    User i goes to the shard the shard map gives id i (`Topology.shard_of`), so on fresh shards the ids are
    1..users as without shards; the ids returned are what is there, whatever an earlier run left."""
    have = {r["email"] for r in web.query_all("SELECT email FROM users")}
    for i in range(1, users + 1):
        if f"user{i}@demo.example" not in have:
            web.create_user(f"user{i}", f"user{i}@demo.example", shard=web.topology.shard_of(i).name)
    return sorted(r["id"] for r in web.query_all("SELECT id FROM users WHERE email LIKE 'user%%@demo.example'", ()))


def run_one(web: WebServer, rng: random.Random, users: list[int] | None = None) -> str:
    """One request for a skewed pick of `users` (default: ids 1..USERS)."""
    user = users[_popular(rng, len(users)) - 1] if users else _popular(rng, USERS)
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

    seeder = WebServer(topo, topo.master.name)
    users = seed(seeder)
    seeder.close()
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
                op = run_one(web, rng, users)
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
