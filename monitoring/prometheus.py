"""Prometheus configuration for a deployment, from the component list `squealctl up` records.

Production users run a real Prometheus (and Grafana, with monitoring/grafana-dashboard.json); this writes the
`scrape_configs` for every component that serves `/metrics`, labelled by role, region and cluster, and
loads squeal's alerting rules (monitoring/alerts.yml, documented in docs/metrics.md). `promtool check
config` accepts the output. memcached itself speaks no HTTP: scrape it with the standard
memcached_exporter, or use the monitoring server's own view (it reads `stats` directly).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ALERT_RULES = Path(__file__).resolve().with_name("alerts.yml")


def scrape_config(components_file: Path, interval: str = "5s", rules: Path | None = ALERT_RULES) -> dict:
    """A prometheus.yml document (as data) with one static target per component that has metrics.

    Rules are evaluated as often as targets are scraped, so an alert's `for:` is honoured to the interval.
    The rules file is named by its absolute path: Prometheus resolves relative ones against the directory
    of the config file, wherever the operator saves this output.
    """
    recorded = json.loads(components_file.read_text())
    components = recorded["components"] + recorded.get("supervisors", [])
    jobs: dict[str, list[dict]] = {}
    for c in components:
        if not c.get("metrics"):
            continue
        labels = {k: c[k] for k in ("region", "cluster") if c.get(k)}
        jobs.setdefault(f"squeal-{c['role']}", []).append({"targets": [c["metrics"]], "labels": labels})
    doc: dict[str, Any] = {"global": {"scrape_interval": interval, "evaluation_interval": interval}}
    if rules is not None:
        doc["rule_files"] = [str(Path(rules).resolve())]
    # honor_labels: a label a component exports itself wins over the target's. The prober's series carry the
    # region and cluster probed (squeal_probe_*{region, cluster}), the demo web tier's the ones it serves;
    # the target's region (where the process runs) must not rename them to exported_region.
    doc["scrape_configs"] = [
        {"job_name": job, "honor_labels": True, "static_configs": targets} for job, targets in sorted(jobs.items())
    ]
    return doc


def render_yaml(doc: dict) -> str:
    """YAML is a superset of JSON: emit JSON-style YAML so no YAML library is needed."""
    return json.dumps(doc, indent=2) + "\n"
