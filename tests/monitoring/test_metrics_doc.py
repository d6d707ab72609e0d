"""docs/metrics.md lists exactly the metrics the Python code defines, and the dashboards chart only listed metrics."""

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


def test_every_python_metric_is_documented_and_every_documented_one_is_defined():
    """Both ways: a stale row (a series renamed or removed) fails as surely as a missing one.

    The router's `squeal_router_*` rows are checked the same way by the router's own test
    (`stats.rs`, `docs_metrics_md_lists_exactly_the_families_the_router_renders`), against what it renders.
    """
    defined = python_metrics()
    assert len(defined) > 40
    python_rows = {n for n in DOCUMENTED if not n.startswith("squeal_router_")}
    assert defined - DOCUMENTED == set(), "defined but not in docs/metrics.md"
    assert python_rows - defined == set(), "in docs/metrics.md but defined nowhere"


def _charted(text: str) -> set[str]:
    return {_base(n) for n in re.findall(r"squeal_[a-z_]+", text) if not n.endswith("_")}


def test_dashboards_only_chart_documented_metrics():
    grafana = (ROOT / "monitoring" / "grafana-dashboard.json").read_text()
    exprs = " ".join(t["expr"] for p in json.loads(grafana)["panels"] for t in p["targets"])
    panels = (ROOT / "monitoring" / "panels.py").read_text()
    # each source charts something: a regex that finds nothing would pass any dashboard
    assert len(_charted(exprs)) > 10 and len(_charted(panels)) > 10, (_charted(exprs), _charted(panels))
    assert (_charted(exprs) | _charted(panels)) - DOCUMENTED == set()


def test_grafana_percentage_axes_end_at_100_percent():
    """A ratio cannot pass 100 %: an axis that autoscales past it (the built-in page's ran to 108 %,
    issue 37 item 8) draws headroom nothing can fill."""
    panels = json.loads((ROOT / "monitoring" / "grafana-dashboard.json").read_text())["panels"]
    ratios = [p for p in panels if p.get("fieldConfig", {}).get("defaults", {}).get("unit") == "percentunit"]
    assert ratios, "no percentage panel: the check checks nothing"
    for p in ratios:
        defaults = p["fieldConfig"]["defaults"]
        assert (defaults.get("min"), defaults.get("max")) == (0, 1), p["title"]
