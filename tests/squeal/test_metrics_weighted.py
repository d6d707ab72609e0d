"""`observe_times`: a run of transactions acknowledged together is observed as that many observations; `add_counts`:
the native delivery thread's per-bucket counts are the observations they count."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from squeal.process.metrics import add_counts, observe_times


def samples(h: Histogram) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for metric in h.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_observing_n_times_at_once_equals_n_observations() -> None:
    registry = CollectorRegistry()
    one_by_one = Histogram("a_seconds", "a", ["flow"], buckets=(0.001, 0.01, 0.1, 1.0), registry=registry)
    at_once = Histogram("b_seconds", "b", ["flow"], buckets=(0.001, 0.01, 0.1, 1.0), registry=registry)
    for amount, times in [(0.0005, 3), (0.05, 1), (0.05, 7), (2.5, 4), (0.01, 2)]:
        for _ in range(times):
            one_by_one.labels(flow="c").observe(amount)
        observe_times(at_once.labels(flow="c"), amount, times)
    a, b = samples(one_by_one), samples(at_once)
    assert {(n.replace("a_", "b_"), le): v for (n, le), v in a.items()} == b
    assert b[("b_seconds_count", "")] == 17
    assert b[("b_seconds_bucket", "0.001")] == 3


def test_adding_per_bucket_counts_equals_the_observations_counted() -> None:
    registry = CollectorRegistry()
    bounds = (0.001, 0.01, 0.1, 1.0)
    observed = Histogram("a_seconds", "a", ["flow"], buckets=bounds, registry=registry)
    added = Histogram("b_seconds", "b", ["flow"], buckets=bounds, registry=registry)
    values = [0.0005, 0.0005, 0.05, 2.5, 0.01, 0.2, 0.2, 0.2]
    counts = [0] * (len(bounds) + 1)  # (+Inf last, as the thread counts)
    for v in values:
        observed.labels(flow="c").observe(v)
        counts[next((i for i, b in enumerate(bounds) if v <= b), len(bounds))] += 1
    add_counts(added.labels(flow="c"), counts, sum(values))
    add_counts(added.labels(flow="c"), [], 0.0)  # (nothing counted: nothing changes)
    a, b = samples(observed), samples(added)
    assert {(n.replace("a_", "b_"), le): v for (n, le), v in a.items()} == b
    assert b[("b_seconds_count", "")] == 8
    assert b[("b_seconds_bucket", "+Inf")] == 8
