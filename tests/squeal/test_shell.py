"""Issue 33 item 3: one process shell. `squeal run --region` (a `RegionDaemon`) and `squeal run --instance` (a
`PoolWorker`) run inside one `squeal.process.shell.Shell`: the one builder of the status site (/metrics, /healthz,
/sampled-deletes), the signals, the shutdown and the exit code. Unit tests on fake reactors: no server starts."""

from __future__ import annotations

import json
import queue
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge
from twisted.application.service import IService, Service
from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock
from twisted.web.test.requesthelper import DummyRequest

import router_config
from squeal.delivery.sampler import SampledDelete
from squeal.pool.worker import PoolWorker
from squeal.process.shell import Shell
from squeal.shard.region import RegionDaemon

SQUEAL = Path(__file__).resolve().parents[2] / "squeal"

TOPOLOGY = (
    '[[rules]]\ntable = "app.users"\nkeys = ["user:{id}"]\n'
    '[regions.east]\nmaster = true\ndatabase = { role = "primary", port = 3306, server_id = 1 }\n'
    '[regions.east.clusters.a]\nrouters = ["127.0.0.1:7001"]\n'
    'pools.wildcard = { servers = ["127.0.0.1:7002"] }\n'
)
POOL = (
    '[[regions.east.squeal_instances]]\nname = "east-1"\nmetrics_port = 19110\ndatabase = "east"\n'
    '[zookeeper]\nservers = ["127.0.0.1:2181"]\npeer_ports = [[2888, 3888]]\nroot = "/squeal-shell"\n'
)


class Reactor(MemoryReactorClock):
    """A memory reactor that runs until stopped: `callWhenRunning` hooks first, then what threads hand it
    (`callFromThread`), for at most 10 s."""

    def __init__(self) -> None:
        super().__init__()
        self.from_threads: queue.Queue = queue.Queue()

    def callFromThread(self, f: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N802 - Twisted's name
        self.from_threads.put((f, args, kwargs))

    def run(self) -> None:
        self.running = self.hasRun = True
        for f, args, kwargs in self.whenRunningHooks:
            f(*args, **kwargs)
        deadline = time.monotonic() + 10
        while self.running:
            assert time.monotonic() < deadline, "the reactor was never stopped"
            try:
                f, args, kwargs = self.from_threads.get(timeout=0.02)
            except queue.Empty:
                continue
            f(*args, **kwargs)

    def shut_down(self) -> defer.Deferred:
        """The reactor's "before shutdown" triggers, as SIGTERM runs them: fires when every one has."""
        triggers = self.triggers.get("before", {}).get("shutdown", [])
        return defer.DeferredList([defer.maybeDeferred(f, *a, **kw) for f, a, kw in triggers])


def render(site: Any, path: bytes, args: dict[bytes, list[bytes]] | None = None) -> tuple[int, bytes]:
    request = DummyRequest([path])
    request.args = args or {}
    child = site.resource.getChildWithDefault(path, request)
    body = child.render(request)
    return request.responseCode or 200, body


def served(reactor: MemoryReactorClock) -> tuple[int, Any, str]:
    assert len(reactor.tcpServers) == 1, reactor.tcpServers
    port, site, _, interface = reactor.tcpServers[0]
    return port, site, interface


# -- one builder of the status site -----------------------------------------------------------------------------------


def test_the_status_site_is_built_in_one_place() -> None:
    """Only the shell makes the status site's resources and listens for it; the daemons and the worker do not."""
    builders = re.compile(r"MetricsPage\(|server\.Site\(|putChild\(|listenTCP\(")
    found = sorted(
        str(path.relative_to(SQUEAL.parent))
        for path in SQUEAL.rglob("*.py")
        if builders.search(path.read_text()) is not None
    )
    assert found == ["squeal/process/shell.py"]


def inside_of(kind: str, reactor: Any) -> Any:
    if kind == "region":
        return RegionDaemon(router_config.loads(TOPOLOGY), "east", reactor=reactor)
    return PoolWorker(router_config.loads(TOPOLOGY + POOL), "east-1", reactor=reactor)


@pytest.mark.parametrize("kind", ["region", "worker"])
def test_a_region_daemon_and_a_worker_serve_all_three_paths_through_the_shell(kind: str) -> None:
    reactor = Reactor()
    inside = inside_of(kind, reactor)
    assert IService.providedBy(inside)  # what runs inside the shell is a Twisted service
    shell = Shell(inside, port=19999, host="127.0.0.2", reactor=reactor)
    shell.serve()
    port, site, interface = served(reactor)
    assert (port, interface) == (19999, "127.0.0.2")

    code, body = render(site, b"metrics")
    assert code == 200
    # each one's own series: the destinations' write series of a region daemon, the pool's of a worker
    assert (b"squeal_delete_writes_total" if kind == "region" else b"squeal_pool_worker_healthy") in body

    code, body = render(site, b"healthz")
    status = json.loads(body)
    assert code == 503 and status["ok"] is False  # nothing delivers yet
    assert status["region"] == "east"
    if kind == "worker":
        assert status["instance"] == "east-1"

    code, body = render(site, b"sampled-deletes", {b"since": [b"0"]})
    assert code == 200 and json.loads(body) == []
    code, body = render(site, b"sampled-deletes", {b"since": [b"soon"]})
    assert code == 400


# -- the run loop -----------------------------------------------------------------------------------------------------


class Inside(Service):
    """What the shell runs, recording what it is asked."""

    def __init__(self, reactor: Reactor, serves_while_preparing: bool = False) -> None:
        self.reactor = reactor
        self.serves_while_preparing = serves_while_preparing
        self.exit_code = 0
        self.registry = CollectorRegistry()
        Gauge("inside_up", "what runs inside", registry=self.registry).set(1)
        self.calls: list[str] = []
        self.fail: Exception | None = None
        self.stopped: defer.Deferred = defer.Deferred()  # what stopService returns: fired by the test
        self.listening_when_prepared = False

    def status(self) -> dict[str, Any]:
        return {"ok": self.running, "problems": {}}

    def sampled(self, since: float) -> list[SampledDelete]:
        return [SampledDelete("a", "user:1", 5.0)] if since < 5.0 else []

    def prepare(self) -> None:
        self.listening_when_prepared = bool(self.reactor.tcpServers)
        self.calls.append("prepare")
        if self.fail is not None:
            raise self.fail

    def reload(self) -> None:
        self.calls.append("reload")

    def startService(self) -> None:  # noqa: N802 - Twisted's name
        super().startService()
        self.calls.append("start")
        self.reactor.stop()  # (the test goes on with the reactor's shutdown triggers)

    def stopService(self) -> defer.Deferred:  # noqa: N802 - Twisted's name
        super().stopService()
        self.calls.append("stop")
        return self.stopped


@pytest.fixture
def restore_sighup():
    before = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, before)


