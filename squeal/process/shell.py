"""The process shell of `squeal run`: one status site, one run loop, for whatever runs inside.

What runs inside is a Twisted service (`Inside`): a `RegionDaemon` (`squeal run --region`: one pipeline per shard of
the region) or a `PoolWorker` (`squeal run --instance`: the pipelines of the shards its pool gives it). The shell
owns what is the process's, not theirs:

* the status site on the daemon's host and port - `/metrics` (the inside's registry), `/healthz` (its `status()`:
  200 while it says "ok", else 503) and `/sampled-deletes` (its `sampled(since)`) - built here and nowhere else;
* preparing: a region daemon's blocking checks run before the reactor (a start-up error is a plain exception: one
  line and exit 2 in squeal.cli), and its site answers once they are done (the harness's "ready"); a worker's
  (`serves_while_preparing`) run on a thread while /healthz already answers (waiting for ZooKeeper is visible);
* the signals: SIGTERM/SIGINT stop the reactor, whose "before shutdown" stops the service (its Deferred waited
  for), SIGHUP `reload()`s it; the pid file (`squeal replay` signals a region daemon through it);
* the exit code: 2 for a start-up error, else the one the service ended with.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from twisted.application import internet
from twisted.internet import defer
from twisted.web import resource, server

from squeal.delivery.sampler import SampledDelete
from squeal.read.reader import ReaderConfigError

log = logging.getLogger(__name__)

STARTUP_ERRORS = (ConnectionError, ReaderConfigError, ValueError)  # `prepare`'s one-line errors (squeal.cli)


class Inside(Protocol):
    """What the shell runs: a Twisted service with a status."""

    exit_code: int
    serves_while_preparing: bool  # /healthz from the first moment (True), or once `prepare` is done
    registry: CollectorRegistry

    def status(self) -> dict[str, Any]: ...
    def sampled(self, since: float) -> list[SampledDelete]: ...
    def prepare(self) -> None: ...
    def reload(self) -> None: ...
    def startService(self) -> None: ...  # noqa: N802 - Twisted's name
    def stopService(self) -> defer.Deferred | None: ...  # noqa: N802 - Twisted's name


class SampledDeletesResource(resource.Resource):
    """`GET /sampled-deletes?since=UNIXTIME`: 1-in-N acknowledged deletes, for the prober to re-check."""

    isLeaf = True

    def __init__(self, recent: Callable[[float], list[SampledDelete]]) -> None:
        super().__init__()
        self.recent = recent  # since -> samples (a worker owning nothing has none)

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - Twisted's name
        try:
            since = float(request.args.get(b"since", [b"0"])[0])
        except ValueError:
            request.setResponseCode(400)
            return b"since must be a unix time\n"
        request.setHeader(b"content-type", b"application/json")
        return json.dumps([{"flow": s.flow, "key": s.key, "acked_at": s.acked_at} for s in self.recent(since)]).encode()


class MetricsPage(resource.Resource):
    """`GET /metrics`: the registry in Prometheus' text format (or OpenMetrics, as the scraper's Accept asks; gzip
    when accepted), rendered on the reactor thread. prometheus_client's own Twisted resource renders on a pool
    thread behind WSGI and hands every write back to the reactor: a tenth of a scrape's CPU (3.8 against 3.4 ms
    for 4 shards' 43 KB), and the monitoring server scrapes every second."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self.registry = registry

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - Twisted's name
        encoder, content_type = choose_encoder((request.getHeader(b"accept") or b"").decode("latin-1"))
        output = encoder(self.registry)
        request.setHeader(b"content-type", content_type.encode())
        if gzip_accepted((request.getHeader(b"accept-encoding") or b"").decode("latin-1")):
            output = gzip.compress(output)
            request.setHeader(b"content-encoding", b"gzip")
        return output


class HealthResource(resource.Resource):
    """`GET /healthz`: the status JSON; 200 while `ok`, else 503."""

    isLeaf = True

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        super().__init__()
        self.status = status

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - Twisted's name
        status = self.status()
        request.setResponseCode(200 if status["ok"] else 503)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(status).encode() + b"\n"


def status_site(inside: Inside) -> server.Site:
    """/metrics, /healthz and /sampled-deletes of what runs inside."""
    root = resource.Resource()
    root.putChild(b"metrics", MetricsPage(inside.registry))
    root.putChild(b"healthz", HealthResource(inside.status))
    root.putChild(b"sampled-deletes", SampledDeletesResource(inside.sampled))
    return server.Site(root)


class Shell:
    """One `squeal run` process around `inside` (see the module docstring); `run()` returns its exit code."""

    def __init__(self, inside: Inside, port: int, host: str, reactor: Any = None, pid_file: Path | None = None) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.inside = inside
        self.pid_file = pid_file
        # On the host from the topology (127.0.0.1 unless a multi-host topology names one), where the monitoring
        # server and Prometheus look for it.
        self.site = internet.TCPServer(port, status_site(inside), interface=host, reactor=reactor)
        self.failed = False

    @property
    def exit_code(self) -> int:
        return 2 if self.failed else self.inside.exit_code

    def serve(self) -> None:
        """The status site listens (once)."""
        if not self.site.running:
            self.site.startService()

    def start(self) -> None:
        """Reactor, once prepared: the site, the service, the signals, the pid file."""
        self.serve()
        self.inside.startService()
        self.reactor.addSystemEventTrigger("before", "shutdown", self.stop)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda *_: self.reactor.callFromThread(self.inside.reload))
        if self.pid_file is not None:
            self.pid_file.parent.mkdir(parents=True, exist_ok=True)
            self.pid_file.write_text(f"{os.getpid()}\n")

    def stop(self) -> defer.Deferred:
        """Before the reactor shuts down: the service stops (flushes, final markers); then the pid file goes."""

        def gone(result: Any) -> Any:
            if self.pid_file is not None:
                try:
                    self.pid_file.unlink(missing_ok=True)
                except OSError:
                    pass
            return result

        return defer.maybeDeferred(self.inside.stopService).addBoth(gone)

    def _failed(self, e: BaseException) -> None:
        """Reactor: `prepare` gave up (a worker's): the one line of squeal.cli's start-up errors, exit code 2."""
        if not isinstance(e, STARTUP_ERRORS):
            log.error("start-up failed", exc_info=e)
        print(f"squeal: error: {e}", file=sys.stderr)
        self.failed = True
        if self.reactor.running:
            self.reactor.stop()

    def _prepare_on_thread(self) -> None:
        def prepare() -> None:
            try:
                self.inside.prepare()
            except Exception as e:  # noqa: BLE001 - reported by `_failed`, on the reactor
                self.reactor.callFromThread(self._failed, e)
            else:
                self.reactor.callFromThread(lambda: self.start() if self.reactor.running else None)

        # A thread of its own, not the reactor's pool: a shutdown waits for the pool's threads, and this one may
        # wait for ZooKeeper indefinitely.
        threading.Thread(target=prepare, name="squeal-prepare", daemon=True).start()

    def run(self) -> int:
        """Prepare, start, run the reactor until SIGTERM/SIGINT; the exit code."""
        if self.inside.serves_while_preparing:
            self.serve()
            self.reactor.callWhenRunning(self._prepare_on_thread)
        else:
            self.inside.prepare()  # (raises: squeal.cli's one-line start-up errors)
            self.reactor.callWhenRunning(self.start)
        self.reactor.run()
        return self.exit_code
