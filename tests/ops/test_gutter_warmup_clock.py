"""gutter_health and WarmupController on a clock driven by hand: no servers, no real sleeping.

Each server's `stats` counters grow with the fake clock at a fixed rate of gets per second, so a hit rate or a
gets-per-second figure is right only when it is measured across the sample window the code sleeps through.
(The servers themselves are covered by test_gutter_warmup.py.)
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

import gutter
import router_config
from gutter import health
from warmup import WarmupController, WarmupError, controller

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local.toml"


class FakeClock:
    """Time that moves only when the code under test sleeps."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeServers:
    """memcached `stats` of servers serving (hits, misses) per second of the fake clock; unlisted: down."""

    def __init__(self, clock: FakeClock, rates: dict[str, tuple[float, float]]) -> None:
        self.clock = clock
        self.rates = rates

    def scrape(
        self, address: str, timeout: float = 1.0, tls: ssl.SSLContext | None = None
    ) -> Iterator[tuple[str, dict[str, str], float]]:
        if address not in self.rates:
            raise OSError(f"{address}: connection refused")
        hits, misses = self.rates[address]
        yield "memcached_get_hits", {}, hits * self.clock.now
        yield "memcached_get_misses", {}, misses * self.clock.now


@pytest.fixture
def topo() -> router_config.Topology:
    return router_config.load(EXAMPLE)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def serve(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, rates: dict[str, tuple[float, float]]) -> None:
    fake = FakeServers(clock, rates)
    monkeypatch.setattr(health, "scrape_memcached", fake.scrape)
    monkeypatch.setattr(controller, "scrape_memcached", fake.scrape)


def test_gutter_health_measures_the_gutter_across_one_sample_window(monkeypatch, topo, clock):
    cluster = topo.cluster("east-a")
    assert cluster.gutter is not None
    gutter_addr = str(cluster.gutter.servers[0])
    wildcard = [str(a) for a in cluster.wildcard.servers]
    # the gutter: 30 hits and 10 misses a second; one wildcard server answers, the rest are down
    serve(monkeypatch, clock, {gutter_addr: (30.0, 10.0), wildcard[0]: (500.0, 500.0)})

    result = gutter.gutter_health(cluster, sample_seconds=4.0, sleep=clock.sleep)

    assert clock.sleeps == [4.0], "one sample window, of the length asked for"
    assert result.gutter_hit_rate == pytest.approx(0.75)
    assert result.gutter_gets_per_second == pytest.approx(40.0), "the gutter's gets, not the wildcard's"
    assert set(result.down) == {str(a) for p in cluster.pools for a in p.servers} - {gutter_addr, wildcard[0]}


def test_gutter_health_without_gutter_gets_has_no_hit_rate(monkeypatch, topo, clock):
    cluster = topo.cluster("east-a")
    assert cluster.gutter is not None
    serve(monkeypatch, clock, {str(cluster.gutter.servers[0]): (0.0, 0.0)})
    result = gutter.gutter_health(cluster, sample_seconds=1.0, sleep=clock.sleep)
    assert result.gutter_hit_rate is None and result.gutter_gets_per_second == 0.0


@pytest.fixture
def state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    (state / "components.json").write_text(json.dumps({"topology": str(EXAMPLE), "components": []}))
    return state


def rates_of(topo: router_config.Topology, cold: tuple[float, float], warm: tuple[float, float]) -> dict:
    rates = {str(a): cold for a in topo.cluster("east-b").wildcard.servers}
    rates.update({str(a): warm for a in topo.cluster("east-a").wildcard.servers})
    return rates


def test_warmup_stamps_its_start_on_the_clock_and_samples_one_window(monkeypatch, topo, clock, state):
    serve(monkeypatch, clock, rates_of(topo, cold=(20.0, 80.0), warm=(80.0, 20.0)))
    warmup = WarmupController(state, sleep=clock.sleep, clock=clock.time)
    warmup.start("east-b")
    assert warmup.overlay()["east-b"]["started"] == 1000.0

    status = warmup.status("east-b", sample_seconds=3.0)

    assert clock.sleeps == [3.0] and clock.now == 1003.0
    assert status.cold_hit_rate == pytest.approx(0.2) and status.warm_hit_rate == pytest.approx(0.8)
    assert status.progress == pytest.approx(0.25)


def test_warmup_finish_waits_for_the_target_then_turns_the_route_off(monkeypatch, topo, clock, state):
    warmup = WarmupController(state, sleep=clock.sleep, clock=clock.time)
    warmup.start("east-b")
    serve(monkeypatch, clock, rates_of(topo, cold=(50.0, 50.0), warm=(80.0, 20.0)))
    with pytest.raises(WarmupError, match="not warm yet"):
        warmup.finish("east-b", target=0.9)
    assert "east-b" in warmup.overlay()

    serve(monkeypatch, clock, rates_of(topo, cold=(75.0, 25.0), warm=(80.0, 20.0)))
    status = warmup.finish("east-b", target=0.9)
    assert status is not None and status.progress == pytest.approx(0.9375)
    assert warmup.overlay() == {}
    assert len(clock.sleeps) == 2, "one sample window per finish"
