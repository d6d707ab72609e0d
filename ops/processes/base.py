"""What every process the harness starts shares: `ManagedProcess` (a work dir, a log file, a readiness check,
stopped by pid), free ports, `wait_until` (the one poll loop of the code base), the child environment, and the reaper
that kills what a crashed caller left running."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]


class _Reaper:
    """This process's `python -m ops.reaper` (started on first use): told of every server `ManagedProcess.start`
    starts and stops, it kills the ones still running when this process ends without stopping them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = 0  # the pid that started it (a forked child must start its own)

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._owner != os.getpid():
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "ops.reaper"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    env=child_env(),
                    cwd=REPO_ROOT,
                    start_new_session=True,  # a signal to this process group must not end it before its parent
                    text=True,
                )
                self._owner = os.getpid()
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                log.warning("the reaper (pid %s) is gone: servers started from now on outlive a crash", self._proc.pid)

    def started(self, pid: int) -> None:
        from ops.reaper import start_time

        started = start_time(pid)
        if started is not None:
            self._send(f"+{pid} {started}")

    def stopped(self, pid: int) -> None:
        if self._proc is not None:
            self._send(f"-{pid}")


_reaper = _Reaper()


class HarnessError(RuntimeError):
    """A component could not be started (missing binary, failed readiness check)."""


_handed_out: set[int] = set()


def child_env() -> dict[str, str]:
    """The environment for the Python processes we start (squeal, monitoring, the supervisor): this checkout
    first on PYTHONPATH, so a child imports the same code as its parent even when the virtualenv's editable
    install points at another checkout (a git worktree sharing `.venv`)."""
    env = dict(os.environ)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + rest if rest else "")
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel picks it), never one this process handed out before:
    callers often ask for many ports before binding any (a whole topology), and must not get one twice."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def require_binary(name: str, package: str, *, search: tuple[str, ...] = ()) -> str:
    """Absolute path of `name`, or an error telling the operator how to install it."""
    found = shutil.which(name) or next((p for p in search if os.access(p, os.X_OK)), None)
    if not found:
        raise HarnessError(f"{name} not found: install it with `apt-get install {package}` (or run scripts/setup.sh)")
    return found


class Polled(Protocol):
    """What `wait_until` watches for an early exit: a Popen, or the supervisor's `Run`."""

    returncode: int | None

    def poll(self) -> int | None: ...


def wait_until(
    check: Callable[[], T],
    timeout: float,
    what: str = "condition",
    proc: Polled | None = None,
    log_file: Path | None = None,
    *,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (OSError,),
    error: type[Exception] | None = HarnessError,
) -> T | None:
    """Poll `check` every `interval` s until it returns something truthy, and return that: the one poll loop
    of the code base (start-up checks, experiments, drills, test helpers).

    `check` runs at least once, and once more at the deadline. An exception in `ignore` (default: OSError, a
    server not answering yet) counts as not yet. If `proc` (anything with `poll()`/`returncode`) exits, fail
    at once with `log_file`'s tail. Time out: raise `error` (saying `what` and the log tail), or, when
    `error` is None, return the last falsy result (None if `check` raised).
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise (error or HarnessError)(f"{what} exited with code {proc.returncode} during start-up{_tail(log_file)}")
        result = None
        with contextlib.suppress(*ignore):
            result = check()
        if result:
            return result
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(interval, left))
    if error is None:
        return result
    raise error(f"timed out after {timeout:g}s waiting for {what}{_tail(log_file)}")


def _tail(log_file: Path | None, lines: int = 15) -> str:
    if log_file is None or not log_file.exists():
        return ""
    text = log_file.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last lines of {log_file} ---\n" + "\n".join(text)


class ManagedProcess:
    """One child process with a work dir, a log file and a readiness check. Context manager."""

    name = "process"

    def __init__(self, port: int | None = None, workdir: str | Path | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"squeal-{self.name}-")).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.workdir / f"{self.name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def prepare(self) -> None:
        """Anything to do before the first start (e.g. initialise a datadir)."""

    start_timeout = 30.0

    def start(self) -> ManagedProcess:
        if self.proc and self.proc.poll() is None:
            return self
        self.prepare()
        log_handle = open(self.log_file, "ab")
        log.info("starting %s on %s (log %s)", self.name, self.address, self.log_file)
        self.proc = subprocess.Popen(
            self.command(),
            env=child_env(),
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal must not kill children before we stop them
        )
        log_handle.close()
        _reaper.started(self.proc.pid)  # and if this process dies without stopping it, it goes too
        try:
            wait_until(self.ready, self.start_timeout, f"{self.name} on {self.address}", self.proc, self.log_file)
        except BaseException:
            self.kill()
            raise
        return self

    stop_signal = signal.SIGTERM

    def stop(self, grace: float = 10.0) -> None:
        """`stop_signal` (SIGTERM), wait up to `grace` seconds, then SIGKILL."""
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("%s pid %s ignored SIGTERM for %.0fs; killing", self.name, self.proc.pid, grace)
            self.kill()
        _reaper.stopped(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL: for tests that simulate a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            _reaper.stopped(self.proc.pid)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its port but stops answering (a hung server).

        Returns once every thread is stopped: a signal is delivered asynchronously, and on a busy machine a
        thread already running could still answer a request sent right after the kill."""
        assert self.proc is not None
        pid = self.proc.pid
        os.kill(pid, signal.SIGSTOP)

        def stopped() -> bool:
            try:
                return all(
                    (task / "stat").read_text().rpartition(")")[2].split()[0] in ("T", "t")
                    for task in Path(f"/proc/{pid}/task").iterdir()
                )
            except OSError:  # a thread exited while we looked: look again
                return False

        wait_until(stopped, 5.0, f"{self.name} pid {pid} to stop", interval=0.005)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _http_ok(url: str, unhealthy_ok: bool = False) -> bool:
    """True once `url` answers 200 (or, with `unhealthy_ok`, 503 with a JSON body: a daemon up but unhealthy)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as e:
        return unhealthy_ok and e.code == 503 and e.headers.get("content-type", "").startswith("application/json")
    except urllib.error.URLError:
        return False
