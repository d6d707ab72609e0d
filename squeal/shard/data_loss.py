"""Binlog data loss (Wormhole's onDataLoss): what one shard's readers do when the binlog cannot serve a position.

A `DataLossPolicy` is owned by a `daemon.Daemon` and handed to its readers (`ReadLoop(on_data_loss=...)`).
With on_data_loss = "flush" a reader resumes at once from the oldest binlog (the destinations told to flush first,
by the read loop); with "halt" (or a position this server never had) it waits on its thread, /healthz 503 and an
ERROR every minute, until an operator accepts the loss: `squeal accept-data-loss` leaves a request file
(`accept_path`) that the daemon's checkpoint tick takes (`take_acceptance`).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from router_config import SquealSettings
from squeal.keys.pipeline import ReadLoop
from squeal.process.metrics import Metrics
from squeal.read import gtid as g
from squeal.read.reader import DataLoss

log = logging.getLogger(__name__)


def accept_path(state_dir: Path, region: str, shard: str | None = None) -> Path:
    """The request file `squeal accept-data-loss` leaves for a region's daemon (a shard's, with [shards])."""
    return state_dir / (f"accept-data-loss-{region}" + (f"-{shard}" if shard else ""))


class DataLossPolicy:
    """One shard's on_data_loss policy (see the module docstring). `shard`: its name in a sharded topology, else
    None (messages and the request file name it only then); `problems` is the daemon's, shared."""

    def __init__(
        self,
        reactor: Any,
        settings: SquealSettings,
        metrics: Metrics,
        problems: dict[str, str],
        state_dir: Path,
        region: str,
        shard: str | None,
    ) -> None:
        self.reactor = reactor
        self.settings = settings
        self.metrics = metrics
        self.problems = problems
        self.region = region
        self.shard = shard
        # where `squeal accept-data-loss` leaves its request for this daemon (this shard's)
        self.accept_path = accept_path(state_dir, region, shard)
        # halted readers wait on this until an operator accepts the loss (set from the reactor, read on threads)
        self._accepted = threading.Condition()
        self._accepted_at = 0.0
        self._halted: set[str] = set()  # (reactor) the readers halted now

    def take_acceptance(self) -> None:
        """Reactor (the checkpoint tick): an operator's request, if any, resumes every halted reader."""
        path = self.accept_path
        if not path.exists():
            return
        path.unlink(missing_ok=True)
        if not self._halted:
            log.warning("accept-data-loss request ignored: no reader is halted on data loss")
            return
        log.warning(
            "data loss accepted by the operator: flushing the region's destinations and resuming (%s)",
            ", ".join(sorted(self._halted)),
        )
        with self._accepted:
            self._accepted_at = time.time()
            self._accepted.notify_all()

    def on_data_loss(self, loop: ReadLoop, loss: DataLoss) -> g.Position | None:
        """On a reader's thread: the binlog cannot serve `loss.requested`. Returns where to resume (after the
        destinations are told to flush), or None when stopping. With on_data_loss = "halt" (or a position
        this server never had) it waits here, /healthz 503, an ERROR every minute, until an operator
        accepts the loss."""
        name = loop.reader.name if self.shard is None else f"{loop.reader.name} of shard {self.shard}"
        policy = self.settings.on_data_loss
        requested = g.format_position(loss.requested) or "the start"
        resume = loss.resume
        if resume is None:
            policy = "halt"
            why = (
                f"binlog reader {name}: the database cannot serve position {requested} ({loss.message}) and "
                f"that position is not behind its oldest binlog ({g.format_position(loss.oldest or {}) or '?'}):"
                " a datamarker from another server or a restored backup? Stop squeal, set every flow's "
                "marker with `squeal replay TOPOLOGY --region R --flow all --from GTID`, start it again"
            )
        else:
            oldest = g.format_position(loss.oldest or {})
            why = (
                f"binlog reader {name}: DATA LOSS: the binlog after {requested} was purged ({loss.message}); "
                f"lost GTIDs {loss.lost_range()}; the oldest binlog starts after {oldest}"
            )
        self.metrics.data_loss.labels(policy=policy).inc()
        if policy == "flush":
            log.error(
                '%s; on_data_loss = "flush": flushing every destination of region %s and resuming after %s',
                why,
                self.region,
                g.format_position(resume or {}),
            )
            return resume
        if resume is not None:
            shard = f" --shard {self.shard}" if self.shard is not None else ""
            why += (
                f'; on_data_loss = "halt": delivery stopped. Recover with `squeal accept-data-loss TOPOLOGY '
                f"--region {self.region}{shard}` (flushes the region's caches, resumes from the oldest "
                "binlog; docs/runbooks/data-loss.md)"
            )
        self.reactor.callFromThread(self._set_halted, name, why)
        since = last_log = time.time()
        log.error("%s", why)
        with self._accepted:
            while not loop.reader.stopped and self._accepted_at <= since:
                self._accepted.wait(1.0)  # (short: a stopping reader is noticed within a second)
                if time.time() - last_log >= 60 and self._accepted_at <= since:
                    last_log = time.time()
                    log.error("still halted (%.0f min): %s", (last_log - since) / 60, why)
        self.reactor.callFromThread(self._set_halted, name, None)
        if loop.reader.stopped or resume is None:
            return None
        log.warning(
            "binlog reader %s: data loss accepted; flushing and resuming after %s", name, g.format_position(resume)
        )
        return resume

    def _set_halted(self, reader: str, why: str | None) -> None:
        if why is None:
            self._halted.discard(reader)
            self.problems.pop(f"data_loss:{reader}", None)
        else:
            self._halted.add(reader)
            self.problems[f"data_loss:{reader}"] = why
        self.metrics.halted.set(1 if self._halted else 0)
