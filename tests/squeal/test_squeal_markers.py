"""Datamarker failures: unwritable marker dir, SIGTERM with one, start-up on one, corrupt replay requests.

Integration tests run the real daemon against the session's MariaDB and real memcached; the unit tests at the
bottom drive `Daemon.checkpoint()` / `shutdown()` on a fake reactor with stores that fail or hang.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from squeal_helpers import create_schema, healthz, scrape, topology_text, unique_db, wait_until, write_topology
from twisted.application.service import IService
from twisted.internet import defer, task
from zope.interface.verify import verifyObject

import router_config
from ops.harness import REPO_ROOT, MariaDB, free_port
from router_config import Address
from squeal.delivery.flows import Flow
from squeal.markers.datamarkers import DatamarkerDirError, FileDatamarkerStore, MarkerWatch
from squeal.read import gtid as g
from squeal.shard.daemon import Daemon
from squeal.shard.region import RegionDaemon

FLOWS = ("c0", "c1", "regional")


# -- helpers ------------------------------------------------------------------------------------------------------


health = healthz  # (status, body)


def with_marker_max_age(env, seconds: float):
    """Set `[squeal] marker_max_age_s` in the env's topology (before the daemon starts)."""
    text = env.topology.read_text()
    assert text.startswith("[squeal]\n")
    env.topology.write_text(text.replace("[squeal]\n", f"[squeal]\nmarker_max_age_s = {seconds}\n", 1))
    return env


@contextlib.contextmanager
def dir_replaced_by_a_file(state: Path):
    """The marker dir moved away and a plain file put at its path: every write fails (ENOTDIR), even as root."""
    away = state.with_name(state.name + ".away")
    state.rename(away)
    state.write_text("not a directory\n")
    try:
        yield away
    finally:
        state.unlink()
        away.rename(state)


