"""The supervisor `squealctl up` leaves running in the background.

    python -m ops.supervisor STATE_DIR TOPOLOGY [--without ROLES] [--demo] [--demo-rate R] [--ready-fd FD]

Started by `squealctl up` (ops/local/up.py), not by hand. It starts the deployment's components in order
(`Deployment.start_components`: ops/processes/'s command lines and readiness checks, MariaDB first — after
starting a topology's ZooKeeper servers, which come up meanwhile — then memcached, routers, squeal,
monitoring) and then keeps them running. It is Twisted's ProcessMonitor
(twisted.runner.procmon) with three changes: a component's output goes to its own log file (not through a pipe
to the supervisor, so components outlive a supervisor that dies), `stop` sends the component's own stop signal
(after SIGCONT: a paused process cannot handle SIGTERM), and every exit and restart is logged, counted and
written to STATE_DIR/components.json.

Restart policy (procmon's): a component that exits without being asked to is restarted at once if it had run
`threshold` seconds, else after a delay that starts at `minRestartDelay` and doubles with each early death up
to `maxRestartDelay` (capped exponential backoff; a good run resets it). Unlike systemd's Restart=on-failure an
exit with status 0 is restarted too: every component is a server, so any exit nobody asked for is a failure.
Exits that `squealctl stop` or `down` asked for are not restarted. Restarts are logged to
STATE_DIR/supervisor.log (the exit, then the new pid and how long after the exit it answered) and counted in
`squeal_component_restarts_total{component,role,region,cluster,pool}` on the supervisor's /metrics and in each
component's `restarts` in components.json.

`squealctl stop|start|restart NAME` reach it on a Unix socket (`Deployment.control_socket`), one JSON line each
way: `stop` takes the component out of the monitor (it stays down until `start`), `start` puts it back and
answers once its readiness check passes. SIGTERM (`squealctl down`) stops every component — the demo and
monitoring, then squeal, routers, memcached, MariaDB and ZooKeeper last (`STOP_TIERS`), each tier after the one
before has exited — waits for them (SIGKILL after `killTime` seconds) and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics
from prometheus_client.twisted import MetricsResource
from twisted.application import service
from twisted.internet import defer, error, protocol
from twisted.internet import reactor as _reactor
from twisted.internet.threads import blockingCallFromThread
from twisted.logger import STDLibLogObserver, globalLogBeginner
from twisted.protocols.basic import LineReceiver
from twisted.python.failure import Failure
from twisted.runner import procmon
from twisted.web import resource, server, static

import router_config
from ops.harness import HarnessError, ManagedProcess, free_port, wait_until
from ops.local import Component, Deployment, doing

log = logging.getLogger("ops.supervisor")
# The global reactor provides every interface used here (TCP, Unix sockets, threads, processes); its stub names one.
reactor: Any = _reactor
LABELS = ("component", "role", "region", "cluster", "pool")


class Run:
    """One process of a component. Has the `poll()`/`returncode` of a Popen, which harness.wait_until watches."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.started = time.monotonic()
        self.returncode: int | None = None
        self.how = ""  # "exited with code 1", "killed by SIGKILL"

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class Unit:
    component: Component  # what components.json says of it
    proc: ManagedProcess  # its readiness check, stop signal and start timeout
    run: Run | None = None
    exited_at: float | None = None  # monotonic time of its last exit nobody asked for


class _ComponentProtocol(protocol.ProcessProtocol):
    def __init__(self, supervisor: Supervisor, name: str, run: Run) -> None:
        self.supervisor, self.name, self.run = supervisor, name, run

    def processEnded(self, reason: Failure) -> None:  # noqa: N802 - twisted's naming
        self.supervisor.component_exited(self.name, self.run, reason)


# `down` stops components in this order, each tier once the one before has exited: who sends requests before
# whom they send them to. A role not listed goes first.
STOP_TIERS = (("squeal",), ("router",), ("memcached",), ("mariadb-primary", "mariadb-replica"), ("zookeeper",))


def stop_tier(role: str) -> int:
    return next((i + 1 for i, roles in enumerate(STOP_TIERS) if role in roles), 0)


