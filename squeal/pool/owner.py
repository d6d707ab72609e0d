"""What a ZooKeeper-fenced owner of squeal's work needs beyond the pool's own logic (squeal/pool/): a worker's
session lease, its start-up and its rejoin after a loss.

* `SessionLease`: how long the process may still act on what it owns (docs/squeal.md, "Fencing" and "A lapsed
  lease resumes"): each round trip to ZooKeeper proves the session alive until the request's send time + T (the
  session timeout), so the lease runs to send time + `lease_fraction` x T and ends before ZooKeeper can expire
  the session and hand its ephemeral znodes - a member, a shard's `owner` - to someone else. A lease that runs
  out on a slow answer only *lapses* (nothing is sent) and resumes when a multi-operation through ZooKeeper's
  leader confirms the znode it is tied to (the session lived, so its ephemeral znodes never went: nobody else can
  have taken over); no confirmation within `resume_within` more, a LOST session, or the znode gone or another
  session's: lost for good (`on_lost(reason)`: "lease", "session", "znode").
* Start-up: `connect_zookeeper` (the client every owner dials the ensemble with, one error line when it does not
  answer); `startup_timeout` (how long it waits: for ever after a rejoin). The process around it - the status
  site from the first moment, `prepare` on a thread - is the shell's (squeal/process/shell.py).
* After a takeover: `wait_for_copy` (a new owner never skips what its copy has not applied yet).
* After a loss: `rejoin_owning_nothing` (the process replaces itself: nothing of what it owned survives).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, RolledBackError

from router_config import Topology
from squeal.pool.zookeeper import UNAVAILABLE, client_options
from squeal.read import gtid as g
from squeal.read.reader import current_position

log = logging.getLogger(__name__)

LEASE_FRACTION = 0.6


class SessionLease:
    """The lease of one ZooKeeper session, tied to one of its ephemeral znodes (`path`: a pool worker's member
    znode); see the module docstring.

    `on_pause(True)` when sending must stop (the connection
    SUSPENDED, the lease lapsed), `on_pause(False)` when it may go on; `on_lapse()` / `on_resume()` once per lapse
    and per confirmed resumption (metrics). Callbacks run on the lease's or kazoo's threads: they must not block.
    Two threads: the renewal (a round trip every `tick`) and the watchdog (the lapse at the instant the lease ends,
    the loss `resume_within` later), so a hung ZooKeeper call never keeps the lease alive past its end."""

    def __init__(
        self,
        client: KazooClient,
        path: str,
        session_timeout: float,
        on_lost: Callable[[str], None],
        tick: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        lease_fraction: float = LEASE_FRACTION,
        resume_within: float | None = None,
        on_pause: Callable[[bool], None] = lambda paused: None,
        on_lapse: Callable[[], None] = lambda: None,
        on_resume: Callable[[], None] = lambda: None,
        who: str = "",
    ) -> None:
        if not 0 < lease_fraction < 1:
            raise ValueError("lease_fraction must be between 0 and 1: the lease must end before the session can")
        self.client = client
        self.path = path
        self.session_timeout = session_timeout
        self.length = lease_fraction * session_timeout
        self.tick = tick if tick is not None else session_timeout / 6
        self.resume_within = resume_within if resume_within is not None else session_timeout
        self.call_timeout = max(0.5, session_timeout / 3)
        self.on_lost, self.on_pause, self.on_lapse, self.on_resume = on_lost, on_pause, on_lapse, on_resume
        self.who = who or path
        self.clock = clock
        self.until = 0.0
        self.lapsed = False
        self.suspended = False
        self.lost: str | None = None
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- life cycle -------------------------------------------------------------------------------------------

    def start(self, sent: float) -> SessionLease:
        """The znode was just created by a request sent at `sent`: the first lease."""
        self.until = sent + self.length
        self.suspended = not self.client.connected
        self.client.add_listener(self._on_connection)
        for target, what in ((self._run, "renewal"), (self._watchdog, "watchdog")):
            t = threading.Thread(target=target, name=f"lease-{what}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, wait: bool = True) -> None:
        """No more renewals, pauses or losses from here on. `wait=False` from a callback or kazoo's thread: the
        lease's threads end by themselves (a renewal in flight finishes its call first)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        with contextlib.suppress(Exception):
            self.client.remove_listener(self._on_connection)
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join(self.call_timeout * 2 + 1)

    # -- what the owner asks ----------------------------------------------------------------------------------

    def valid(self) -> bool:
        """Whether the owner may act now: checked at that instant (a process resumed from SIGSTOP long after its
        lease ended finds it over before its watchdog has run)."""
        return self.lost is None and not self.suspended and not self.lapsed and self.clock() < self.until

    def left(self) -> float:
        return max(0.0, self.until - self.clock()) if self.valid() else 0.0

    # -- threads ----------------------------------------------------------------------------------------------

    def _on_connection(self, state: str) -> None:
        """kazoo's connection thread: never block here."""
        if state == KazooState.SUSPENDED:
            if not self.suspended and self.lost is None:
                log.warning(
                    "%s: ZooKeeper connection suspended: sending paused (lease %.2fs left)", self.who, self.left()
                )
            self.suspended = True
            self.on_pause(True)
        elif state == KazooState.LOST:
            self.suspended = True
            self._lose("session", "ZooKeeper session lost (expired or closed)")
        else:  # CONNECTED
            was, self.suspended = self.suspended, False
            if was and self.lost is None and not self.lapsed:  # (a lapsed lease resumes only when confirmed)
                log.info("%s: ZooKeeper connection back within the lease: sending resumed", self.who)
                self.on_pause(False)

    def _lose(self, reason: str, why: str) -> None:
        with self._lock:
            if self.lost is not None or self._stop.is_set():
                return
            self.lost = reason
            self._lock.notify_all()
        log.warning("%s: lease lost: %s", self.who, why)
        threading.Thread(target=self.on_lost, args=(reason,), name="lease-lost", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            if self.lost is not None:
                return
            sent = self.clock()
            try:
                self._renew(sent)
            except (*UNAVAILABLE, KazooException) as e:
                log.debug("%s: lease renewal: %s", self.who, e)

    def _watchdog(self) -> None:
        with self._lock:
            while not self._stop.is_set() and self.lost is None:
                now = self.clock()
                if now < self.until:
                    self._lock.wait(self.until - now)
                    continue
                if not self.lapsed:
                    self.lapsed = True
                    self._lock.release()
                    try:
                        self._lapse()
                    finally:
                        self._lock.acquire()
                    continue
                left = self.until + self.resume_within - now
                if left > 0:
                    self._lock.wait(left)
                    continue
                self._lock.release()
                try:
                    self._lose(
                        "lease",
                        f"no answer from ZooKeeper confirmed the session within {self.resume_within:g}s after the "
                        f"lease ran out (session timeout {self.session_timeout:g}s)",
                    )
                finally:
                    self._lock.acquire()

    def _lapse(self) -> None:
        log.warning(
            "%s: lease ran out: no answer from ZooKeeper for %.1fs (session timeout %gs): sending paused; it "
            "resumes if ZooKeeper confirms the session within %gs",
            self.who,
            self.length,
            self.session_timeout,
            self.resume_within,
        )
        self.on_lapse()
        self.on_pause(True)

    def _session(self) -> int | None:
        cid = self.client.client_id
        return cid[0] if cid else None

    def _renew(self, sent: float) -> None:
        stat = self.client.exists_async(self.path).get(timeout=self.call_timeout)
        if stat is None or stat.ephemeralOwner != self._session():
            self._lose("znode", f"{self.path} is gone or belongs to another session")
            return
        if not self.lapsed:
            self._extend(sent)
            return
        # Lapsed: an answer alone proves nothing about the time between; a multi-operation (a check) goes through
        # ZooKeeper's leader, which refuses it for an expired session, so its success means the session - and so
        # its ephemeral znode - lived all along.
        t = self.client.transaction()
        t.check(self.path, stat.version)
        results = t.commit_async().get(timeout=self.call_timeout)
        failures = [
            (i, r) for i, r in enumerate(results) if isinstance(r, Exception) and not isinstance(r, RolledBackError)
        ]
        if failures:
            i, failure = failures[0]
            if i == 0 and isinstance(failure, BadVersionError):
                return  # (its owner rewrote the znode meanwhile: a member's publication) the next tick
            self._lose(
                "znode",
                f"the lease ran out and is over: {type(failure).__name__} checking {self.path}",
            )
            return
        if sent + self.length <= self.clock():
            return  # confirmed, but too late to send on it: the next round trip
        with self._lock:
            self.lapsed = False
            self._extend(sent)
        log.info("%s: ZooKeeper confirmed the session again: sending resumed, nothing lost, no new epoch", self.who)
        self.on_resume()
        if not self.suspended:
            self.on_pause(False)

    def _extend(self, sent: float) -> None:
        with self._lock:
            self.until = max(self.until, sent + self.length)
            self._lock.notify_all()


# -- start-up ---------------------------------------------------------------------------------------------------


def connect_zookeeper(topology: Topology, connect_timeout: float | None) -> KazooClient:
    """A started client of the topology's ensemble with squeal's identity (`client_options`), retrying a lost
    connection for ever; ConnectionError naming the servers if it cannot connect within `connect_timeout` (None:
    wait as long as it takes - a process that replaced a deposed owner)."""
    zk = topology.zookeeper
    if zk is None:
        raise ValueError(f"{topology.source}: squeal instances need a [zookeeper] section")
    client = KazooClient(
        hosts=zk.hosts,
        timeout=zk.session_timeout_s,
        connection_retry={"max_tries": -1, "delay": 0.05, "max_delay": 1.0},
        **client_options(topology),
    )
    try:
        client.start(timeout=connect_timeout)
    except Exception as e:
        client.stop()
        within = f" within {connect_timeout:g}s" if connect_timeout is not None else ""
        raise ConnectionError(f"cannot reach ZooKeeper {zk.hosts}{within}: {e or type(e).__name__}") from e
    return client


def rejoined() -> str | None:
    """Why this process replaced a deposed owner (`rejoin_owning_nothing`), None for a first start: it then waits for
    its copy and ZooKeeper without a time-out (it lost them a moment ago; waiting while owning nothing is harmless)."""
    return os.environ.get("SQUEAL_REJOINED") or None


def startup_timeout(connect_timeout: float) -> float | None:
    """How long `prepare` waits for the copy and ZooKeeper: `connect_timeout` at a first start, for ever (None)
    after a rejoin."""
    return None if rejoined() else connect_timeout


def rejoin_owning_nothing(reason: str) -> None:
    """Replace this process by a fresh one with the same command line: a deposed owner keeps nothing of what it
    owned (queues, readers, connections to the destinations) and comes back owning nothing."""
    log.warning("rejoining the pool owning nothing (%s): restarting this process", reason)
    for h in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            h.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    env = dict(os.environ, SQUEAL_REJOINED=reason)
    os.execve(sys.executable, sys.orig_argv, env)


# -- takeover ----------------------------------------------------------------------------------------------------


class TakeoverError(RuntimeError):
    """A new owner could not start delivering (its copy too far behind, the database unreachable, ...)."""


def wait_for_copy(
    connect: Callable[[], Any],
    target: Any,
    timeout: float,
    progress: Callable[[float], None] = lambda waited: None,
    interval: float = 0.05,
) -> float:
    """Block until the copy's `@@gtid_binlog_pos` covers `target` (every flow's marker): a takeover never
    skips what its copy has not applied yet. Returns the seconds waited; TakeoverError after `timeout`."""
    started = time.monotonic()
    conn = connect()
    try:
        while True:
            have = current_position(conn)
            waited = time.monotonic() - started
            progress(waited)
            if g.covers_position(have, target):
                return waited
            if waited >= timeout:
                raise TakeoverError(
                    f"this copy has applied only {g.format_position(have) or 'nothing'} after "
                    f"{waited:.1f}s; the flows' datamarkers need {g.format_position(target)} "
                    "(takeover_wait_s)"
                )
            time.sleep(interval)
    finally:
        conn.close()
