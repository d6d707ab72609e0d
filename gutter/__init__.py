"""Gutter pools: sizing rule, TTL policy and a health view (paper section 3.3)."""

from gutter.health import GutterHealth, ServerHealth, gutter_health
from gutter.policy import (
    DEFAULT_TTL,
    GUTTER_FRACTION,
    SizingAdvice,
    check_topology,
    gutter_ttl,
    recommended_gutter_size,
    sizing_advice,
)

__all__ = [
    "DEFAULT_TTL",
    "GUTTER_FRACTION",
    "GutterHealth",
    "ServerHealth",
    "SizingAdvice",
    "check_topology",
    "gutter_health",
    "gutter_ttl",
    "recommended_gutter_size",
    "sizing_advice",
]
