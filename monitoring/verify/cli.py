"""`squealctl verify`'s command line (`run`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import router_config
from monitoring.verify.codec import VerifyError
from monitoring.verify.report import EXIT_CANNOT_CHECK
from monitoring.verify.scan import verify

log = logging.getLogger(__name__)


def run(
    topo: router_config.Topology,
    *,
    database: str | None = None,
    sample: int | None = 200,
    codec: str | None = None,
    grace: float | None = None,
    out: Callable[[str], None] = print,
    err: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> int:
    """`squealctl verify`: print unchecked clusters, stale copies and a summary; return the exit code."""
    try:
        report = verify(topo, database=database, sample=sample, codec=codec, grace=grace)
    except VerifyError as e:
        err(f"squealctl verify: cannot check: {e}")
        return EXIT_CANNOT_CHECK
    for unchecked in report.unchecked:
        err(str(unchecked))
    for stale in report.stale:
        out(str(stale))
    out(report.summary())
    return report.exit_code
