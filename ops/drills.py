"""Chaos drill (`squealctl drill`): break a running deployment the way machines break, check that it heals.

Against the deployment `squealctl up` started (its supervisor must be running), in order:

1. kill -9 the master region's squeal daemon; it must be back (a new pid, answering) within `back_within` s
2. kill -9 a router; back?
3. kill -9 a memcached server (a wildcard pool's); back?
4. SIGSTOP another router for `pause` s, then SIGCONT: answering again, same pid (a paused process has not
   exited, so the supervisor must leave it alone)
5. `squealctl restart` the replica region's MariaDB (with [shards]: one shard's copy there): back, and
   replication catches up with that shard's primary
6. SIGSTOP the replica for `pause` s (a replica stall), SIGCONT: replication catches up
7. `squealctl verify` on the recorded topology: nothing cached disagrees with the database

A step whose component the deployment does not run (`up --without ...`) is skipped and says so. Every step
prints one line with what it measured. Runbook: docs/runbooks/chaos-drill.md.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import pymysql

import router_config
from ops.harness import HarnessError, memcached_command, wait_until
from ops.local import Deployment

POLL = 0.05


@dataclass
class Step:
    what: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"drill: {'ok    ' if self.ok else 'FAILED'} {self.what}: {self.detail}"


class Drill:
    def __init__(
        self,
        deployment: Deployment,
        topology: str,
        pause: float = 3.0,
        back_within: float = 30.0,
        out: Callable[[str], None] = print,
    ) -> None:
        self.deployment, self.topology = deployment, topology
        self.topo = router_config.load(topology)
        self.pause, self.back_within, self.out = pause, back_within, out
        self.steps: list[Step] = []

    # -- reading the deployment ------------------------------------------------------------------

    def rows(self) -> dict[str, dict]:
        return {r["name"]: r for r in self.deployment.status()}

    def row(self, name: str) -> dict:
        return self.rows()[name]

    def answers(self, row: dict) -> bool:
        """A real answer, not an accepted connection (the kernel accepts for a paused process too): routers and
        memcached reply to `version` (over TLS with the topology's `[tls]`: their ports speak nothing else),
        MariaDB greets a new connection, the others answer HTTP on /healthz."""
        if not row["running"]:
            return False
        host, _, port = row["address"].rpartition(":")
        try:
            if row["role"] in ("router", "memcached"):
                tls = router_config.tls_context(self.topo.tls, "monitoring")
                reply = memcached_command((host, int(port)), b"version\r\n", timeout=0.5, tls=tls)
                return reply.startswith(b"VERSION")
            if row["role"].startswith("mariadb"):
                with socket.create_connection((host, int(port)), timeout=0.5) as s:
                    return bool(s.recv(1))
            conn = http.client.HTTPConnection(host, int(port), timeout=0.5)
            try:
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                return True
            finally:
                conn.close()
        except (OSError, http.client.HTTPException):
            return False

    def _pick(self, role: str, prefer: Callable[[dict], bool] = lambda r: True, skip: str | None = None) -> str | None:
        candidates = [r for r in self.rows().values() if r["role"] == role and r["name"] != skip]
        preferred = [r for r in candidates if prefer(r)]
        return (preferred or candidates or [{"name": None}])[0]["name"]

    def record(self, step: Step) -> None:
        self.steps.append(step)
        self.out(str(step))

    def skip(self, what: str, why: str) -> None:
        self.out(f"drill: skip   {what}: {why}")

    # -- steps -----------------------------------------------------------------------------------

    def _running(self, name: str | None, role: str, verb: str, after: str = "") -> tuple[dict, str] | None:
        """The row of `name` and the step's title ("<verb> <name> (pid N)<after>"), or None when there is
        nothing to do it to: no such component (skipped) or not running before the drill (a failed step)."""
        if name is None:
            self.skip(f"{verb} a {role}", "the deployment runs none")
            return None
        before = self.row(name)
        what = f"{verb} {name} (pid {before['pid']}){after}"
        if not before["running"]:
            self.record(Step(what, False, "it was not running before the drill"))
            return None
        return before, what

    def kill(self, name: str | None, role: str) -> None:
        target = self._running(name, role, "kill -9")
        if target is None or name is None:
            return
        before, what = target
        os.kill(before["pid"], signal.SIGKILL)
        t0 = time.monotonic()

        def back() -> dict | None:
            now = self.row(name)
            return now if now["running"] and now["pid"] != before["pid"] and self.answers(now) else None

        now = wait_until(back, self.back_within, f"{name} back", interval=POLL, ignore=(), error=None)
        if now:
            took = time.monotonic() - t0
            detail = f"back as pid {now['pid']}, answering {took:.2f} s after the kill (restarts {now['restarts']})"
            self.record(Step(what, True, detail))
            return
        self.record(Step(what, False, f"not back after {self.back_within:.0f} s: {self._state(name)}"))

    def pause_process(self, name: str | None, role: str) -> None:
        target = self._running(name, role, "SIGSTOP", f" for {self.pause:g} s")
        if target is None or name is None:
            return
        before, what = target
        os.kill(before["pid"], signal.SIGSTOP)
        try:
            time.sleep(min(0.5, self.pause))
            paused = "not answering while paused" if not self.answers(before) else "still answering while paused (?)"
            time.sleep(max(0.0, self.pause - 0.5))
        finally:
            os.kill(before["pid"], signal.SIGCONT)
        t0 = time.monotonic()

        def answering() -> dict | None:
            now = self.row(name)
            return now if self.answers(now) else None

        now = wait_until(answering, self.back_within, f"{name} answering", interval=POLL, ignore=(), error=None)
        if now:
            took = time.monotonic() - t0
            same = now["pid"] == before["pid"] and now["restarts"] == before["restarts"]
            detail = f"{paused}; answering {took:.2f} s after SIGCONT"
            if same:
                self.record(Step(what, True, f"{detail}, same pid (not restarted)"))
            else:
                self.record(Step(what, False, f"{detail}, but it was restarted (pid {now['pid']})"))
            return
        self.record(Step(what, False, f"not answering {self.back_within:.0f} s after SIGCONT: {self._state(name)}"))

    def restart_replica(self, name: str | None) -> None:
        if name is None:
            self.skip("restart the replica MariaDB", "the deployment runs no replica")
            return
        t0 = time.monotonic()
        try:
            message = self.deployment.control("restart", name)
        except HarnessError as e:
            self.record(Step(f"restart {name}", False, str(e).splitlines()[0]))
            return
        took = time.monotonic() - t0
        caught_up = self._replication_caught_up(name)
        self.record(Step(f"restart {name}", caught_up.ok, f"{message} ({took:.2f} s); {caught_up.detail}"))

    def stall_replica(self, name: str | None) -> None:
        if name is None:
            self.skip("SIGSTOP the replica MariaDB", "the deployment runs no replica")
            return
        self.pause_process(name, "replica")
        if self.steps and self.steps[-1].ok:
            caught_up = self._replication_caught_up(name)
            self.record(Step(f"replication after the stall of {name}", caught_up.ok, caught_up.detail))

    def _replication_caught_up(self, name: str) -> Step:
        """The replica applies everything the primary has committed (MASTER_GTID_WAIT)."""
        row = self.row(name)
        if row.get("shard"):  # a shard's copy: its own primary (topologies with [shards])
            shard = self.topo.shard(row["shard"])
            primary, replica = shard.primary, shard.copy(row["region"])
        else:
            primary, replica = self.topo.master.database, self.topo.region(row["region"]).database
        t0 = time.monotonic()
        try:
            with _connect(primary) as conn, conn.cursor() as cur:
                cur.execute("SELECT @@gtid_binlog_pos")
                position = cur.fetchone()[0]
            with _connect(replica) as conn, conn.cursor() as cur:
                cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (position, self.back_within))
                done = cur.fetchone()[0] == 0
        except pymysql.MySQLError as e:
            return Step("replication", False, f"cannot check replication: {e}")
        took = time.monotonic() - t0
        if done:
            return Step("replication", True, f"replica at the primary's {position or 'empty'} GTID after {took:.2f} s")
        return Step("replication", False, f"replica did not reach {position} in {self.back_within:.0f} s")

    def settle(self) -> None:
        """Every component answering again (no step left one down), before verify reads the caches."""
        t0 = time.monotonic()
        rows: list[dict] = []

        def all_answering() -> bool:
            rows[:] = self.rows().values()
            return all(r["answering"] for r in rows)

        what = "every component answering"
        if wait_until(all_answering, self.back_within, what, interval=0.2, ignore=(), error=None):
            self.out(f"drill: every component answers ({len(rows)}), {time.monotonic() - t0:.2f} s after the last step")
            return
        down = [n for n, r in self.rows().items() if not r["answering"]]
        self.record(Step("settle", False, f"not answering {self.back_within:.0f} s after the last step: {down}"))

    def verify(self) -> int:
        cmd = [sys.executable, "-m", "ops.cli", "--state-dir", str(self.deployment.state_dir), "verify", self.topology]
        self.out(f"drill: squealctl verify {self.topology}")
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        for line in (result.stdout + result.stderr).splitlines():
            self.out(f"  {line}")
        self.out(f"drill: verify exit status {result.returncode}")
        return result.returncode

    def _state(self, name: str) -> str:
        r = self.row(name)
        return f"pid {r['pid']}, running {r['running']}, restarts {r['restarts']}"

    # -- the sequence ----------------------------------------------------------------------------

    def run(self, verify: bool = True) -> int:
        """0: every step passed and verify found nothing stale; 1: a step failed or verify found stale copies;
        2: verify could not check (every status but 0 and 1)."""
        master = self.topo.master.name
        router = self._pick("router")
        # in a pooled region: a worker that owns shards (another must take them over, the killed one come back)
        self.kill(
            self._pick("squeal", lambda r: r["region"] == master and (not r.get("instance") or bool(r.get("owns")))),
            "squeal daemon",
        )
        self.kill(router, "router")
        self.kill(self._pick("memcached", lambda r: r["pool"] == "wildcard"), "memcached")
        self.pause_process(self._pick("router", skip=router) or router, "router")
        replica = self._pick("mariadb-replica")
        self.restart_replica(replica)
        self.stall_replica(replica)
        self.settle()
        failed = [s for s in self.steps if not s.ok]
        code = 1 if failed else 0
        if verify:
            status = self.verify()
            code = max(code, status if status in (0, 1) else 2)
        self.out(
            f"drill: {len(self.steps) - len(failed)} of {len(self.steps)} checks passed"
            + (f"; failed: {', '.join(s.what for s in failed)}" if failed else "")
        )
        return code


def _connect(db: router_config.Database) -> pymysql.connections.Connection:
    return router_config.connect_database(db, "monitoring")


def run_drill(
    deployment: Deployment,
    topology: str | None = None,
    pause: float = 3.0,
    back_within: float = 30.0,
    verify: bool = True,
) -> int:
    """`squealctl drill`: the drill against the deployment in `deployment.state_dir`."""
    if not deployment.components():
        raise HarnessError(f"no deployment in {deployment.state_dir} (run `squealctl up` first)")
    supervisor = deployment.supervisor()
    if supervisor is None or not deployment.is_running(supervisor):
        raise HarnessError(
            f"the deployment in {deployment.state_dir} has no running supervisor: nothing would restart what the "
            "drill kills; `squealctl down`, then `squealctl up`"
        )
    topology = deployment.topology(topology)
    return Drill(deployment, str(topology), pause, back_within).run(verify)
