"""The pool controller's account of shards that run on no worker (issue 24 item 5: "time any shard was without an
owner", a move's pause), from the members' published shards; a clock of the test's own, no servers."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from squeal.pool import binlog_meter
from squeal.pool.binlog_meter import BinlogMeter
from squeal.pool.controller import Controller
from squeal.pool.metrics import PoolMetrics
from squeal.read.reader import Source


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_the_controller_measures_how_long_each_shard_ran_nowhere() -> None:
    registry = CollectorRegistry()
    worker = SimpleNamespace(client=None, base="/pool", metrics=PoolMetrics(registry))
    clock = [100.0]
    controller = Controller(worker, clock=lambda: clock[0])  # type: ignore[arg-type]  # only what the accounting reads
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


class _Copy:
    """What `BinlogMeter` asks of a shard's copy: `SHOW BINARY LOGS` answering the sizes it is given."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def connect(self, **timeouts: float) -> _Copy:
        return self

    def cursor(self) -> _Copy:
        return self

    def __enter__(self) -> _Copy:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def execute(self, sql: str) -> None:
        assert sql == "SHOW BINARY LOGS"

    def fetchall(self) -> list[tuple[str, int]]:
        return list(self.sizes.items())

    def close(self) -> None:
        pass


def test_the_binlog_meter_gives_bytes_per_second_over_its_own_interval() -> None:
    """Sampled every 5 s, the meter's `rate` is the growth over its own interval (a rotation counts the new file
    whole, a purge nothing), so the load's once-a-second smoothing sees a steady figure, not a burst in one
    second of five."""
    clock = [0.0]
    copy = _Copy({"bin.000001": 1000})
    meter = BinlogMeter(lambda shard: copy, every=5.0, clock=lambda: clock[0])
    assert meter.sample("s0") == 0 and "s0" not in meter.rate  # one sample: no rate yet
    clock[0] = 5.0
    copy.sizes = {"bin.000001": 6000}
    assert meter.sample("s0") == 5000 and meter.rate["s0"] == 1000.0
    clock[0] = 10.0
    copy.sizes = {"bin.000001": 8000, "bin.000002": 500}  # rotated: 2,000 more in the old file, 500 in the new
    assert meter.sample("s0") == 7500 and meter.rate["s0"] == 500.0
    clock[0] = 15.0
    copy.sizes = {"bin.000002": 500}  # the old file purged, nothing written
    assert meter.sample("s0") == 7500 and meter.rate["s0"] == 0.0


def test_the_binlog_meter_gives_up_on_a_copy_that_accepts_and_never_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frozen copy (SIGSTOPped, a cut network: the connection is accepted, nothing comes back) fails the sample
    after the meter's timeout instead of hanging its thread, which measures every other shard too."""
    monkeypatch.setattr(binlog_meter, "BINLOG_TIMEOUT_S", 1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        meter = BinlogMeter(lambda shard: Source("127.0.0.1", port, "squeal", "squeal"))
        failed: list[BaseException] = []

        def sample() -> None:
            try:
                meter.sample("s0")
            except Exception as e:  # noqa: BLE001 - what the meter's loop catches
                failed.append(e)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        thread.join(60)  # a deadline far past the timeout, not a speed check
        assert not thread.is_alive(), "the meter hangs on a copy that never answers"
        assert failed and "timed out" in str(failed[0]).lower(), failed
