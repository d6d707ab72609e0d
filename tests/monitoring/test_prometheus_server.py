"""Debian's real `prometheus` on the config `squealctl prometheus-config` prints: every target is up and the
alerting rules are loaded and evaluated without errors.

The targets are processes that start in well under a second: two routers (`--metrics-port`) in front of a
memcached, and the monitoring server (`--no-prober`), listed in a components.json like the one `squealctl
up` writes. squeal daemons are the same kind of target (a static host:port serving /metrics); starting one
needs MariaDB, which the promtool tests do not.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path

import pytest

from ops.cli import main as squealctl
from ops.harness import ManagedProcess, MonitoringServer, free_port, wait_until
from tests.binaries import needs_binary

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "monitoring" / "alerts.yml"
PROMETHEUS = shutil.which("prometheus")

pytestmark = needs_binary(
    PROMETHEUS is not None, "prometheus not found: scripts/setup.sh installs it (Debian package `prometheus`)"
)


def _get(url: str) -> dict | bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = resp.read()
    return json.loads(body) if resp.headers.get_content_type() == "application/json" else body


class Prometheus(ManagedProcess):
    """`prometheus` on a free loopback port, its TSDB in the work dir."""

    name = "prometheus"

    def __init__(self, config: Path, workdir: Path) -> None:
        super().__init__(workdir=workdir)
        self.config = config

    def command(self) -> list[str]:
        assert PROMETHEUS is not None
        return [
            PROMETHEUS,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address={self.address}",
            "--log.level=warn",
        ]

    def ready(self) -> bool:
        return _get(f"http://{self.address}/-/ready").startswith(b"Prometheus Server is Ready")

    def api(self, path: str) -> dict:
        reply = _get(f"http://{self.address}/api/v1/{path}")
        assert reply["status"] == "success", reply
        return reply["data"]


def test_prometheus_scrapes_every_target_and_loads_the_rules(
    tmp_path: Path, processes, memcached_factory, router_factory, capsys: pytest.CaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    memcached = memcached_factory()
    components = [
        {
            "role": "memcached",
            "region": "east",
            "cluster": "east-a",
            "pool": "wildcard",
            "pid": memcached.pid,
            "address": memcached.address,
            "log": str(memcached.log_file),
            "cmdline": memcached.command(),
            "metrics": None,
        }
    ]
    config = {"pools": {"main": {"servers": [memcached.address]}}, "route": {"type": "PoolRoute", "pool": "main"}}
    for region, cluster in (("east", "east-a"), ("west", "west-a")):
        router = router_factory(config, metrics_port=free_port())
        components.append(
            {
                "role": "router",
                "region": region,
                "cluster": cluster,
                "pool": None,
                "pid": router.pid,
                "address": router.address,
                "log": str(router.log_file),
                "cmdline": router.command(),
                "metrics": f"127.0.0.1:{router.metrics_port}",
            }
        )
    monitor = processes.add(
        MonitoringServer(
            ROOT / "examples" / "local.toml", state, workdir=tmp_path / "monitoring", extra_args=("--no-prober",)
        )
    )
    components.append(
        {
            "role": "monitoring",
            "region": "east",
            "cluster": None,
            "pool": None,
            "pid": monitor.pid,
            "address": monitor.address,
            "log": str(monitor.log_file),
            "cmdline": monitor.command(),
            "metrics": monitor.address,
        }
    )
    (state / "components.json").write_text(json.dumps({"topology": "examples/local.toml", "components": components}))

    assert squealctl(["--state-dir", str(state), "prometheus-config"]) == 0
    prometheus_yml = tmp_path / "prometheus.yml"
    prometheus_yml.write_text(capsys.readouterr().out)
    prometheus = processes.add(Prometheus(prometheus_yml, tmp_path / "prometheus"))

    expected = {c["metrics"]: c for c in components if c["metrics"]}

    def all_up() -> bool:
        active = prometheus.api("targets")["activeTargets"]
        return {t["labels"]["instance"] for t in active} == set(expected) and all(t["health"] == "up" for t in active)

    wait_until(all_up, 30, "every target up in Prometheus", prometheus.proc, prometheus.log_file)
    for target in prometheus.api("targets")["activeTargets"]:
        c = expected[target["labels"]["instance"]]
        assert target["scrapePool"] == f"squeal-{c['role']}"
        assert target["labels"]["region"] == c["region"] and target["labels"].get("cluster") == c["cluster"]
    # the routers' series arrived, with the target's labels
    tko = prometheus.api("query?query=squeal_router_servers_tko")["result"]
    assert sorted((s["metric"]["cluster"], s["value"][1]) for s in tko) == [("east-a", "0"), ("west-a", "0")]

    names = set(re.findall(r"^\s+- alert: (\w+)$", ALERTS.read_text(), re.M))

    def rules_evaluated() -> bool:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return {r["name"] for r in rules} == names and all(r["health"] == "ok" for r in rules)

    wait_until(rules_evaluated, 30, "every rule loaded and evaluated", prometheus.proc, prometheus.log_file)
    groups = prometheus.api("rules")["groups"]
    assert {g["file"] for g in groups} == {str(ALERTS)}
    for rule in (r for g in groups for r in g["rules"]):
        assert rule["type"] == "alerting" and rule["duration"] > 0 and rule["labels"]["severity"]
        assert rule["annotations"]["runbook"].startswith("docs/runbooks/")
    # a healthy set of targets has nothing pending or firing
    assert prometheus.api("alerts")["alerts"] == []
