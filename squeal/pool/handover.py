"""Handing shards over, on the reactor: `start_shard` runs the pipeline of a shard the worker just took (its
markers read and its copy caught up first), `stop_shard` stops the pipeline of a shard assigned elsewhere, lets its
in-flight deletes be acknowledged, writes its markers and releases it; `give_back_acceptance` returns an operator's
unapplied accept-data-loss for the next owner.

Thread: `start_shard` and `stop_shard` are called on the reactor (the worker's thread schedules them with
`callFromThread`); their blocking parts - ZooKeeper, the copy's catch-up - run in the reactor's thread pool (the
pipeline's `before` step, `deferToThreadPool`), never on the reactor itself. `give_back_acceptance` blocks: the
thread pool only."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import KazooException
from twisted.internet import defer, threads

from squeal.pool.owner import wait_for_copy
from squeal.pool.zookeeper import UNAVAILABLE
from squeal.read import gtid as g
from squeal.shard.daemon import source_for
from squeal.shard.data_loss import accept_path

if TYPE_CHECKING:
    from squeal.pool.worker import PoolWorker

log = logging.getLogger(__name__)

RETRY_FAILED_S = 5.0  # a shard whose pipeline failed to start is tried again after this long


def start_shard(worker: PoolWorker, shard: str) -> None:
    """Reactor: the pipeline of a shard just taken: markers from ZooKeeper, its copy caught up with them."""
    assert worker.client is not None and worker.daemon is not None and worker.ownership is not None
    ownership = worker.ownership
    store = worker.store_for(shard)  # (the one of the pipeline checked ahead, if it was)

    taken = time.monotonic()
    phases: dict[str, float] = {}
    ahead = shard in worker.daemon.checked_ahead

    def before() -> None:
        phases["queued"] = time.monotonic() - taken
        store.ensure_paths()  # (made already if the pipeline was checked ahead)
        target: dict = {}
        for position in store.read().values():  # read once: the pipeline starts from these
            g.merge(target, g.parse_position(position))
        copy = source_for(worker.topology.shard_copy(shard, worker.region.name))
        wait_for_copy(
            copy.connect, target, worker.zk.takeover_wait_s, progress=worker.metrics.copy_wait.labels(shard=shard).set
        )
        phases["markers"] = time.monotonic() - taken

    def started(_: Any) -> None:
        took = time.monotonic() - taken
        worker.metrics.owned.labels(shard=shard).set(1)
        worker.metrics.starts.inc()
        worker.metrics.start_seconds.observe(took)
        log.info(
            "worker %s: shard %s delivering %.0f ms after it was taken (waited for a thread %.0f ms, "
            "markers read and copy caught up by %.0f ms, then %s and the start)",
            worker.name,
            shard,
            took * 1000,
            phases.get("queued", 0) * 1000,
            phases.get("markers", 0) * 1000,
            "the flows (its database checked ahead)" if ahead else "the pipeline's checks, flows",
        )
        _started_or_not(worker, shard)

    def failed(f: Any) -> None:
        log.error(
            "worker %s: shard %s could not start: %s; released, retried in %gs",
            worker.name,
            shard,
            f.getErrorMessage(),
            RETRY_FAILED_S,
        )
        worker.failed_at[shard] = time.monotonic()
        worker.stores.pop(shard, None)
        d = threads.deferToThreadPool(
            worker.reactor, worker.reactor.getThreadPool(), ownership.release, shard, "failed"
        )
        d.addBoth(lambda _: _started_or_not(worker, shard))

    worker.daemon.add_shard(shard, before=before).addCallbacks(started, failed)


def _started_or_not(worker: PoolWorker, shard: str) -> None:
    with worker.state_lock:
        worker.starting.discard(shard)
    worker.wake.set()


def stop_shard(worker: PoolWorker, shard: str) -> None:
    """Reactor: a shard assigned elsewhere: stop reading it, let its in-flight deletes be acknowledged, write
    its markers, then release it."""
    assert worker.daemon is not None and worker.ownership is not None
    ownership = worker.ownership
    log.info(
        "worker %s: shard %s is assigned to %s now: handing it on",
        worker.name,
        shard,
        worker.assignment.get(shard, "nobody"),
    )

    def release(saved: Any) -> defer.Deferred:
        if saved is not True:
            log.error(
                "worker %s: shard %s's final markers were not all written; its next owner resends from the older ones",
                worker.name,
                shard,
            )

        def hand_on() -> None:
            give_back_acceptance(worker, shard)
            ownership.release(shard, "moved")

        return threads.deferToThreadPool(worker.reactor, worker.reactor.getThreadPool(), hand_on)

    def done(_: Any) -> None:
        worker.stores.pop(shard, None)
        worker.shard_loads.forget(shard)
        if shard in _owned_labels(worker):
            worker.metrics.owned.remove(shard)
        worker.metrics.stops.inc()
        with worker.state_lock:
            worker.stopping_shards.discard(shard)
        worker.wake.set()

    worker.daemon.remove_shard(shard).addBoth(release).addBoth(done)


def give_back_acceptance(worker: PoolWorker, shard: str) -> None:
    """An operator's accept-data-loss this worker took for `shard` but whose pipeline stopped before applying
    it (a move in the same second, a SIGTERM) goes back beside the shard's markers for the next owner: taken
    from ZooKeeper, it would otherwise be lost with this worker's request file and the shard stay halted."""
    store = worker.stores.get(shard)
    path = accept_path(worker.state_dir, worker.region.name, shard if worker.topology.sharded else None)
    if store is None or not path.exists():
        return
    try:
        store.request_loss_acceptance()
    except (*UNAVAILABLE, KazooException) as e:
        log.error(
            "worker %s: could not hand shard %s's accepted data loss on (%s): run `squeal accept-data-loss "
            "--shard %s` again",
            worker.name,
            shard,
            e,
            shard,
        )
        return
    path.unlink(missing_ok=True)
    log.warning(
        "worker %s: shard %s's accepted data loss was not applied here: handed on to its next owner",
        worker.name,
        shard,
    )


def _owned_labels(worker: PoolWorker) -> set[str]:
    return {s.labels["shard"] for m in worker.metrics.owned.collect() for s in m.samples}
