"""1-in-N sample of acknowledged deletes, for the monitoring server to re-check later (paper 7.3's method).

The sampler sees each acknowledged batch (its `md <key> q` payload) and keeps every `every`-th plain key
with its flow and acknowledgement time in a bounded ring. `GET /sampled-deletes?since=T` on the daemon's
metrics port serves the ring as JSON; the prober re-reads those keys a little later and reports any that
hold a value the database disagrees with. Base64 (`b`) keys are counted but not sampled.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SampledDelete:
    flow: str
    key: str
    acked_at: float  # unix time the destination acknowledged the batch


class DeleteSampler:
    def __init__(self, every: int = 1000, keep: int = 1000) -> None:
        if every < 1:
            raise ValueError(f"sample every N deletes needs N >= 1, got {every}")
        self.every = every
        self._until_next = every  # deletes to skip before the next sample
        self._ring: deque[SampledDelete] = deque(maxlen=keep)
        self._lock = threading.Lock()  # offered on the reactor thread, read by the web resource (same thread
        # in the daemon, but tests read from others)

    def offer(self, flow: str, payload: bytes, nkeys: int, acked_at: float) -> None:
        """Called per acknowledged batch; parses the payload only when a sample falls inside it."""
        if nkeys < self._until_next:
            self._until_next -= nkeys
            return
        lines = payload.split(b"\r\n")
        index = self._until_next - 1
        while index < nkeys:
            parts = lines[index].split(b" ") if index < len(lines) else []
            if len(parts) == 3 and parts[0] == b"md" and parts[2] == b"q":  # plain key (no b flag)
                with self._lock:
                    self._ring.append(SampledDelete(flow, parts[1].decode("ascii"), acked_at))
            index += self.every
        self._until_next = index - nkeys + 1

    def take(self, samples: list[SampledDelete]) -> None:
        """Samples the native delivery thread took (it counts and picks them as `offer` does)."""
        with self._lock:
            self._ring.extend(samples)

    def recent(self, since: float = 0.0) -> list[SampledDelete]:
        with self._lock:
            return [s for s in self._ring if s.acked_at > since]
