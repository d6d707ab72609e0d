"""`squealctl status` tells a squeal daemon that answers but does not deliver (/healthz 503: halted on binlog data
loss, markers not saved, ...) from one that is up, and says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import psutil
import pytest

from ops.local import Component, Deployment

PROBLEMS = {"data_loss": "the binlog no longer has 0-1-5..0-1-9: run `squealctl accept-data-loss --region east`"}


class Health(BaseHTTPRequestHandler):
    code = 503

    def do_GET(self) -> None:
        body = json.dumps({"ok": self.code == 200, "problems": PROBLEMS if self.code != 200 else {}}).encode()
        self.send_response(self.code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def healthz() -> Iterator[HTTPServer]:
    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def record(state: Path, address: str) -> None:
    """A deployment whose squeal component is this very process (alive, same command) serving `address`."""
    me = os.getpid()
    squeal = Component(
        role="squeal",
        region="east",
        cluster=None,
        pool=None,
        pid=me,
        address=address,
        log=str(state / "squeal.log"),
        cmdline=psutil.Process(me).cmdline(),
        name="squeal/east",
    )
    state.mkdir(parents=True, exist_ok=True)
    Deployment(state).save([squeal], "topology.toml")


@pytest.mark.parametrize("code", [503, 200])
def test_status_shows_a_daemon_that_answers_503_as_unhealthy_with_its_problems(tmp_path, healthz, code) -> None:
    Health.code = code
    address = f"127.0.0.1:{healthz.server_address[1]}"
    record(tmp_path, address)
    row = Deployment(tmp_path).status()[0]
    assert row["answering"] and row["healthy"] is (code == 200)
    assert row["problems"] == (PROBLEMS if code == 503 else {})
    out = subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(tmp_path), "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = next(line for line in out.stdout.splitlines() if line.startswith("squeal/east"))
    if code == 503:
        assert line.endswith("UNHEALTHY (/healthz 503): data_loss: " + PROBLEMS["data_loss"]), line
    else:
        assert line.endswith(" up"), line


def test_status_json_says_healthy_and_why_not_for_every_component(tmp_path, healthz) -> None:
    """Issue 27 item 6: `status --json` carries `healthy` and `problems` for every component, not only the text
    form, and not only squeal's (a halted leader must not look healthy to a script)."""
    Health.code = 503
    record(tmp_path, f"127.0.0.1:{healthz.server_address[1]}")
    deployment = Deployment(tmp_path)
    me = os.getpid()
    gone = Component(
        role="memcached",
        region="east",
        cluster="east-a",
        pool="wildcard",
        pid=2**22 + 7,
        address="127.0.0.1:1",
        log="",
        cmdline=["/nonexistent/memcached", "-p", "1"],
        name="memcached/east-a/wildcard/0",
    )
    closed = Component(
        role="router",
        region="east",
        cluster="east-a",
        pool=None,
        pid=me,
        address="127.0.0.1:1",
        log="",
        cmdline=psutil.Process(me).cmdline(),
        name="router/east-a/0",
    )
    deployment.save(deployment.components() + [gone, closed], "topology.toml")
    out = subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(tmp_path), "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["squeal/east"]["healthy"] is False and rows["squeal/east"]["problems"] == PROBLEMS
    assert rows["memcached/east-a/wildcard/0"]["healthy"] is False
    assert "not running" in rows["memcached/east-a/wildcard/0"]["problems"]["process"]
    assert rows["router/east-a/0"]["healthy"] is False
    assert "does not accept connections" in rows["router/east-a/0"]["problems"]["port"]
