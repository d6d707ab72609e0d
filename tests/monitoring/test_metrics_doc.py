"""docs/metrics.md lists every metric the code defines, and the dashboards chart only listed metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "metrics.md").read_text()
DOCUMENTED = set(re.findall(r"^\| `(squeal_[a-z_]+)`", DOC, re.M))
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def python_metrics() -> set[str]:
    found = set()
    for path in ROOT.glob("*/**/*.py"):
        if {".venv", "tests", "build"} & set(path.parts):  # (build/: a packaging copy, maybe of older code)
            continue
        names = re.findall(r'(?:Counter|Gauge|Histogram)(?:MetricFamily)?\(\s*"(squeal_[a-z_]+)"', path.read_text())
        found |= {_base(n) for n in names}  # prometheus-client adds/strips the _total suffix itself
    return found


def router_metrics() -> set[str]:
    stats = (ROOT / "router" / "src" / "stats.rs").read_text()
    literal = {_base(n) for n in re.findall(r"(squeal_router_[a-z_]+)", stats) if not n.endswith("_")}
    scalars = {f"squeal_router_{n}" for n in re.findall(r'\(\s*"([a-z_]+)",\s*"', stats)}
    return literal | scalars


def test_every_defined_metric_is_documented():
    defined = python_metrics() | router_metrics()
    assert len(defined) > 40
    assert defined - DOCUMENTED == set()


def test_dashboards_only_chart_documented_metrics():
    grafana = (ROOT / "monitoring" / "grafana-dashboard.json").read_text()
    exprs = " ".join(t["expr"] for p in json.loads(grafana)["panels"] for t in p["targets"])
    panels = (ROOT / "monitoring" / "panels.py").read_text()
    used = {_base(n) for n in re.findall(r"squeal_[a-z_]+", exprs + panels) if not n.endswith("_")}
    assert used - DOCUMENTED == set()
