"""The pool controller's account of shards that run on no worker (issue 24 item 5: "time any shard was without an
owner", a move's pause), from the members' published shards; a clock of the test's own, no servers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from squeal import pool


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_the_controller_measures_how_long_each_shard_ran_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    worker = SimpleNamespace(client=None, base="/pool", metrics=pool.PoolMetrics(registry))
    controller = pool.Controller(worker)  # type: ignore[arg-type]  # only what the accounting reads
    clock = [100.0]
    monkeypatch.setattr(pool.time, "monotonic", lambda: clock[0])
    names = ["s0", "s1"]

    def look(**running: list[str]) -> None:
        controller._account_unowned({w: {"shards": shards} for w, shards in running.items()}, names)

    look(w1=["s0", "s1"])
    assert _value(registry, "squeal_pool_shard_unowned_seconds", shard="s0") == 0.0
    clock[0] = 101.0
    look(w1=["s1"])  # s0 handed on: w1 stopped it, w2 has not started it yet
    clock[0] = 103.5
    look(w1=["s1"])
    assert _value(registry, "squeal_pool_shard_unowned_seconds", shard="s0") == 2.5
    assert _value(registry, "squeal_pool_shard_unowned_seconds", shard="s1") == 0.0
    assert _value(registry, "squeal_pool_unowned_seconds_count") == 0.0
    clock[0] = 104.0
    look(w1=["s1"], w2=["s0"])  # runs again: one pause of 3 s observed
    assert _value(registry, "squeal_pool_shard_unowned_seconds", shard="s0") == 0.0
    assert _value(registry, "squeal_pool_unowned_seconds_count") == 1.0
    assert _value(registry, "squeal_pool_unowned_seconds_sum") == 3.0
    assert _value(registry, "squeal_pool_unowned_seconds_bucket", le="2.0") == 0.0
    assert _value(registry, "squeal_pool_unowned_seconds_bucket", le="3.0") == 1.0
