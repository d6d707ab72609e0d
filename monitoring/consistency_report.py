"""`squealctl consistency`: the monitoring server's inspector report (`/api/consistency`), as text or JSON,
and whether a region is under the topology's `consistency_slo` (exit status 1)."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from typing import Any

import router_config

SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> float:
    """ "10m", "90s", "2h", "1d" or plain seconds -> seconds (ValueError naming the text)."""
    m = SINCE.match(text)
    if m is None or float(m.group(1)) <= 0:
        raise ValueError(f"--since {text!r}: give a duration like 90s, 10m, 2h or 1d")
    return float(m.group(1)) * UNITS[m.group(2) or "s"]


def _figure(f: dict[str, Any]) -> str:
    if not f["checked"]:
        return "not checked"
    if f["nines"] is None:
        shown = f">= {f['nines_at_least']:.1f} nines (none inconsistent)"
    else:
        shown = f"{f['nines']:.2f} nines"
    return f"{f['checked']} checked, {f['inconsistent']} inconsistent, {f['ratio'] * 100:.5f}% = {shown}"


def below_slo(report: dict[str, Any]) -> list[str]:
    """Regions whose nines within the SLO's window are under the SLO (nothing without an SLO)."""
    slo = report.get("slo")
    if not slo:
        return []
    out = []
    for region, doc in report["regions"].items():
        f = doc["windows"].get(slo["window"])
        if f and f["checked"] and f["nines"] is not None and f["nines"] < slo["nines"]:
            out.append(region)
    return out


def format_report(report: dict[str, Any]) -> str:
    """`squealctl consistency`'s text: per region each window, then each cluster and shard, then what was
    found inconsistent last."""
    since = report["since_s"]
    head = f"consistency over the last {since / 60:g} min" if since >= 60 else f"consistency over the last {since:g}s"
    if report.get("slo"):
        head += f" (SLO: {report['slo']['text']})"
    lines = [head]
    if not report["regions"]:
        lines.append("  nothing checked yet: no sampled change has come due (or no shard is being read)")
    for region, doc in report["regions"].items():
        lines.append(f"region {region}")
        for window, f in doc["windows"].items():
            lines.append(f"  within {window:<6} {_figure(f)}")
        for kind in ("clusters", "shards"):
            for name, windows in doc[kind].items():
                worst = ", ".join(f"{w}: {f['inconsistent']}/{f['checked']}" for w, f in windows.items())
                lines.append(f"    {kind[:-1]} {name:<12} inconsistent/checked  {worst}")
    for region in below_slo(report):
        lines.append(f"BELOW THE SLO: region {region}")
    for shard, s in report.get("shards", {}).items():
        if s.get("error"):
            lines.append(f"shard {shard}: {s['error']}")
    recent = report.get("recent", [])[:10]
    if recent:
        lines.append("last inconsistencies:")
        for r in recent:
            lines.append(
                f"  {r['key']} in {r['cluster']} ({r['window']}): holds {r['found']}, the database {r['expected']} "
                f"({r['table']} row {r['row']}, GTID {r['gtid']}, {r['age_s']:.1f}s after the commit)"
            )
    return "\n".join(lines)


def consistency_main(topo: router_config.Topology, since: str, as_json: bool) -> int:
    """`squealctl consistency`: the monitoring server's inspector report. Exit status 0, 1 when a region is under
    the topology's consistency_slo, 2 when the monitoring server does not answer or --since is not a duration."""
    try:
        seconds = parse_since(since)
    except ValueError as e:
        print(f"squealctl consistency: {e}", file=sys.stderr)
        return 2
    url = f"http://{topo.monitoring.host}:{topo.monitoring.port}/api/consistency?since={seconds:g}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            report = json.loads(answer.read())
    except (OSError, ValueError) as e:
        print(f"squealctl consistency: the monitoring server at {url} did not answer: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report["regions"], indent=2) if as_json else format_report(report))
    return 1 if below_slo(report) else 0
