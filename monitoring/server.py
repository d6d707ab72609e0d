"""The monitoring server: scrapes every component, runs the prober, serves the dashboard.

    python -m monitoring serve TOPOLOGY --state-dir var/local --port 19000

Routes: `/` the dashboard page, `/api/panels` its data (JSON), `/api/targets` scrape health,
`/api/owners` who owns each shard of a pooled region (monitoring/owners.py), `/api/links` each link's TLS state
(monitoring/links.py), `/api/consistency?since=SECONDS` the consistency inspector's figures (monitoring/inspector.py),
`/metrics` the prober's and the inspector's own Prometheus metrics, `/healthz`.
Targets come from `squealctl`'s component list (every memcached, and every process that recorded a
metrics address), so whatever `squealctl up` started is watched without extra configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet import reactor as _reactor
from twisted.web import resource, server

import router_config
from monitoring import panels
from monitoring.inspector import Inspector
from monitoring.links import LinkWatch
from monitoring.owners import OwnershipWatch
from monitoring.prober import Prober
from monitoring.scrape import Scraper, Store, Target
from squeal import CertExpiry

# The global reactor provides every interface used here (TCP, threads, run's options); its stub names one.
reactor: Any = _reactor

log = logging.getLogger(__name__)
PAGE = Path(__file__).with_name("dashboard.html")


def targets_from_components(components_file: Path) -> list[Target]:
    """Scrape targets for every component `squealctl up` recorded."""
    if not components_file.exists():
        return []
    out = []
    for c in json.loads(components_file.read_text())["components"]:
        # `instance`: a region's HA squeal instances are several targets of one role and region
        labels = tuple((k, c[k]) for k in ("role", "region", "cluster", "pool", "instance") if c.get(k))
        if c["role"] == "memcached":
            out.append(Target("memcached", c["address"], labels))
        if c.get("metrics"):
            out.append(Target("prometheus", c["metrics"], labels))
    return out


class _Leaf(resource.Resource):
    isLeaf = True

    def __init__(self, render, content_type: bytes) -> None:
        super().__init__()
        self._render, self._type = render, content_type

    def render_GET(self, request):  # noqa: N802 - twisted's naming
        request.setHeader(b"content-type", self._type)
        request.setHeader(b"cache-control", b"no-store")
        return self._render()


class _Consistency(resource.Resource):
    """`/api/consistency?since=600`: the inspector's report over the last `since` seconds (default 600)."""

    isLeaf = True

    def __init__(self, inspector: Inspector | None) -> None:
        super().__init__()
        self.inspector = inspector

    def render_GET(self, request):  # noqa: N802 - twisted's naming
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        if self.inspector is None:
            request.setResponseCode(404)
            return json.dumps({"error": "the consistency inspector is not running (--no-inspector)"}).encode()
        try:
            since = float((request.args.get(b"since") or [b"600"])[0])
            if not since > 0:
                raise ValueError
        except ValueError:
            request.setResponseCode(400)
            return json.dumps({"error": "since must be a number of seconds greater than 0"}).encode()
        return json.dumps(self.inspector.report(since)).encode()


def build_site(
    store: Store,
    scraper: Scraper,
    registry: CollectorRegistry,
    owners: OwnershipWatch | None = None,
    links: LinkWatch | None = None,
    inspector: Inspector | None = None,
) -> server.Site:
    root = resource.Resource()
    root.putChild(b"", _Leaf(PAGE.read_bytes, b"text/html; charset=utf-8"))
    root.putChild(b"healthz", _Leaf(lambda: b"ok\n", b"text/plain"))
    root.putChild(b"metrics", _Leaf(lambda: generate_latest(registry), b"text/plain; version=0.0.4"))
    api = resource.Resource()
    root.putChild(b"api", api)
    api.putChild(b"panels", _Leaf(lambda: json.dumps(panels.build(store)).encode(), b"application/json"))
    api.putChild(
        b"owners",
        _Leaf(lambda: json.dumps(owners.snapshot() if owners else []).encode(), b"application/json"),
    )
    api.putChild(b"consistency", _Consistency(inspector))
    api.putChild(
        b"links",
        _Leaf(lambda: json.dumps(links.snapshot() if links else []).encode(), b"application/json"),
    )
    api.putChild(
        b"targets",
        _Leaf(
            lambda: json.dumps(
                [
                    {"kind": t.kind, "address": t.address, "labels": dict(t.labels), "up": scraper.up.get(t.address)}
                    for t in scraper.targets
                ]
            ).encode(),
            b"application/json",
        ),
    )
    return server.Site(root)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m monitoring",
        description="Scrape a local squeal deployment, probe invalidation latency, and serve the operators' dashboard.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the monitoring server")
    s.add_argument("topology", help="topology TOML (the prober writes canary rows to its master database)")
    s.add_argument("--state-dir", default="var/local", help="squealctl state dir whose components are scraped")
    s.add_argument("--port", type=int, default=19000, help="HTTP port for the dashboard (default %(default)s)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--probe-interval", type=float, default=1.0, help="seconds between canary probes")
    s.add_argument("--no-prober", action="store_true", help="no canary probes")
    s.add_argument(
        "--no-inspector",
        action="store_true",
        help="no consistency inspector (it reads every shard's binlog and checks 1 in [monitoring] "
        "consistency_sample committed row changes in every cluster)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        topo = router_config.load(args.topology)
    except router_config.TopologyError as e:
        print(f"monitoring: error: {e}", file=sys.stderr)
        return 2
    registry = CollectorRegistry()
    if topo.tls is not None:  # every certificate [tls] names: MariaDB, ZooKeeper, memcached have no /metrics
        registry.register(CertExpiry(router_config.certificate_files(topo.tls)))
    store = Store()
    components = Path(args.state_dir) / "components.json"
    own = Target("prometheus", f"{args.host}:{args.port}", (("role", "monitoring"),))
    scraper = Scraper(
        [own],
        store,
        discover=lambda: targets_from_components(components),
        memcached_tls=lambda: router_config.tls_context(topo.tls, "monitoring"),
    )
    if not args.no_prober:
        prober = Prober(topo, registry, interval=args.probe_interval)
        prober.start()
    watch = OwnershipWatch(topo).start()
    link_watch = LinkWatch(topo).start()
    inspector = None if args.no_inspector else Inspector(topo, registry).start()
    site = build_site(store, scraper, registry, watch, link_watch, inspector)
    reactor.listenTCP(args.port, site, interface=args.host)
    scraper.start()  # after the listen: its first scrape is of this server's own /metrics
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: reactor.callFromThread(reactor.stop))
    log.info("dashboard on http://%s:%d/ scraping %d targets", args.host, args.port, len(scraper.targets))
    reactor.run(installSignalHandlers=False)
    return 0
