"""The elastic worker pool live (issue 24; not a test: prints figures for docs/benchmarks.md).

    .venv/bin/python bench/squeal_pool.py [--kills 20] [--moves 10] [--rounds 2] [--seconds 20] [--rate 400]

One run, on this machine, with the acceptance tests' set-up (tests/squeal/test_pool_workers.py's `Pool`): a
MariaDB primary per shard (4 shards), two memcached clusters, a 3-server ZooKeeper ensemble (session timeout
2 s), a pooled region of three workers `squeal run --instance wN` (placement: cooldown 2 s, so a restarted
worker is filled again at once), and a background load of `--rate` rows/s (10-row INSERT transactions: BEGIN,
10 single-row INSERTs, COMMIT; round robin over the shards) throughout.

1. Failover, `--kills` times: a canary key (a row of a shard the victim owns) set in both clusters, kill -9 of
   the worker owning that shard, the canary row committed at once, polled every 1 ms until gone from both
   clusters: failover = kill -> canary gone (the session expiry, the controller's placement, the new owner's
   start from the markers). The killed worker is restarted and the bench waits until every shard runs again
   before the next kill.
2. Planned moves, `--moves` times: `squealctl move`'s request for one shard to another worker while a prober
   commits a row of that shard every 20 ms (key cached first) and times commit -> gone from both clusters;
   reported for the probes committed while a move was under way (request -> the new owner running) and for
   the probes between moves.
3. Cost, `--rounds` times alternating: the same 4 shards read by one `squeal run --region east` (the same
   topology without the pool) and by the pool (2 workers), each under the background load for `--seconds`:
   squeal CPU (every squeal process, user + system) per 1,000 rows read. Both modes keep up with the offered
   load (rows read = rows written), so the cost shows as CPU, not as rows/s. Also per pool round: ZooKeeper
   requests/s per worker (each server's `cons`); with `--idle-seconds N`, each mode's CPU per second over N
   seconds with the load paused (the fixed cost alone).

4. Throughput, with `--backlog N` (N > 0), `--rounds` times alternating: a region of its own (a new schema,
   ZooKeeper root and memcached pair on the same shards), its single daemon and its pool (2 workers) each
   started once to write their datamarkers at "now", then per round N rows written to the shards while no
   squeal runs (the background load paused) and read by one mode, then by the other (the order alternates):
   each mode catches up on the same backlog from the same markers. Rows/s = the rows read (`squeal_rows_total`,
   summed over the mode's processes) / the time from its first shard running (a pool places its shards one
   by one) until every flow of every shard acknowledged the shards' last GTIDs; also the time from the start
   of the processes. The backlog is 100-row transactions (BEGIN, 100 single-row INSERTs, COMMIT: the harness's
   connections autocommit, and PyMySQL's executemany sends one statement per row when a VALUES item is a
   literal, so without the BEGIN each row was a transaction of its own); each mode's
   `squeal_transactions_total` must equal the transactions written, or the bench stops. The issue's "the
   pool's throughput vs one daemon ... (cost <= 2%)" is pool / single here.

The load average is printed with every phase (the machine is shared). Everything started is stopped by pid
and the temporary directory removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "squeal"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# This checkout before the venv's editable install (another checkout's, in a worktree): the harness's REPO_ROOT,
# and so every squeal process's PYTHONPATH, is then this checkout - without it the bench measured that other code.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pool_support import ensemble
from squeal_helpers import healthz
from squeal_latency_load import pct
from squeal_throughput import check_transactions, cpu_seconds, loadavg, metric_sum
from test_pool_workers import SHARDS, Pool

from ops.harness import REPO_ROOT, MariaDB, SquealDaemon, ZooKeeper, free_port, wait_until
from squeal.pool.squealctl import request_move
from squeal.read import gtid as g

os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))

PLACEMENT = "cooldown_s = 2\n"
DEADLINE = 60.0


class Load(threading.Thread):
    """`rate` rows/s of 10-row INSERT transactions, round robin over the shards (ids from 10,000,000: row i on
    shard i % 4, like the tests' rows)."""

    def __init__(self, env: Pool, rate: float) -> None:
        super().__init__(daemon=True)
        self.env, self.rate = env, rate
        self.next_of = [10_000_000 + j for j in range(len(SHARDS))]
        self.rows = 0
        self.stop_flag = threading.Event()
        self.paused = threading.Event()
        self.idle_seconds = 0.0

    def run(self) -> None:
        conns = [db.connect(self.env.schema) for db in self.env.dbs]
        t = time.monotonic()
        j = 0
        try:
            while not self.stop_flag.is_set():
                if self.paused.is_set():  # (`--idle`: the squeal processes' cost with nothing to deliver)
                    self.stop_flag.wait(0.05)
                    t = time.monotonic()
                    continue
                ids = [self.next_of[j] + 4 * k for k in range(10)]
                self.next_of[j] += 40
                with conns[j].cursor() as cur:
                    cur.execute("BEGIN")
                    cur.executemany("INSERT INTO users VALUES (%s, %s, 'load')", [(i, f"l{i}@load") for i in ids])
                    cur.execute("COMMIT")
                self.rows += 10
                j = (j + 1) % len(conns)
                t += 10.0 / self.rate
                time.sleep(max(0.0, t - time.monotonic()))
        finally:
            for c in conns:
                c.close()

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(20)


class Canary:
    """Commit a row of one shard with its key cached in both clusters; time commit -> gone (1 ms polls)."""

    def __init__(self, env: Pool, base: int = 1_000_000) -> None:
        self.env = env
        self.next_of = [base + j for j in range(len(SHARDS))]
        self.conns = [db.connect(env.schema) for db in env.dbs]

    def prepare(self, shard: int) -> int:
        i = self.next_of[shard]
        self.next_of[shard] += len(SHARDS)
        for c in self.env.caches:
            c.set_many([f"user:{i}"])
        return i

    def commit(self, shard: int, i: int) -> float:
        with self.conns[shard].cursor() as cur:
            cur.execute("INSERT INTO users VALUES (%s, %s, 'canary')", (i, f"c{i}@canary"))
        return time.monotonic()

    def gone_at(self, i: int, timeout: float = DEADLINE) -> float:
        key = [f"user:{i}"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(c.present(key) for c in self.env.caches):
                return time.monotonic()
            time.sleep(0.001)
        raise TimeoutError(f"canary {key[0]} still cached after {timeout:g}s")


def running_everywhere(env: Pool, names: tuple[str, ...]) -> dict[str, set[str]]:
    return wait_until(lambda: env.placed(names), DEADLINE, f"every shard running on {names}")


def failovers(env: Pool, kills: int) -> list[float]:
    canary = Canary(env)
    names = ("w1", "w2", "w3")
    out: list[float] = []
    for k in range(kills):
        placed = running_everywhere(env, names)
        shard = k % len(SHARDS)
        victim = next(n for n, s in placed.items() if SHARDS[shard] in s)
        i = canary.prepare(shard)
        t0 = time.monotonic()
        env.workers[victim].kill()
        canary.commit(shard, i)
        took = canary.gone_at(i) - t0
        out.append(took)
        print(
            f"  kill {k + 1}: {victim} (owned {sorted(placed[victim])}) -> {SHARDS[shard]} delivering again "
            f"after {took * 1000:.0f} ms; {loadavg()}",
            flush=True,
        )
        env.workers[victim].start()
    running_everywhere(env, names)
    return out


class Prober(threading.Thread):
    def __init__(self, env: Pool, shard: int, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.canary = Canary(env, base=2_000_000)
        self.shard, self.every = shard, every
        self.samples: list[tuple[float, float]] = []  # (commit time, commit -> gone)
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            i = self.canary.prepare(self.shard)
            t = self.canary.commit(self.shard, i)
            self.samples.append((t, self.canary.gone_at(i) - t))
            time.sleep(self.every)

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(DEADLINE)


def planned_moves(env: Pool, moves: int) -> tuple[list[float], list[float], list[float]]:
    from pool_support import client

    names = ("w1", "w2", "w3")
    zk = client(env.zk_hosts, 2.0)
    prober = Prober(env, 0)
    prober.start()
    windows: list[tuple[float, float]] = []
    try:
        for k in range(moves):
            placed = running_everywhere(env, names)
            source = next(n for n, s in placed.items() if SHARDS[0] in s)
            target = names[(names.index(source) + 1) % len(names)]
            time.sleep(3.0)  # the cooldown (2 s) of the last move, and probes between moves
            t0 = time.monotonic()
            request_move(zk, env.root, "east", SHARDS[0], target)
            wait_until(
                lambda t=target: SHARDS[0] in env.running(t)
                and all(SHARDS[0] not in env.running(n) for n in names if n != t),
                DEADLINE,
                f"{SHARDS[0]} on {target}",
            )
            windows.append((t0, time.monotonic()))
            print(
                f"  move {k + 1}: {SHARDS[0]} {source} -> {target} in {(windows[-1][1] - t0) * 1000:.0f} ms "
                f"(request -> running there); {loadavg()}",
                flush=True,
            )
        time.sleep(1.0)
    finally:
        prober.stop()
        zk.stop()
        zk.close()
    during = sorted(d for t, d in prober.samples if any(a <= t <= b for a, b in windows))
    between = sorted(d for t, d in prober.samples if not any(a - 0.5 <= t <= b + 1.0 for a, b in windows))
    return during, between, [b - a for a, b in windows]


def squeal_cpu_per_krow(ports_pids: dict[int, int], load: Load, seconds: float) -> tuple[float, float, int, float]:
    """(CPU ms per 1,000 rows read, rows read / rows written, rows read, delete writes per 1,000 rows read) over
    `seconds` of the running load. The writes tell how much cross-shard batching each mode got: one process
    packs every shard's deletes for a destination into shared writes, a worker only its own shards'."""
    pids = list(ports_pids.values())
    rows0 = sum(metric_sum(p, "squeal_rows_total") for p in ports_pids)
    writes0 = sum(metric_sum(p, "squeal_delete_writes_total") for p in ports_pids)
    cpu0, w0 = cpu_seconds(pids), load.rows
    time.sleep(seconds)
    rows1 = sum(metric_sum(p, "squeal_rows_total") for p in ports_pids)
    writes1 = sum(metric_sum(p, "squeal_delete_writes_total") for p in ports_pids)
    cpu1, w1 = cpu_seconds(pids), load.rows
    read = int(rows1 - rows0)
    per_krow = 1000 / max(1, read)
    return (cpu1 - cpu0) * 1000 * per_krow, read / max(1, w1 - w0), read, (writes1 - writes0) * per_krow


def zk_requests(pids: list[int], members: list[ZooKeeper]) -> int:
    """Requests (pings included) the ensemble has received so far on the sessions of processes `pids`: each
    server's `cons` (packets received per connection), matched to the processes by their client ports."""
    mine = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            mine |= {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.raddr}
    total = 0
    for m in members:
        try:
            with socket.create_connection((m.host, m.port), timeout=2) as conn:
                conn.sendall(b"cons")
                reply = b""
                while chunk := conn.recv(65536):
                    reply += chunk
        except OSError:
            continue
        for port, received in re.findall(r":(\d+)\[\d+\]\([^)]*?recved=(\d+)", reply.decode(errors="replace")):
            if int(port) in mine:
                total += int(received)
    return total


def single_topology(env: Pool) -> Path:
    text = env.topology.read_text().replace("squeal_pool = true\n", "")
    text = re.sub(
        r'\[\[regions\.east\.squeal_instances\]\]\nname = "w\d"\nmetrics_port = \d+\nhost = "[^"]*"\n', "", text
    )
    text = re.sub(r"\n\[regions\.east\.squeal_placement\]\n[^\[]*", "\n", text)
    path = env.base / "single.toml"
    path.write_text(text)
    return path


def idle_cpu(pids: list[int], seconds: float) -> float:
    """CPU ms per second of the processes `pids` over `seconds`: what they cost with nothing to deliver (the
    load paused 2 s before, so that its last rows are delivered first)."""
    time.sleep(2.0)
    cpu0, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pids) - cpu0) * 1000 / (time.monotonic() - t0)


def costs(env: Pool, rounds: int, seconds: float, load: Load) -> list[tuple[str, float, float, int, float]]:
    single = SquealDaemon(single_topology(env), "east", port=free_port(), workdir=env.base / "single")

    def single_health() -> dict:
        with contextlib.suppress(OSError):
            return healthz(single.port)[1]
        return {}

    out = []
    for r in range(rounds):
        for mode in ("single", "pool"):
            if mode == "single":
                single.start()
                wait_until(
                    lambda: set(single_health().get("shards") or {}) == set(SHARDS),
                    DEADLINE,
                    "the single daemon running every shard",
                )
                time.sleep(3.0)  # past its start-up
                figure = squeal_cpu_per_krow({single.port: single.pid}, load, seconds)
                if load.idle_seconds:
                    load.paused.set()
                    idle = idle_cpu([single.pid], load.idle_seconds)
                    load.paused.clear()
                    print(f"  round {r + 1} single idle: {idle:.1f} ms CPU per second", flush=True)
                single.stop(grace=10)
            else:
                for n in ("w1", "w2"):
                    env.workers[n].start()
                running_everywhere(env, ("w1", "w2"))
                time.sleep(3.0)
                pids = [env.workers[n].pid for n in ("w1", "w2")]
                asked, t0 = zk_requests(pids, env.zk), time.monotonic()
                figure = squeal_cpu_per_krow({env.ports[n]: env.workers[n].pid for n in ("w1", "w2")}, load, seconds)
                rate = (zk_requests(pids, env.zk) - asked) / (time.monotonic() - t0) / len(pids)
                print(f"  round {r + 1} pool: {rate:.1f} ZooKeeper requests/s per worker (pings included)", flush=True)
                if load.idle_seconds:
                    load.paused.set()
                    idle = idle_cpu(pids, load.idle_seconds)
                    load.paused.clear()
                    print(f"  round {r + 1} pool idle: {idle:.1f} ms CPU per second (both workers)", flush=True)
                for n in ("w1", "w2"):
                    env.workers[n].stop(grace=10)
            out.append((mode, *figure))
            print(
                f"  round {r + 1} {mode}: {figure[0]:.2f} ms CPU per 1,000 rows, {figure[2]} rows read "
                f"({figure[1]:.3f} of those written), {figure[3]:.0f} delete writes per 1,000 rows; {loadavg()}",
                flush=True,
            )

    return out


BACKLOG_TXN_ROWS = 100


def write_backlog(env: Pool, rows: int, first: int) -> tuple[dict[str, g.Position], int]:
    """`rows` rows over the shards (100-row transactions, row i on shard i % 4, ids from `first`): each shard's
    binlog position after them, and the transactions written."""
    per = rows // len(SHARDS)
    txns = 0
    for j, db in enumerate(env.dbs):
        with db.connect(env.schema) as conn, conn.cursor() as cur:
            for start in range(0, per, BACKLOG_TXN_ROWS):
                ids = [first + j + len(SHARDS) * (start + k) for k in range(min(BACKLOG_TXN_ROWS, per - start))]
                # autocommit is on: the explicit BEGIN/COMMIT makes the 100 INSERTs one transaction
                cur.execute("BEGIN")
                cur.executemany("INSERT INTO users VALUES (%s, %s, 'backlog')", [(i, f"b{i}@backlog") for i in ids])
                cur.execute("COMMIT")
                txns += 1
    return {s: g.parse_position(db.gtid_binlog_pos()) for s, db in zip(SHARDS, env.dbs, strict=True)}, txns


def caught_up(ports: list[int], ends: dict[str, g.Position]) -> bool:
    """Every flow of every shard, in whichever of the processes on `ports` runs it, acknowledged its end."""
    done: set[str] = set()
    for port in ports:
        try:
            shards = healthz(port)[1].get("shards") or {}
        except OSError:
            continue
        for shard, st in shards.items():
            flows = st.get("flows") or {}
            if flows and all(g.covers_position(g.parse_position(f["acked"]), ends[shard]) for f in flows.values()):
                done.add(shard)
    return done == set(SHARDS)


def rows_read(ports: list[int]) -> float:
    return sum(metric_sum(p, 'squeal_rows_total{reader="live"') for p in ports)


def transactions_read(ports: list[int]) -> float:
    return sum(metric_sum(p, 'squeal_transactions_total{reader="live"') for p in ports)


def throughputs(env: Pool, rounds: int, backlog: int) -> list[tuple[str, float, float, int]]:
    """(mode, rows/s from the first shard running to caught up, seconds from the processes' start to caught up,
    rows read) per round and mode."""
    single = SquealDaemon(single_topology(env), "east", port=free_port(), workdir=env.base / "single-tp")
    workers = [env.workers[n] for n in ("w1", "w2")]

    def shards_running(ports: list[int]) -> int:
        n = 0
        for port in ports:
            with contextlib.suppress(OSError):
                n += len(healthz(port)[1].get("shards") or {})
        return n

    def start(mode: str) -> tuple[list[int], float]:
        """The mode's ports, and when its first shard ran (a pool's shards start one by one as they are placed)."""
        if mode == "single":
            single.start()
            ports = [single.port]
        else:
            for w in workers:
                w.start()
            ports = [env.ports[n] for n in ("w1", "w2")]
        wait_until(lambda: shards_running(ports) > 0, DEADLINE, f"a shard running in {mode}", interval=0.02)
        return ports, time.monotonic()

    def stop(mode: str) -> None:
        for d in [single] if mode == "single" else workers:
            d.stop(grace=10)

    for mode in ("single", "pool"):  # markers at "now" for both, before any backlog
        ports, _ = start(mode)
        wait_until(lambda p=ports: shards_running(p) == len(SHARDS), DEADLINE, f"every shard running in {mode}")
        stop(mode)
    out = []
    first = 50_000_000
    for r in range(rounds):
        ends, txns = write_backlog(env, backlog, first)  # both modes' markers are where the last backlog ended
        first += backlog + len(SHARDS)
        for mode in ("single", "pool") if r % 2 == 0 else ("pool", "single"):
            t0 = time.monotonic()
            ports, t_first = start(mode)
            wait_until(functools.partial(caught_up, ports, ends), 600, f"{mode} to catch up", interval=0.05)
            t_done = time.monotonic()
            read = rows_read(ports)
            transactions = transactions_read(ports)
            stop(mode)
            check_transactions(transactions, txns, f"round {r + 1} {mode}")
            rate = read / (t_done - t_first)
            out.append((mode, rate, t_done - t0, int(read)))
            print(
                f"  round {r + 1} {mode}: {read:.0f} rows in {t_done - t_first:.2f} s from its first shard running "
                f"= {rate:,.0f} rows/s; {t_done - t0:.2f} s from the start ({t_first - t0:.2f} s to the first "
                f"shard); {transactions:.0f} transactions of {BACKLOG_TXN_ROWS} rows; {loadavg()}",
                flush=True,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--moves", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=400.0)
    ap.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="also measure throughput: rows per round both modes catch up on (0: skip; e.g. 200000)",
    )
    ap.add_argument(
        "--idle-seconds",
        type=float,
        default=0.0,
        help="after each cost round, this long with the load paused: each mode's CPU with nothing to deliver",
    )
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="squeal-pool-bench-"))
    dbs = [MariaDB(server_id=500 + i, workdir=base / f"s{i}", gtid_domain_id=50 + i) for i in range(len(SHARDS))]
    with ensemble(base / "zk") as zk:
        try:
            for db in dbs:
                db.start()
            env = Pool(base / "pool", dbs, zk, placement=PLACEMENT)
            load = Load(env, args.rate)
            load.idle_seconds = args.idle_seconds
            load.start()
            print(
                f"{len(SHARDS)} shards, 3 workers, session timeout 2 s, {args.rate:g} rows/s background; {loadavg()}",
                flush=True,
            )
            try:
                for n in ("w1", "w2", "w3"):
                    env.workers[n].start()
                running_everywhere(env, ("w1", "w2", "w3"))
                if args.kills:
                    times = sorted(failovers(env, args.kills))
                    print(
                        f"failover over {len(times)} kill -9s: min {times[0] * 1000:.0f} ms, p50 "
                        f"{pct(times, 0.5) * 1000:.0f} ms, p90 {pct(times, 0.9) * 1000:.0f} ms, p99 "
                        f"{pct(times, 0.99) * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms",
                        flush=True,
                    )
                if args.moves:
                    during, between, spans = planned_moves(env, args.moves)
                    print(
                        f"planned moves: {len(spans)}, request -> running on the target p50 "
                        f"{pct(sorted(spans), 0.5) * 1000:.0f} ms, max {max(spans) * 1000:.0f} ms; moving shard's "
                        f"commit -> gone during moves ({len(during)} probes) p50 {pct(during, 0.5) * 1000:.1f} ms, "
                        f"p99 {pct(during, 0.99) * 1000:.1f} ms, max {during[-1] * 1000:.1f} ms; between moves "
                        f"({len(between)} probes) p50 {pct(between, 0.5) * 1000:.1f} ms, p99 "
                        f"{pct(between, 0.99) * 1000:.1f} ms",
                        flush=True,
                    )
                for n in ("w1", "w2", "w3"):
                    env.workers[n].stop(grace=10)
                if args.rounds:
                    figures = costs(env, args.rounds, args.seconds, load)
                    s = sorted(f[1] for f in figures if f[0] == "single")
                    p = sorted(f[1] for f in figures if f[0] == "pool")
                    print(
                        f"cost: squeal CPU per 1,000 rows, single median {pct(s, 0.5):.2f} ms, pool median "
                        f"{pct(p, 0.5):.2f} ms: pool / single {pct(p, 0.5) / pct(s, 0.5):.3f}",
                        flush=True,
                    )
                if args.backlog:
                    load.paused.set()
                    tp = Pool(base / "throughput", dbs, zk)
                    try:
                        figures2 = throughputs(tp, max(args.rounds, 1), args.backlog)
                    finally:
                        tp.stop()
                        load.paused.clear()
                    s = sorted(f[1] for f in figures2 if f[0] == "single")
                    p = sorted(f[1] for f in figures2 if f[0] == "pool")
                    pairs = [dict((m, f) for m, f, *_ in figures2[i : i + 2]) for i in range(0, len(figures2), 2)]
                    ratios = [pair["pool"] / pair["single"] for pair in pairs]
                    print(
                        f"throughput: rows/s catching up on {args.backlog:,} rows, single median {pct(s, 0.5):,.0f}, "
                        f"pool median {pct(p, 0.5):,.0f}: pool / single {pct(p, 0.5) / pct(s, 0.5):.3f} "
                        f"(per round: {', '.join(f'{x:.2f}' for x in ratios)})",
                        flush=True,
                    )
            finally:
                load.stop()
                env.stop()
        finally:
            for db in dbs:
                db.stop(grace=5)
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
