"""Dashboard arithmetic on plain data: rates, ratios and histogram percentiles."""

from __future__ import annotations

import pytest

from monitoring import Store, build_panels
from monitoring.panels import histogram_quantile, rate


def test_rate_is_increase_per_second_over_the_window():
    counter = {float(t): 10.0 * t for t in range(0, 31)}  # +10 per second
    out = rate(counter, window=5)
    assert out and all(v == pytest.approx(10.0) for _, v in out)


def test_rate_survives_a_counter_reset():
    counter = {0.0: 100.0, 1.0: 110.0, 2.0: 3.0}  # process restarted between 1 and 2
    assert rate(counter, window=1)[-1] == [2.0, 3.0]


def test_histogram_quantile_picks_the_bucket_holding_the_quantile():
    # 100 observations: 90 under 10 ms, 9 under 100 ms, 1 under 1 s
    buckets = {0.01: {0.0: 0, 10.0: 90}, 0.1: {0.0: 0, 10.0: 99}, 1.0: {0.0: 0, 10.0: 100}}
    assert histogram_quantile(0.5, buckets, window=20) == [[10.0, pytest.approx(0.01 * 50 / 90)]]
    assert histogram_quantile(0.99, buckets, window=20) == [[10.0, pytest.approx(0.1)]]
    assert histogram_quantile(0.999, buckets, window=20) == [[10.0, pytest.approx(0.1 + 0.9 * 0.9)]]


def test_panels_from_scraped_samples():
    store = Store()
    for t in range(10):
        for cluster, hits in (("east-a", 9), ("east-b", 1)):
            store.add("memcached_get_hits", {"cluster": cluster, "pool": "wildcard"}, hits * t, float(t))
            store.add("memcached_get_misses", {"cluster": cluster, "pool": "wildcard"}, (10 - hits) * t, float(t))
        store.add(
            "squeal_probe_invalidation_seconds_bucket",
            {"region": "east", "cluster": "east-a", "le": "0.005"},
            float(t),
            float(t),
        )
        store.add(
            "squeal_probe_invalidation_seconds_bucket",
            {"region": "east", "cluster": "east-a", "le": "+Inf"},
            float(t),
            float(t),
        )
    panels = {p["title"]: p for p in build_panels(store)}
    hit = {line["label"]: line["points"][-1][1] for line in panels[next(t for t in panels if "hit rate" in t)]["lines"]}
    assert hit == {"east-a": pytest.approx(0.9), "east-b": pytest.approx(0.1)}
    latency = panels[next(t for t in panels if t.startswith("Invalidation latency"))]["lines"]
    assert {line["label"] for line in latency} == {"east/east-a p50", "east/east-a p99"}
    assert latency[0]["points"][-1][1] == pytest.approx(0.0025)  # p50 of observations all under 5 ms


def _sharded_store() -> Store:
    """Two shards' squeal series (lag, commit → acknowledged latency) and the prober's canary on each shard."""
    store = Store()
    for t in range(10):
        for shard, lag, le in (("s0", 1.0, "0.01"), ("s1", 5.0, "0.5")):
            for flow in ("east-a", "east-b"):
                labels = {"region": "east", "flow": flow, "shard": shard}
                store.add("squeal_flow_lag_seconds", labels, lag, float(t))
                store.add("squeal_invalidation_latency_seconds_bucket", {**labels, "le": le}, float(t), float(t))
                store.add("squeal_invalidation_latency_seconds_bucket", {**labels, "le": "+Inf"}, float(t), float(t))
            store.add("squeal_source_replication_lag_seconds", {"region": "west", "shard": shard}, lag, float(t))
            store.add("squeal_halted", {"region": "west", "shard": shard}, 0.0, float(t))
            probe = {"region": "east", "cluster": "east-a", "shard": shard}
            store.add("squeal_probe_invalidation_seconds_bucket", {**probe, "le": le}, float(t), float(t))
            store.add("squeal_probe_invalidation_seconds_bucket", {**probe, "le": "+Inf"}, float(t), float(t))
        # the process's region-wide registry serves these gauges too, never set: not a shard, not a line
        store.add("squeal_source_replication_lag_seconds", {"region": "west"}, 0.0, float(t))
        store.add("squeal_halted", {"region": "west"}, 0.0, float(t))
    return store


def _last(panel: dict) -> dict[str, float]:
    return {line["label"]: line["points"][-1][1] for line in panel["lines"]}


