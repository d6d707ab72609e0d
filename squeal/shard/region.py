"""A region's squeal daemon: one `Daemon` pipeline per shard, composed.

Each shard of the topology (docs/squeal.md, "Shards") gets a pipeline of its own — its reader thread, flows,
datamarkers, catch-up readers, data-loss policy and lag — so a shard whose binlog was purged, whose primary is
down or whose markers cannot be written halts or lags alone. What the shards share is what makes many shards
cheap: one `Sender` per destination (`SenderHub`), so deletes for one cluster from every shard leave on one
connection and, when they are ready together, in one write; one wake-up of the reactor for every shard's newly
read transactions (`HandoffGroup`); one registry (/metrics with a `shard` label), one status (/healthz naming
the shard of every problem), one sample of acknowledged deletes, and one shutdown.

A `RegionDaemon` is a Twisted `MultiService` whose children are the shards' pipelines (`Daemon` services, named
by shard): `squeal run --region` runs it in the process shell (squeal/process/shell.py: the status site, signals, pid
file, exit code), and a pool worker runs one for the shards it owns.

A topology without [shards] has one shard: this is then the daemon `squeal run --region` has always been (its
/healthz and /metrics look as before: no `shard` label, no shard prefix on problems).

SIGHUP re-reads the topology file: a shard added to it starts a pipeline of its own; the running ones go on
untouched (docs/runbooks/add-a-shard.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from twisted.application import service
from twisted.internet import defer, task, threads

import router_config
from router_config import Topology
from squeal.delivery.native import AnyFlow, make_hub
from squeal.delivery.sampler import DeleteSampler, SampledDelete
from squeal.keys.pipeline import HandoffGroup
from squeal.markers.datamarkers import DatamarkerStore
from squeal.process.metrics import WriteMetrics
from squeal.shard.daemon import Daemon, state_dir_for

log = logging.getLogger(__name__)

RETRY_S = 5.0  # a shard whose database did not answer at start-up is tried again this often


class ShardLabels:
    """A Prometheus collector that serves several registries as one: each shard's series get `shard="NAME"`
    (none for a topology without [shards]); families of the same name are merged."""

    def __init__(
        self, parts: Callable[[], list[tuple[str | None, CollectorRegistry]]], before: Callable[[], None] = lambda: None
    ) -> None:
        self.parts = parts
        self.before = before  # (the native delivery thread's counters taken into the series first)

    def collect(self) -> Iterator[Metric]:
        self.before()
        families: dict[str, Metric] = {}
        for shard, registry in self.parts():
            for family in registry.collect():
                out = families.get(family.name)
                if out is None:
                    out = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for s in family.samples:
                    labels = dict(s.labels, shard=shard) if shard is not None else s.labels
                    out.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
        yield from families.values()


class RegionDaemon(service.MultiService):
    """Every shard's pipeline of one region in one process (`squeal run --region`, and a pool worker's shards): a
    service whose children are the running shards' `Daemon`s."""

    serves_while_preparing = False  # (the shell) /healthz answers once every shard is prepared: "ready"

    def __init__(
        self,
        topology: Topology,
        region: str,
        state_dir: str | Path | None = None,
        from_gtid: str | None = None,
        reactor: Any = None,
        reply_timeout: float = 2.0,
        connect_timeout: float = 20.0,
        sample_every: int = 1000,
        stores: Callable[[str], DatamarkerStore] | None = None,
        checkpoint_interval: float = 1.0,
        gate: Callable[[str], Callable[[], bool]] | None = None,
        instance: str | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        super().__init__()
        self.reactor = reactor
        self.topology = topology
        self.region = topology.region(region)
        self.state_dir = state_dir_for(topology, state_dir)
        self.stores = stores  # shard -> its datamarker store (a pool: ZooKeeper); None: files under state_dir
        self.gate = gate  # shard -> whether its flows may hand out a batch now (a pool worker's per-shard fence)
        # what every shard's pipeline is made with (the keyword arguments of `Daemon`)
        self.pipeline_options: dict[str, Any] = {
            "from_gtid": from_gtid,
            "reply_timeout": reply_timeout,
            "connect_timeout": connect_timeout,
            "sample_every": sample_every,
            "checkpoint_interval": checkpoint_interval,
            "instance": instance,  # the pool worker this runs in: which copies it reads
        }
        # Write-level series (writes, deletes per write) are the destinations', not a shard's.
        self.metrics = WriteMetrics()
        self.sampler = DeleteSampler(every=sample_every)
        self.hub = make_hub(reactor, topology.squeal, self.metrics, self.sampler, reply_timeout, tls=topology.tls)
        # Every shard's live hand-off wakes and lingers as one (`HandoffGroup`): N shards cost the reactor what
        # one shard at their total rate does, and their transactions of a turn share the next write.
        self.handoffs = HandoffGroup(reactor)
        self.registry = CollectorRegistry()
        self.registry.register(ShardLabels(self._registries, before=self.hub.refresh))
        self.stopping = False
        self.exit_code = 0
        self._adding: set[str] = set()
        self._warm: dict[str, Daemon] = {}  # shard -> a pipeline checked ahead (`warm`), not started
        self._warm_failed: dict[str, float] = {}  # shard -> when checking it ahead last failed (monotonic)
        self.waiting: dict[str, str] = {}  # shard -> why its pipeline has not started yet (retried)

    # -- shards -----------------------------------------------------------------------------------------------

    def _pipeline(self, shard: str) -> Daemon:
        return Daemon(
            self.topology,
            self.region.name,
            self.state_dir,
            store=self.stores(shard) if self.stores else None,
            reactor=self.reactor,
            shard=shard,
            hub=self.hub,
            handoffs=self.handoffs,
            **self.pipeline_options,
        )

    def prepare(self) -> None:
        """Prepare every shard's pipeline (blocking). A shard whose database does not answer does not hold the
        others back: it is a /healthz problem naming it, retried every `RETRY_S` once running. Any other error
        (a bad rule, an unwritable marker dir), or no shard answering at all, is a start-up error naming it."""
        for shard in self.topology.shards:
            daemon = self._pipeline(shard.name)
            try:
                daemon.prepare()
            except ConnectionError as e:
                if not self.topology.sharded or len(self.topology.shards) == 1:
                    raise
                self._detach(daemon)
                self.waiting[shard.name] = f"shard {shard.name}: not started, its database does not answer: {e}"
                log.error(
                    "%s; the other shards start, this one is retried every %gs", self.waiting[shard.name], RETRY_S
                )
                continue
            except Exception as e:
                if not self.topology.sharded:
                    raise
                raise type(e)(f"shard {shard.name} ({daemon.database.address}): {e}") from e
            self._run_shard(daemon)
        if not self.shards:
            raise ConnectionError("no shard's database answers: " + "; ".join(self.waiting.values()))
        if self.topology.sharded:
            log.info(
                "region %s: %d shards (%s), one pipeline each; %d destinations shared by all",
                self.region.name,
                len(self.shards),
                ", ".join(self.shards),
                len(self.hub.senders),
            )

    @property
    def shards(self) -> dict[str, Daemon]:
        """The running shards' pipelines (this service's children), by shard."""
        return {name: d for name, d in list(self.namedServices.items()) if isinstance(d, Daemon)}

    def _run_shard(self, daemon: Daemon) -> None:
        """A prepared pipeline becomes a child: started at once if this service runs, else when it starts."""
        daemon.setName(daemon.shard.name)
        daemon.setServiceParent(self)

    @property
    def flows(self) -> dict[str, AnyFlow]:
        """Every shard's flows: `shard/destination` (a topology without [shards]: `destination`)."""
        out: dict[str, AnyFlow] = {}
        for shard, daemon in self.shards.items():
            for name, flow in daemon.flows.items():
                out[f"{shard}/{name}" if self.topology.sharded else name] = flow
        return out

    @property
    def senders(self) -> dict[str, Any]:
        return self.hub.senders

    def _registries(self) -> list[tuple[str | None, CollectorRegistry]]:
        label = self.topology.sharded
        parts: list[tuple[str | None, CollectorRegistry]] = [(None, self.metrics.registry)]
        parts += [(shard if label else None, d.metrics.registry) for shard, d in list(self.shards.items())]
        return parts

    # -- running ----------------------------------------------------------------------------------------------

    def startService(self) -> None:  # noqa: N802 - Twisted's name
        """Every prepared shard's pipeline starts (the reactor about to run, or running); the shards whose database
        did not answer are retried."""
        super().startService()
        if self.waiting:
            self._schedule_retries()

    def sampled(self, since: float) -> list[SampledDelete]:
        """/sampled-deletes: the acknowledged deletes sampled since `since`, every shard's."""
        return self.sampler.recent(since)

    def checkpoint(self) -> None:
        for daemon in self.shards.values():
            daemon.checkpoint()

    def reload(self) -> None:
        """SIGHUP: apply replay requests now; with [shards], start a pipeline for every shard the topology file
        has gained (the running ones are not touched)."""
        self.checkpoint()
        if not self.topology.sharded or self.stopping:
            return
        try:
            fresh = router_config.load(self.topology.source)
        except (router_config.TopologyError, OSError) as e:
            log.error("SIGHUP: cannot re-read %s, shards unchanged: %s", self.topology.source, e)
            return
        gone = [s for s in self.shards if s not in {sh.name for sh in fresh.shards}]
        if gone:
            log.warning(
                "SIGHUP: shard(s) %s left %s; their pipelines run until squeal restarts",
                ", ".join(gone),
                self.topology.source,
            )
        for shard in fresh.shards:
            if shard.name not in self.shards and shard.name not in self._adding:
                self._add_shard(fresh, shard.name)

    def _schedule_retries(self) -> None:
        """Reactor: retry the waiting shards every RETRY_S (until none waits)."""
        retries = getattr(self, "_retries", None)
        if retries is None or not retries.running:
            self._retries = task.LoopingCall(self._retry_waiting)
            self._retries.clock = self.reactor
            self._retries.start(RETRY_S, now=False)

    def _retry_waiting(self) -> None:
        """Reactor, every RETRY_S: try again the shards whose database did not answer at start-up."""
        for shard in list(self.waiting):
            if shard not in self._adding and not self.stopping:
                self._add_shard(self.topology, shard, new=False)
        if not self.waiting and self._retries.running:
            self._retries.stop()

    def _detach(self, daemon: Daemon) -> None:
        """A pipeline that will not run (or no longer runs): its flows leave the shared senders."""
        for sender in self.hub.senders.values():
            for flow in list(daemon.flows.values()):
                if flow in sender.flows:
                    sender.remove_flow(flow)

    def _add_shard(self, topology: Topology, shard: str, new: bool = True) -> None:
        """Prepare a shard's pipeline on a thread and start it: one new in the topology (SIGHUP), or one whose
        database did not answer before (`new=False`, retried every RETRY_S)."""
        if new:
            log.info("shard %s is new in %s: starting its pipeline", shard, topology.source)
        self.topology = topology

        def ready(_: Any) -> None:
            self.waiting.pop(shard, None)

        def failed(f: Any) -> None:
            if self.stopping:
                return
            # a /healthz problem naming the shard, retried like a shard whose database was down at start-up
            why = "its database does not answer" if f.check(ConnectionError) else "its pipeline failed"
            self.waiting[shard] = f"shard {shard}: not started, {why}: {f.getErrorMessage()}"
            if new:
                log.error("%s (retried every %gs)", self.waiting[shard], RETRY_S)
            self._schedule_retries()

        self.add_shard(shard).addCallbacks(ready, failed)

    def warm(self, shard: str) -> defer.Deferred:
        """Reactor: build `shard`'s pipeline and run its database checks (`Daemon.check`) on a thread, without
        starting it or touching its datamarkers: `add_shard` then starts from it and does only what needs the
        shard's ownership. A pool worker warms a shard the assignment gives it while the old owner still hands it
        on. Fires when the checks are done (a failure is logged and forgotten: `add_shard` checks again)."""
        daemon = self._warm.get(shard)
        if daemon is None:
            if time.monotonic() - self._warm_failed.get(shard, -RETRY_S) < RETRY_S:
                return defer.succeed(None)  # (its database did not answer a moment ago)
            daemon = self._warm[shard] = self._pipeline(shard)

        def failed(f: Any) -> None:
            if self._warm.get(shard) is daemon:
                del self._warm[shard]
            if shard not in self._warm_failed:
                log.warning(
                    "shard %s: checking its database ahead failed (%s); checked again when it starts",
                    shard,
                    f.getErrorMessage(),
                )
            self._warm_failed[shard] = time.monotonic()

        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), daemon.check)
        return d.addCallbacks(lambda _: self._warm_failed.pop(shard, None), failed)

    def unwarm(self, shard: str) -> None:
        """Forget a shard's pipeline checked ahead (the assignment no longer gives it to this worker)."""
        self._warm.pop(shard, None)

    @property
    def warmed(self) -> set[str]:
        """The shards whose pipeline is being checked ahead or has been."""
        return set(self._warm)

    @property
    def checked_ahead(self) -> set[str]:
        """The shards whose pipeline has been checked ahead (`warm` done): ready to start once owned."""
        return {shard for shard, daemon in list(self._warm.items()) if daemon.checked}

    def add_shard(self, shard: str, before: Callable[[], None] | None = None) -> defer.Deferred:
        """Start `shard`'s pipeline while the others run: `before()` (blocking: a pool worker's wait for its copy)
        and the pipeline's `prepare()` on a thread, then its reader, flows (gated by `gate(shard)`) and
        checkpoints. A pipeline checked ahead (`warm`) starts from its checks; otherwise, with `before`, the checks
        run on another thread while `before` waits. Fires when it delivers; fails (the shard is then not running)
        with the start-up error."""
        if shard in self.shards or shard in self._adding:
            return defer.fail(ValueError(f"shard {shard} is running or starting already"))
        self._adding.add(shard)
        daemon = self._warm.pop(shard, None)
        if daemon is None and before is not None:  # checked on another thread while `before` waits (ZooKeeper,
            self.warm(shard)  # the copy): in parallel, not one after the other
            daemon = self._warm.pop(shard, None)
        if daemon is None:
            daemon = self._pipeline(shard)

        def prepare() -> None:
            if before is not None:
                before()
            daemon.prepare()  # (its checks: done, or waited for)

        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), prepare)

        def ready(_: Any) -> Daemon:
            self._adding.discard(shard)
            if self.stopping:
                self._detach(daemon)
                raise RuntimeError(f"shard {shard}: not started, the daemon is stopping")
            if self.gate is not None:
                may_send = self.gate(shard)
                for flow in daemon.flows.values():
                    flow.may_send = may_send
            self._run_shard(daemon)
            log.info("shard %s: pipeline started (%d shards)", shard, len(self.shards))
            return daemon

        def failed(f: Any) -> Any:
            self._adding.discard(shard)
            self._detach(daemon)
            return f

        return d.addCallbacks(ready, failed)

    def remove_shard(self, shard: str, flush_timeout: float = 10.0, save_timeout: float = 5.0) -> defer.Deferred:
        """Stop `shard`'s pipeline while the others run, and hand it on (`Daemon.retire`): it stops reading, its
        in-flight deletes are acknowledged, its flows leave the shared senders, its final markers are written.
        Fires True if every marker was written (the next owner starts exactly there), False otherwise (the next
        owner starts from older markers: duplicates, never a gap)."""
        daemon = self.shards.get(shard)
        if daemon is None:
            return defer.succeed(True)
        retired = daemon.retire(flush_timeout, save_timeout)
        daemon.disownServiceParent()  # (its stopService waits for the hand-on: nothing more)
        log.info("shard %s: stopping its pipeline (%d shards left)", shard, len(self.shards))
        return retired

    def status(self) -> dict[str, Any]:
        statuses = {name: d.status() for name, d in self.shards.items()}
        if not self.topology.sharded and len(statuses) == 1:
            return next(iter(statuses.values()))
        problems = {
            f"{name}: {k}": f"shard {name}: {v}" for name, st in statuses.items() for k, v in st["problems"].items()
        }
        problems |= {f"{name}: not started": why for name, why in self.waiting.items()}
        return {
            "ok": bool(statuses)
            and all(st["ok"] for st in statuses.values())
            and not self.stopping
            and not self.waiting,
            "problems": problems,
            "region": self.region.name,
            "reader_connected": all(st["reader_connected"] for st in statuses.values()),
            "alerts": [a for st in statuses.values() for a in st["alerts"]][-10:],
            "xa_prepared": sum(st["xa_prepared"] for st in statuses.values()),
            "flows": {f"{name}/{f}": v for name, st in statuses.items() for f, v in st["flows"].items()},
            "shards": statuses,
        }

    def take_loss_acceptances(self, stores: dict[str, Any], who: str) -> None:
        """`squeal accept-data-loss` requests kept in ZooKeeper (a znode per shard, `stores`: shard -> its store)
        handed to each running shard's pipeline, which applies it at its next checkpoint (its own request file).
        Called every second or so by a pool worker; a ZooKeeper error waits for the next call. A
        store looks only when its watch on the request's znode fired (`if_changed`): no request per shard per call."""
        for shard, store in list(stores.items()):
            pipeline = self.shards.get(shard)
            if pipeline is None:
                continue
            try:
                if store.take_loss_acceptance(if_changed=True):
                    log.warning("%s: data loss accepted by the operator (%s)", who, store.accept_path)
                    pipeline.data_loss.accept_path.write_text("accepted\n")
            except Exception as e:  # noqa: BLE001 - retried at the next call; ZooKeeper may be away for a while
                log.debug("cannot take %s: %s", store.accept_path, e)

    def stopService(self) -> defer.Deferred:  # noqa: N802 - Twisted's name
        """SIGTERM: every shard's pipeline stops at once (each flushes, then writes its final markers); fires when
        all are done, with the worst of their exit codes."""
        self.stopping = True
        shards = list(self.shards.values())

        def done(_: Any) -> None:
            self.exit_code = max([self.exit_code, *(d.exit_code for d in shards)])
            for sender in self.hub.senders.values():  # (one whose shards all moved away is still connected)
                sender.stop()

        return defer.maybeDeferred(super().stopService).addBoth(done)