@pytest.mark.usefixtures("restore_sighup")
def test_the_shell_prepares_then_serves_starts_and_stops_its_inside_and_returns_its_exit_code(tmp_path: Path) -> None:
    """A region daemon: prepared before the reactor runs (a start-up error is a plain exception: one line, exit
    2), then the site and the service start; SIGHUP reloads; SIGTERM's shutdown stops the service and the pid
    file goes once its Deferred fires; the shell returns the exit code the service ended with."""
    reactor = Reactor()
    inside = Inside(reactor)
    pid = tmp_path / "squeal-east.pid"
    shell = Shell(inside, port=19998, host="127.0.0.1", reactor=reactor, pid_file=pid)
    code = shell.run()
    assert inside.calls == ["prepare", "start"]
    assert not inside.listening_when_prepared  # /healthz answering means "prepared" for a region daemon
    _, site, _ = served(reactor)
    assert json.loads(render(site, b"sampled-deletes", {b"since": [b"1"]})[1]) == [
        {"flow": "a", "key": "user:1", "acked_at": 5.0}
    ]
    assert pid.read_text().strip().isdigit()
    signal.getsignal(signal.SIGHUP)(signal.SIGHUP, None)  # type: ignore[operator, misc]
    reactor.from_threads.get_nowait()[0]()  # (the handler hands the reload to the reactor)
    assert inside.calls[-1] == "reload"

    inside.exit_code = 1  # (as a pipeline whose markers could not be written sets it while stopping)
    shut = reactor.shut_down()
    assert inside.calls[-1] == "stop" and not shut.called and pid.exists()
    inside.stopped.callback(None)
    assert shut.called and not pid.exists()
    assert code == 0  # (what it was when the reactor returned in this fake)
    assert shell.exit_code == 1


def test_a_worker_serves_while_it_prepares_and_a_start_up_error_is_one_line_and_exit_2(capsys) -> None:
    reactor = Reactor()
    inside = Inside(reactor, serves_while_preparing=True)
    inside.fail = ConnectionError("cannot reach ZooKeeper 127.0.0.1:2181 within 20s")
    code = Shell(inside, port=19997, host="127.0.0.1", reactor=reactor).run()
    assert inside.listening_when_prepared  # /healthz answers while it waits for ZooKeeper
    assert inside.calls == ["prepare"]  # never started
    assert code == 2
    assert capsys.readouterr().err == "squeal: error: cannot reach ZooKeeper 127.0.0.1:2181 within 20s\n"


@pytest.mark.usefixtures("restore_sighup")
def test_a_worker_starts_once_prepared() -> None:
    reactor = Reactor()
    inside = Inside(reactor, serves_while_preparing=True)
    assert Shell(inside, port=19996, host="127.0.0.1", reactor=reactor).run() == 0
    assert inside.calls == ["prepare", "start"] and inside.listening_when_prepared
    assert reactor.triggers["before"]["shutdown"]  # SIGTERM stops it
