"""The workload's building blocks: Zipf ranks, table-3 value sizes, the spec hand-off, the CLI surface."""

from __future__ import annotations

import random
import statistics

import pytest

from leases import LeaseCache, connect
from loadtest.cli import main, parser
from loadtest.experiments import EXPERIMENTS, load
from loadtest.experiments.report import format_table
from loadtest.stockcache import StockCache, stock_client
from loadtest.workload import SPEC_ENV, TABLE3, Spec, ValueSizes, Zipf, body, percentile
from ops.harness import free_port
from router_config import Address


def test_zipf_rank_zero_is_hottest_and_shares_match_the_law():
    z, rng = Zipf(1000, 1.0), random.Random(1)
    draws = [z.rank(rng) for _ in range(50_000)]
    assert min(draws) == 0 and max(draws) < 1000
    top10 = sum(d < 10 for d in draws) / len(draws)
    assert top10 == pytest.approx(z.share(10), abs=0.01)  # H(10)/H(1000) ≈ 0.39
    assert draws.count(0) > draws.count(1) > draws.count(9)


@pytest.mark.parametrize("pool", ["wildcard", "regional"])
def test_value_sizes_follow_table3_median_and_p95(pool):
    sizes, rng = ValueSizes(pool, cap=10**7), random.Random(2)
    draws = [sizes.size(rng) for _ in range(40_000)]
    p5, _, p50, _, p95, _ = TABLE3[pool]
    assert percentile(draws, 0.5) == pytest.approx(p50, rel=0.05)
    assert percentile(draws, 0.95) == pytest.approx(p95, rel=0.1)
    assert percentile(draws, 0.05) == pytest.approx(p5, rel=0.1)


def test_value_sizes_respect_the_column_cap():
    sizes, rng = ValueSizes("regional", cap=60_000), random.Random(3)
    assert max(sizes.size(rng) for _ in range(5000)) == 60_000
    assert statistics.mean(ValueSizes("wildcard").size(rng) for _ in range(20_000)) < 2_000


def test_body_has_the_requested_size():
    assert [len(body(n, 7)) for n in (1, 99, 5000)] == [1, 99, 5000]


def test_spec_round_trips_through_the_environment():
    spec = Spec(topology="t.toml", region="east", clusters=["east-a"], ids=[3, 1], leases=False, client="stock")
    assert Spec.from_env(spec.to_env()) == spec
    with pytest.raises(RuntimeError, match=SPEC_ENV):
        Spec.from_env({})


def test_cli_knows_every_experiment_and_rejects_others(capsys):
    assert set(parser()._actions[1].choices) == {*EXPERIMENTS, "all"}
    for name in EXPERIMENTS:
        module = load(name)
        assert callable(module.run) and callable(module.check)
    with pytest.raises(SystemExit) as e:
        main(["nope"])
    assert e.value.code == 2
    with pytest.raises(KeyError):
        load("nope")
    with pytest.raises(SystemExit) as e:
        main(["gutter", "--client", "stock"])  # only herd has a stock-client variant
    assert e.value.code == 2


def test_table_formatting_aligns_columns():
    text = format_table([["a", "bb"], ["long name", 1234.5], ["x", 0.25]])
    lines = text.splitlines()
    assert lines[1].startswith("---------") and len({len(line) for line in lines}) == 1
    assert "1,234" in text and "0.25" in text


def test_stock_cache_is_plain_look_aside_in_the_web_tiers_json(memcached_factory):
    """The stock-client web tier (`client="stock"`): miss → loader → set, a cached None is a hit, values are
    the lease client's JSON (either client reads the other's), and a memcache outage falls back to the loader."""
    mc = memcached_factory()
    cache = StockCache(stock_client([Address("127.0.0.1", mc.port)]), name="stock-test")
    loads = []

    def no_such_row():
        loads.append(1)
        return None

    assert cache.get_or_fill("user:1", no_such_row, 60) is None
    assert cache.get_or_fill("user:1", no_such_row, 60) is None and len(loads) == 1  # "no row" cached, a hit
    assert cache.get_or_fill("feed:1", lambda: [{"id": 1}], 60) == [{"id": 1}]
    assert LeaseCache(connect([Address("127.0.0.1", mc.port)])).get("feed:1") == [{"id": 1}]
    assert cache.delete("feed:1") and cache.get("feed:1") is None and cache.exists("feed:1") is False
    assert {k: v for k, v in cache.stats.snapshot().items() if v} == {"hits": 1, "misses": 2, "loads": 2, "fills": 2}

    down = StockCache(stock_client([Address("127.0.0.1", free_port())], timeout=0.5), name="stock-down")
    assert down.get_or_fill("feed:1", lambda: ["db"], 60) == ["db"]
    assert down.stats.loads == 1 and down.stats.errors == 1 and down.stats.fills == 0
