"""The one client of a squeal daemon's `/healthz` (`shell.HealthResource` serves it): for `squealctl status`
and `up`, the dashboard's owners table, the benchmarks and the tests.

A daemon answers 200 while healthy and 503 with its `problems` otherwise; both carry the status JSON (a
region daemon's `flows` and `shards`, a pool worker's `state` and `owns`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def fetch_health(address: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of the daemon at `address` ("host:port"); the body is {} if it is not a JSON
    object. Raises OSError when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=timeout) as resp:
            code, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:  # a 503 carries the status too
        code, raw = e.code, e.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    return code, body if isinstance(body, dict) else {}


def probe_health(address: str, timeout: float = 2.0) -> tuple[int | None, dict[str, Any]]:
    """`fetch_health`, or (None, {}) when nothing answers."""
    try:
        return fetch_health(address, timeout)
    except OSError:
        return None, {}
