"""Talking to the supervisor `up` left running: `squealctl stop|start|restart NAME` over its control socket, and
`squealctl down` (the supervisor stops its components; whatever it could not stop is stopped by pid here).
"""

from __future__ import annotations

import json
import logging
import signal
import socket

from ops.harness import HarnessError, wait_until
from ops.local import pids
from ops.local.state import StateDir

log = logging.getLogger(__name__)


def down(state: StateDir, grace: float = 10.0) -> int:
    """Stop the supervisor (it stops its components) and then every component still running, whatever its
    pid now; returns how many components were running."""
    components = state.components()
    running = sum(pid is not None for pid in pids.locate(components))
    supervisor = state.supervisor()
    if supervisor and pids.is_running(supervisor):
        log.info("stopping the supervisor, pid %d", supervisor.pid)
        pids.send(supervisor.pid, signal.SIGCONT)
        pids.send(supervisor.pid, signal.SIGTERM)
        # it gives each component `grace` seconds, then SIGKILL
        wait_until(lambda: not pids.is_running(supervisor), grace + 5, "the supervisor to exit", error=None)
        if pids.is_running(supervisor):
            log.warning("the supervisor (pid %d) did not exit; killing it", supervisor.pid)
            pids.send(supervisor.pid, signal.SIGKILL)
    pids.stop(components, grace)  # what the supervisor did not stop (or, dead, could not)
    state.state_file.unlink(missing_ok=True)
    return running


def control(state: StateDir, action: str, name: str) -> str:
    """`stop`, `start` or `restart` the component called `name`, through the supervisor; returns what it did."""
    state.component(name)
    supervisor = state.supervisor()
    if supervisor is None or not pids.is_running(supervisor):
        pid = f" (pid {supervisor.pid})" if supervisor else ""
        raise HarnessError(
            f"the supervisor of the deployment in {state.state_dir} is not running{pid}: nothing can {action} "
            "components by name; `squealctl down`, then `squealctl up` again"
        )
    reply = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(300)  # a start waits for the component's readiness check (MariaDB: up to 60 s)
            s.connect(str(state.control_socket))
            s.sendall(json.dumps({"action": action, "name": name}).encode() + b"\n")
            while not reply.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
    except OSError as e:
        raise HarnessError(f"cannot reach the supervisor on {state.control_socket}: {e}") from e
    if not reply:
        raise HarnessError(f"the supervisor closed the connection without answering `{action} {name}`")
    answer = json.loads(reply)
    if not answer["ok"]:
        raise HarnessError(answer["error"])
    return answer["message"]
