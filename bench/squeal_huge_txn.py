"""One huge transaction: how long until squeal has deleted all its keys, against bare decode (not a test).

    .venv/bin/python bench/squeal_huge_txn.py [--rows 100000] [--repeat 3] [--reader native|python]

Each pair: every key of `--rows` new users rows (`user:{id}`, `user:email:{email}`: two distinct keys per
row) is set in two memcached "clusters"; one transaction INSERTs the rows (multi-row statements of 1,000
rows, one COMMIT) while `squeal run` (default `max_backlog` = 100,000 keys, half the transaction's keys)
follows the binlog live. squeal's time runs from COMMIT returning to both clusters having acknowledged the
transaction's GTID (`/healthz` polled every 20 ms); then every key is checked gone from both clusters.
Right after, bare python-mysql-replication decodes the same transaction (same library options as squeal's
reader, nothing else done), then `mariadb-binlog --read-from-remote-server -v` (the "C decoder") decodes
it to /dev/null. ratio = squeal's commit -> all keys deleted / bare decode (lower is better; its inverse is
the "x bare" speed-up). The median pair is reported with every pair, squeal's sheds (must be 0), its RSS
(before, peak while the pair ran) and the CPU that squeal and the two memcacheds used from COMMIT to the
acknowledgement (on a 2-core box, the memcacheds' deletes share the cores with squeal: their CPU is part of
the wall-clock time). `--reader` is the daemon's `[squeal] reader` (default native). Each pair stops the bench
unless squeal counted exactly one transaction.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "squeal"))
from squeal_helpers import Cache, topology_text
from squeal_throughput import (
    bare_decode,
    c_decoder,
    check_transactions,
    cpu_seconds,
    create_schema,
    loadavg,
    metric_sum,
)

from ops.harness import MariaDB, Memcached, SquealDaemon
from squeal import fetch_health
from squeal.read import gtid as g


def health(port: int) -> dict:
    return fetch_health(f"127.0.0.1:{port}", timeout=5)[1]  # a 503 still carries the flows


def user_keys(ids: range) -> list[str]:
    return [f"user:{i}" for i in ids] + [f"user:email:u{i}@example.com" for i in ids]


def in_chunks(keys: list[str], n: int = 20_000):
    for i in range(0, len(keys), n):
        yield keys[i : i + n]


def one_pair(
    db: MariaDB, schema: str, caches: list[Cache], daemon: SquealDaemon, ids: range, memcached_pids: list[int]
) -> dict:
    keys = user_keys(ids)
    for c in caches:
        for part in in_chunks(keys):
            c.set_many(part)
        assert sum(len(c.present(part)) for part in in_chunks(keys)) == len(keys), "keys not cached"
    proc = psutil.Process(daemon.pid)
    rss_before = proc.memory_info().rss
    peak = [rss_before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    sheds0 = metric_sum(daemon.port, "squeal_flow_sheds_total")
    txns0 = metric_sum(daemon.port, 'squeal_transactions_total{reader="live"')
    start = db.gtid_binlog_pos()
    with db.connect(schema, autocommit=False) as conn, conn.cursor() as cur:
        rows = list(ids)
        cpu_before: tuple[float, float] | None = None
        t_write = time.perf_counter()
        for i in range(0, len(rows), 1000):
            part = rows[i : i + 1000]
            cur.execute(
                "INSERT INTO users VALUES " + ", ".join(["(%s, %s, 'n', 0)"] * len(part)),
                [v for j in part for v in (j, f"u{j}@example.com")],
            )
        cpu_before = cpu_seconds([daemon.pid]), cpu_seconds(memcached_pids)  # (squeal is idle until the commit)
        conn.commit()
        t_commit = time.perf_counter()
    end = g.parse_position(db.gtid_binlog_pos())
    dispatched = None
    while True:
        h = health(daemon.port)
        now = time.perf_counter()
        if dispatched is None and g.covers_position(g.parse_position(h["live_position"]), end):
            dispatched = now
        if all(g.covers_position(g.parse_position(f["acked"]), end) for f in h["flows"].values()):
            break
        if now - t_commit > 600:
            raise RuntimeError(f"squeal did not acknowledge the transaction in 600 s: {h}")
        time.sleep(0.02)
    t_acked = time.perf_counter()
    cpu_squeal, cpu_memcached = cpu_seconds([daemon.pid]) - cpu_before[0], cpu_seconds(memcached_pids) - cpu_before[1]
    stop.set()
    sampler.join()
    left = sum(len(c.present(part)) for c in caches for part in in_chunks(keys))
    if left:
        raise RuntimeError(f"{left} keys still cached after squeal acknowledged the transaction")
    sheds = metric_sum(daemon.port, "squeal_flow_sheds_total") - sheds0
    txns = metric_sum(daemon.port, 'squeal_transactions_total{reader="live"') - txns0
    check_transactions(txns, 1, "the huge transaction")  # one COMMIT: one transaction, whatever its statements
    bare_rows, bare_s, _ = bare_decode(db, schema, start, end)
    if bare_rows != len(ids):
        raise RuntimeError(f"bare decode read {bare_rows} rows, want {len(ids)}")
    c_s, _ = c_decoder(db, start, end)
    squeal_s = t_acked - t_commit
    return {
        "write_s": t_commit - t_write,
        "squeal_s": squeal_s,
        "read_s": (dispatched or t_acked) - t_commit,
        "bare_s": bare_s,
        "ratio": squeal_s / bare_s,
        "sheds": sheds,
        "keys": len(keys),
        "c_s": c_s,
        "rss_before_mb": rss_before / 2**20,
        "rss_peak_mb": peak[0] / 2**20,
        "cpu_squeal_s": cpu_squeal,
        "cpu_memcached_s": cpu_memcached,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reader", default="native", choices=("native", "python"))
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="squeal-huge-"))
    db = MariaDB(1, workdir=base / "db").start()
    mcs = [Memcached(workdir=base / "mc", memory_mb=512).start() for _ in range(2)]
    daemon = None
    caches: list[Cache] = []
    try:
        schema = "bench"
        create_schema(db, schema)
        topo = base / "topology.toml"
        text = topology_text(db, schema, [m.port for m in mcs], regional=False)  # max_backlog 100,000
        topo.write_text(text.replace("[squeal]\n", f'[squeal]\nreader = "{args.reader}"\n', 1))
        daemon = SquealDaemon(topo, "east", workdir=base / "squeal", state_dir=base / "state")
        daemon.start()
        caches = [Cache(m.port) for m in mcs]
        pairs = []
        for i in range(args.repeat):
            print(f"pair {i + 1}/{args.repeat}: {loadavg()}")
            p = one_pair(
                db, schema, caches, daemon, range(i * args.rows + 1, (i + 1) * args.rows + 1), [m.pid for m in mcs]
            )
            pairs.append(p)
            print(
                f"  one transaction of {args.rows:,} rows / {p['keys']:,} keys (written in {p['write_s']:.1f}s): "
                f"squeal commit -> every key deleted in both clusters {p['squeal_s']:.2f}s (read and handed "
                f"to the flows after {p['read_s']:.2f}s); bare decode {p['bare_s']:.2f}s; ratio {p['ratio']:.2f} "
                f"({1 / p['ratio']:.1f}x bare); C decoder {p['c_s']:.2f}s; "
                f"sheds {p['sheds']:.0f}; squeal RSS {p['rss_before_mb']:.0f} MB before, peak "
                f"{p['rss_peak_mb']:.0f} MB; CPU from commit to acknowledged: squeal {p['cpu_squeal_s']:.2f}s, "
                f"the two memcacheds {p['cpu_memcached_s']:.2f}s"
            )
        print(f"after the pairs: {loadavg()}")
        pairs.sort(key=lambda p: p["ratio"])
        mid = pairs[(len(pairs) - 1) // 2]
        ratios = ", ".join(f"{p['ratio']:.2f}" for p in pairs)
        print(
            f"RATIO squeal[{args.reader}] commit->deleted / bare decode: median {mid['ratio']:.2f} "
            f"({1 / mid['ratio']:.1f}x bare) of {len(pairs)} pairs ({ratios}); median pair squeal "
            f"{mid['squeal_s']:.2f}s, bare {mid['bare_s']:.2f}s, C decoder {mid['c_s']:.2f}s (squeal = "
            f"{mid['c_s'] / mid['squeal_s']:.2f} of C); sheds {sum(p['sheds'] for p in pairs):.0f}; peak RSS "
            f"{max(p['rss_peak_mb'] for p in pairs):.0f} MB"
        )
    finally:
        for c in caches:
            c.close()
        if daemon is not None:
            daemon.stop()
        for m in mcs:
            m.stop()
        db.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
