"""Experiment output: a printed table, `reports/<name>.json` and `reports/<name>.png` (matplotlib, Agg)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: CI and ssh sessions have no display
import matplotlib.pyplot as plt
from matplotlib.figure import Figure


@dataclass
class Report:
    """What one experiment found. `table`: rows of the printed table (first row: headers)."""

    name: str
    paper: str
    short: bool
    table: list[list[Any]]
    results: dict[str, Any]
    series: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    figure: Figure | None = None

    def text(self) -> str:
        return (
            f"{self.name}: {'short' if self.short else 'long'} form — paper: {self.paper}\n"
            + format_table(self.table)
            + "".join(f"\n  note: {n}" for n in self.notes)
        )

    def write(self, out_dir: str | Path) -> tuple[Path, Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        json_path, png_path = out / f"{self.name}.json", out / f"{self.name}.png"
        doc = {
            "experiment": self.name,
            "form": "short" if self.short else "long",
            "paper": self.paper,
            "table": self.table,
            "results": self.results,
            "series": self.series,
            "notes": self.notes,
        }
        json_path.write_text(json.dumps(doc, indent=2, default=_plain) + "\n")
        if self.figure is not None:
            self.figure.savefig(png_path, dpi=80)
            plt.close(self.figure)
        return json_path, png_path


def _plain(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"
    return str(v)


def format_table(rows: Sequence[Sequence[Any]]) -> str:
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(max(len(r) for r in cells))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(widths[i]) if i else c.ljust(widths[i]) for i, c in enumerate(row)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def figure(rows: int = 1, cols: int = 1, title: str = "") -> tuple[Figure, Any]:
    """A small figure (the PNGs are committed under docs/img)."""
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.2 * rows), squeeze=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig, axes


def plot_series(ax: Any, series: Sequence[tuple[float, float]], label: str, **kw: Any) -> None:
    if series:
        xs, ys = zip(*series, strict=True)
        ax.plot(xs, ys, label=label, **kw)
