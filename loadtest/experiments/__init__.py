"""The paper's experiments as runnable scenarios: each `run(short, workdir) -> Report` and `check(report)`."""

from __future__ import annotations

import importlib
from types import ModuleType

EXPERIMENTS = ("herd", "gutter", "warmup", "batching", "regional")


def load(name: str) -> ModuleType:
    """The module of experiment `name` (one of EXPERIMENTS)."""
    if name not in EXPERIMENTS:
        raise KeyError(f"no experiment {name!r} (have: {', '.join(EXPERIMENTS)})")
    return importlib.import_module(f"loadtest.experiments.{name}")
