"""`squealctl up`: check that nothing of the topology runs or holds its ports, then start the supervisor
(ops/supervisor.py) in its own session and wait on a pipe until it reports every component answering — or why
start-up failed, once it has stopped what it started. `up --tls` first gives the topology a `[tls]` of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import tomli_w

import router_config
from ops import tls as pki
from ops.harness import HarnessError, _tail, child_env
from ops.local import pids
from ops.local.state import Component, StateDir
from ops.plan import plan


def up(
    state: StateDir,
    topology_path: str | Path,
    without: frozenset[str] = frozenset(),
    demo: bool = False,
    demo_rate: float = 40.0,
    tls: bool = False,
) -> list[Component]:
    """Start the supervisor, which starts every component of the topology and keeps it running; returns once
    every component answers. On any failure the supervisor stops what it started and the error is raised.

    With a `[tls]` section (or `tls`: `squealctl up --tls`, which gives the topology one, see `with_tls` below)
    every server starts with TLS on its topology port and every client dials it with TLS."""
    topo = router_config.load(topology_path)
    supervisor = state.supervisor()
    if (supervisor and pids.is_running(supervisor)) or any(pids.locate(state.components())):
        raise HarnessError(f"a topology is already up (state in {state.state_dir}); run `squealctl down` first")
    # A server that cannot bind may look ready anyway when another service answers on its port.
    busy = [
        f"{a} ({where})"
        for role, where, a in topo.listeners()
        if role not in without and not router_config.can_listen(a)
    ]
    if busy:
        more = f" and {len(busy) - 5} more" if len(busy) > 5 else ""
        raise HarnessError(
            f"{topology_path}: {len(busy)} port(s) already in use, nothing started: {', '.join(busy[:5])}{more}; "
            "stop what listens there or change the port in the topology file"
        )
    if tls and topo.tls is None:
        topology_path = with_tls(state, topology_path, topo)
        topo = router_config.load(topology_path)
    plan(topo, without=without)  # with [tls], a missing certificate: nothing started
    # Never wipe the state dir: it holds durable state a restart must resume from (MariaDB datadirs,
    # reused by MariaDB.prepare; squeal's datamarkers; the routers' delete spools). components.json is
    # rewritten by the supervisor before it starts anything (nothing it names runs: checked above); a squeal
    # pid file left by a crash is overwritten by the daemon, and `squeal replay` checks a pid before
    # signalling it.
    state.state_dir.mkdir(parents=True, exist_ok=True)
    # The only disposable state: warm-up overlays describe the previous run's router configs (and caches,
    # which start empty again); `up` writes every cluster's normal config, so an overlay would be a lie.
    (state.state_dir / "warmup.json").unlink(missing_ok=True)
    state.state_file.unlink(missing_ok=True)
    return _start_supervisor(state, topology_path, without, demo, demo_rate)


def with_tls(state: StateDir, topology_path: str | Path, topo: router_config.Topology) -> Path:
    """`squealctl up --tls` on a topology without `[tls]`: a local CA and a certificate per component in
    `<state>/tls/` (ops/tls.py; the CA is kept across `up`s), each valid for every host of the topology, and
    `<state>/topology-tls.toml` — the topology file as it is, plus `[tls] dir = <state>/tls, require = true`
    — which every component then reads: the servers take their certificates from it, the clients (squeal,
    monitoring, the demo web tier, `squealctl verify/flush/drill`) their CA and their own certificates."""
    directory = state.state_dir / "tls"
    zookeepers = topo.zookeeper.servers if topo.zookeeper is not None else ()
    hosts = [*topo.hosts(), *(a.host for a in zookeepers), "localhost"]
    pki.issue_for_components(directory, router_config.TLS_COMPONENTS, hosts)
    text = Path(topology_path).read_text()
    section = tomli_w.dumps({"tls": {"dir": str(directory), "require": True}})
    out = state.tls_topology
    state.state_dir.mkdir(parents=True, exist_ok=True)
    state.tls_topology.with_suffix(".source").write_text(str(Path(topology_path).resolve()))
    out.write_text(
        text.rstrip("\n")
        + f"\n\n# Added by `squealctl up --tls` to {Path(topology_path).resolve()}: every link over TLS.\n"
        + section
    )
    return out


def _start_supervisor(
    state: StateDir, topology_path: str | Path, without: frozenset[str], demo: bool, demo_rate: float
) -> list[Component]:
    """`python -m ops.supervisor` in its own session (it outlives this shell); it reports on a pipe once every
    component answers, or why start-up failed once it has stopped what it started."""
    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-m", "ops.supervisor", str(state.state_dir), str(topology_path)]
    cmd += ["--ready-fd", str(write_fd), "--demo-rate", str(demo_rate)]
    if without:
        cmd += ["--without", ",".join(sorted(without))]
    if demo:
        cmd.append("--demo")
    log_path = state.state_dir / "supervisor.log"
    try:
        with open(log_path, "ab") as log_file:
            proc = subprocess.Popen(
                cmd,
                env=child_env(),  # its components inherit it: this checkout's code everywhere
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in this terminal must not reach it later
                pass_fds=(write_fd,),
            )
    finally:
        os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as ready:
            line = ready.readline()
    except BaseException:  # Ctrl-C during start-up: stop what was started, as before
        pids.send(proc.pid, signal.SIGTERM)
        proc.wait()
        state.state_file.unlink(missing_ok=True)
        raise
    reply = json.loads(line) if line.strip() else {}
    if reply.get("ok"):
        return state.components()
    code = proc.wait()  # it has stopped what it started (or died)
    state.state_file.unlink(missing_ok=True)
    died = f"the supervisor exited during start-up (code {code}){_tail(log_path)}"
    raise HarnessError(reply.get("error") or died)