@contextlib.contextmanager
def read_only_dir(path: Path):
    """An existing directory nothing can be written to: a read-only tmpfs mounted on it (root), else
    `chattr +i` (root), else mode 0555 (not root). Skips the test if none works here."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield "mode 0555"
        finally:
            path.chmod(0o755)
        return
    # (what it is, the command that makes the directory read-only, the one that undoes it), tried in turn
    for how, make, undo in (
        ("read-only tmpfs", ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"], ["umount", "-l"]),
        ("chattr +i", ["chattr", "+i"], ["chattr", "-i"]),
    ):
        if shutil.which(make[0]) and subprocess.run([*make, str(path)], capture_output=True).returncode == 0:
            try:
                yield how
            finally:
                subprocess.run([*undo, str(path)], capture_output=True)
            return
    pytest.skip("cannot make a read-only directory here (no mount, no chattr)")


def markers(state: Path) -> dict[str, str | None]:
    store = FileDatamarkerStore(state)
    return {f: store.load(f) for f in FLOWS}


def run_squeal(topology: Path, *args: str) -> subprocess.CompletedProcess:
    exe = REPO_ROOT / ".venv" / "bin" / "squeal"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "squeal.cli"]
    return subprocess.run(
        [*cmd, "run", str(topology), "--region", "east", "--metrics-port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- integration: the real daemon ------------------------------------------------------------------------------------


def test_unwritable_marker_dir_fails_healthz_keeps_delivering_and_recovers(squeal_env) -> None:
    env = with_marker_max_age(squeal_env(), 2).start()
    port = env.daemon.port
    env.sql("INSERT INTO users VALUES (1, NULL, 'a')")
    env.fence()
    wait_until(lambda: markers(env.state_dir)["c0"] == env.db.gtid_binlog_pos(), 10, "markers written")
    assert health(port)[0] == 200

    with dir_replaced_by_a_file(env.state_dir) as away:
        keys = [f"user:{i}" for i in range(2, 12)]
        for c in env.caches:
            c.set_many(keys)
        env.sql("INSERT INTO users VALUES " + ", ".join(f"({i}, NULL, 'b')" for i in range(2, 12)))
        env.fence()  # invalidations keep flowing with the marker dir gone
        assert not any(c.present(keys) for c in env.caches)

        def unhealthy():
            code, body = health(port)
            return body if code == 503 and "datamarker:c0" in body.get("problems", {}) else None

        body = wait_until(unhealthy, 20, "/healthz 503 for the unwritable marker dir")
        reason = body["problems"]["datamarker:c0"]
        assert str(env.state_dir) in reason and "Not a directory" in reason, reason
        assert {f"datamarker:{f}" for f in FLOWS} <= set(body["problems"])
        errors = scrape(port)['squeal_datamarker_write_errors_total{flow="c0"}']
        assert errors >= 1
        wait_until(
            lambda: scrape(port)['squeal_datamarker_write_errors_total{flow="c0"}'] > errors, 10, "writes retried"
        )
        assert scrape(port)['squeal_datamarker_age_seconds{flow="c0"}'] > 2
        for c in env.caches:  # still delivering while unhealthy
            c.set("user:1")
        env.sql("UPDATE users SET name = 'c' WHERE id = 1")
        env.fence()
        assert not any(c.has("user:1") for c in env.caches)
        log = env.log()
        # one ERROR per failure streak (then at most once a minute), naming the path and the errno
        assert log.count("flow c0: cannot write its datamarker") == 1, log
        assert "[Errno 20] Not a directory" in log and str(env.state_dir) in log
        assert "Traceback" not in log
        assert markers(away)["c0"] != env.db.gtid_binlog_pos()  # not written meanwhile

    # Restored: the next checkpoint writes every marker and /healthz is 200 again.
    wait_until(lambda: health(port)[0] == 200, 10, "/healthz 200 after the marker dir is back")
    last = env.db.gtid_binlog_pos()
    wait_until(lambda: markers(env.state_dir) == {f: last for f in FLOWS}, 10, "markers written again")
    m = scrape(port)
    assert m['squeal_datamarker_age_seconds{flow="c0"}'] < 2
    assert "flow c0: datamarker written again" in env.log()


def test_sigterm_with_unwritable_marker_dir_exits_in_bounded_time_nonzero(squeal_env) -> None:
    env = squeal_env().start()
    env.fence()
    with dir_replaced_by_a_file(env.state_dir):
        env.sql("INSERT INTO users VALUES (1, NULL, 'a')")
        env.fence()  # acknowledged, so every flow has a position its marker lacks
        proc = env.daemon.proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(20)  # a hang detector, not a speed requirement
        except subprocess.TimeoutExpired:
            pytest.fail("squeal did not exit within 20 s of SIGTERM with an unwritable marker dir")
    assert code == 1, code
    log = env.log()
    errors = [line for line in log.splitlines() if " ERROR " in line and "could not save the datamarkers" in line]
    assert len(errors) == 1, log
    assert all(f"{f} at " in errors[0] for f in FLOWS) and str(env.state_dir) in errors[0], errors[0]
    assert "Not a directory" in errors[0]


@pytest.mark.parametrize("how", ["file_in_the_way", "under_a_file", "read_only"])
def test_start_on_unwritable_marker_dir_is_a_one_line_error(primary: MariaDB, tmp_path: Path, how: str) -> None:
    schema = unique_db("mdir")
    create_schema(primary, schema)
    topo = write_topology(tmp_path / "t.toml", topology_text(primary, schema, [free_port()]))
    state = tmp_path / "state"
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    if how == "file_in_the_way":
        state.write_text("x")
    elif how == "under_a_file":
        (tmp_path / "file").write_text("x")
        state = tmp_path / "file" / "state"
    else:
        ctx = read_only_dir(state)
    with ctx:
        result = run_squeal(topo, "--state-dir", str(state))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("squeal: error:")]
    assert len(errors) == 1 and str(state) in errors[0], result.stderr
    if how == "read_only":
        assert "cannot write datamarkers in" in errors[0], errors[0]


def test_corrupt_replay_request_is_set_aside_and_markers_keep_being_written(squeal_env) -> None:
    env = squeal_env().start()
    env.fence()
    bad = env.state_dir / "c0.replay"
    bad.write_text("{not json")
    aside = env.state_dir / "c0.replay.corrupt"
    wait_until(lambda: aside.exists() and not bad.exists(), 10, "the corrupt replay request set aside")
    assert aside.read_text() == "{not json"
    env.sql("INSERT INTO users VALUES (1, NULL, 'a')")
    env.fence()
    last = env.db.gtid_binlog_pos()
    wait_until(lambda: markers(env.state_dir) == {f: last for f in FLOWS}, 10, "markers written")
    assert health(env.daemon.port)[0] == 200
    log = env.log()
    assert "corrupt replay request" in log and str(bad) in log and "Traceback" not in log
    # a good request next to a corrupt one is still applied
    (env.state_dir / "c1.replay").write_text(json.dumps({"flow": "c1"}))  # no position: corrupt
    FileDatamarkerStore(env.state_dir).request_replay("c0", last)
    wait_until(lambda: "flow c0: replay from" in env.log(), 10, "the good replay request applied")
    assert (env.state_dir / "c1.replay.corrupt").exists()


# -- unit: pure logic --------------------------------------------------------------------------------------------------


def test_marker_watch_ages_only_pending_positions_and_rate_limits_logs() -> None:
    w = MarkerWatch(log_every=60)
    assert w.age("a", 1000.0) == 0.0  # never moved: current
    w.moved("a", 100.0)
    w.moved("a", 105.0)  # still the first unsaved change that counts
    assert w.age("a", 112.0) == 12.0 and w.pending("a")
    assert w.failed("a", "[Errno 28] No space left on device", 112.0) is True  # a streak starts: log
    assert w.failed("a", "e", 113.0) is False  # ... and not again for a minute
    assert w.failed("a", "e", 171.0) is False
    assert w.failed("a", "e2", 172.0) is True
    assert w.failures("a") == 4 and w.last_error("a") == "e2"
    assert w.written("a") == 4
    assert w.age("a", 500.0) == 0.0 and not w.pending("a") and w.last_error("a") == ""
    assert w.failed("a", "e3", 501.0) is True  # a new streak logs at once
    assert w.written("b") == 0


def test_file_store_errors_name_the_path_and_leave_no_litter(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DatamarkerDirError, match="exists and is not a directory"):
        FileDatamarkerStore(blocker)
    with pytest.raises(DatamarkerDirError, match=str(blocker / "sub")):
        FileDatamarkerStore(blocker / "sub")
    d = tmp_path / "dm"
    store = FileDatamarkerStore(d)
    store.check_writable()
    assert list(d.iterdir()) == []  # the probe is gone
    (d / "a.marker").mkdir()  # a directory where the marker goes: the rename fails
    with pytest.raises(OSError):
        store.save("a", "0-1-1")
    assert sorted(p.name for p in d.iterdir()) == ["a.marker"]  # no temporary file left behind
    (d / "b.marker").write_text("{")
    with pytest.raises(ValueError, match="b.marker is not a datamarker file"):
        store.load("b")
    (d / "c.marker").write_text(json.dumps({"position": "garbage"}))
    with pytest.raises(g.GtidError, match="c.marker"):
        store.load("c")
    d.rename(tmp_path / "away")
    d.write_text("x")
    with pytest.raises(DatamarkerDirError, match="cannot write datamarkers in"):
        store.check_writable()


def test_corrupt_replay_requests_are_set_aside_and_do_not_block_the_others(tmp_path: Path, caplog) -> None:
    store = FileDatamarkerStore(tmp_path)
    store.request_replay("good", "0-1-7")
    (tmp_path / "a.replay").write_text("{not json")
    (tmp_path / "b.replay").write_text("[1, 2]")
    (tmp_path / "c.replay").write_text(json.dumps({"position": 5}))
    (tmp_path / "e.replay").write_text(json.dumps({"flow": "e"}))
    (tmp_path / "d.replay").write_text(json.dumps({"position": "x-y"}))
    with caplog.at_level(logging.ERROR, logger="squeal.markers.datamarkers"):
        assert store.take_replay_requests() == {"good": "0-1-7"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{n}.replay.corrupt" for n in "abcde"]
    for n in "abcde":
        assert str(tmp_path / f"{n}.replay") in caplog.text
    assert store.take_replay_requests() == {}


def test_marker_max_age_setting_is_validated() -> None:
    base = (
        '[[rules]]\ntable = "app.users"\nkeys = ["user:{id}"]\n'
        '[regions.east]\nmaster = true\ndatabase = { role = "primary", port = 3306, server_id = 1 }\n'
        '[regions.east.clusters.a]\nrouters = ["127.0.0.1:7001"]\n'
        'pools.wildcard = { servers = ["127.0.0.1:7002"] }\n'
    )
    assert router_config.loads(base).squeal.marker_max_age_s == 30.0
    assert router_config.loads("[squeal]\nmarker_max_age_s = 5\n" + base).squeal.marker_max_age_s == 5.0
    with pytest.raises(router_config.TopologyError, match=r"squeal\.marker_max_age_s.*greater than 0"):
        router_config.loads("[squeal]\nmarker_max_age_s = 0\n" + base)
    with pytest.raises(router_config.TopologyError, match=r"squeal\.marker_max_age_s"):
        router_config.loads('[squeal]\nmarker_max_age_s = "soon"\n' + base)


# -- unit: the daemon's checkpoint and shutdown on a fake reactor -----------------------------------------------------


class FakeReactor(task.Clock):
    """task.Clock plus callFromThread (queued, run by `pump`): the store thread is a real thread."""

    def __init__(self) -> None:
        super().__init__()
        self.from_threads: queue.Queue = queue.Queue()

    def callFromThread(self, f, *args, **kwargs) -> None:  # noqa: N802 - Twisted's name
        self.from_threads.put((f, args, kwargs))

    def pump(self, until, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise AssertionError("timed out pumping the fake reactor")
            try:
                f, args, kwargs = self.from_threads.get(timeout=0.02)
            except queue.Empty:
                continue
            f(*args, **kwargs)


class FlakyStore:
    """A datamarker store in memory whose writes fail (`fail`) or block (`hang`) on demand."""

    def __init__(self) -> None:
        self.saved: dict[str, str] = {}
        self.fail: Exception | None = None
        self.fail_replays: Exception | None = None
        self.hang = threading.Event()  # set: save() blocks until `release` is set
        self.release = threading.Event()
        self.calls = 0
        self.looks: list[bool] = []  # each take_replay_requests call's `if_changed`
        self.dir = "/fake/markers"

    def load(self, flow: str) -> str | None:
        return self.saved.get(flow)

    def save(self, flow: str, position: str) -> None:
        self.calls += 1
        if self.hang.is_set():
            self.release.wait()
        if self.fail is not None:
            raise self.fail
        self.saved[flow] = position

    def request_replay(self, flow: str, position: str) -> None:
        raise NotImplementedError

    def take_replay_requests(self, if_changed: bool = False) -> dict[str, str]:
        self.looks.append(if_changed)
        if self.fail_replays is not None:
            raise self.fail_replays
        return {}


def make_daemon(tmp_path: Path, store: FlakyStore, max_age: float = 5.0) -> tuple[Daemon, FakeReactor]:
    topo = router_config.loads(
        f"[squeal]\nmarker_max_age_s = {max_age}\n"
        '[[rules]]\ntable = "app.users"\nkeys = ["user:{id}"]\n'
        '[regions.east]\nmaster = true\ndatabase = { role = "primary", port = 3306, server_id = 1 }\n'
        '[regions.east.clusters.a]\nrouters = ["127.0.0.1:7001"]\n'
        'pools.wildcard = { servers = ["127.0.0.1:7002"] }\n'
    )
    reactor = FakeReactor()
    reactor.advance(1000.0)
    d = Daemon(topo, "east", state_dir=tmp_path, store=store, reactor=reactor)
    d.flows["a"] = Flow("a", "cluster", [Address("127.0.0.1", 7001)], {0: (1, 5)}, 1000, metrics=d.metrics)
    return d, reactor


def ack(flow: Flow, seq: int) -> None:
    g.advance(flow.acked, (0, 1, seq))
    flow.dirty = True


def checkpoint(d: Daemon, reactor: FakeReactor) -> None:
    d.checkpoint()
    reactor.pump(lambda: d.checkpoints.round is None)


def counter(d: Daemon, name: str) -> float:
    return d.metrics.registry.get_sample_value(name, {"flow": "a"}) or 0.0


def test_failed_marker_writes_are_retried_counted_and_fail_health_after_max_age(tmp_path: Path, caplog) -> None:
    store = FlakyStore()
    d, reactor = make_daemon(tmp_path, store, max_age=5.0)
    flow = d.flows["a"]
    ack(flow, 6)
    store.fail = OSError(28, "No space left on device", "/fake/markers/.a.marker.1.tmp")
    with caplog.at_level(logging.INFO, logger="squeal.markers.checkpoints"):
        for _ in range(4):
            checkpoint(d, reactor)
            reactor.advance(1.0)
        assert flow.dirty and store.calls == 4  # retried at every checkpoint
        assert counter(d, "squeal_datamarker_write_errors_total") == 4
        assert not d.problems  # 3 s old: under marker_max_age_s
        for _ in range(3):
            checkpoint(d, reactor)
            reactor.advance(1.0)
        assert d.checkpoints.watch.age("a", reactor.seconds()) == 7.0
        checkpoint(d, reactor)
        reason = d.problems["datamarker:a"]
        assert "/fake/markers" in reason and "No space left on device" in reason and "Errno 28" in reason
        assert not d.status()["ok"]
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and ".a.marker.1.tmp" in errors[0].getMessage()  # once per streak
        store.fail = None
        ack(flow, 7)
        checkpoint(d, reactor)
    assert store.saved == {"a": "0-1-7"} and not flow.dirty
    assert "datamarker:a" not in d.problems
    assert d.checkpoints.watch.age("a", reactor.seconds()) == 0.0
    assert counter(d, "squeal_datamarker_writes_total") == 1
    assert "written again" in caplog.text


def test_checkpoint_survives_replay_errors_and_unexpected_store_errors(tmp_path: Path) -> None:
    store = FlakyStore()
    d, reactor = make_daemon(tmp_path, store)
    loop = task.LoopingCall(d.checkpoint)
    loop.clock = reactor
    loop.start(1.0, now=False)
    store.fail_replays = PermissionError(13, "Permission denied", "/fake/markers")
    store.fail = RuntimeError("zookeeper session expired")
    ack(d.flows["a"], 6)
    for _ in range(3):
        reactor.advance(1.0)
        reactor.pump(lambda: d.checkpoints.round is None)
    assert loop.running
    assert counter(d, "squeal_datamarker_write_errors_total") == 3
    store.fail = store.fail_replays = None
    reactor.advance(1.0)
    reactor.pump(lambda: d.checkpoints.round is None)
    assert store.saved == {"a": "0-1-6"}
    loop.stop()


def test_a_hung_store_neither_blocks_checkpoints_nor_shutdown(tmp_path: Path, caplog) -> None:
    store = FlakyStore()
    d, reactor = make_daemon(tmp_path, store, max_age=2.0)
    ack(d.flows["a"], 6)
    store.hang.set()
    d.checkpoint()
    reactor.pump(lambda: store.calls == 1)  # the write started, and never returns
    for _ in range(3):
        reactor.advance(1.0)
        d.checkpoint()  # returns at once: the round in progress is not joined by another
    assert store.calls == 1
    assert "has not returned" in d.problems["datamarker:a"]
    finished = d.shutdown(flush_timeout=1.0, save_timeout=2.0)
    reactor.advance(1.0)
    assert not finished.called
    with caplog.at_level(logging.ERROR, logger="squeal.shard.daemon"):
        reactor.advance(2.0)
    assert finished.called and d.exit_code == 1
    assert "could not save the datamarkers of flow(s) a at 0-1-6 in /fake/markers" in caplog.text
    store.release.set()


def test_shutdown_with_a_failing_store_fires_and_exits_1_and_with_a_good_one_exits_0(tmp_path: Path, caplog) -> None:
    store = FlakyStore()
    d, reactor = make_daemon(tmp_path, store)
    ack(d.flows["a"], 6)
    store.fail = OSError(30, "Read-only file system", "/fake/markers/.a.marker.1.tmp")
    finished = d.shutdown(save_timeout=2.0)
    with caplog.at_level(logging.ERROR, logger="squeal.shard.daemon"):
        for _ in range(5):  # retried every 0.5 s until the 2 s are up
            reactor.pump(lambda: d.checkpoints.round is None)
            reactor.advance(0.5)
    assert finished.called and d.exit_code == 1
    assert store.calls >= 3
    assert "Read-only file system" in caplog.text and "a at 0-1-6" in caplog.text

    store2 = FlakyStore()
    d2, reactor2 = make_daemon(tmp_path, store2)
    ack(d2.flows["a"], 9)
    finished2 = d2.shutdown()
    reactor2.pump(lambda: finished2.called)
    assert d2.exit_code == 0 and store2.saved == {"a": "0-1-9"}


def test_the_checkpoint_timer_looks_for_replay_requests_only_if_changed_an_asked_checkpoint_looks_now(
    tmp_path: Path,
) -> None:
    """The periodic checkpoint lets a store skip its look when nothing changed (a ZooKeeper store's watch: no
    request per shard per second); SIGHUP's checkpoint (`squeal replay`'s "apply now") and the final markers look."""
    store = FlakyStore()
    d, reactor = make_daemon(tmp_path, store)
    d.start_checkpoints()  # the timer start_pipeline starts, on the fake clock
    reactor.advance(d.checkpoint_interval)
    reactor.pump(lambda: d.checkpoints.round is None)
    assert store.looks == [True]
    checkpoint(d, reactor)  # asked (SIGHUP)
    assert store.looks == [True, False]
    d._checkpoint_timer.stop()


# -- unit: the shard pipeline as a Twisted service (issue 33 item 3) -------------------------------------------------


def started(d: Daemon) -> list[str]:
    """Start `d` as a service without its readers (this fake has no database): what its pipeline was asked."""
    asked: list[str] = []
    d.start_pipeline = lambda: asked.append("start_pipeline")  # type: ignore[method-assign]
    d.startService()
    return asked


def test_the_pipeline_is_a_service_whose_stop_fires_after_its_final_markers(tmp_path: Path) -> None:
    store = FlakyStore()
    d, reactor = make_daemon(tmp_path, store)
    assert verifyObject(IService, d)
    assert started(d) == ["start_pipeline"] and d.running
    ack(d.flows["a"], 6)
    store.hang.set()
    stopped = d.stopService()
    assert isinstance(stopped, defer.Deferred) and not d.running and d.stopping
    reactor.pump(lambda: store.calls == 1)  # the final marker's write has started, and hangs
    assert not stopped.called
    store.release.set()
    reactor.pump(lambda: stopped.called)
    assert store.saved == {"a": "0-1-6"} and d.exit_code == 0
    again = d.stopService()  # (a parent's removeService after a shutdown): no second shutdown
    assert again.called and store.calls == 1


def test_retire_is_a_stop_that_hands_the_shard_on(tmp_path: Path) -> None:
    store = FlakyStore()
    d, reactor = make_daemon(tmp_path, store)
    started(d)
    ack(d.flows["a"], 7)
    handed = d.retire()
    assert not d.running and d.stopping
    reactor.pump(lambda: handed.called)
    assert handed.result is True and store.saved == {"a": "0-1-7"}
    stopped = d.stopService()  # what a parent's removeService calls: the hand-on, not a shutdown after it
    assert stopped.called and store.calls == 1


def test_a_region_daemon_is_a_service_of_its_shards_pipelines(tmp_path: Path) -> None:
    """The region's service starts its shards' pipelines and stops them all at once; a shard handed on
    (`remove_shard`: retired) leaves it and is not stopped a second time."""
    stores = {"s1": FlakyStore(), "s2": FlakyStore()}
    region = RegionDaemon(
        router_config.loads(
            '[[rules]]\ntable = "app.users"\nkeys = ["user:{id}"]\n'
            '[regions.east]\nmaster = true\n[regions.east.clusters.a]\nrouters = ["127.0.0.1:7001"]\n'
            'pools.wildcard = { servers = ["127.0.0.1:7002"] }\n'
            "[shards.s1]\ngtid_domain_id = 1\neast = { port = 3307, server_id = 11 }\n"
            "[shards.s2]\ngtid_domain_id = 2\neast = { port = 3308, server_id = 12 }\n"
        ),
        "east",
        state_dir=tmp_path,
        reactor=(reactor := FakeReactor()),
        stores=stores.__getitem__,
    )
    asked: list[str] = []
    for shard in ("s1", "s2"):
        d = region._pipeline(shard)
        d.flows["a"] = Flow("a", "cluster", [Address("127.0.0.1", 7001)], {0: (1, 5)}, 1000, metrics=d.metrics)
        d.start_pipeline = lambda shard=shard: asked.append(shard)  # type: ignore[method-assign]
        region._run_shard(d)
    assert asked == [] and set(region.shards) == {"s1", "s2"}  # prepared: started with the service
    region.startService()
    assert sorted(asked) == ["s1", "s2"] and all(d.running for d in region.shards.values())

    ack(region.shards["s1"].flows["a"], 6)
    handed = region.remove_shard("s1")
    reactor.pump(lambda: handed.called)
    assert handed.result is True and stores["s1"].saved == {"a": "0-1-6"} and set(region.shards) == {"s2"}

    ack(region.shards["s2"].flows["a"], 8)
    stopped = region.stopService()
    reactor.pump(lambda: stopped.called)
    assert stores["s2"].saved == {"a": "0-1-8"} and region.exit_code == 0
    assert stores["s1"].calls == 1  # handed on once, not stopped again
