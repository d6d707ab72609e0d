"""Prometheus scrape configuration for a deployment, from the component list `squealctl up` records.

Production users run a real Prometheus (and Grafana, with monitoring/grafana-dashboard.json); this writes the
`scrape_configs` for every component that serves `/metrics`, labelled by role, region and cluster.
memcached itself speaks no HTTP: scrape it with the standard memcached_exporter, or use the monitoring
server's own view (it reads `stats` directly).
"""

from __future__ import annotations

import json
from pathlib import Path


def scrape_config(components_file: Path, interval: str = "5s") -> dict:
    """A prometheus.yml document (as data) with one static target per component that has metrics."""
    components = json.loads(components_file.read_text())["components"]
    jobs: dict[str, list[dict]] = {}
    for c in components:
        if not c.get("metrics"):
            continue
        labels = {k: c[k] for k in ("region", "cluster") if c.get(k)}
        jobs.setdefault(f"squeal-{c['role']}", []).append({"targets": [c["metrics"]], "labels": labels})
    return {
        "global": {"scrape_interval": interval},
        "scrape_configs": [{"job_name": job, "static_configs": targets} for job, targets in sorted(jobs.items())],
    }


def render_yaml(doc: dict) -> str:
    """YAML is a superset of JSON: emit JSON-style YAML so no YAML library is needed."""
    return json.dumps(doc, indent=2) + "\n"
