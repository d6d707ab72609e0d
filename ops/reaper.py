"""Stops the servers a process started when that process dies without stopping them (issue 37 item 7).

The harness starts every server in a session of its own (`start_new_session`: a Ctrl-C in the terminal must not
reach it before the harness stops it in order), so nothing ties a server to the process that started it: a test
run killed with SIGKILL (a CI timeout, an impatient developer) left its MariaDB, ZooKeeper and squeal processes
running. `python -m ops.reaper` is the tie: the harness starts one per process, on first use, and tells it on
its stdin which servers it starts and stops:

    +PID START_TIME     a server started (PID leads its own process group; START_TIME from /proc/PID/stat)
    -PID                that server was stopped

When its stdin ends — the harness's process exited or was killed, the kernel closes the pipe either way — it
kills the process group of every server still registered, if its leader is still that same process (same start
time: a pid the kernel gave to something else is left alone). It ignores SIGINT and SIGTERM meant for the
terminal's process group or the test run: only the end of its parent ends it.
"""

from __future__ import annotations

import os
import signal
import sys


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def reap(lines: list[str]) -> list[int]:
    """The registrations in `lines` applied in order; kills what is left, returns the pids it killed."""
    alive: dict[int, str] = {}
    for line in lines:
        op, _, rest = line.strip().partition(" ")
        if op.startswith("+") and op[1:].isdigit():
            alive[int(op[1:])] = rest
        elif op.startswith("-") and op[1:].isdigit():
            alive.pop(int(op[1:]), None)
    killed = []
    for pid, started in alive.items():
        if start_time(pid) != started:
            continue  # gone already, or a new process with a reused pid
        for sig in (signal.SIGCONT, signal.SIGKILL):  # (SIGCONT: a paused server must not linger)
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
        killed.append(pid)
    return killed


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lines = []
    for line in sys.stdin:  # until the parent's end closes the pipe
        lines.append(line)
    reap(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
