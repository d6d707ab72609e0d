"""Monitoring: Prometheus scraping, the invalidation-latency prober, the consistency checker, the dashboard."""

from monitoring.consistency_report import consistency_main
from monitoring.inspector import Inspector
from monitoring.panels import build as build_panels
from monitoring.prober import CANARY_TABLE, Prober, ProberError, ProbeResult
from monitoring.scrape import Scraper, Store, Target

__all__ = [
    "CANARY_TABLE",
    "Inspector",
    "consistency_main",
    "ProbeResult",
    "Prober",
    "ProberError",
    "Scraper",
    "Store",
    "Target",
    "build_panels",
]
