"""What the ops tests share: a small two-region topology, stable ports, and `squealctl` as a process."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import router_config
from ops.harness import REPO_ROOT

# Ports here are placeholders (the loader wants them distinct); every one is reassigned to a free port.
TWO_REGIONS = """
[[rules]]
table = "app.users"
keys = ["user:{id}"]

[regions.east]
master = true
database = { role = "primary", port = 1, server_id = 1 }

[regions.east.clusters.east-a]
routers = ["127.0.0.1:2"]
pools.wildcard = { kind = "wildcard", servers = ["127.0.0.1:3"] }

[regions.west]
database = { role = "replica", port = 4, server_id = 2 }

[regions.west.clusters.west-a]
routers = ["127.0.0.1:5"]
pools.wildcard = { kind = "wildcard", servers = ["127.0.0.1:6"] }
"""

_handed_out: set[int] = set()


def stable_port() -> int:
    """A free port below Linux's ephemeral range (32768-60999): a second `up` binds every port again, and
    no outgoing connection of the first run (or of anything else) can be holding one as its source port."""
    while True:
        port = random.randint(20000, 32000)
        if port not in _handed_out and router_config.can_listen(router_config.Address("127.0.0.1", port)):
            _handed_out.add(port)
            return port


def squealctl(state: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`squealctl --state-dir STATE ARGS...` in a process of its own; raises with its output if it fails."""
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"squealctl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result
