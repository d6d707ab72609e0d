"""What HA costs squeal, and how long a failover takes (not a test: prints figures for docs/benchmarks.md).

    .venv/bin/python bench/squeal_ha.py [--rows 50000] [--repeat 3] [--probe-seconds 10] [--load-txn 100]
                                        [--kills 20] [--session-timeout 2]

One run, on this machine: a MariaDB primary and its GTID replica (log_slave_updates), two memcached
"clusters", a 3-server ZooKeeper ensemble (ops/harness.py, tickTime 500 ms), `squeal run` with the native
reader. Single = `squeal run --region east` on the primary; HA = `squeal run --instance east-1` (primary)
leading and `--instance east-2` (replica) standing by, datamarkers in ZooKeeper.

1. Throughput: one binlog of `--rows` row changes (bench/squeal_throughput.py's `load`: 10-row transactions,
   half INSERTs, half UPDATEs) replayed `--repeat` times by each, alternating. Single: squeal_throughput's
   `squeal_replay` (window from /healthz answering to both clusters acknowledging the last GTID; rows read
   before the window subtracted). HA: the standby is up *before* the replay starts: the bench holds the
   region's leader znode with a session of its own while east-2, then east-1 (`--from-gtid` the binlog's
   start) come up and stand by, then deletes it; east-1 (preferred) wins, takes over and replays. Window
   from east-1 leading and its reader having read its first rows (the single daemon's window also opens
   with its reader under way) to both clusters acknowledging, rows read before subtracted. Each replay
   prints squeal's CPU per 1,000 rows, and for HA the standby's and the ZooKeeper servers' CPU meanwhile.
2. Latency: back-to-back probes (squeal_latency_load's `Prober`: set the key in both clusters, UPDATE the
   probe row, COMMIT, poll every 0.5 ms; COMMIT returned -> key gone) for `--probe-seconds` against each
   mode, twice, alternating (single, HA, single, HA), under a paced background load of `--load-txn`
   10-row transactions/s (squeal_latency_load's `LoadGenerator`, 1 process x 2 threads).
3. Failover: the HA pair (hand-back disabled, so the instances take turns), the background load on, and
   `--kills` times: the canary key set in both clusters, kill -9 of whichever instance leads, the canary
   row UPDATEd and committed at once, polled every 1 ms until gone from both clusters: failover time = kill ->
   canary gone. Split: kill -> the new leader elected (its /healthz `takeover.since`), election -> delivering
   (`takeover.ready_after_s`), the rest. The killed instance is restarted and stands by before the next kill.

The load average is printed with every phase (the machine is shared). Everything started is stopped by pid
and the temporary directory removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from kazoo.client import KazooClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "squeal"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from squeal_helpers import Cache, healthz, topology_text
from squeal_latency_load import PROBE_ROWS, PROBE_TEMPLATE, SCHEMA, LoadGenerator, Phase, Prober, ms, pct
from squeal_throughput import cpu_seconds, create_schema, load, loadavg, metric_sum, squeal_replay

from ops.harness import REPO_ROOT, MariaDB, Memcached, SquealDaemon, ZooKeeper, free_port, wait_until
from squeal import gtid as g

# The daemons run from the virtualenv, whose editable install may point at another checkout: run this one's.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))


def single_topology(db: MariaDB, caches: list[Memcached]) -> str:
    text = topology_text(
        db, SCHEMA, [m.port for m in caches], regional=False, extra_rules=[(f"{SCHEMA}.probe", [PROBE_TEMPLATE])]
    )
    return text.replace("[squeal]\n", '[squeal]\nreader = "native"\n', 1)


def ha_topology(
    db: MariaDB,
    replica: MariaDB,
    caches: list[Memcached],
    zk: list[ZooKeeper],
    root: str,
    ports: dict[str, int],
    session_timeout: float,
    handback_after: float,
) -> str:
    text = single_topology(db, caches)
    text += (
        f'\n[regions.east.replicas.east-r1]\nhost = "{replica.host}"\nport = {replica.port}\n'
        f'server_id = {replica.server_id}\nuser = "{replica.user}"\npassword = "{replica.password}"\n'
    )
    for name, copy in (("east-1", "east"), ("east-2", "east-r1")):
        text += (
            f'\n[[regions.east.squeal_instances]]\nname = "{name}"\ndatabase = "{copy}"\nmetrics_port = {ports[name]}\n'
        )
    servers = ", ".join(f'"{m.host}:{m.port}"' for m in zk)
    return text + (
        f"\n[zookeeper]\nservers = [{servers}]\nsession_timeout_s = {session_timeout:g}\n"
        f'root = "{root}"\ntakeover_wait_s = 30\nhandback_after_s = {handback_after:g}\n'
    )


class HaPair:
    """east-1 and east-2 on a fresh ZooKeeper root (no markers yet)."""

    def __init__(
        self,
        base: Path,
        db: MariaDB,
        replica: MariaDB,
        caches: list[Memcached],
        zk: list[ZooKeeper],
        session_timeout: float,
        handback_after: float,
        from_gtid: str | None = None,
    ) -> None:
        work = Path(tempfile.mkdtemp(dir=base, prefix="ha-"))
        self.root = f"/bench{uuid.uuid4().hex[:8]}"
        self.ports = {name: free_port() for name in ("east-1", "east-2")}
        topo = work / "topology.toml"
        topo.write_text(ha_topology(db, replica, caches, zk, self.root, self.ports, session_timeout, handback_after))
        extra = ("--from-gtid", from_gtid) if from_gtid else ()
        self.daemons = {
            name: SquealDaemon(
                topo,
                "east",
                port=port,
                workdir=work / name,
                state_dir=work / name / "st",
                extra_args=("--instance", name, *extra),
            )
            for name, port in self.ports.items()
        }

    def health(self, name: str) -> dict:
        return healthz(self.ports[name])[1]

    def state(self, name: str) -> str | None:
        try:
            return self.health(name).get("state")
        except OSError:
            return None

    def leader(self) -> str | None:
        return next((n for n in self.daemons if self.state(n) == "leader"), None)

    def stop(self) -> None:
        for d in self.daemons.values():
            d.stop(grace=10)


def ha_replay(
    base: Path,
    db: MariaDB,
    replica: MariaDB,
    caches: list[Memcached],
    zk: list[ZooKeeper],
    start: str,
    end: g.Position,
    session_timeout: float,
) -> dict:
    """The replay with a standby in place before it starts: the leader znode is held by the bench's own
    session until both instances stand by."""
    pair = HaPair(base, db, replica, caches, zk, session_timeout, 3600.0, from_gtid=start)
    hold = KazooClient(hosts=",".join(f"{m.host}:{m.port}" for m in zk), timeout=session_timeout)
    hold.start(timeout=15)
    try:
        base_path = f"{pair.root}/regions/east"
        hold.create(f"{base_path}/epoch", json.dumps({"epoch": 0}).encode(), makepath=True)
        hold.create(
            f"{base_path}/leader",
            json.dumps({"name": "bench-hold", "epoch": 0, "since": time.time()}).encode(),
            ephemeral=True,
        )
        for name in ("east-2", "east-1"):
            pair.daemons[name].start()
            wait_until(
                lambda n=name: pair.health(n).get("ha", {}).get("leader") == "bench-hold", 30, f"{name} to stand by"
            )
        hold.delete(f"{base_path}/leader")  # the region is free: east-1 (preferred) takes it and replays
        port = pair.ports["east-1"]
        wait_until(lambda: pair.state("east-1") == "leader", 30, "east-1 to lead", interval=0.002)
        # The window opens once the leader's reader has read something, as the single daemon's does (its
        # /healthz answers after its reader started; squeal_replay subtracts what was read before): the
        # reader's connection set-up is not throughput. (Takeover time is measured by the failover part.)
        wait_until(
            lambda: metric_sum(port, 'squeal_rows_total{reader="live"') > 0, 30, "east-1 to read", interval=0.002
        )
        t0 = time.perf_counter()
        rows0 = metric_sum(port, 'squeal_rows_total{reader="live"')
        groups = {
            "leader": [pair.daemons["east-1"].pid],
            "standby": [pair.daemons["east-2"].pid],
            "zookeeper": [m.pid for m in zk],
        }
        cpu0 = {k: cpu_seconds(pids) for k, pids in groups.items()}
        wait_until(
            lambda: all(
                g.covers_position(g.parse_position(f["acked"]), end) for f in pair.health("east-1")["flows"].values()
            ),
            600,
            f"the leader to acknowledge {g.format_position(end)}",
            interval=0.02,
        )
        elapsed = time.perf_counter() - t0
        cpu = {k: cpu_seconds(pids) - cpu0[k] for k, pids in groups.items()}
        rows = metric_sum(port, 'squeal_rows_total{reader="live"')
        sheds = metric_sum(port, "squeal_flow_sheds_total")
    finally:
        hold.stop()
        hold.close()
        pair.stop()
    window = rows - rows0
    return {
        "rows": rows,
        "window_rows": window,
        "seconds": elapsed,
        "rows_per_s": window / elapsed,
        "sheds": sheds,
        "cpu_per_1000": cpu["leader"] / max(window, 1) * 1000,
        "others_cpu": {k: v for k, v in cpu.items() if k != "leader"},
    }


def median(values: list[float]) -> float:
    return sorted(values)[(len(values) - 1) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000, help="row changes in the replayed binlog")
    ap.add_argument("--repeat", type=int, default=3, help="replays per mode (alternating)")
    ap.add_argument("--probe-seconds", type=float, default=10.0, help="probing per latency phase (2 per mode)")
    ap.add_argument("--load-txn", type=float, default=100.0, help="background 10-row transactions/s")
    ap.add_argument("--kills", type=int, default=20, help="kill -9s of the leader")
    ap.add_argument("--session-timeout", type=float, default=2.0, help="ZooKeeper session timeout (s)")
    args = ap.parse_args()
    print(
        f"command: .venv/bin/python bench/squeal_ha.py --rows {args.rows} --repeat {args.repeat} "
        f"--probe-seconds {args.probe_seconds:g} --load-txn {args.load_txn:g} --kills {args.kills} "
        f"--session-timeout {args.session_timeout:g}"
    )
    print(f"start: {loadavg()}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="squeal-ha-bench-"))
    started: list = []
    gen: LoadGenerator | None = None
    try:
        db = MariaDB(1, workdir=base / "db").start()
        started.append(db)
        replica = MariaDB(2, workdir=base / "replica", replica=True).start()
        started.append(replica)
        replica.replicate_from(db)
        for d in (db, replica):
            d.execute("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
        mcs = [Memcached(workdir=base / "mc", memory_mb=256).start() for _ in range(2)]
        started += mcs
        zk = ZooKeeper.ensemble(3, workdir=base / "zk")
        started += zk
        for m in zk:
            m.start()
        ZooKeeper.wait_serving(zk)
        create_schema(db, SCHEMA, PROBE_ROWS)

        # 1. throughput
        start = db.gtid_binlog_pos()
        load(db, SCHEMA, args.rows)
        end = g.parse_position(db.gtid_binlog_pos())
        replica.wait_for_gtid(g.format_position(end), timeout=300)
        rates: dict[str, list[float]] = {"single": [], "ha": []}
        for i in range(args.repeat):
            for mode in ("single", "ha"):
                print(f"replay {i + 1}/{args.repeat} {mode}: {loadavg()}", flush=True)
                r = (
                    squeal_replay(base, db, SCHEMA, mcs, start, end, batch_size=256, reader="native")
                    if mode == "single"
                    else ha_replay(base, db, replica, mcs, zk, start, end, args.session_timeout)
                )
                if r["rows"] != args.rows:
                    raise RuntimeError(f"{mode}: squeal read {r['rows']:.0f} rows, {args.rows} written")
                rates[mode].append(r["rows_per_s"])
                others = "".join(f", {k} {v:.2f}s" for k, v in r.get("others_cpu", {}).items())
                print(
                    f"  {r['window_rows']:.0f} rows in {r['seconds']:.3f}s = {r['rows_per_s']:,.0f} rows/s "
                    f"({r['rows'] - r['window_rows']:.0f} read before); sheds {r['sheds']:.0f}; CPU: squeal "
                    f"{r['cpu_per_1000'] * 1000:.1f} ms per 1,000 rows{others}",
                    flush=True,
                )
        ratios = [h / s for s, h in zip(rates["single"], rates["ha"], strict=True)]

        # 2. latency under a paced background load
        gen = LoadGenerator(db, SCHEMA, args.load_txn, procs=1, threads=2)
        gen.launch()
        gen.go()
        phases = {"single": Phase("single"), "ha": Phase("ha")}
        for i in range(2):
            for mode in ("single", "ha"):
                print(f"latency {i + 1}/2 {mode}: {loadavg()}", flush=True)
                if mode == "single":
                    work = Path(tempfile.mkdtemp(dir=base, prefix="live-"))
                    (work / "topology.toml").write_text(single_topology(db, mcs))
                    single = SquealDaemon(
                        work / "topology.toml",
                        "east",
                        workdir=work,
                        state_dir=work / "st",
                        extra_args=("--from-gtid", db.gtid_binlog_pos()),
                    )
                    single.start()
                    stop = single.stop
                else:
                    pair = HaPair(base, db, replica, mcs, zk, args.session_timeout, 3600.0)
                    pair.daemons["east-1"].start()
                    wait_until(lambda p=pair: p.state("east-1") == "leader", 30, "east-1 to lead")
                    pair.daemons["east-2"].start()
                    wait_until(
                        lambda p=pair: p.health("east-2").get("ha", {}).get("leader") == "east-1",
                        30,
                        "east-2 to stand by",
                    )
                    stop = pair.stop
                prober = Prober(db, SCHEMA, [m.port for m in mcs])
                try:
                    prober.run(phases[mode], 1.0)  # warm-up, not counted
                    phases[mode].samples.clear()
                    phases[mode].seconds = 0
                    prober.run(phases[mode], args.probe_seconds)
                finally:
                    prober.close()
                    stop()

        # 3. failover
        pair = HaPair(base, db, replica, mcs, zk, args.session_timeout, 3600.0)
        pair.daemons["east-1"].start()
        wait_until(lambda: pair.state("east-1") == "leader", 30, "east-1 to lead")
        pair.daemons["east-2"].start()
        wait_until(lambda: pair.health("east-2").get("ha", {}).get("leader") == "east-1", 30, "east-2 to stand by")
        caches = [Cache(m.port) for m in mcs]
        dbconn = db.connect(SCHEMA)
        cur = dbconn.cursor()
        failovers: list[tuple[float, float, float]] = []  # (kill -> gone, kill -> elected, elected -> delivering)
        print(f"failover: {loadavg()}", flush=True)
        try:
            for k in range(args.kills):
                leader = pair.leader()
                other = "east-2" if leader == "east-1" else "east-1"
                key = PROBE_TEMPLATE.format(id=1)
                for c in caches:
                    c.set(key, b"canary")
                kill_wall, t_kill = time.time(), time.perf_counter()
                pair.daemons[leader].kill()
                cur.execute("UPDATE probe SET seq = seq + 1 WHERE id = 1")  # autocommit: committed now
                while any(c.has(key) for c in caches):
                    if time.perf_counter() - t_kill > 60:
                        raise RuntimeError(f"kill {k + 1}: the canary was still cached 60 s after the kill")
                    time.sleep(0.001)
                gone = time.perf_counter() - t_kill
                takeover = pair.health(other)["takeover"]
                failovers.append((gone, takeover["since"] - kill_wall, takeover.get("ready_after_s", 0.0)))
                print(
                    f"  kill {k + 1}: {leader} killed -> {other} elected {failovers[-1][1] * 1000:.0f} ms, "
                    f"delivering {failovers[-1][2] * 1000:.0f} ms later, canary gone {gone * 1000:.0f} ms "
                    f"after the kill",
                    flush=True,
                )
                pair.daemons[leader].start()
                wait_until(
                    lambda n=leader, o=other: pair.health(n).get("ha", {}).get("leader") == o,
                    30,
                    f"{leader} to stand by",
                )
        finally:
            for c in caches:
                c.close()
            cur.close()
            dbconn.close()
            pair.stop()
        gen.stop()
        gen = None

        # report
        print(f"\nend: {loadavg()}")
        print("\n| throughput (rows/s) | " + " | ".join(f"round {i + 1}" for i in range(args.repeat)) + " | median |")
        print("|---|" + "---|" * (args.repeat + 1))
        for mode in ("single", "ha"):
            print(f"| {mode} | " + " | ".join(f"{x:,.0f}" for x in rates[mode]) + f" | {median(rates[mode]):,.0f} |")
        print("| HA ÷ single | " + " | ".join(f"{x:.3f}" for x in ratios) + f" | {median(ratios):.3f} |")
        print("\n| latency (COMMIT returned -> gone) | probes | c0 p50 | c0 p99 | c1 p50 | c1 p99 | missed |")
        print("|---|---|---|---|---|---|---|")
        for mode, ph in phases.items():
            cells = " | ".join(f"{ms(pct(ph.latencies(c), 0.5))} | {ms(pct(ph.latencies(c), 0.99))}" for c in (0, 1))
            print(f"| {mode} | {len(ph.samples)} | {cells} | {ph.missed(0) + ph.missed(1)} |")
        gone = sorted(f[0] for f in failovers)
        elected = sorted(f[1] for f in failovers)
        ready = sorted(f[2] for f in failovers)
        print(f"\n| failover over {len(gone)} kill -9s | min | p50 | p90 | p99 | max |")
        print("|---|---|---|---|---|---|")
        for what, vals in (
            ("kill -> canary gone", gone),
            ("kill -> new leader elected", elected),
            ("elected -> delivering", ready),
        ):
            print(f"| {what} | " + " | ".join(f"{pct(vals, q) * 1000:.0f} ms" for q in (0, 0.5, 0.9, 0.99, 1.0)) + " |")
        return 0
    finally:
        if gen is not None:
            gen.stop()
        for p in reversed(started):
            p.stop(grace=10)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
