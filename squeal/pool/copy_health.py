"""`watch_copy_health`: whether a pool worker's own database copy answers (regions without [shards], where each
worker reads a copy of its own), so that the controller gives a worker whose copy is lost no shard.

Runs on its own daemon thread ("pool-health", started by the worker); it only reports changes (`changed`), which
the worker publishes in its member znode from its own thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from squeal.read.reader import Source

HEALTH_EVERY_S = 1.0  # how often a worker of a region without [shards] asks its own copy whether it answers


def watch_copy_health(
    source: Source, stop: threading.Event, healthy: Callable[[], bool], changed: Callable[[bool], None]
) -> None:
    """Every `HEALTH_EVERY_S` until `stop`: `SELECT 1` on the copy; `changed(now)` when the answer differs from
    `healthy()`, the worker's last published state.

    On one kept connection (a new one a second was a MariaDB login, and a TLS handshake, a second per worker);
    timeouts bound a check of a frozen server; a failed check drops the connection and the next reconnects."""
    conn = None
    timeout = 2
    while not stop.wait(HEALTH_EVERY_S):
        try:
            if conn is None:
                conn = source.connect(connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout)
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
            now = True
        except Exception:  # noqa: BLE001 - any failure: not healthy
            now = False
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
        if now != healthy():
            changed(now)
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
