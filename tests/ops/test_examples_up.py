"""Every example in examples/ comes up with `squealctl up`, with and without `--tls` (ports moved to free ones).

Each run brings the whole example up with its demo web tier (databases, ZooKeeper, memcached, routers, squeal,
monitoring), checks that `status` finds every component running and answering, lets the demo serve, requires
`squealctl verify` to compare some cached copies and find none stale, and takes it down. Pairs that other tests
already bring up in full are left to them: examples/local.toml without TLS (tests/e2e/test_platform.py) and
examples/sharded.toml without TLS (tests/ops/test_sharded_deployment.py).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import urllib.request
from pathlib import Path

import pytest

import router_config
from ops.harness import REPO_ROOT, ROUTER_BIN, wait_until
from tests.binaries import needs_binary
from tests.ops.deployments import squealctl, stable_port


def demo_requests_served(metrics: str) -> float:
    """Requests the demo web tier answered `ok` (its /metrics)."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    ok = [ln for ln in text.splitlines() if ln.startswith("squeal_demo_requests_total{") and 'outcome="ok"' in ln]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in ok)


WITHIN = 60.0  # a deadline for something that must happen, not a speed check
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.toml"))
COVERED_ELSEWHERE = {("local", False), ("sharded", False)}

pytestmark = [pytest.mark.slow, needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")]


def test_the_examples_are_the_ones_this_module_knows():
    """A new example is brought up here too (or added to COVERED_ELSEWHERE with the test that does)."""
    assert {e.stem for e in EXAMPLES} == {"local", "sharded", "three-hosts", "three-hosts-ha"}


RUNS = [(e, tls) for e in EXAMPLES for tls in (False, True) if (e.stem, tls) not in COVERED_ELSEWHERE]


@pytest.mark.parametrize(("example", "tls"), RUNS, ids=[f"{e.stem}-{'tls' if t else 'plaintext'}" for e, t in RUNS])
def test_every_example_comes_up(example: Path, tls: bool, tmp_path: Path) -> None:
    topo = router_config.reassign_ports(router_config.load(example), stable_port)
    path = tmp_path / example.name
    path.write_text(router_config.dumps(topo))
    # a short state dir: MariaDB refuses a socket path over 107 bytes, and pytest's tmp paths are long
    state = Path(tempfile.mkdtemp(prefix="squeal-example-"))
    try:
        squealctl(state, "up", str(path), "--demo", *(["--tls"] if tls else []))
        rows = json.loads(squealctl(state, "status", "--json").stdout)
        down = [r["name"] for r in rows if not (r["running"] and r.get("answering", True))]
        assert rows and not down, f"not running or not answering: {down}"
        assert {r["role"] for r in rows} >= {"mariadb-primary", "memcached", "router", "monitoring", "demo"}
        demo = next(r for r in rows if r["role"] == "demo")
        wait_until(lambda: demo_requests_served(demo["metrics"]) >= 50, WITHIN, f"{example.stem}'s demo serving")
        result = squealctl(state, "verify", str(path), check=False)
        summary = result.stdout + result.stderr
        assert result.returncode == 0 and " 0 stale" in summary, summary
        compared = re.search(r"(\d+) cached copies compared", summary)
        assert compared and int(compared[1]) > 0, f"verify compared nothing, so it proved nothing: {summary}"
    finally:
        squealctl(state, "down", check=False)
        shutil.copytree(
            state, tmp_path / "state", ignore=shutil.ignore_patterns("data-*", "*.sock"), dirs_exist_ok=True
        )
        shutil.rmtree(state, ignore_errors=True)  # (logs kept under tmp_path above)
