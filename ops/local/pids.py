"""Recorded components as live processes: is a pid still the one we started, where does a component run now, and
stopping them by pid (SIGTERM, then SIGKILL after a grace period).

Pids get reused, so a pid counts only while it runs the command we recorded; a component whose recorded pid is
gone is looked for by its command line (restarted by hand, or by a supervisor that has since died).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from dataclasses import asdict

import psutil

from ops.harness import wait_until
from ops.local.state import Component

log = logging.getLogger(__name__)


def is_running(c: Component) -> bool:
    """The pid is alive and still runs the command we started (not a reused pid)."""
    try:
        proc = psutil.Process(c.pid)
        same = same_command(proc.cmdline(), c.cmdline) if len(c.cmdline) > 1 else True
        return proc.status() != psutil.STATUS_ZOMBIE and same
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def locate(components: list[Component]) -> list[int | None]:
    """The pid each component runs as now: the recorded one while it runs the recorded command, else any
    process running exactly that command (restarted by hand, or by a supervisor that has since died)."""
    found: list[int | None] = [c.pid if is_running(c) else None for c in components]
    missing = [i for i, pid in enumerate(found) if pid is None and len(components[i].cmdline) > 1]
    if missing:
        for proc in psutil.process_iter(["cmdline", "status"]):
            cmdline, status = proc.info["cmdline"], proc.info["status"]
            if not cmdline or status == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            for i in missing:
                if found[i] is None and same_command(cmdline, components[i].cmdline):
                    found[i] = proc.pid
                    break
    return found


def stop(components: list[Component], grace: float = 10.0) -> int:
    """SIGTERM every one still running (newest first, wherever it runs now), SIGKILL any still there after
    `grace` seconds; returns how many were running."""
    newest_first = list(reversed(components))
    running = [(c, pid) for c, pid in zip(newest_first, locate(newest_first), strict=True) if pid]
    for c, pid in running:
        log.info("stopping %s pid %d", c.name or c.role, pid)
        send(pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
        send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for c, pid in running:
        current = Component(**{**asdict(c), "pid": pid})
        left = deadline - time.monotonic()
        wait_until(functools.partial(_stopped, current), left, f"pid {pid} to exit", error=None)
        if is_running(current):
            log.warning("%s pid %d ignored SIGTERM; killing", c.name or c.role, pid)
            send(pid, signal.SIGKILL)
    return len(running)


def same_command(actual: list[str], recorded: list[str]) -> bool:
    """A script's shebang puts its interpreter first, so compare the arguments after the program."""
    return len(actual) >= len(recorded) and actual[len(actual) - len(recorded) + 1 :] == recorded[1:]


def uptime(pid: int) -> float | None:
    try:
        return max(0.0, time.time() - psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def send(pid: int, sig: int) -> None:
    """Signal `pid`, if it still exists."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _stopped(c: Component) -> bool:
    return not is_running(c)
