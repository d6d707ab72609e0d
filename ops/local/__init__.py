"""A whole topology on this machine: `squealctl up` / `status` / `down` / `stop|start|restart NAME`.

`up` starts a supervisor in the background (ops/supervisor.py), which starts every process of the topology's
plan (ops/plan.py, the list `render systemd` writes units for too: the ZooKeeper ensemble of a topology with
workers, every MariaDB copy, memcached per pool member, one router per router address, a region's squeal
workers or its single daemon, monitoring), restarts any that exits without being asked to, and records them —
current pid, restarts, held down by `stop` — in `<state_dir>/components.json`; `status` and `down` read that
file, so they work from any later shell. Processes are stopped by pid, and only if the pid still runs the
command we started (pids get reused); a component whose recorded pid is gone is looked for by its command line
(restarted by hand, or by a supervisor that has since died), so `down` stops it whatever its pid now.

The state dir is durable: `up` never deletes it. MariaDB datadirs, squeal's datamarkers and the routers'
delete spools stay where the previous `up` left them, so a restarted platform resumes where it stopped
(squeal re-sends from each flow's marker what was committed while it was down).

`Deployment` is the front door; each concern is a module of this package:

- `state`: components.json and the state dir's layout (`Component`, `StateDir`, which `Deployment` is)
- `pids`: is a recorded pid still ours, where a component runs now, stopping by pid
- `up`: the checks before anything starts, `--tls`, launching the supervisor and waiting for it
- `start`: what the supervisor runs: each process of the plan made and started, in order (`doing`, `StartupError`)
- `status`: each component's rows for `squealctl status`
- `control`: `stop|start|restart NAME` through the supervisor's socket, and `down`
"""

from __future__ import annotations

from ops.local import pids
from ops.local.control import control as _control
from ops.local.control import down as _down
from ops.local.start import StartupError, doing, failure_reason
from ops.local.start import start_components as _start_components
from ops.local.state import Component, StateDir
from ops.local.status import status as _status
from ops.local.status import supervisor_status as _supervisor_status
from ops.local.up import up as _up

__all__ = ["ALL_ROLES", "Component", "Deployment", "StartupError", "StateDir", "doing", "failure_reason"]

ALL_ROLES = ("zookeeper", "mariadb-primary", "mariadb-replica", "memcached", "router", "squeal", "monitoring", "demo")


class Deployment(StateDir):
    """The local processes of one topology, tracked in `state_dir` (its files: `StateDir`). Each method is the
    function of the same name in this package's modules (each takes the deployment's StateDir first)."""

    is_running = staticmethod(pids.is_running)
    up = _up
    start_components = _start_components
    status = _status
    supervisor_status = _supervisor_status
    down = _down
    control = _control
