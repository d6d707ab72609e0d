"""A test run killed with SIGKILL takes its servers with it (issue 37 item 7, ops/reaper.py): a pytest that started
a memcached and a MariaDB through the fixtures is killed, and both servers go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from ops.harness import REPO_ROOT, wait_until
from ops.reaper import reap, start_time

INNER = textwrap.dedent(
    """
    import os, time
    from pathlib import Path

    def test_start_servers_and_hang(memcached_factory, mariadb_factory):
        mc, db = memcached_factory(), mariadb_factory()
        Path(os.environ["SQUEAL_TEST_PIDS"]).write_text(f"{mc.proc.pid} {db.proc.pid}")
        time.sleep(600)  # killed long before
    """
)


def alive(pid: int) -> bool:
    return start_time(pid) is not None and "Z" not in Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2][:3]


def test_servers_die_with_a_killed_pytest(tmp_path):
    inner = tmp_path / "test_inner.py"
    inner.write_text(INNER)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "SQUEAL_TEST_PIDS": str(pids_file), "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(inner)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: pids_file.exists() and pids_file.read_text(), 120, "the inner test's servers", run)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(alive(p) for p in pids)
        run.send_signal(signal.SIGKILL)  # no teardown, no atexit: only the reaper can stop them now
        run.wait()
        wait_until(lambda: not any(alive(p) for p in pids), 30, f"the servers {pids} to die with the test run")
    finally:
        if run.poll() is None:
            run.kill()
        for pid in [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


def test_the_reaper_spares_what_was_stopped_and_pids_reused_since():
    """Unit: a stopped server is forgotten; a registered pid whose process changed (start time) is left alone."""
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        me = start_time(sleeper.pid)
        lines = [f"+{sleeper.pid} {me}\n", f"+{other.pid} 1\n", "+999999999 5\n", f"+{os.getpid()} x\n"]
        assert reap([*lines, f"-{sleeper.pid}\n"]) == []  # stopped, a wrong start time, gone, not ours
        assert reap(lines) == [sleeper.pid]
        sleeper.wait(10)
        assert sleeper.returncode == -signal.SIGKILL and other.poll() is None
    finally:
        for p in (sleeper, other):
            p.kill()
            p.wait()
