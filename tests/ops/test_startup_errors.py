"""A start-up failure of `squealctl up` names the component (as `status` lists it), its address, what `up` was doing
and the log to read (issue 37 item 2)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pymysql
import pytest

from ops.local import StartupError, doing
from tests.ops.deployments import TWO_REGIONS, squealctl, write_on_stable_ports


def test_a_step_that_fails_is_named_with_the_component_its_address_and_its_log(tmp_path):
    proc = SimpleNamespace(address="127.0.0.1:3306", log_file=tmp_path / "mariadb-3306.log")
    with pytest.raises(StartupError) as caught:
        with doing("mariadb/east/users-0/east-r", proc, "replicating from 127.0.0.1:3307 and catching up with it"):
            raise pymysql.err.OperationalError(1045, "Access denied for user 'squeal'@'127.0.0.1'")
    assert str(caught.value) == (
        f"mariadb/east/users-0/east-r (127.0.0.1:3306, log {tmp_path}/mariadb-3306.log): replicating from "
        "127.0.0.1:3307 and catching up with it failed: OperationalError 1045: Access denied for user "
        "'squeal'@'127.0.0.1'"
    )
    # a step inside another keeps the innermost (most precise) name
    with pytest.raises(StartupError, match=r"^inner "):
        with doing("outer", proc, "outer step"), doing("inner", proc, "inner step"):
            raise OSError("boom")


def test_up_names_the_server_that_did_not_start(tmp_path):
    """A real failure: MariaDB refuses a Unix socket path over 107 bytes, so a state dir that deep stops the first
    server. `up` must say which component, where, doing what, and which log says why."""
    path = tmp_path / "two.toml"
    topo = write_on_stable_ports(TWO_REGIONS, path)
    deep = Path(tempfile.mkdtemp(prefix="squeal-startup-")) / ("d" * 90)
    try:
        result = squealctl(deep, "up", str(path), "--without", "memcached,router,squeal,monitoring", check=False)
        assert result.returncode != 0
        db = topo.master.database
        first = result.stderr.strip().splitlines()[0]
        assert re.match(
            rf"squealctl: error: mariadb/east \({db.host}:{db.port}, log {deep}/mariadb-east/\S+\.log\): "
            r"starting it failed: .* exited with code \d+ during start-up",
            first,
        ), result.stderr
        assert "The socket file path is too long" in result.stderr  # the log's tail says why
    finally:
        shutil.rmtree(deep.parent, ignore_errors=True)
