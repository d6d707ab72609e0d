"""One squeal process over 1, 2, 4, 8 shards (not a test: prints figures for docs/benchmarks.md).

    .venv/bin/python bench/squeal_shards.py [--shards 1,2,4,8] [--rows 200000] [--rate 400] [--seconds 20]
        [--flush-ms 0.5[,2,5]] [--only replay|live|idle|lone] [--idle-seconds 30] [--lone-rate 50]
        [--delivery native[,python]]

1. Cost per row: `--rows` row changes (transactions of 10 single-row INSERTs, then 10 UPDATEs) spread evenly
   over N shards (one MariaDB primary each, its own GTID domain) are read by one `squeal run` process from
   datamarkers set just before the load, through every shard's pipeline to two memcached "clusters" (with
   `--delivery native,python`, one process per delivery in turn over the same binlogs). Reported:
   rows per CPU-second of the squeal process (all threads) from /healthz answering to every flow having
   acknowledged the last GTID of its shard, as a ratio to the 1-shard figure of the same run (target >= 0.8:
   sharding must not cost per row), the wall-clock rows/s over the same window and its ratio to 1 shard (issue
   33: >= 1.6x at 4 shards on 2 cores, once the per-transaction work is off the GIL), and squeal's RSS at the
   end, per shard.
2. Aggregation: a paced write load of `--rate` single-row transactions per second in total (2 keys each), from
   8 writer connections spread round robin over the N shards for `--seconds` (the rate reported is the one the
   writers achieved: a busy box may not reach `--rate`), while squeal follows live. Reported: deletes per
   write (squeal_deletes_per_write: mean, median interpolated in its buckets as Prometheus' histogram_quantile
   does, and the share of writes carrying more than 16), which should grow with N at a fixed total rate, since
   the shards' batches to one cluster share one connection and one write; writes and deletes per second per
   cluster (from the load's start to the last acknowledgement), the delivery latency (binlog read -> delete
   acknowledged, p50 and p99 interpolated) that the packing costs, squeal's CPU time per 1,000 transactions
   (all threads, same window), and how long after the load the last delete was acknowledged (> ~1 s: squeal
   fell behind the load, and its read-to-ack latency alone does not show it).
   `--flush-ms` repeats the live rounds for each `[squeal] flush_interval_ms` given: how much a longer
   coalescing window packs, and what it adds to the latency.
3. Idle (`--only idle`): the same process over N shards with nothing written, its CPU per second over
   `--idle-seconds` in three modes: quiet (nothing asks it anything), scraped (/metrics read once a second,
   as the monitoring server does) and probed (scraped, plus one single-row transaction a second on every
   shard, as the canary prober commits); the cost of each shard above the first (issue 33's fixed cost:
   <= 1 ms CPU/s an idle shard); and the CPU of one /metrics scrape (300 back to back, less the quiet rate).
4. Lone transactions (`--only lone`, `--lone-rate 50`): one shard sent single-row transactions one at a time,
   the CPU each costs above the quiet rate, by thread (user and system).
The replay part also prints squeal's CPU per 1,000 rows by thread, user and system.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
from squeal_throughput import check_transactions, thread_times

from monitoring.panels import quantile
from ops.harness import MariaDB, Memcached, SquealDaemon, free_port, wait_until
from squeal import probe_health

DOMAIN = 30  # shard i runs in GTID domain 30 + i
WRITERS = 8  # writer connections of the live load, spread round robin over the shards
SCHEMA = "CREATE TABLE users (id INT PRIMARY KEY, email VARCHAR(200), name VARCHAR(200), n INT) ENGINE=InnoDB"


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def metric_sum(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def health(port: int) -> dict:
    return probe_health(f"127.0.0.1:{port}", timeout=5)[1]


DELIVERY = {"setting": "native"}  # [squeal] delivery of the round being run (--delivery)


def topology(dbs: list[MariaDB], schema: str, caches: list[Memcached], flush_ms: float = 0.5) -> str:
    shards = "".join(
        f"[shards.s{i}]\ngtid_domain_id = {DOMAIN + i}\neast = {{ port = {db.port}, server_id = {db.server_id} }}\n"
        for i, db in enumerate(dbs)
    )
    clusters = "".join(
        f'[regions.east.clusters.c{i}]\nrouters = ["127.0.0.1:{m.port}"]\n'
        f'pools.wildcard = {{ kind = "wildcard", servers = ["127.0.0.1:{free_port()}"] }}\n'
        for i, m in enumerate(caches)
    )
    # max_backlog above any round's keys: no flow is shed to a catch-up reader (which would read rows twice)
    return (
        f'[squeal]\ndatamarker_dir = "dm"\nmetrics_port_base = {free_port()}\nmax_backlog = 5000000\n'
        f'flush_interval_ms = {flush_ms}\ndelivery = "{DELIVERY["setting"]}"\n{shards}'
        f'[[rules]]\ntable = "{schema}.users"\nkeys = ["user:{{id}}", "user:email:{{email}}"]\n'
        f"[regions.east]\nmaster = true\n{clusters}"
    )


def load(db: MariaDB, schema: str, rows: int, txns: list[int]) -> None:
    """rows/2 INSERTs then rows/2 UPDATEs, 10 statements per transaction (autocommit off: each `commit()`
    ends one); adds the transactions written to `txns`."""
    n = rows // 2
    with db.connect(schema, autocommit=False) as conn, conn.cursor() as cur:
        for phase in ("insert", "update"):
            for start in range(1, n + 1, 10):
                for i in range(start, min(start + 10, n + 1)):
                    if phase == "insert":
                        cur.execute("INSERT INTO users VALUES (%s, %s, %s, 0)", (i, f"u{i}@x", f"name {i}"))
                    else:
                        cur.execute("UPDATE users SET n = n + 1, email = %s WHERE id = %s", (f"v{i}@x", i))
                conn.commit()
                txns.append(1)


def write_markers(state: Path, shards: int, positions: list[str], clusters: int) -> None:
    for i in range(shards):
        d = state / "shards" / f"s{i}"
        d.mkdir(parents=True, exist_ok=True)
        for c in range(clusters):
            doc = {"flow": f"c{c}", "position": positions[i], "saved_at": time.time()}
            (d / f"c{c}.marker").write_text(json.dumps(doc) + "\n")


def seq(position: str, domain: int) -> int:
    for part in position.split(","):
        d, _, n = part.split("-")
        if int(d) == domain:
            return int(n)
    return 0


def acked_all(daemon: SquealDaemon, targets: dict[str, int]) -> bool:
    flows = health(daemon.port).get("flows", {})
    for name, flow in flows.items():
        shard = name.split("/", 1)[0]
        if seq(flow["acked"], DOMAIN + int(shard[1:])) < targets[shard]:
            return False
    return bool(flows)


def thread_delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """(user, system) seconds each kind of thread used between two `thread_times` readings."""
    zero = (0.0, 0.0)
    return {k: (u - before.get(k, zero)[0], s - before.get(k, zero)[1]) for k, (u, s) in after.items()}


def by_thread(threads: dict[str, tuple[float, float]], per: float, unit: str) -> str:
    """`name user U sys S` for each kind of thread, in ms per `unit` (`per` of them in the window)."""
    return (
        "; ".join(
            f"{name} user {1000 * u / per:.2f} sys {1000 * s / per:.2f}"
            for name, (u, s) in sorted(threads.items(), key=lambda kv: -sum(kv[1]))
            if u + s > 0
        )
        + f" (ms per {unit})"
    )


def cpu_seconds(procs: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def replay_rounds(
    base: Path, dbs: list[MariaDB], caches: list[Memcached], rows: int, deliveries: list[str]
) -> list[dict]:
    """`rows` written over the shards once, then replayed by one process per delivery in turn (the same binlogs)."""
    n = len(dbs)
    schema = f"bench_{n}_{int(time.time()) % 100000}"
    for db in dbs:
        db.execute(f"CREATE DATABASE {schema}", f"USE {schema}", SCHEMA)
    before = [db.gtid_binlog_pos() for db in dbs]
    txns: list[int] = []  # (list.append is atomic across the loaders' threads)
    threads = [threading.Thread(target=load, args=(db, schema, rows // n, txns)) for db in dbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = {f"s{i}": seq(db.gtid_binlog_pos(), DOMAIN + i) for i, db in enumerate(dbs)}
    out = []
    for d in deliveries:
        DELIVERY["setting"] = d
        r = replay_round(base / f"replay-{n}-{d}", dbs, caches, schema, before, after, len(txns))
        out.append({**r, "delivery": d})
    DELIVERY["setting"] = deliveries[0]
    return out


def replay_round(
    work: Path,
    dbs: list[MariaDB],
    caches: list[Memcached],
    schema: str,
    before: list[str],
    after: dict[str, int],
    txns: int,
) -> dict:
    """One `squeal run` from `before` until every flow acknowledged `after`."""
    n = len(dbs)
    work.mkdir()
    (work / "topology.toml").write_text(topology(dbs, schema, caches))
    write_markers(work / "state", n, before, len(caches))
    daemon = SquealDaemon(work / "topology.toml", "east", workdir=work, state_dir=work / "state")
    daemon.start()
    try:
        proc = psutil.Process(daemon.proc.pid)
        # the servers squeal reads from and writes to share the 2 cores: their CPU over the window says how
        # much of the box was left for squeal (the MariaDB binlog dumps above all)
        others = [psutil.Process(s.pid) for s in [*dbs, *caches] if s.pid is not None]
        cpu0, others0, box0 = sum(proc.cpu_times()[:2]), cpu_seconds(others), psutil.cpu_times()
        threads0 = thread_times(proc.pid)
        rows0 = metric_sum(scrape(daemon.port), "squeal_rows_total")
        t0 = time.monotonic()
        wait_until(lambda: acked_all(daemon, after), 600, "every shard's flows to acknowledge the load", interval=0.05)
        wall = time.monotonic() - t0
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        threads = thread_delta(threads0, thread_times(proc.pid))
        servers_cpu = cpu_seconds(others) - others0
        box1 = psutil.cpu_times()
        box_busy = sum(box1) - box1.idle - box1.iowait - (sum(box0) - box0.idle - box0.iowait)
        text = scrape(daemon.port)
        rows_read = metric_sum(text, "squeal_rows_total") - rows0
        counted = metric_sum(text, 'squeal_transactions_total{reader="live"')
        rss = proc.memory_info().rss / 2**20
    finally:
        daemon.stop(grace=10)
    check_transactions(counted, txns, f"replay over {n} shards (10-row transactions)")
    return {
        "shards": n,
        "rows": rows_read,
        "cpu_s": cpu,
        "wall_s": wall,
        "rows_per_cpu_s": rows_read / cpu,
        "rss_mb": rss,
        "squeal_cores": cpu / wall,
        "servers_cores": servers_cpu / wall,  # the MariaDB primaries and memcacheds
        "box_cores": box_busy / wall,  # everything the box ran over the window
        "threads": threads,  # name -> (user, system) CPU seconds over the window
    }


IDLE_MODES = ("quiet", "scraped", "probed")


def idle_round(base: Path, dbs: list[MariaDB], caches: list[Memcached], seconds: float) -> dict:
    """The fixed cost: one `squeal run` over N shards with nothing written, CPU over `seconds` in each of three
    modes one after the other: `quiet` (nothing asks it anything), `scraped` (its /metrics read once a second,
    as the monitoring server does), `probed` (scraped, and one single-row transaction a second committed on
    every shard, as the monitoring server's canary prober does: a deployment's "idle" shard is never idle)."""
    n = len(dbs)
    schema = f"idle_{n}_{int(time.time()) % 100000}"
    for db in dbs:
        db.execute(f"CREATE DATABASE {schema}", f"USE {schema}", SCHEMA, "INSERT INTO users VALUES (1, 'a@x', 'a', 0)")
    work = base / f"idle-{n}"
    work.mkdir()
    (work / "topology.toml").write_text(topology(dbs, schema, caches))
    write_markers(work / "state", n, [db.gtid_binlog_pos() for db in dbs], len(caches))
    daemon = SquealDaemon(work / "topology.toml", "east", workdir=work, state_dir=work / "state")
    daemon.start()
    conns = [db.connect(schema, autocommit=True) for db in dbs]
    result: dict = {"shards": n}
    try:
        proc = psutil.Process(daemon.proc.pid)
        time.sleep(3)  # start-up done: every reader connected, the first checkpoints written
        for mode in IDLE_MODES:
            cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
            tick = t0
            while (now := time.monotonic()) < t0 + seconds:
                if mode != "quiet":
                    scrape(daemon.port)
                if mode == "probed":
                    for conn in conns:
                        with conn.cursor() as cur:
                            cur.execute("UPDATE users SET n = n + 1 WHERE id = 1")
                tick += 1.0
                time.sleep(max(0.0, tick - time.monotonic()))
            cpu, wall = sum(proc.cpu_times()[:2]) - cpu0, now - t0
            result[f"{mode}_ms_per_s"] = 1000 * cpu / wall
        # one scrape's own cost: 300 back to back, less the quiet rate over the same time
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        for _ in range(300):
            scrape(daemon.port)
        cpu, wall = sum(proc.cpu_times()[:2]) - cpu0, time.monotonic() - t0
        result["ms_per_scrape"] = 1000 * (cpu - result["quiet_ms_per_s"] / 1000 * wall) / 300
        result["rss_mb"] = proc.memory_info().rss / 2**20
    finally:
        for conn in conns:
            conn.close()
        daemon.stop(grace=10)
    return result


def lone_round(base: Path, db: MariaDB, caches: list[Memcached], rate: float, seconds: float) -> dict:
    """A quiet shard's cost per transaction: single-row transactions `rate` a second, each alone (the shard idle
    between them), CPU by thread less the quiet rate measured just before."""
    schema = f"lone_{int(time.time()) % 100000}"
    db.execute(f"CREATE DATABASE {schema}", f"USE {schema}", SCHEMA, "INSERT INTO users VALUES (1, 'a@x', 'a', 0)")
    work = base / "lone"
    work.mkdir()
    (work / "topology.toml").write_text(topology([db], schema, caches))
    write_markers(work / "state", 1, [db.gtid_binlog_pos()], len(caches))
    daemon = SquealDaemon(work / "topology.toml", "east", workdir=work, state_dir=work / "state")
    daemon.start()
    conn = db.connect(schema, autocommit=True)
    try:
        time.sleep(3)  # start-up done
        quiet0, t0 = thread_times(daemon.proc.pid), time.monotonic()
        time.sleep(seconds)
        quiet = thread_delta(quiet0, thread_times(daemon.proc.pid))
        quiet_wall = time.monotonic() - t0
        busy0, t0 = thread_times(daemon.proc.pid), time.monotonic()
        sent, tick = 0, t0
        while time.monotonic() < t0 + seconds:
            with conn.cursor() as cur:
                cur.execute("UPDATE users SET n = n + 1 WHERE id = 1")
            sent += 1
            tick += 1 / rate
            time.sleep(max(0.0, tick - time.monotonic()))
        busy = thread_delta(busy0, thread_times(daemon.proc.pid))
        wall = time.monotonic() - t0
    finally:
        conn.close()
        daemon.stop(grace=10)
    scale = wall / quiet_wall  # the quiet rate over the busy window
    zero = (0.0, 0.0)
    threads = {k: (u - quiet.get(k, zero)[0] * scale, s - quiet.get(k, zero)[1] * scale) for k, (u, s) in busy.items()}
    return {"transactions": sent, "rate": sent / wall, "threads": threads}


def histogram_buckets(text: str, name: str) -> dict[float, float]:
    """{upper bound: cumulative count} of histogram `name`, summed over its series (every flow)."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = float(line.split('le="', 1)[1].split('"', 1)[0])  # ("+Inf" reads as inf)
            buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def live_round(
    base: Path, dbs: list[MariaDB], caches: list[Memcached], rate: float, seconds: float, flush_ms: float
) -> dict:
    n = len(dbs)
    schema = f"live_{n}_{int(time.time() * 1000) % 10000000}"
    for db in dbs:
        db.execute(f"CREATE DATABASE {schema}", f"USE {schema}", SCHEMA)
    work = base / f"live-{n}-{flush_ms:g}ms"
    work.mkdir()
    (work / "topology.toml").write_text(topology(dbs, schema, caches, flush_ms))
    daemon = SquealDaemon(work / "topology.toml", "east", workdir=work, state_dir=work / "state")
    daemon.start()
    started = time.monotonic()
    stop = started + seconds
    writers = max(n, WRITERS)  # the same writers whatever N: one shard is not held back by a single connection
    sent = [0] * writers

    def writer(j: int) -> None:  # rate/writers transactions a second on shard j % n, paced by the clock, until `stop`
        interval = writers / rate
        with dbs[j % n].connect(schema) as conn, conn.cursor() as cur:
            k, next_at = 0, time.monotonic()
            while time.monotonic() < stop:  # (a box too busy for the rate ends on time, at a lower rate)
                k += 1
                row = k * writers + j  # (unique on the shard whichever writers share it)
                cur.execute("INSERT INTO users VALUES (%s, %s, 'x', 0)", (row, f"e{row}@x"))
                sent[j] += 1
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

    try:
        proc = psutil.Process(daemon.proc.pid)
        cpu0 = sum(proc.cpu_times()[:2])
        threads = [threading.Thread(target=writer, args=(j,)) for j in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        loaded = time.monotonic()
        targets = {f"s{i}": seq(db.gtid_binlog_pos(), DOMAIN + i) for i, db in enumerate(dbs)}
        wait_until(lambda: acked_all(daemon, targets), 120, "the live load to be acknowledged", interval=0.05)
        done = time.monotonic()  # (a squeal that lags behind the load is still working after it: `behind_s`)
        cpu = sum(proc.cpu_times()[:2]) - cpu0  # (from the load's start until all of it is acknowledged)
        text = scrape(daemon.port)
    finally:
        daemon.stop(grace=10)
    counted = metric_sum(text, 'squeal_transactions_total{reader="live"')
    check_transactions(counted, sum(sent), f"live round over {n} shards (single-row transactions)")
    deletes = metric_sum(text, "squeal_deletes_per_write_sum")
    writes = metric_sum(text, "squeal_deletes_per_write_count")
    per_write = histogram_buckets(text, "squeal_deletes_per_write")
    latency = histogram_buckets(text, "squeal_delivery_latency_seconds")
    return {
        "shards": n,
        "flush_ms": flush_ms,
        "txn_per_s": sum(sent) / (loaded - started),  # what the writers achieved (at most `rate`)
        "deletes_per_write_mean": deletes / max(writes, 1),
        "deletes_per_write_median": quantile(0.5, per_write),
        "over_16": 1 - per_write.get(16.0, 0.0) / max(writes, 1),
        "writes_per_s": writes / (done - started) / len(caches),  # per cluster (each gets the same keys)
        "deletes_per_s": deletes / (done - started) / len(caches),
        "behind_s": done - loaded,
        "latency_p50_ms": 1000 * (quantile(0.5, latency) or 0.0),
        "latency_p99_ms": 1000 * (quantile(0.99, latency) or 0.0),
        "cpu_ms_per_1k_txn": 1e6 * cpu / max(1, sum(sent)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", default="1,2,4,8", help="shard counts to measure (default %(default)s)")
    p.add_argument("--rows", type=int, default=200_000, help="row changes per replay round, over all shards")
    p.add_argument("--rate", type=float, default=400, help="live transactions per second, over all shards")
    p.add_argument("--seconds", type=float, default=20, help="live load duration per shard count")
    p.add_argument(
        "--only",
        choices=("replay", "live", "idle", "lone"),
        default=None,
        help="run one part; `idle` (only when asked for): the process's CPU per second with nothing written",
    )
    p.add_argument(
        "--idle-seconds", type=float, default=30, help="the idle part's window per shard count (and lone's windows)"
    )
    p.add_argument("--lone-rate", type=float, default=50, help="`lone`: single-row transactions a second")
    p.add_argument("--flush-ms", default="0.5", help="[squeal] flush_interval_ms of the live rounds, a list")
    p.add_argument(
        "--delivery",
        default="native",
        help="[squeal] delivery, a list: the replay rounds run each one in turn, on the same binlogs, and compare "
        "them with the first (the other parts run the first only); default %(default)s",
    )
    args = p.parse_args()
    deliveries = args.delivery.split(",")
    for d in deliveries:
        if d not in ("native", "python"):
            p.error(f"--delivery: {d!r} is not native or python")
    DELIVERY["setting"] = deliveries[0]
    counts = [int(c) for c in args.shards.split(",")]
    base = Path(tempfile.mkdtemp(prefix="squeal-shards-"))
    dbs = [MariaDB(500 + i, workdir=base / f"db{i}", gtid_domain_id=DOMAIN + i) for i in range(max(counts))]
    caches = [Memcached(workdir=base / "mc") for _ in range(2)]
    try:
        for proc in [*dbs, *caches]:
            proc.start()
        print(
            f"# squeal over 1..{max(counts)} shards, {args.rows} rows per replay round, {os.cpu_count()} cores, "
            f"deliveries {args.delivery}, load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if args.only == "lone":
            r = lone_round(base, dbs[0], caches, args.lone_rate, args.idle_seconds)
            per = r["transactions"]
            cpu = sum(u + s for u, s in r["threads"].values())
            print(
                f"\n{per} lone single-row transactions at {r['rate']:.0f}/s on one shard: {1000 * cpu / per:.3f} ms of "
                f"CPU each above the quiet rate; by thread: {by_thread(r['threads'], per, 'transaction')}"
            )
            return 0
        if args.only == "idle":
            idles = [idle_round(base, dbs[:n], caches, args.idle_seconds) for n in counts]
            print(
                "\n| shards | CPU ms/s: quiet | scraped | probed | per shard above the first: quiet | scraped | "
                "probed | CPU ms a scrape | RSS MB |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            first = idles[0]
            for r in idles:
                more = r["shards"] - first["shards"]
                extra = [
                    (r[f"{m}_ms_per_s"] - first[f"{m}_ms_per_s"]) / more if more else float("nan") for m in IDLE_MODES
                ]
                print(
                    f"| {r['shards']} | "
                    + " | ".join(f"{r[f'{m}_ms_per_s']:.2f}" for m in IDLE_MODES)
                    + " | "
                    + " | ".join(f"{e:.2f}" for e in extra)
                    + f" | {r['ms_per_scrape']:.2f} | {r['rss_mb']:.0f} |"
                )
            return 0
        replays = []
        if args.only != "live":
            for n in counts:
                replays += replay_rounds(base, dbs[:n], caches, args.rows, deliveries)
        if replays:
            print(
                "\n| delivery | shards | rows | squeal CPU s | rows / CPU-s | vs 1 shard | vs "
                f"{deliveries[0]} | rows/s (wall) | vs 1 shard (wall) | RSS MB | RSS MB per shard "
                "| cores: squeal / servers / whole box |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in replays:
            one = next(o for o in replays if o["delivery"] == r["delivery"])  # its first shard count
            first = next(o for o in replays if o["shards"] == r["shards"])  # the first delivery's
            wall, wall_one = r["rows"] / r["wall_s"], one["rows"] / one["wall_s"]
            print(
                f"| {r['delivery']} | {r['shards']} | {r['rows']:.0f} | {r['cpu_s']:.2f} | "
                f"{r['rows_per_cpu_s']:,.0f} | {r['rows_per_cpu_s'] / one['rows_per_cpu_s']:.2f}x | "
                f"{r['rows_per_cpu_s'] / first['rows_per_cpu_s']:.2f}x | {wall:,.0f} | {wall / wall_one:.2f}x | "
                f"{r['rss_mb']:.0f} | {r['rss_mb'] / r['shards']:.0f} | {r['squeal_cores']:.2f} / "
                f"{r['servers_cores']:.2f} / {r['box_cores']:.2f} |"
            )
        for r in replays:
            print(
                f"{r['delivery']}, {r['shards']} shard(s), by thread: "
                f"{by_thread(r['threads'], r['rows'] / 1000, '1,000 rows')}"
            )
        if args.only == "replay":
            return 0
        flushes = [float(f) for f in args.flush_ms.split(",")]
        lives = [live_round(base, dbs[:n], caches, args.rate, args.seconds, f) for f in flushes for n in counts]
        print(
            "\n| flush ms | shards | txn/s (all shards) | writes/s per cluster | deletes/s per cluster "
            "| deletes per write: mean | median | writes > 16 | delivery p50 ms | p99 ms | squeal CPU ms / 1k txn "
            "| last ack after the load, s |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in lives:
            print(
                f"| {r['flush_ms']:g} | {r['shards']} | {r['txn_per_s']:.0f} | {r['writes_per_s']:.0f} | "
                f"{r['deletes_per_s']:.0f} | {r['deletes_per_write_mean']:.2f} | "
                f"{r['deletes_per_write_median'] or 0:.1f} | {r['over_16']:.0%} | {r['latency_p50_ms']:.1f} | "
                f"{r['latency_p99_ms']:.1f} | {r['cpu_ms_per_1k_txn']:.0f} | {r['behind_s']:.1f} |"
            )
        print(f"\nload average at the end: {os.getloadavg()}")
    finally:
        for proc in [*caches, *dbs]:
            proc.stop(grace=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