class Supervisor(procmon.ProcessMonitor):
    """The components of one deployment, started in order and restarted when they exit."""

    # procmon's stub types these as int; it hands them to callLater, which takes seconds as a float
    threshold = 10.0  # type: ignore[assignment]  # a component that dies sooner after its start is dying young
    minRestartDelay = 0.5  # type: ignore[assignment]
    maxRestartDelay = 30.0  # type: ignore[assignment]
    killTime = 10.0  # type: ignore[assignment]  # stop signal, then SIGKILL after this long (as `squealctl down`)
    protocols: dict[str, Any]  # name -> _ComponentProtocol (procmon's own LoggingProtocol is not used)

    def __init__(self, deployment: Deployment, topology: str) -> None:
        super().__init__(reactor)
        self.deployment, self.topology = deployment, topology
        self.units: dict[str, Unit] = {}  # by name, in start order
        self.record: dict = {}  # the supervisor's own entry in components.json
        self.stopping = False
        self.started_all = False
        self.start_error: str | None = None
        self._restart_due: set[str] = set()
        self._exit_waiters: dict[str, list[defer.Deferred]] = {}
        self._devnull = os.open(os.devnull, os.O_RDONLY)
        self.registry = CollectorRegistry()
        self.restart_counter = Counter(
            "squeal_component_restarts_total",
            "Times the supervisor restarted a component after an exit nobody asked for",
            LABELS,
            registry=self.registry,
        )
        self.up_gauge = Gauge(
            "squeal_component_up",
            "1 while the component's process runs, 0 while it is down (exited, backing off, or held by stop)",
            LABELS,
            registry=self.registry,
        )

    # -- components.json and metrics -------------------------------------------------------------

    def save(self) -> None:
        self.deployment.save([u.component for u in self.units.values()], self.topology, self.record)

    def _labels(self, c: Component) -> dict[str, str]:
        return {
            "component": c.name,
            "role": c.role,
            "region": c.region,
            "cluster": c.cluster or "",
            "pool": c.pool or "",
        }

    def listen(self, master_region: str) -> None:
        """Serve /metrics on a free loopback port and the control socket; record both in components.json."""
        root = resource.Resource()
        root.putChild(b"metrics", MetricsResource(registry=self.registry))
        root.putChild(b"healthz", static.Data(b"ok\n", "text/plain"))
        site = _QuietSite(root)
        port = free_port("127.0.0.1")
        reactor.listenTCP(port, site, interface="127.0.0.1")
        control = self.deployment.control_socket
        control.unlink(missing_ok=True)
        factory = _ControlFactory(self)
        reactor.listenUNIX(str(control), factory, mode=0o600)
        address = f"127.0.0.1:{port}"
        self.record = {
            "name": "supervisor",
            "role": "supervisor",
            "region": master_region,
            "cluster": None,
            "pool": None,
            "pid": os.getpid(),
            "address": address,
            "log": str(self.deployment.state_dir / "supervisor.log"),
            "cmdline": psutil.Process().cmdline(),
            "metrics": address,
            "control": str(control),
        }
        self.save()
        log.info("supervisor pid %d: metrics on http://%s/metrics, control socket %s", os.getpid(), address, control)

    # -- start-up (in a thread: readiness checks and MariaDB set-up block) -------------------------

    def start_all(self, topology_path: str, without: frozenset[str], demo: bool, demo_rate: float) -> None:
        def track(
            proc: ManagedProcess,
            name: str,
            role: str,
            region: str,
            cluster: str | None = None,
            pool: str | None = None,
            metrics: str | None = None,
            instance: str | None = None,
            wait: bool = True,
            shard: str | None = None,
        ) -> Callable[[], None]:
            """Start `proc`; with `wait` (the default) return once it is ready, else at once with a function
            that waits for that (slow starters, e.g. ZooKeeper's JVMs, start while the rest does)."""
            if self.stopping:
                raise HarnessError("the supervisor was stopped during start-up")
            with doing(name, proc, "preparing it"):
                proc.prepare()
            component = Component(
                role,
                region,
                cluster,
                pool,
                0,
                proc.address,
                str(proc.log_file),
                proc.command(),
                metrics,
                name=name,
                instance=instance,
                shard=shard,
            )
            run = blockingCallFromThread(reactor, self.add, component, proc)

            def ready() -> None:
                with doing(name, proc, "starting it"):
                    wait_until(proc.ready, proc.start_timeout, f"{proc.name} on {proc.address}", run, proc.log_file)

            if wait:
                ready()
            return ready

        try:
            self.deployment.start_components(topology_path, without, demo, demo_rate, track)
        except BaseException as e:
            message = str(e) if isinstance(e, HarnessError | router_config.TopologyError) else f"{e!r}"
            log.exception("start-up failed; stopping what was started")
            reactor.callFromThread(self._start_failed, message)
        else:
            reactor.callFromThread(self._started)

    def _started(self) -> None:
        self.started_all = True
        log.info("all %d components up", len(self.units))
        _report({"ok": True})

    def _start_failed(self, message: str) -> None:
        self.start_error = message
        if not self.stopping:
            reactor.stop()  # the shutdown trigger stops what was started

    def add(self, component: Component, proc: ManagedProcess) -> Run:
        """Start a new component now and watch it from then on (reactor thread)."""
        self.units[component.name] = Unit(component, proc)
        labels = self._labels(component)
        self.restart_counter.labels(**labels)
        log.info("starting %s: %s (log %s)", component.name, " ".join(component.cmdline), component.log)
        self.addProcess(component.name, component.cmdline, env=dict(os.environ))
        run = self.units[component.name].run
        assert run is not None
        return run

    # -- procmon, adapted --------------------------------------------------------------------------

    def startProcess(self, name: str) -> None:  # noqa: N802 - procmon's naming
        if name in self.protocols:
            return
        unit, process = self.units[name], self._processes[name]
        restart = name in self._restart_due
        self._restart_due.discard(name)
        run = unit.run = Run()
        proto = _ComponentProtocol(self, name, run)
        self.protocols[name] = proto
        self.timeStarted[name] = self._clock.seconds()
        log_fd = os.open(unit.component.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            transport = self._reactor.spawnProcess(
                proto,
                process.args[0],
                process.args,
                env=process.env,
                path=process.cwd,
                childFDs={0: self._devnull, 1: log_fd, 2: log_fd},
            )
        except OSError:
            log.exception("%s: cannot run %s", name, process.args[0])
            self.component_exited(name, run, Failure())
            return
        finally:
            os.close(log_fd)
        if run.returncode is not None:  # it was reaped during spawnProcess
            return
        run.pid = transport.pid
        c = unit.component
        c.pid, c.stopped = run.pid, False
        self.up_gauge.labels(**self._labels(c)).set(1)
        if restart:
            c.restarts += 1
            self.restart_counter.labels(**self._labels(c)).inc()
            log.warning("%s restarted: pid %d (restart %d)", name, run.pid, c.restarts)
            exited_at = unit.exited_at or run.started
            self.when_ready(unit, run).addCallbacks(
                lambda t: log.info("%s is back: pid %d answers %.2f s after its exit", name, run.pid, t - exited_at),
                lambda f: self._not_back(name, run, f),
            )
        self.save()

    def _not_back(self, name: str, run: Run, failure: Failure) -> None:
        if not (self.stopping or name not in self._processes):  # else stopped on purpose while it started
            log.warning("%s (pid %d) did not come back: %s", name, run.pid, failure.getErrorMessage())

    def stopProcess(self, name: str) -> None:  # noqa: N802 - procmon's naming
        if name not in self._processes:
            raise KeyError(f"Unrecognized process name: {name}")
        proto = self.protocols.get(name)
        if proto is None:
            return
        transport = proto.transport
        if transport is None:  # not spawned yet
            return
        try:
            transport.signalProcess(signal.SIGCONT)  # a paused process cannot handle SIGTERM
            transport.signalProcess(self.units[name].proc.stop_signal)
        except error.ProcessExitedAlready:
            return
        self.murder[name] = self._clock.callLater(self.killTime, self._forceStopProcess, transport)

    def stopService(self) -> None:  # noqa: N802 - twisted's naming
        """procmon's: no more restarts; `shutdown` then stops the components, tier by tier."""
        service.Service.stopService(self)
        for call in self.restart.values():
            if call.active():
                call.cancel()

    def component_exited(self, name: str, run: Run, reason: Failure) -> None:
        code, sig = getattr(reason.value, "exitCode", None), getattr(reason.value, "signal", None)
        if sig:
            run.returncode, run.how = -sig, f"killed by {signal.Signals(sig).name}"
        elif code is not None:
            run.returncode, run.how = code, f"exited with code {code}"
        else:
            run.returncode, run.how = 127, f"could not start ({reason.getErrorMessage()})"
        unit = self.units[name]
        c = unit.component
        self.up_gauge.labels(**self._labels(c)).set(0)
        asked = self.stopping or name not in self._processes
        lived = time.monotonic() - run.started
        if asked:
            log.info("%s (pid %s) stopped: %s", name, run.pid, run.how)
        elif self.running:
            young = self._clock.seconds() - self.timeStarted[name] < self.threshold
            delay = self.delay[name] if young else 0
            unit.exited_at = time.monotonic()
            self._restart_due.add(name)
            log.warning("%s (pid %s) %s after %.1f s; restarting it in %.1f s", name, run.pid, run.how, lived, delay)
        if self.protocols.get(name) is not None and self.protocols[name].run is run:
            # procmon's bookkeeping: forget the process, back off, schedule the restart (unless asked to stop)
            self._monitoredProcessExited(name, reason)
        for waiter in self._exit_waiters.pop(name, []):
            waiter.callback(run)
        self.save()

    def _exit_of(self, name: str) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self._exit_waiters.setdefault(name, []).append(d)
        return d

    def when_ready(self, unit: Unit, run: Run) -> defer.Deferred:
        """Fires (monotonic time) once the component's readiness check passes; fails if the run exits first."""
        d: defer.Deferred = defer.Deferred()
        what = f"{unit.component.name} (pid {run.pid})"

        def wait() -> None:
            try:
                wait_until(unit.proc.ready, unit.proc.start_timeout, what, run, unit.proc.log_file)
            except HarnessError as e:
                reactor.callFromThread(d.errback, Failure(e))
            else:
                reactor.callFromThread(d.callback, time.monotonic())

        threading.Thread(target=wait, name=f"ready {unit.component.name}", daemon=True).start()
        return d

    # -- squealctl stop|start|restart and down -----------------------------------------------------

    def control(self, action: str, name: str) -> defer.Deferred:
        if name not in self.units:
            raise HarnessError(f"unknown component {name!r}; valid names: {', '.join(self.units)}")
        if self.stopping:
            raise HarnessError("the deployment is being stopped (`squealctl down`)")
        if not self.started_all:
            raise HarnessError("the deployment is still starting; try again once `squealctl up` has returned")
        if action == "stop":
            return self.stop_component(name)
        if action == "start":
            return self.start_component(name)
        if action == "restart":
            d = self.stop_component(name)

            def start(stopped: str) -> defer.Deferred:
                return self.start_component(name).addCallback(lambda started: f"{stopped}; {started}")

            return d.addCallback(start)
        raise HarnessError(f"unknown action {action!r} (stop, start, restart)")

    def stop_component(self, name: str) -> defer.Deferred:
        """Stop it and keep it stopped: out of procmon's list, nothing restarts it until `start_component`."""
        unit = self.units[name]
        if name not in self._processes:
            return defer.succeed(f"{name} is already stopped")
        pending = self.restart.pop(name, None)
        if pending is not None and pending.active():
            pending.cancel()
        self._restart_due.discard(name)
        proto = self.protocols.get(name)
        exited = self._exit_of(name) if proto is not None else None
        log.info("%s: stop requested", name)
        self.removeProcess(name)  # procmon: signal it (our stopProcess) and forget it
        unit.component.stopped = True
        self.save()
        if exited is None:
            return defer.succeed(f"{name} stopped (it was down, waiting to be restarted)")
        return exited.addCallback(lambda run: f"{name} stopped (pid {run.pid} {run.how})")

    def start_component(self, name: str) -> defer.Deferred:
        unit = self.units[name]
        if name in self.protocols:
            assert unit.run is not None
            return defer.succeed(f"{name} is already running (pid {unit.run.pid})")
        log.info("%s: start requested", name)
        if name in self._processes:  # exited, waiting out its restart delay: now
            pending = self.restart.pop(name, None)
            if pending is not None and pending.active():
                pending.cancel()
            self.startProcess(name)
        else:
            self.addProcess(name, unit.component.cmdline, env=dict(os.environ))
        run = unit.run
        assert run is not None
        d = self.when_ready(unit, run)
        d.addCallback(lambda t: f"{name} started: pid {run.pid}, answering after {t - run.started:.1f} s")

        def failed(failure: Failure) -> None:
            log_file = self.record.get("log", "the supervisor's log")
            raise HarnessError(
                f"{failure.getErrorMessage()}\n(the supervisor keeps restarting it, backing off; see {log_file}, "
                f"or `squealctl stop {name}`)"
            )

        return d.addErrback(failed)

    def shutdown(self) -> defer.Deferred:
        """Before the reactor stops (SIGTERM, or a failed start-up): stop every component and wait for it, the
        clients before what they use (`STOP_TIERS`): a squeal worker flushes its deletes, writes its markers and
        releases its shards while its routers, databases and ZooKeeper still answer (stopped all at once, the
        workers found ZooKeeper gone, logged warnings and were killed after `killTime`)."""
        self.stopping = True
        exits = {name: self._exit_of(name) for name in list(self.protocols)}
        log.info("stopping %d components", len(exits))
        self.stopService()
        tiers: dict[int, list[str]] = {}
        for name in reversed(list(self._processes)):  # newest first within a tier
            tiers.setdefault(stop_tier(self.units[name].component.role), []).append(name)
        d: defer.Deferred = defer.succeed(None)
        for tier in sorted(tiers):
            d.addCallback(self._stop_tier, tiers[tier], exits)
        return d.addCallback(lambda _: self.save())

    def _stop_tier(self, _: object, names: list[str], exits: dict[str, defer.Deferred]) -> defer.Deferred:
        for name in names:
            self.stopProcess(name)
        return defer.DeferredList([exits[name] for name in names if name in exits])


class _Control(LineReceiver):
    """One request per connection: {"action": "stop"|"start"|"restart", "name": NAME} → {"ok", "message"|"error"}."""

    delimiter = b"\n"

    def lineReceived(self, line: bytes) -> None:  # noqa: N802 - twisted's naming
        try:
            request = json.loads(line)
            action, name = request["action"], request["name"]
        except (ValueError, KeyError, TypeError):
            self._reply({"ok": False, "error": f"bad request {line[:200]!r}"})
            return
        d = defer.maybeDeferred(self.factory.supervisor.control, action, name)
        d.addCallbacks(lambda message: {"ok": True, "message": message}, self._failed)
        d.addCallback(self._reply)

    def _failed(self, failure: Failure) -> dict:
        if not failure.check(HarnessError):
            log.error("control request failed: %s", failure.getTraceback())
        return {"ok": False, "error": failure.getErrorMessage()}

    def _reply(self, answer: dict) -> None:
        self.sendLine(json.dumps(answer).encode())
        if self.transport is not None:
            self.transport.loseConnection()


class _ControlFactory(protocol.Factory):
    """The control socket's connections, each a `_Control` asking `supervisor`."""

    protocol = _Control
    noisy = False

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor


class _QuietSite(server.Site):
    """/metrics and /healthz without an access log: Prometheus scrapes every few seconds."""

    noisy = False

    def log(self, request: Any) -> None:
        pass


_ready_fd: int | None = None


def _report(answer: dict) -> None:
    """Tell `squealctl up` how start-up ended (once)."""
    global _ready_fd
    if _ready_fd is None:
        return
    try:
        os.write(_ready_fd, json.dumps(answer).encode() + b"\n")
    except OSError:
        pass  # `up` is gone (Ctrl-C): nobody to tell
    os.close(_ready_fd)
    _ready_fd = None


def main(argv: list[str] | None = None) -> int:
    global _ready_fd
    p = argparse.ArgumentParser(prog="python -m ops.supervisor", description=__doc__.split("\n\n")[0])
    p.add_argument("state_dir")
    p.add_argument("topology")
    p.add_argument("--without", default="", help="comma-separated roles not to start")
    p.add_argument("--demo", action="store_true")
    p.add_argument("--demo-rate", type=float, default=40.0)
    p.add_argument("--ready-fd", type=int, help="write one JSON line here once start-up has ended")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    globalLogBeginner.beginLoggingTo([STDLibLogObserver()], redirectStandardIO=False)
    disable_created_metrics()  # no *_created series next to the counters
    if args.ready_fd is not None:
        _ready_fd = args.ready_fd
        os.set_inheritable(_ready_fd, False)  # components must not hold `up`'s pipe open
    without = frozenset(r for r in args.without.split(",") if r)
    deployment = Deployment(args.state_dir)
    supervisor = Supervisor(deployment, str(Path(args.topology).resolve()))
    try:
        supervisor.listen(router_config.load(args.topology).master.name)
    except Exception as e:
        _report({"error": f"the supervisor could not start: {e}"})
        raise
    supervisor.startService()
    reactor.addSystemEventTrigger("before", "shutdown", supervisor.shutdown)
    thread = threading.Thread(
        target=supervisor.start_all, args=(args.topology, without, args.demo, args.demo_rate), daemon=True
    )
    reactor.callWhenRunning(thread.start)
    reactor.run()
    deployment.control_socket.unlink(missing_ok=True)
    _report({"error": supervisor.start_error or "the supervisor was stopped during start-up"})
    log.info("supervisor exits")
    return 1 if supervisor.start_error else 0


if __name__ == "__main__":
    sys.exit(main())
