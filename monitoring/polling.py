"""What the dashboard shows from slow sources (ZooKeeper, a TLS handshake per link): asked on a thread of its
own every `interval` seconds, so a page load never waits for them; `snapshot()` is the last good answer."""

from __future__ import annotations

import logging
import threading
from typing import Any, Self

from router_config import Topology

log = logging.getLogger(__name__)


class Poller:
    """Calls `look()` every `interval` seconds on a thread named `thread_name` (if `wanted()`); an exception is
    logged (`failure`) and the last good answer stays."""

    thread_name = "poller"
    failure = "polling failed"

    def __init__(self, topo: Topology, interval: float) -> None:
        self.topo, self.interval = topo, interval
        self._last: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None  # None: not started, or nothing to ask

    def look(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def wanted(self) -> bool:
        """Whether this topology has anything to ask (no thread otherwise)."""
        return True

    def start(self) -> Self:
        if self.wanted():
            self.thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self.thread.start()
        return self

    def stop(self, wait: float = 5.0) -> None:
        """Stop asking; wait up to `wait` seconds for a look in progress to end."""
        self._stop.set()
        if self.thread is not None:
            self.thread.join(wait)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._last)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                found = self.look()
            except Exception:
                log.exception(self.failure)
            else:
                with self._lock:
                    self._last = found
            self._stop.wait(self.interval)
