"""One shard's checkpoints: datamarker rounds, operator replay requests, marker health, the final markers.

A `Checkpoints` is owned by a `daemon.Daemon`, whose timer calls `Daemon.checkpoint()` every second; that calls
`run` here. Everything runs on the reactor except the store's calls, which run on a thread of their own
(`StoreThread`): a slow or hung disk (or ZooKeeper) never blocks the reactor, and a round still running at the
next checkpoint is not joined by another. Only acknowledged positions are written, never past an undecided XA
prepare; a failed write leaves the flow dirty (retried at the next checkpoint), and a marker waiting longer than
marker_max_age_s puts "datamarker:<flow>" in the daemon's `problems` (/healthz 503) until it is written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from twisted.internet import defer

from router_config import SquealSettings
from squeal.delivery.native import AnyFlow
from squeal.markers.datamarkers import DatamarkerStore, MarkerWatch, StoreThread, describe_error
from squeal.process.metrics import Metrics
from squeal.read import gtid as g
from squeal.read.transactions import PreparedXa

log = logging.getLogger(__name__)

_REPLAYS = "(replay requests)"  # MarkerWatch key of take_replay_requests' failures (for rate-limited logs)


class Checkpoints:
    """The datamarkers of one shard's flows (see the module docstring). `flows` and `problems` are the daemon's
    own dicts, shared (flows are added to it by `Daemon.prepare`; each side sets and clears its own problems)."""

    def __init__(
        self,
        reactor: Any,
        store: DatamarkerStore,
        flows: dict[str, AnyFlow],
        xa: PreparedXa,
        metrics: Metrics,
        settings: SquealSettings,
        problems: dict[str, str],
        state_dir: Path,
    ) -> None:
        self.reactor = reactor
        self.store = store
        self.flows = flows
        self.xa = xa
        self.metrics = metrics
        self.settings = settings
        self.problems = problems
        # where the markers are, for messages: the store's directory (a file store), else the state dir
        self.where = str(getattr(store, "dir", state_dir))
        # per flow, how long its acknowledged position has waited to be durable, and its write errors
        self.watch = MarkerWatch()
        self.round: defer.Deferred | None = None  # the round in progress, if any
        self._thread = StoreThread(reactor)

    def watch_flow(self, flow: AnyFlow) -> None:
        """A new flow's series: its write errors (at 0 from the start) and its marker's age."""
        self.metrics.marker_write_errors.labels(flow=flow.name)

        def marker_age(name: str = flow.name) -> float:
            return self.watch.age(name, self.reactor.seconds())

        self.metrics.marker_age.labels(flow=flow.name).set_function(marker_age)

    def run(self, if_changed: bool = False) -> None:
        """A checkpoint: the marker health check, then a round unless one is still running. Never raises (that
        would stop the daemon's checkpoint loop for good)."""
        try:
            self.watch_markers()
            if self.round is None:
                self.start_round(if_changed=if_changed)
        except Exception:
            log.exception("datamarker checkpoint failed; retried at the next one")

    def start_round(self, if_changed: bool = False) -> defer.Deferred:
        """One checkpoint round (take replay requests, apply them, write the markers of flows that moved); its
        Deferred fires True if it wrote every marker it had to (it never errs)."""
        d = self._thread.call(self.store.take_replay_requests, if_changed)
        d.addCallbacks(self._apply_replays, self._replays_failed)
        d.addCallback(lambda _: self._write_moved_markers())

        def unexpected(failure: Any) -> bool:
            log.error("datamarker checkpoint failed: %s", failure.getTraceback())
            return False

        def done(ok: Any) -> Any:
            if self.round is d:
                self.round = None
            return ok

        d.addErrback(unexpected)
        d.addBoth(done)
        if not d.called:
            self.round = d
        return d

    def _apply_replays(self, requests: dict[str, str]) -> None:
        self.watch.written(_REPLAYS)
        for name, position in requests.items():
            flow = self.flows.get(name)
            if flow is None:
                log.error("replay request for unknown flow %r ignored (flows: %s)", name, ", ".join(self.flows))
                continue
            log.warning("flow %s: replay from %s requested", name, position or "the start")
            flow.rewind(g.parse_position(position))

    def _replays_failed(self, failure: Any) -> None:
        """Replay requests could not be read: logged (rate-limited); the markers are written all the same."""
        error = describe_error(failure.value)
        if self.watch.failed(_REPLAYS, error, self.reactor.seconds()):
            log.error("cannot take replay requests from %s: %s (retried at every checkpoint)", self.where, error)

    def _write_moved_markers(self) -> defer.Deferred | bool:
        now = self.reactor.seconds()
        moved: dict[str, str] = {}
        for flow in self.flows.values():
            if flow.dirty:
                flow.dirty = False
                moved[flow.name] = g.format_position(self.xa.cap(flow.acked))  # never past an undecided XA
                self.watch.moved(flow.name, now)
        if not moved:
            return True
        d = self._thread.call(self._save_markers, moved)
        d.addCallback(self._markers_saved, moved)
        return d

    def _save_markers(self, moved: dict[str, str]) -> dict[str, Exception]:
        """On the store's thread: write each marker; returns the failures (flow -> exception). A store with
        `save_many` (one record for every flow of the shard: `ShardMarkerStore`) gets them in one write."""
        errors: dict[str, Exception] = {}
        save_many = getattr(self.store, "save_many", None)
        if save_many is not None:
            try:
                save_many(moved)
            except Exception as e:  # noqa: BLE001 - as below: the round fails as a whole and is retried
                errors = dict.fromkeys(moved, e)
            return errors
        for name, position in moved.items():
            try:
                self.store.save(name, position)
            except Exception as e:  # noqa: BLE001 - OSError / ValueError from a file store, anything from others
                errors[name] = e
        return errors

    def _markers_saved(self, errors: dict[str, Exception], moved: dict[str, str]) -> bool:
        now = self.reactor.seconds()
        for name in moved:
            e = errors.get(name)
            if e is None:
                failures = self.watch.written(name)
                self.metrics.checkpoints.labels(flow=name).inc()
                self.problems.pop(f"datamarker:{name}", None)
                if failures:
                    log.warning(
                        "flow %s: datamarker written again in %s (after %d failed writes)", name, self.where, failures
                    )
                continue
            flow = self.flows.get(name)
            if flow is not None:
                flow.dirty = True  # retried at the next checkpoint
            self.metrics.marker_write_errors.labels(flow=name).inc()
            if self.watch.failed(name, describe_error(e), now):
                log.error(
                    "flow %s: cannot write its datamarker (%s) in %s: %s; deletes keep flowing, the write "
                    "is retried at every checkpoint (%d failed so far; logged at most once a minute)",
                    name,
                    moved[name],
                    self.where,
                    describe_error(e),
                    self.watch.failures(name),
                )
        self.watch_markers()
        return not errors

    def watch_markers(self) -> None:
        """/healthz: a flow whose acknowledged position has waited more than marker_max_age_s is a problem."""
        now = self.reactor.seconds()
        limit = self.settings.marker_max_age_s
        for name in self.flows:
            key = f"datamarker:{name}"
            age = self.watch.age(name, now)
            if age > limit:
                error = self.watch.last_error(name) or "the write has not returned (a hung disk?)"
                self.problems[key] = (
                    f"flow {name}: datamarker in {self.where} not written for "
                    f"{age:.0f}s (marker_max_age_s = {limit:g}): {error}"
                )
            else:
                self.problems.pop(key, None)

    def unsaved(self) -> list[str]:
        """The flows whose marker is not written yet (moved since, or its write still out)."""
        return [n for n, f in self.flows.items() if f.dirty or self.watch.pending(n)]

    def final(self, timeout: float) -> defer.Deferred:
        """Checkpoint rounds until every flow's marker is written (shutdown, hand-on): a Deferred that fires True,
        or False after `timeout` seconds (a store that keeps failing is retried every 0.5 s; a hung one is
        abandoned with its thread)."""
        result: defer.Deferred = defer.Deferred()

        def give_up() -> None:
            if not result.called:
                result.callback(False)

        timer = self.reactor.callLater(timeout, give_up)

        def round_done(ok: Any) -> None:
            if result.called:
                return
            if ok is True and not any(f.dirty for f in self.flows.values()):
                if timer.active():
                    timer.cancel()
                result.callback(True)
            else:
                self.reactor.callLater(0 if ok is True else 0.5, next_round)

        def next_round() -> None:
            if not result.called:
                (self.round or self.start_round()).addBoth(round_done)

        next_round()
        return result

    def close(self) -> None:
        """The store's thread ends (a retired pipeline's: its shard is handed on)."""
        self._thread.close()
