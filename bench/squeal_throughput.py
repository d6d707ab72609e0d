"""squeal throughput, batching and memory benchmark (not a test: prints figures for docs/benchmarks.md).

    .venv/bin/python bench/squeal_throughput.py [--rows 50000] [--repeat 3] [--readers native,python,native/python]
                                                [--dead-seconds 60] [--no-memory] [--tls] [--no-decoders] [--via-router]
                                                [--rows-per-txn 10] [--max-backlog N]

Transaction shape: every transaction this bench writes is `--rows-per-txn` single-row statements (default 10,
the shape of the figures in docs/benchmarks.md; `--rows-per-txn 1` writes single-row autocommit transactions,
the common OLTP shape), and every squeal replay checks that squeal counted exactly the transactions written
(`squeal_transactions_total{reader="live"}`): a bench that wrote another shape than it says fails.

1. Throughput: one binlog of `--rows` row changes (a 4-column table, transactions of `--rows-per-txn`
   single-row statements, half INSERTs, half UPDATEs; grown until every reader's window below lasts `--min-seconds`,
   default 2 s: the native reader needs several hundred thousand rows) is read by bare
   python-mysql-replication (decode every row, nothing else), by `mariadb-binlog --read-from-remote-server
   -v` decoding the same GTID range to /dev/null (the "C decoder": the limit), and by `squeal run` end to
   end with each of `--readers` (keys rendered, batched, sent to two memcached "clusters", acknowledged,
   datamarkers written). After one unmeasured warm-up decode, they alternate `--repeat` times over the same
   binlog; each round gives ratios (squeal rows/s / bare rows/s, squeal rows/s / C decoder rows/s) and the
   median round is reported, with every round and the load average (the machine is shared) printed. squeal's
   time runs from `/healthz` answering (the live reader starts with it; rows it had already read are
   subtracted) to both clusters having acknowledged the last GTID. Also reported: the CPU ratio, bare
   decode's CPU time / the squeal process's CPU time (all threads) over the same window, squeal's CPU per
   1,000 row changes, and its RSS at the end of the run (at full speed). A replay reads faster than the slower
   of two routers can take deletes, so that router's flow may reach `max_backlog` and be shed to a catch-up
   reader, which reads its share of the binlog a second time (`sheds` in each line; Wormhole's rule: a slow
   destination never holds the others back). `--max-backlog` above the replay's keys measures the data plane
   alone: each row read once.
2. Batching: deletes per write (squeal_deletes_sent_total / squeal_delete_writes_total) for the same
   replay with the topology's batch_size (256) and with batch_size = 1 (no batching).
   With `--tls` the server has a certificate (ops.tls) and every round also runs each reader with the
   topology's `[tls]` section: TLS to MariaDB (the server verified) and, since `[tls]` is one switch for every
   link, the deletes over TLS too, to a second pair of memcached started with `-Z`. RATIO squeal[reader]
   tls/plaintext is the median of the rounds' TLS rows/s / plaintext rows/s (issue 25's target: >= 0.9).
   With `--no-decoders` the rounds skip the bare and C decoders (squeal against itself: TLS vs plaintext).
   With `--via-router` squeal sends to a squeal-router in front of each memcached, as a deployment does (the
   router's TLS port in front of memcached `-Z` under `--tls`), instead of to the memcacheds themselves.
3. Memory: squeal following a steady write load (10-row transactions, whatever `--rows-per-txn`) while one
   cluster's memcached is SIGSTOPped for `--dead-seconds`; squeal's RSS is sampled throughout, then after
   the dead cluster has caught up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent, XidEvent

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "squeal"))
from squeal_helpers import topology_text

from ops import tls as pki
from ops.harness import ManagedProcess, MariaDB, Memcached, Router, SquealDaemon, wait_until
from squeal import fetch_health
from squeal.read import gtid as g
from squeal.read.reader import BinlogReader


class TlsMemcached(Memcached):
    """memcached `-Z` (TLS on its port) for squeal's deletes under `--tls`."""

    def __init__(self, pair: pki.CertPair, ca: pki.CertPair, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pair, self.ca = pair, ca

    def command(self) -> list[str]:
        return [*super().command(), "-Z", "-o", f"ssl_chain_cert={self.pair.cert},ssl_key={self.pair.key}"]

    def ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        with (
            socket.create_connection((self.host, self.port), timeout=1) as s,
            ctx.wrap_socket(s, server_hostname=self.host) as t,
        ):
            t.sendall(b"version\r\n")
            return t.recv(64).startswith(b"VERSION")


def router_in_front(mc: Memcached, workdir: Path, tls: tuple[Path, Path, Path] | None = None) -> Router:
    """A squeal-router whose one pool is `mc` (over TLS, with the router's TLS-only port, when `tls` =
    (certificate, key, CA) is given)."""
    workdir.mkdir(parents=True, exist_ok=True)
    pool: dict = {"servers": [f"{mc.host}:{mc.port}"]} | ({"security_mech": "tls"} if tls else {})
    config = workdir / f"router-{mc.port}.json"
    config.write_text(json.dumps({"pools": {"main": pool}, "route": "PoolRoute|main"}))
    return Router(config, workdir=workdir, tls=tls).start()


def health(port: int) -> dict:
    return fetch_health(f"127.0.0.1:{port}", timeout=5)[1]


def thread_times(pid: int) -> dict[str, tuple[float, float]]:
    """(user, system) CPU seconds of a process's live threads by kind: `reactor` (the main thread, whose id is
    the process's), `python threads` (every other thread named like the process: Python does not name its
    threads for the OS, so the binlog reader's Python loop, the marker store and the pools sum here) and any
    thread that has a name of its own (`/proc/PID/task/*/comm`: the native reader's `squeal-native-b…`)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, tuple[float, float]] = {}
    try:
        process = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return out
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        if task.name == str(pid):
            name = "reactor"
        elif name == process:
            name = "python threads"
        user, system = out.get(name, (0.0, 0.0))
        out[name] = (user + int(fields[11]) / tick, system + int(fields[12]) / tick)  # utime, stime
    return out


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of a process's live threads by kind (see `thread_times`)."""
    return {name: user + system for name, (user, system) in thread_times(pid).items()}


def per_thread(tls: dict, plain: dict) -> str:
    """`name a / b ms` for each thread that used ≥ 0.5 ms per 1,000 rows in either run (a: TLS, b: plaintext)."""
    a, b = tls["threads_per_1000"], plain["threads_per_1000"]
    names = sorted({n for n in (*a, *b) if max(a.get(n, 0), b.get(n, 0)) >= 0.5}, key=lambda n: -a.get(n, 0))
    return ", ".join(f"{n} {a.get(n, 0):.1f} / {b.get(n, 0):.1f} ms" for n in names)


def by_thread(run: dict) -> str:
    """`name x.x` for each thread that used ≥ 0.1 ms per 1,000 rows, most first."""
    t = run["threads_per_1000"]
    return ", ".join(f"{n} {ms:.1f}" for n, ms in sorted(t.items(), key=lambda kv: -kv[1]) if ms >= 0.1)


def metric_sum(port: int, name: str) -> float:
    """Sum of a metric's series; `name` may carry the start of a label set (`squeal_rows_total{reader="live"`)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    prefix = name if "{" in name else name + "{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def load(db: MariaDB, schema: str, rows: int, first_id: int = 1, per_txn: int = 10) -> int:
    """rows/2 INSERTs then rows/2 UPDATEs, `per_txn` single-row statements per transaction (autocommit off,
    so each `commit()` ends one); returns the transactions written."""
    n = rows // 2
    txns = 0
    with db.connect(schema, autocommit=False) as conn, conn.cursor() as cur:
        for start in range(first_id, first_id + n, per_txn):
            for i in range(start, min(start + per_txn, first_id + n)):
                cur.execute("INSERT INTO users VALUES (%s, %s, %s, %s)", (i, f"u{i}@example.com", f"name {i}", i))
            conn.commit()
            txns += 1
        for start in range(first_id, first_id + n, per_txn):
            for i in range(start, min(start + per_txn, first_id + n)):
                cur.execute("UPDATE users SET n = n + 1, email = %s WHERE id = %s", (f"v{i}@example.com", i))
            conn.commit()
            txns += 1
    return txns


def check_transactions(counted: float, meant: int, what: str) -> None:
    """Fail the bench loudly unless squeal counted the transactions it was meant to read: a bench whose
    writes are folded or split differently than it says measures another shape (issue 37 item 6)."""
    if int(counted) != meant:
        raise SystemExit(
            f"{what}: squeal counted {counted:.0f} transactions (squeal_transactions_total), the bench meant to "
            f"write {meant}: the transaction shape is not the one stated"
        )


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU of the processes `pids` so far (all their threads)."""
    return sum(sum(psutil.Process(p).cpu_times()[:2]) for p in pids)


def create_schema(db: MariaDB, schema: str, probe_rows: int = 0) -> None:
    """The squeal benches' schema: `users` (4 columns: the rules render two keys per row image), `posts`, and
    with `probe_rows` a `probe` table of that many rows for canary probes (commit -> key gone)."""
    statements = [
        f"CREATE DATABASE {schema}",
        f"CREATE TABLE {schema}.users (id INT PRIMARY KEY, email VARCHAR(100), name VARCHAR(100), n INT)",
        f"CREATE TABLE {schema}.posts (id INT PRIMARY KEY, author_id INT, title VARCHAR(100))",
    ]
    if probe_rows:
        statements += [
            f"CREATE TABLE {schema}.probe (id INT PRIMARY KEY, seq BIGINT NOT NULL, committed_at DOUBLE NOT NULL)",
            f"INSERT INTO {schema}.probe VALUES " + ", ".join(f"({i}, 0, 0)" for i in range(1, probe_rows + 1)),
        ]
    db.execute(*statements)


def bare_decode(db: MariaDB, schema: str, start: str, end: g.Position) -> tuple[int, float, float]:
    """Decode every row of the binlog after `start` up to `end`, nothing else: (rows, seconds, CPU seconds).

    Same library options as squeal's reader (events, schema and table filters), so the ratio is squeal's
    own cost on top of decoding.

    Blocking mode, stopped at the last transaction's XID: MariaDB ends a non-blocking dump with a lost
    connection, which the library answers by reconnecting from `start` (upstream issue 367), forever.
    """
    stream = BinLogStreamReader(
        connection_settings={
            "host": db.host,
            "port": db.port,
            "user": db.user,
            "passwd": db.password,
            "ssl_disabled": True,
        },  # plaintext, as before --tls existed
        server_id=987654,
        blocking=True,
        is_mariadb=True,
        annotate_rows_event=True,
        auto_position=start,
        only_events=BinlogReader.EVENTS,
        only_schemas=[schema],
        only_tables=["users", "posts"],
        enable_logging=False,
    )
    last = next(iter(end.items()))
    final_gtid = f"{last[0]}-{last[1][0]}-{last[1][1]}"
    rows = 0
    in_final = False
    c0 = time.thread_time()
    t0 = time.perf_counter()
    for ev in stream:
        if hasattr(ev, "rows"):
            rows += len(ev.rows)
        elif isinstance(ev, MariadbGtidEvent):
            in_final = ev.gtid == final_gtid
        elif in_final and isinstance(ev, XidEvent):
            break
    elapsed = time.perf_counter() - t0
    cpu = time.thread_time() - c0
    stream.close()
    return rows, elapsed, cpu


def c_decoder(db: MariaDB, start: str, end: g.Position) -> tuple[float, float]:
    """`mariadb-binlog --read-from-remote-server -v` over the same GTID range, output to /dev/null:
    (seconds, CPU seconds of the child). `-v` makes it decode every row image (to commented pseudo-SQL)."""
    first = db.execute("SHOW BINARY LOGS")[0][0]
    cmd = [
        "mariadb-binlog",
        "--read-from-remote-server",
        f"--host={db.host}",
        f"--port={db.port}",
        f"--user={db.user}",
        f"--password={db.password}",
        "--to-last-log",
        "-v",
        f"--start-position={start}",
        f"--stop-position={g.format_position(end)}",
        first,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def squeal_replay(
    base: Path,
    db: MariaDB,
    schema: str,
    caches: Sequence[ManagedProcess],
    start: str,
    end: g.Position,
    batch_size: int,
    reader: str = "python",
    timeout: float = 900,
    tls_dir: Path | None = None,
    max_backlog: int | None = None,
) -> dict:
    """`tls_dir`: the topology gets `[tls] dir = tls_dir` (squeal dials MariaDB with TLS); `max_backlog`: the
    topology's `[squeal] max_backlog` (None: the default)."""
    work = Path(tempfile.mkdtemp(dir=base))
    topo = work / "topology.toml"
    text = topology_text(
        db,
        schema,
        [m.port for m in caches],
        regional=False,
        batch_size=batch_size,
        **({"max_backlog": max_backlog} if max_backlog is not None else {}),
    )
    if tls_dir is not None:
        text = f'[tls]\ndir = "{tls_dir}"\nrequire = true\n' + text
    reader, _, delivery = reader.partition("/")  # "native/python": the native reader, the Python senders
    setting = f'delivery = "{delivery}"\n' if delivery else ""  # (else the default)
    topo.write_text(text.replace("[squeal]\n", f'[squeal]\nreader = "{reader}"\n{setting}', 1))
    # The 4-column table: rules render two keys per row image.
    daemon = SquealDaemon(topo, "east", workdir=work, state_dir=work / "state", extra_args=("--from-gtid", start))
    daemon.start()
    proc = psutil.Process(daemon.pid)
    cpu0 = proc.cpu_times()
    threads0 = thread_cpu(daemon.pid)
    t0 = time.perf_counter()
    rows0 = metric_sum(daemon.port, 'squeal_rows_total{reader="live"')  # read before the window opened
    try:
        # Each /healthz costs the daemon ~0.5 ms of CPU (250 polls of an idle daemon, 50 a second: 26.5 ms/s against
        # 2.0 idle), work the bench would add to squeal's figures. 10 polls a second bound the end time to 0.1 s.
        wait_until(
            lambda: all(
                g.covers_position(g.parse_position(f["acked"]), end) for f in health(daemon.port)["flows"].values()
            ),
            timeout,
            f"squeal ({reader}) to acknowledge {g.format_position(end)}",
            daemon.proc,
            daemon.log_file,
            interval=0.1,
            error=RuntimeError,
        )
        elapsed = time.perf_counter() - t0
        cpu1 = proc.cpu_times()
        threads1 = thread_cpu(daemon.pid)
        # The live reader's rows only: a flow that shed is re-read by a catch-up reader, whose rows are
        # extra work, not extra throughput.
        rows = metric_sum(daemon.port, 'squeal_rows_total{reader="live"')
        transactions = metric_sum(daemon.port, 'squeal_transactions_total{reader="live"')
        sheds = metric_sum(daemon.port, "squeal_flow_sheds_total")
        deletes = metric_sum(daemon.port, "squeal_deletes_sent_total")
        writes = metric_sum(daemon.port, "squeal_delete_writes_total")
        rss = proc.memory_info().rss
        native = "binlog reader: native" in (daemon.log_file.read_text() if daemon.log_file.exists() else "")
    finally:
        daemon.stop()
    if reader == "native" and not native:
        raise RuntimeError("the daemon did not read with the native reader (see its log)")
    window = rows - rows0
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "rows": rows,
        "transactions": transactions,
        "window_rows": window,
        "seconds": elapsed,
        "rows_per_s": window / elapsed,
        "deletes": deletes,
        "writes": writes,
        "deletes_per_write": deletes / max(writes, 1),
        "rss_mb": rss / 2**20,
        "sheds": sheds,
        "cpu": cpu,
        "cpu_per_1000": cpu / max(window, 1) * 1000,
        # where the CPU went: ms per 1,000 rows of each thread (by name) that ran in the window
        "threads_per_1000": {
            name: (seconds - threads0.get(name, 0.0)) / max(window, 1) * 1e6
            for name, seconds in threads1.items()
            if seconds - threads0.get(name, 0.0) > 0
        },
    }


def memory_run(
    base: Path, db: MariaDB, schema: str, caches: list[Memcached], dead_seconds: float, reader: str = "python"
) -> dict:
    work = Path(tempfile.mkdtemp(dir=base))
    topo = work / "topology.toml"
    text = topology_text(db, schema, [m.port for m in caches], regional=False)
    topo.write_text(text.replace("[squeal]\n", f'[squeal]\nreader = "{reader}"\n', 1))
    daemon = SquealDaemon(topo, "east", workdir=work, state_dir=work / "state", extra_args=("--reply-timeout", "1"))
    daemon.start()
    proc = psutil.Process(daemon.pid)
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    stop_sampling = threading.Event()
    written = [0]

    def writer() -> None:
        with db.connect(schema, autocommit=False) as conn, conn.cursor() as cur:
            i = 10_000_000
            while not stop.is_set():
                for _ in range(10):
                    cur.execute("INSERT INTO users VALUES (%s, %s, 'n', 0)", (i, f"m{i}@example.com"))
                    i += 1
                conn.commit()
                written[0] += 10

    def sampler() -> None:
        t0 = time.monotonic()
        while not stop_sampling.is_set():
            samples.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
            time.sleep(0.25)

    threads = [threading.Thread(target=writer, daemon=True), threading.Thread(target=sampler, daemon=True)]
    for t in threads:
        t.start()
    time.sleep(3)
    before = proc.memory_info().rss / 2**20
    caches[1].pause()
    time.sleep(dead_seconds)
    caches[1].resume()
    resumed_at = time.monotonic()
    stop.set()
    rows_written = written[0]
    end = g.parse_position(db.gtid_binlog_pos())
    wait_until(
        lambda: all(
            g.covers_position(g.parse_position(f["acked"]), end) for f in health(daemon.port)["flows"].values()
        ),
        300,
        "the dead cluster to catch up",
        daemon.proc,
        daemon.log_file,
        interval=0.1,
        error=RuntimeError,
    )
    catch_up = time.monotonic() - resumed_at
    time.sleep(2)
    stop_sampling.set()
    after = proc.memory_info().rss / 2**20
    sheds = metric_sum(daemon.port, "squeal_flow_sheds_total")
    rejoins = metric_sum(daemon.port, "squeal_flow_rejoins_total")
    deletes = metric_sum(daemon.port, "squeal_deletes_sent_total")
    writes = metric_sum(daemon.port, "squeal_delete_writes_total")
    daemon.stop()
    return {
        "dead_seconds": dead_seconds,
        "rows_written": rows_written,
        "write_rate": rows_written / (dead_seconds + 3),
        "rss_before_mb": before,
        "rss_peak_mb": max(r for _, r in samples),
        "rss_after_catchup_mb": after,
        "catch_up_seconds": catch_up,
        "sheds": sheds,
        "rejoins": rejoins,
        "live_deletes_per_write": deletes / max(writes, 1),
    }


def grow_for_window(
    base: Path,
    db: MariaDB,
    schema: str,
    caches: Sequence[ManagedProcess],
    start: str,
    end: g.Position,
    rows: int,
    readers: list[str],
    min_seconds: float,
    per_txn: int,
    txns: int,
) -> tuple[g.Position, int, int]:
    """Writes more row changes until every reader's squeal replay is measured over at least `min_seconds`
    (its window opens at /healthz, and the rows read before are not counted: at the native reader's speed
    50,000 rows left a window of 0.1-0.2 s, and one figure swung 10-19x between rounds). Returns the new
    end of the binlog range, its row changes and its transactions (`txns` written so far)."""
    for reader in readers:
        for _ in range(6):
            r = squeal_replay(base, db, schema, caches, start, end, batch_size=256, reader=reader)
            if r["seconds"] >= min_seconds:
                break
            # enough rows for the window at this rate (+25%), beyond those read before /healthz
            want = int(r["rows_per_s"] * min_seconds * 1.25 + (r["rows"] - r["window_rows"]))
            # load(): half INSERTs, half UPDATEs, whole transactions of each
            more = max(want - rows, rows // 2, 1000) // (2 * per_txn) * (2 * per_txn)
            t = time.perf_counter()
            txns += load(db, schema, more, first_id=rows // 2 + 1, per_txn=per_txn)
            rows += more
            end = g.parse_position(db.gtid_binlog_pos())
            print(
                f"squeal ({reader}) measured over {r['seconds']:.2f}s < {min_seconds:.1f}s: wrote {more} more row "
                f"changes in {time.perf_counter() - t:.1f}s, {rows} in all"
            )
        else:
            raise RuntimeError(f"squeal ({reader}) still measured over less than {min_seconds:.1f}s")
    return end, rows, txns


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds over the same binlog (median reported)")
    ap.add_argument(
        "--readers",
        default="native,python",
        help="squeal readers to run end to end, comma-separated; READER/DELIVERY also sets [squeal] delivery "
        "(native, the default, or python), e.g. native/python,native/native",
    )
    ap.add_argument(
        "--via-router",
        action="store_true",
        help="squeal sends to a squeal-router in front of each memcached (as deployed), not to memcached itself",
    )
    ap.add_argument(
        "--no-decoders",
        action="store_true",
        help="skip the bare and C decoders in each round (for --tls: squeal against itself)",
    )
    ap.add_argument("--dead-seconds", type=float, default=60.0)
    ap.add_argument("--no-memory", action="store_true", help="skip the dead-cluster memory run")
    ap.add_argument(
        "--min-seconds",
        type=float,
        default=2.0,
        help="measure each squeal reader over at least this much decoding after /healthz: the binlog "
        "grows past --rows until it does (the native reader needs far more rows than the python one)",
    )
    ap.add_argument("--tls", action="store_true", help="also run each reader over TLS to MariaDB (RATIO tls/plaintext)")
    ap.add_argument(
        "--rows-per-txn",
        type=int,
        default=10,
        help="single-row statements per transaction (10: the recorded figures; 1: single-row transactions)",
    )
    ap.add_argument(
        "--batch-sizes",
        default="256",
        help="[squeal] batch_size of each squeal run, a list: the first is the recorded figure, the others run "
        "after it in the same round (same binlog) and are reported by their CPU per 1,000 rows",
    )
    ap.add_argument(
        "--max-backlog",
        type=int,
        default=None,
        help="[squeal] max_backlog of every squeal run (default: the topology's default, 100,000 keys); above the "
        "replay's keys no flow is shed, so each row is read once",
    )
    args = ap.parse_args()
    per_txn = args.rows_per_txn
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    shape = f"{per_txn}-row transactions"
    base = Path(tempfile.mkdtemp(prefix="squeal-bench-"))
    tls_dir: Path | None = None
    server_tls: dict = {}
    if args.tls:
        tls_dir = base / "pki"
        ca = pki.make_ca(tls_dir)
        pki.issue(ca, tls_dir, "squeal")
        server = pki.issue(ca, tls_dir, "mariadb")
        server_tls = {"ssl_cert": server.cert, "ssl_key": server.key, "ssl_ca": ca.cert}
    db = MariaDB(1, workdir=base / "db", **server_tls).start()
    caches = [Memcached(workdir=base / "mc", memory_mb=256).start() for _ in range(2)]
    tls_caches = (
        [TlsMemcached(server, ca, workdir=base / "mc-tls", memory_mb=256).start() for _ in range(2)] if args.tls else []
    )
    routers: list[Router] = []
    try:
        # where squeal's deletes go: the memcacheds, or (--via-router) a router in front of each
        dests: Sequence[ManagedProcess] = caches
        tls_dests: Sequence[ManagedProcess] = tls_caches
        if args.via_router:
            dests = [router_in_front(m, base / "routers") for m in caches]
            routers += dests
            if args.tls:
                r = pki.issue(ca, tls_dir, "router")
                tls_dests = [router_in_front(m, base / "routers-tls", (r.cert, r.key, ca.cert)) for m in tls_caches]
                routers += tls_dests
        schema = "bench"
        create_schema(db, schema)
        start = db.gtid_binlog_pos()
        t = time.perf_counter()
        txns = load(db, schema, args.rows, per_txn=per_txn)
        end = g.parse_position(db.gtid_binlog_pos())
        print(
            f"wrote {args.rows} row changes as {txns} {shape} in {time.perf_counter() - t:.1f}s "
            f"({start} -> {g.format_position(end)})"
        )

        readers = [r for r in args.readers.split(",") if r]
        end, rows, txns = grow_for_window(
            base, db, schema, dests, start, end, args.rows, readers, args.min_seconds, per_txn, txns
        )
        print(f"measured over {rows} row changes in {txns} {shape} ({start} -> {g.format_position(end)})")
        if not args.no_decoders:
            bare_decode(db, schema, start, end)  # warm-up: binlog in the page cache, server and library warm
        rounds = []
        for i in range(args.repeat):
            print(f"round {i + 1}/{args.repeat}: {loadavg()}")
            if args.no_decoders:  # squeal against itself only (plaintext vs TLS): nan for the rest
                bare_rows, bare, bare_cpu, c_rate = rows, math.nan, math.nan, math.nan
            else:
                bare_rows, bare_s, bare_cpu = bare_decode(db, schema, start, end)
                bare = bare_rows / bare_s
                c_s, c_cpu = c_decoder(db, start, end)
                c_rate = bare_rows / c_s
                print(
                    f"  bare mysql-replication decode: {bare_rows} rows in {bare_s:.2f}s = {bare:,.0f} rows/s; "
                    f"CPU {bare_cpu:.2f}s"
                )
                print(f"  C decoder (mariadb-binlog -R -v): {c_s:.2f}s = {c_rate:,.0f} rows/s; CPU {c_cpu:.2f}s")
            result = {"bare": bare, "bare_cpu": bare_cpu, "c": c_rate}
            for reader in readers:
                r = squeal_replay(
                    base, db, schema, dests, start, end, batch_sizes[0], reader=reader, max_backlog=args.max_backlog
                )
                if r["rows"] != bare_rows:
                    raise RuntimeError(f"squeal ({reader}) read {r['rows']:.0f} rows, bare decode {bare_rows}")
                check_transactions(r["transactions"], txns, f"squeal ({reader})")
                r["ratio"] = r["rows_per_s"] / bare
                r["of_c"] = r["rows_per_s"] / c_rate
                # CPU over the window, per row, against bare decode's CPU per row
                r["cpu_ratio"] = (bare_cpu / bare_rows) / (r["cpu"] / max(r["window_rows"], 1))
                result[reader] = r
                if tls_dir is not None:
                    t = squeal_replay(
                        base,
                        db,
                        schema,
                        tls_dests,
                        start,
                        end,
                        256,
                        reader=reader,
                        tls_dir=tls_dir,
                        max_backlog=args.max_backlog,
                    )
                    if t["rows"] != bare_rows:
                        raise RuntimeError(f"squeal ({reader}, TLS) read {t['rows']:.0f} rows, bare decode {bare_rows}")
                    check_transactions(t["transactions"], txns, f"squeal ({reader}, TLS)")
                    r["tls"] = t["rows_per_s"] / r["rows_per_s"]
                    print(
                        f"  squeal {reader:6} over TLS: {t['window_rows']:.0f} rows in {t['seconds']:.2f}s = "
                        f"{t['rows_per_s']:,.0f} rows/s = {r['tls']:.2f}x plaintext; CPU per 1,000 rows "
                        f"{t['cpu_per_1000'] * 1000:.1f} ms (plaintext {r['cpu_per_1000'] * 1000:.1f} ms); by thread, "
                        f"TLS / plaintext: {per_thread(t, r)}"
                    )
                print(
                    f"  squeal {reader:6} end to end: {r['window_rows']:.0f} rows in {r['seconds']:.2f}s = "
                    f"{r['rows_per_s']:,.0f} rows/s ({r['rows'] - r['window_rows']:.0f} read before /healthz);"
                    f" {r['deletes_per_write']:.1f} deletes/write; RSS {r['rss_mb']:.0f} MB; sheds "
                    f"{r['sheds']:.0f}; CPU {r['cpu']:.2f}s = {r['cpu_per_1000'] * 1000:.1f} ms per 1,000 rows; "
                    f"{r['ratio']:.2f}x bare, {r['of_c']:.2f} of C, CPU ratio {r['cpu_ratio']:.2f}; by thread "
                    f"(ms per 1,000 rows): {by_thread(r)}"
                )
                for size in batch_sizes[1:]:  # the same reader with another [squeal] batch_size, same round
                    b = squeal_replay(
                        base, db, schema, dests, start, end, size, reader=reader, max_backlog=args.max_backlog
                    )
                    check_transactions(b["transactions"], txns, f"squeal ({reader}, batch_size {size})")
                    result[f"{reader}@{size}"] = b
                    print(
                        f"  squeal {reader:6} batch_size {size}: {b['window_rows']:.0f} rows in {b['seconds']:.2f}s "
                        f"= {b['rows_per_s']:,.0f} rows/s; {b['deletes_per_write']:.1f} deletes/write; sheds "
                        f"{b['sheds']:.0f}; CPU per 1,000 rows {b['cpu_per_1000'] * 1000:.1f} ms; by thread "
                        f"(ms per 1,000 rows): {by_thread(b)}"
                    )
            rounds.append(result)
        print(f"after the rounds: {loadavg()}")
        for reader in readers:
            for size in batch_sizes:
                key = reader if size == batch_sizes[0] else f"{reader}@{size}"
                cpus = sorted(x[key]["cpu_per_1000"] * 1000 for x in rounds)
                print(
                    f"CPU per 1,000 rows, squeal[{reader}] batch_size {size} ({shape}): median "
                    f"{cpus[(len(cpus) - 1) // 2]:.2f} ms of {len(cpus)} rounds ({', '.join(f'{c:.2f}' for c in cpus)})"
                )
        for reader in readers:
            ordered = sorted(rounds, key=lambda x: x[reader]["ratio"])
            mid = ordered[(len(ordered) - 1) // 2]
            cpu_ratios = sorted(x[reader]["cpu_ratio"] for x in rounds)
            each = ", ".join(f"{x[reader]['ratio']:.2f}" for x in ordered)
            print(
                f"RATIO squeal[{reader}]/bare ({shape}): median {mid[reader]['ratio']:.2f} of {len(rounds)} rounds "
                f"({each}); "
                f"in the median round bare {mid['bare']:,.0f} rows/s, C decoder {mid['c']:,.0f} rows/s, "
                f"squeal {mid[reader]['rows_per_s']:,.0f} rows/s = {mid[reader]['of_c']:.2f} of C; CPU ratio "
                f"median {cpu_ratios[(len(cpu_ratios) - 1) // 2]:.2f}; CPU per 1,000 rows "
                f"{mid[reader]['cpu_per_1000'] * 1000:.1f} ms; RSS {mid[reader]['rss_mb']:.0f} MB"
            )
            if tls_dir is not None:
                tls_ratios = sorted(x[reader]["tls"] for x in rounds)
                print(
                    f"RATIO squeal[{reader}] tls/plaintext: median {tls_ratios[(len(tls_ratios) - 1) // 2]:.2f} "
                    f"of {len(rounds)} rounds ({', '.join(f'{v:.2f}' for v in tls_ratios)})"
                )
        main_reader = readers[0] if readers else "python"
        batched = rounds[(len(rounds) - 1) // 2][readers[0]]
        single = squeal_replay(base, db, schema, caches, start, end, batch_size=1, reader=main_reader)
        check_transactions(single["transactions"], txns, f"squeal ({main_reader}, batch 1)")
        print(
            f"squeal[{main_reader}] end to end (batch 1, {shape}): {single['rows_per_s']:,.0f} rows/s; "
            f"{single['deletes_per_write']:.1f} deletes/write; sheds {single['sheds']:.0f}; batching = "
            f"{batched['deletes_per_write'] / single['deletes_per_write']:.0f}x deletes per write"
        )
        if args.no_memory:
            return 0

        mem = memory_run(base, db, schema, caches, args.dead_seconds, main_reader)
        print(f"memory run done: {loadavg()}")
        print(
            f"memory ({main_reader} reader): one cluster dead {mem['dead_seconds']:.0f}s under "
            f"{mem['write_rate']:,.0f} rows/s: RSS "
            f"{mem['rss_before_mb']:.0f} MB before, peak {mem['rss_peak_mb']:.0f} MB, "
            f"{mem['rss_after_catchup_mb']:.0f} MB after catch-up ({mem['catch_up_seconds']:.1f}s to catch up; "
            f"sheds {mem['sheds']:.0f}, rejoins {mem['rejoins']:.0f}); live deletes/write "
            f"{mem['live_deletes_per_write']:.1f}"
        )
    finally:
        for router in routers:
            router.stop()
        for m in tls_caches:
            m.stop()
        for m in caches:
            try:
                m.resume()
            except (OSError, AssertionError):
                pass
            m.stop()
        db.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
