"""Log levels (issue 37 item 3): INFO for what is expected, WARNING for a degraded state, ERROR for what needs a
person. A clean `squealctl up` of a pooled topology, a planned move (`squealctl move`) and a `down` write no
WARNING or ERROR line in the Python components' logs — and the events themselves are still there, at INFO."""

from __future__ import annotations

import re
from pathlib import Path

from ops.harness import ROUTER_BIN, wait_until
from tests.binaries import needs_binary
from tests.ops.deployments import squealctl, two_worker_deployment_up

pytestmark = needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")

NOT_ROUTINE = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback")


def python_logs(state: Path) -> list[Path]:
    """The logs of the Python components (the servers' own logs — MariaDB's, ZooKeeper's — have their own levels)."""
    return [state / "supervisor.log", *sorted((state / "squeal").glob("*.log")), *(state / "monitoring").glob("*.log")]


def test_a_clean_up_a_planned_move_and_a_down_log_nothing_above_info(tmp_path):
    with two_worker_deployment_up(tmp_path) as deployment:  # up ... down
        state = deployment.state
        owner = deployment.owner("east")
        assert owner is not None
        other = next(i.name for i in deployment.topo.region("east").squeal_instances if i.name != owner)
        squealctl(state, "move", "main", "--to", other)
        # (the preferred worker may get it back soon after: handback_after_s is 2 s here)
        took = re.compile(rf"worker {other} owns shard main \(epoch [2-9]")
        wait_until(lambda: any(took.search(p.read_text()) for p in python_logs(state)), 60, f"{other} took main")
    logs = python_logs(state)
    assert len(logs) >= 4, logs  # the supervisor, three squeal daemons, the monitoring server
    loud = [f"{p.name}: {line}" for p in logs for line in p.read_text().splitlines() if NOT_ROUTINE.search(line)]
    assert loud == [], "\n".join(loud)
    text = "\n".join(p.read_text() for p in logs)
    for event in (  # (the pool's loggers are its modules': squeal.pool.worker, .controller, ...)
        rf"INFO squeal\.pool\.\w+: worker {owner} joined region east's pool",
        r"INFO squeal\.pool\.\w+: worker east-\d is the controller of region east's pool",
        rf"INFO squeal\.pool\.\w+: worker {other} owns shard main",
        rf"INFO squeal\.pool\.\w+: controller: shard main: {owner} -> {other} \(manual",
        r"INFO ops\.supervisor: stopping \d+ components",
    ):
        assert re.search(event, text), event
