"""squeal under faults: kill -9 mid-stream, a stopped cluster, start-up refusals."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from squeal_helpers import create_schema, scrape, topology_text, unique_db, wait_until, write_topology

from ops import harness
from ops.harness import REPO_ROOT, MariaDB
from squeal import FileDatamarkerStore


class Writer(threading.Thread):
    """Steady single-row transactions: INSERT posts(id, author_id) with ids from `first` on."""

    def __init__(self, env, first: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.env, self.next_id, self.rate = env, first, rate
        self.first = first
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.env.connect() as conn, conn.cursor() as cur:
                t = time.monotonic()
                while not self.stop_flag.is_set():
                    cur.execute("INSERT INTO posts VALUES (%s, %s, 't')", (self.next_id, self.next_id % 97))
                    self.next_id += 1
                    t += 1.0 / self.rate
                    time.sleep(max(0.0, t - time.monotonic()))
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def stop(self) -> list[int]:
        self.stop_flag.set()
        self.join(10)
        assert self.error is None, self.error
        return list(range(self.first, self.next_id))


def post_keys(ids) -> list[str]:
    return [f"post:{i}" for i in ids]


@pytest.mark.parametrize("delivery", ["native", "python"])
def test_kill_9_mid_stream_then_restart_loses_nothing(squeal_env, delivery: str) -> None:
    env = squeal_env(delivery=delivery).start()
    planned = range(1, 4001)
    for c in env.caches:
        c.set_many(post_keys(planned))
    writer = Writer(env, first=1, rate=400)
    writer.start()
    wait_until(lambda: writer.next_id > 300, 10, "some writes")
    env.daemon.kill()  # SIGKILL: no flush, no checkpoint
    wait_until(lambda: writer.next_id > 700, 10, "writes while squeal is down")
    written = writer.stop()
    env.daemon.start()
    # Key by key against the database: every committed row's key is gone from every cluster.
    in_db = [r[0] for r in env.sql("SELECT id FROM posts ORDER BY id")]
    assert in_db == written
    left: dict[int, set[str]] = {}

    def gone() -> bool:
        left.update({c.addr[1]: c.present(post_keys(in_db)) for c in env.caches})
        return not any(left.values())

    harness.wait_until(gone, 20, "keys gone", interval=0.1, error=None)
    assert not any(left.values()), {p: sorted(k)[:10] for p, k in left.items()}
    # Never-written rows were not invalidated: squeal deletes exactly what committed.
    for c in env.caches:
        assert c.present(post_keys(range(written[-1] + 1, written[-1] + 50))) == set(
            post_keys(range(written[-1] + 1, written[-1] + 50))
        )


def _p99(samples: list[float]) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * 0.99))]


@pytest.mark.parametrize("delivery", ["native", "python"])
def test_stopped_cluster_does_not_delay_the_other_and_catches_up(squeal_env, delivery: str) -> None:
    # A small max_backlog makes the stopped cluster's flow shed and come back through a catch-up reader.
    env = squeal_env(max_backlog=300, extra_args=("--reply-timeout", "0.5"), delivery=delivery).start()
    healthy, stopped = env.caches
    planned = range(1, 6001)
    for c in env.caches:
        c.set_many(post_keys(planned))
    probe_id = [0]

    def probe() -> float:
        """Commit an update of one user row, time until its key is gone from the healthy cluster."""
        probe_id[0] += 1
        key = f"user:{probe_id[0]}"
        healthy.set(key)
        t0 = time.monotonic()
        env.sql(f"INSERT INTO users VALUES ({probe_id[0]}, NULL, 'p')")
        wait_until(lambda: not healthy.has(key), 10, f"{key} deleted", interval=0.001)
        return time.monotonic() - t0

    def sample(seconds: float) -> list[float]:
        out, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            out.append(probe())
            time.sleep(0.02)
        return out

    writer = Writer(env, first=1, rate=150)
    writer.start()
    baseline = sample(3)
    env.memcacheds[1].pause()  # SIGSTOP: the port still accepts, nothing answers
    try:
        during = sample(10)
    finally:
        env.memcacheds[1].resume()
    written = writer.stop()
    base_p99, fault_p99 = _p99(baseline), _p99(during)
    print(
        f"healthy-cluster p99: baseline {base_p99 * 1000:.1f} ms ({len(baseline)} probes), "
        f"other cluster stopped {fault_p99 * 1000:.1f} ms ({len(during)} probes)"
    )
    assert fault_p99 < max(5 * base_p99, 0.5), (base_p99, fault_p99)

    # The stopped cluster catches up fully: every committed row's key is gone from it too.
    wait_until(lambda: not stopped.present(post_keys(written)), 30, "the stopped cluster to catch up", interval=0.2)
    assert not healthy.present(post_keys(written))
    m = scrape(env.daemon.port)
    assert m['squeal_flow_sheds_total{flow="c1"}'] >= 1  # it went over max_backlog ...
    assert m['squeal_flow_rejoins_total{flow="c1"}'] >= 1  # ... and a catch-up reader brought it back
    assert m.get('squeal_flow_sheds_total{flow="c0"}', 0) == 0
    wait_until(lambda: scrape(env.daemon.port)['squeal_flow_state{flow="c1",state="live"}'] == 1, 10, "c1 live")


def _run_squeal(topology, *args: str) -> subprocess.CompletedProcess:
    exe = REPO_ROOT / ".venv" / "bin" / "squeal"
    return subprocess.run(
        [
            str(exe if exe.exists() else sys.executable),
            "run",
            str(topology),
            "--region",
            "east",
            "--metrics-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_rule_naming_a_missing_column_is_a_start_up_error(primary: MariaDB, tmp_path) -> None:
    schema = unique_db("badrule")
    create_schema(primary, schema)
    text = topology_text(primary, schema, [1], extra_rules=[(f"{schema}.other", ["other:{id}", "o:{nope}"])])
    result = _run_squeal(write_topology(tmp_path / "t.toml", text), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 2, result.stderr
    assert f"rules[2] (table {schema}.other)" in result.stderr
    assert "'nope'" in result.stderr and "o:{nope}" in result.stderr


def test_a_filter_comparing_a_number_column_with_a_string_is_a_start_up_error(primary: MariaDB, tmp_path) -> None:
    schema = unique_db("badfilter")
    create_schema(primary, schema)
    text = topology_text(primary, schema, [1]) + (
        f'\n[[rules]]\ntable = "{schema}.other"\nkeys = ["other:{{id}}"]\nwhere = "id = \'7\'"\n'
    )
    result = _run_squeal(write_topology(tmp_path / "t.toml", text), "--state-dir", str(tmp_path / "s"))
    assert result.returncode == 2, result.stderr
    assert f"rules[2].where (table {schema}.other): id is int: compare it with a number, not '7'" in result.stderr
    assert "Traceback" not in result.stderr


def test_server_without_annotations_is_refused(mariadb_factory, tmp_path) -> None:
    db = mariadb_factory(7)
    db.execute("SET GLOBAL binlog_annotate_row_events = OFF", "SET GLOBAL binlog_row_image = 'MINIMAL'")
    schema = unique_db("refuse")
    create_schema(db, schema)
    result = _run_squeal(
        write_topology(tmp_path / "t.toml", topology_text(db, schema, [1])), "--state-dir", str(tmp_path / "s")
    )
    assert result.returncode == 2, result.stderr
    assert "binlog_annotate_row_events" in result.stderr and "binlog_row_image" in result.stderr
    assert "Traceback" not in result.stderr


def test_replay_rewinds_one_flow_of_the_running_daemon_and_sigterm_checkpoints(squeal_env) -> None:
    env = squeal_env().start()
    before = env.db.gtid_binlog_pos()
    keys = [f"user:{i}" for i in range(1, 21)]
    env.sql("INSERT INTO users VALUES " + ", ".join(f"({i}, NULL, 'n')" for i in range(1, 21)))
    env.fence()
    for c in env.caches:  # the web tier re-fills the caches (say, with data a broken router misrouted)
        c.set_many(keys)
    replay = subprocess.run(
        [
            str(REPO_ROOT / ".venv" / "bin" / "squeal"),
            "replay",
            str(env.topology),
            "--region",
            "east",
            "--flow",
            "c1",
            "--from",
            before,
            "--state-dir",
            str(env.state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert replay.returncode == 0, replay.stderr
    assert "told the running daemon" in replay.stdout
    wait_until(lambda: not env.caches[1].present(keys), 10, "c1 to be replayed")
    env.fence()
    assert env.caches[0].present(keys) == set(keys), "replaying c1 touched c0"

    # SIGTERM: flush and checkpoint; every flow's datamarker is the server's last GTID.
    last = env.db.gtid_binlog_pos()
    env.daemon.stop()
    assert env.daemon.proc.returncode == 0
    store = FileDatamarkerStore(env.state_dir)
    assert {f: store.load(f) for f in ("c0", "c1", "regional")} == {"c0": last, "c1": last, "regional": last}