def test_sharded_series_give_latency_and_lag_per_shard():
    panels = {p["title"]: p for p in build_panels(_sharded_store())}
    lag = _last(panels["squeal lag per shard (its worst flow)"])
    assert lag == {"east/s0": 1.0, "east/s1": 5.0}
    # a flow's lag is its worst shard's: lags do not add up (summed, east-a would read 6 s)
    assert _last(panels["squeal lag per flow"]) == {"east/east-a": 5.0, "east/east-b": 5.0}
    assert _last(panels["Replica lag behind the primary per region and shard"]) == {"west/s0": 1.0, "west/s1": 5.0}
    alerts = _last(panels[next(t for t in panels if t.startswith("squeal alerts"))])
    assert alerts == {"west/s0 HALTED": 0.0, "west/s1 HALTED": 0.0}

    canary = _last(panels["Invalidation latency per shard (canary commit → key gone, every cluster)"])
    assert set(canary) == {"s0 p50", "s0 p99", "s1 p50", "s1 p99"}
    assert canary["s0 p99"] < 0.01 < 0.1 < canary["s1 p99"] <= 0.5
    # squeal's own commit → acknowledged histogram starts from the binlog's whole-second commit time: its
    # p99 read 1.0-1.6 s, mostly that resolution (issue 37 item 8). The canary's millisecond clock
    # measures the same path per shard, so no panel draws the coarse one.
    assert not [t for t in panels if "1 s resolution" in t or t.startswith("squeal invalidation latency")]
    assert all("canary" in t or "binlog read" in t for t in panels if "latency" in t), list(panels)
    # the per-cluster canary panel still sums every shard's probes
    per_cluster = _last(panels["Invalidation latency (canary commit → key gone)"])
    assert set(per_cluster) == {"east/east-a p50", "east/east-a p99"}


def test_unsharded_series_get_no_shard_panels():
    store = Store()
    for t in range(10):
        store.add("squeal_flow_lag_seconds", {"region": "east", "flow": "east-a"}, 2.0, float(t))
        store.add("squeal_source_replication_lag_seconds", {"region": "west"}, 3.0, float(t))
    panels = {p["title"]: p for p in build_panels(store)}
    assert not [t for t in panels if "per shard" in t]
    assert _last(panels["squeal lag per flow"]) == {"east/east-a": 2.0}
    assert _last(panels["Replica lag behind the primary per region"]) == {"west": 3.0}


def test_pool_series_give_worker_load_shard_owners_moves_and_unowned_time():
    """Issue 24 item 5: a pooled region's dashboard: load per worker, the worker running each shard, moves per
    minute by reason, and how long any shard has run on no worker with the move pauses' p99."""
    store = Store()
    for t in range(0, 61, 5):
        at = float(t)
        for worker, load in (("east-1", 40.0), ("east-2", 10.0)):
            store.add("squeal_pool_worker_load", {"region": "east", "instance": worker}, load, at)
        # s1 moves from east-1 to east-2 at t = 30
        store.add("squeal_pool_shard_owned", {"region": "east", "instance": "east-1", "shard": "s0"}, 1.0, at)
        store.add(
            "squeal_pool_shard_owned",
            {"region": "east", "instance": "east-1" if t < 30 else "east-2", "shard": "s1"},
            1.0,
            at,
        )
        ctl = {"region": "east", "instance": "east-1"}
        store.add("squeal_pool_moves_total", {**ctl, "reason": "rebalance"}, 0.0 if t < 30 else 1.0, at)
        store.add("squeal_pool_shard_unowned_seconds", {**ctl, "shard": "s0"}, 0.0, at)
        store.add("squeal_pool_shard_unowned_seconds", {**ctl, "shard": "s1"}, 2.0 if t == 30 else 0.0, at)
        paused = 0.0 if t < 35 else 1.0  # one pause, between 1 and 2 s
        for le, count in (("0.5", 0.0), ("1.0", 0.0), ("2.0", paused), ("+Inf", paused)):
            store.add("squeal_pool_unowned_seconds_bucket", {**ctl, "le": le}, count, at)
    panels = {p["title"]: p for p in build_panels(store)}
    assert _last(panels["squeal pool: load per worker"]) == {"east/east-1": 40.0, "east/east-2": 10.0}
    owners = panels["squeal pool: worker running each shard (1 while it runs it)"]
    assert {line["label"] for line in owners["lines"]} == {
        "east/s0 on east-1",
        "east/s1 on east-1",
        "east/s1 on east-2",
    }
    assert _last(panels["squeal pool: shard moves per minute by reason"])["east rebalance"] > 0
    unowned = panels["squeal pool: time a shard has run on no worker, and move pauses p99"]
    assert max(v for line in unowned["lines"] if line["label"] == "east/s1" for _, v in line["points"]) == 2.0
    assert 1.0 < _last(unowned)["east move pause p99"] <= 2.0
    assert "squeal pool: load per worker" not in {p["title"] for p in build_panels(_sharded_store())}
