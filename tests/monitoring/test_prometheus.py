"""`squealctl prometheus-config` and monitoring/alerts.yml pass Prometheus' own checks (promtool, from Debian's
`prometheus` package that scripts/setup.sh installs), and every alert is unit-tested, documented and names a
runbook that exists. The real Prometheus binary runs in test_prometheus_server.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from monitoring.prometheus import ALERT_RULES, render_yaml, scrape_config
from ops.cli import main as squealctl
from tests.binaries import needs_binary

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "monitoring" / "alerts.yml"
ALERT_TESTS = ROOT / "monitoring" / "alerts_test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = needs_binary(
    PROMTOOL is not None, "promtool not found: scripts/setup.sh installs it (Debian package `prometheus`)"
)


def component(role: str, region: str, cluster: str | None = None, metrics: str | None = None, **kw) -> dict:
    """One entry of components.json as `squealctl up` writes it."""
    return {
        "role": role,
        "region": region,
        "cluster": cluster,
        "pool": kw.get("pool"),
        "pid": kw.get("pid", 1),
        "address": kw.get("address", "127.0.0.1:1"),
        "log": "/dev/null",
        "cmdline": ["x"],
        "metrics": metrics,
    }


def write_components(state_dir: Path, components: list[dict]) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "components.json"
    path.write_text(json.dumps({"topology": str(ROOT / "examples" / "local.toml"), "components": components}))
    return path


def alert_blocks() -> dict[str, str]:
    """alert name -> the text of its rule in alerts.yml."""
    parts = re.split(r"^      - alert: ", ALERTS.read_text(), flags=re.M)[1:]
    return {p.split("\n", 1)[0].strip(): p for p in parts}


def promtool(*args: str) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def test_scrape_config_jobs_labels_and_rules(tmp_path: Path) -> None:
    components = write_components(
        tmp_path,
        [
            component("memcached", "east", "east-a", pool="wildcard"),  # no /metrics: memcached_exporter's job
            component("router", "east", "east-a", "127.0.0.1:9201"),
            component("router", "west", "west-a", "127.0.0.1:9202"),
            component("squeal", "east", metrics="127.0.0.1:9100"),
            component("monitoring", "east", metrics="127.0.0.1:19000"),
        ],
    )
    doc = scrape_config(components)
    assert doc["global"] == {"scrape_interval": "5s", "evaluation_interval": "5s"}
    assert doc["rule_files"] == [str(ALERT_RULES)] and ALERT_RULES == ALERTS and ALERT_RULES.is_absolute()
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert sorted(jobs) == ["squeal-monitoring", "squeal-router", "squeal-squeal"]
    assert jobs["squeal-router"]["static_configs"] == [
        {"targets": ["127.0.0.1:9201"], "labels": {"region": "east", "cluster": "east-a"}},
        {"targets": ["127.0.0.1:9202"], "labels": {"region": "west", "cluster": "west-a"}},
    ]
    # the prober exports the region/cluster it probed: they must not become exported_region/exported_cluster
    assert all(j["honor_labels"] is True for j in jobs.values())
    assert "rule_files" not in scrape_config(components, rules=None)
    assert json.loads(render_yaml(doc)) == doc


@needs_promtool
def test_squealctl_prometheus_config_passes_promtool(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state = tmp_path / "state"
    write_components(
        state,
        [
            component("router", "east", "east-a", "127.0.0.1:9201"),
            component("squeal", "east", metrics="127.0.0.1:9100"),
            component("monitoring", "east", metrics="127.0.0.1:19000"),
        ],
    )
    assert squealctl(["--state-dir", str(state), "prometheus-config"]) == 0
    config = tmp_path / "elsewhere" / "prometheus.yml"  # saved away from the repository: rules still found
    config.parent.mkdir()
    config.write_text(capsys.readouterr().out)
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_blocks())} rules found" in out and str(ALERTS) in out


@needs_promtool
def test_alert_rules_pass_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_blocks())} rules found" in result.stdout


@needs_promtool
def test_alert_rules_unit_tests_pass() -> None:
    """monitoring/alerts_test.yml: each alert fires on a synthetic series and stays quiet on a healthy one."""
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_for_severity_runbook_tests_and_docs() -> None:
    blocks = alert_blocks()
    expected = {
        "SquealDaemonDown",
        "SquealFlowLagHigh",
        "SquealFlowBacklogStuck",
        "SquealReaderDisconnected",
        "SquealHalted",
        "SquealBinlogDataLoss",
        "SquealBulkChangeNeedsFlush",
        "SquealDatamarkerAgeHigh",
        "SquealDatamarkerWriteErrors",
        "SquealProbeDeadlineMissed",
        "SquealConsistencyBelowSlo",
        "SquealGutterActive",
        "SquealRouterServersTKO",
        "SquealPoolShardUnowned",
        "SquealTlsCertExpiringSoon",
    }
    assert set(blocks) == expected
    tests = ALERT_TESTS.read_text()
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(squeal_[a-z_]+)`", doc, re.M))
    for name, block in blocks.items():
        assert re.search(r"^        for: \d+[smh]$", block, re.M), f"{name}: no for:"
        assert re.search(r"^          severity: (critical|warning)$", block, re.M), f"{name}: no severity"
        for key in ("summary", "description"):
            assert re.search(rf"^          {key}: ", block, re.M), f"{name}: no {key}"
        runbook = re.search(r"^          runbook: (docs/runbooks/[a-z0-9-]+\.md)$", block, re.M)
        assert runbook and (ROOT / runbook.group(1)).is_file(), f"{name}: runbook missing or not a file"
        assert f"Runbook: {runbook.group(1)}" in block, f"{name}: the description does not name its runbook"
        # fires in at least one unit test (an expected alert, not only `exp_alerts: []`)
        assert re.search(rf"alertname: {name}\n\s+exp_alerts:\n\s+- exp_labels:", tests), f"{name}: never fires"
        assert f"| `{name}` |" in doc, f"{name}: not in docs/metrics.md (Alerts)"
        for metric in re.findall(r"\bsqueal_[a-z_]+", block.split("annotations:")[0]):
            assert re.sub(r"_(total|bucket|count|sum)$", "", metric) in documented, f"{name}: {metric} undocumented"
