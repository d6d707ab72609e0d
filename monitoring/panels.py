"""Dashboard panels computed from scraped samples: rates, ratios and histogram percentiles over time.

The page only draws lines; all arithmetic lives here so it is tested in Python. A panel is
`{"title", "unit", "lines": [{"label", "points": [[t, v], ...]}]}`.

Sharded topologies: squeal's per-shard series and the prober's carry a `shard` label. Lines then name the shard
where it matters (lag, replica lag, alerts), lag is the worst of the series it combines (lags do not add up),
and a panel appears that a topology without [shards] does not get: invalidation latency per shard (the
prober's canary, commit → key gone on a millisecond clock, every cluster). squeal's own commit → acknowledged
histogram gets no panel: its commit time is the binlog's, whole seconds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from monitoring.scrape import Store

WINDOW = 15.0  # seconds over which rates and percentiles are computed


def _aligned(
    series: list[dict], group: Callable[[dict], str | None], *, worst: bool = False
) -> dict[str, dict[float, float]]:
    """Sum series that share a group label at each scrape time (scrapes of one round share a timestamp);
    `worst`: take the largest instead (gauges such as lag, which do not add up across shards)."""
    out: dict[str, dict[float, float]] = defaultdict(dict)
    for s in series:
        label = group(s["labels"])
        if label is None:
            continue
        at = out[label]
        for t, v in s["points"]:
            at[t] = (max(at[t], v) if worst else at[t] + v) if t in at else v
    return out


def _sharded(*metrics: list[dict]) -> bool:
    """Whether any of these series carry a `shard` label (squeal and the prober on a topology with [shards])."""
    return any("shard" in s["labels"] for series in metrics for s in series)


def _shard_series(series: list[dict]) -> list[dict]:
    """A metric's series without those that lack a `shard` label when others have one: a sharded squeal
    process also serves its region-wide registry, whose per-shard gauges (halted, replica lag) are never set."""
    if not _sharded(series):
        return series
    return [s for s in series if s["labels"].get("shard")]


def _where(lab: dict) -> str:
    """`region` or, for a shard's series, `region/shard`."""
    region = lab.get("region", "?")
    return f"{region}/{lab['shard']}" if lab.get("shard") else region


def rate(points: dict[float, float], window: float = WINDOW) -> list[list[float]]:
    """Per-second increase of a counter over the trailing window (counter resets count from zero)."""
    times = sorted(points)
    out = []
    start = 0
    for i, t in enumerate(times):
        while times[start] < t - window:
            start += 1
        if start == i:
            continue
        t0 = times[start]
        delta = points[t] - points[t0]
        if delta < 0:  # restart
            delta = points[t]
        out.append([t, delta / (t - t0)])
    return out


def ratio(num: list[list[float]], den: list[list[float]]) -> list[list[float]]:
    d = dict((t, v) for t, v in den)
    return [[t, v / d[t]] for t, v in num if d.get(t)]


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' histogram_quantile on cumulative {upper bound: count}: interpolated linearly inside the bucket
    that holds it (the first bucket starts at 0; in the +Inf bucket: the highest finite bound); None without
    observations. The one implementation, for the panels and `verify`'s grace."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                finite = [b for b in bounds if b != float("inf")]
                return finite[-1] if finite else None
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return bounds[-1]


def histogram_quantile(q: float, buckets: dict[float, dict[float, float]], window: float = WINDOW) -> list[list[float]]:
    """q-quantile over time from cumulative bucket counters {le: {t: count}}: `quantile` of the increase over
    `window` at each time."""
    if not buckets:
        return []
    bounds = sorted(buckets)
    times = sorted(set().union(*(set(b) for b in buckets.values())))
    out = []
    for t in times:
        t0 = next((x for x in times if x >= t - window), t)
        if t0 == t:
            continue
        value = quantile(q, {le: buckets[le].get(t, 0.0) - buckets[le].get(t0, 0.0) for le in bounds})
        if value is not None:
            out.append([t, value])
    return out


def _histogram_by(store: Store, name: str, group: Callable[[dict], str]) -> dict[str, dict[float, dict[float, float]]]:
    grouped: dict[str, dict[float, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    for s in store.select(f"{name}_bucket"):
        le = float(s["labels"]["le"])
        if le == float("inf"):
            continue
        for t, v in s["points"]:
            bucket = grouped[group(s["labels"])][le]
            bucket[t] = bucket.get(t, 0.0) + v
    return grouped


def _lines(data: Mapping[str, Sequence[Sequence[float]]]) -> list[dict]:
    return [{"label": label, "points": pts} for label, pts in sorted(data.items()) if pts]


def build(store: Store) -> list[dict]:
    """Every panel of the dashboard, from what the store holds now."""
    panels = []

    by_cluster = _histogram_by(
        store, "squeal_probe_invalidation_seconds", lambda lab: f"{lab.get('region')}/{lab.get('cluster')}"
    )
    lat = {}
    for cluster, buckets in by_cluster.items():
        # a minute of probes (one a second): a 15 s window would make p99 the single slowest probe
        lat[f"{cluster} p50"] = histogram_quantile(0.5, buckets, window=60)
        lat[f"{cluster} p99"] = histogram_quantile(0.99, buckets, window=60)
    panels.append({"title": "Invalidation latency (canary commit → key gone)", "unit": "s", "lines": _lines(lat)})

    if _sharded(store.select("squeal_probe_invalidation_seconds_bucket")):
        per_shard = {}
        by_shard = _histogram_by(store, "squeal_probe_invalidation_seconds", lambda lab: lab.get("shard") or "?")
        for shard, buckets in by_shard.items():  # one canary a second, on each shard in turn: a longer window
            per_shard[f"{shard} p50"] = histogram_quantile(0.5, buckets, window=60 * len(by_shard))
            per_shard[f"{shard} p99"] = histogram_quantile(0.99, buckets, window=60 * len(by_shard))
        panels.append(
            {
                "title": "Invalidation latency per shard (canary commit → key gone, every cluster)",
                "unit": "s",
                "lines": _lines(per_shard),
            }
        )
    # No panel of squeal's own commit → acknowledged histogram (squeal_invalidation_latency_seconds): it starts
    # from the binlog's whole-second commit time, so its p99 read 1.0-1.6 s that was mostly that resolution.
    # The canary above measures the same path per shard with a millisecond clock (issue 37 item 8); squeal's
    # binlog read → acknowledged below is precise too.
    by_flow = _histogram_by(
        store, "squeal_delivery_latency_seconds", lambda lab: f"{lab.get('region', '?')}/{lab.get('flow', '?')}"
    )
    panels.append(
        {
            "title": "squeal delivery latency p99 per flow (binlog read → delete acknowledged)",
            "unit": "s",
            "lines": _lines({f: histogram_quantile(0.99, b) for f, b in by_flow.items()}),
        }
    )

    lag = store.select("squeal_flow_lag_seconds")
    for series, title, unit, worst in (
        (lag, "squeal lag per flow", "s", True),  # with shards: the flow's worst shard
        (store.select("squeal_flow_backlog"), "squeal backlog per flow (keys queued)", "keys", False),
    ):
        flows = _aligned(series, lambda lab: f"{lab.get('region', '?')}/{lab.get('flow')}", worst=worst)
        panels.append({"title": title, "unit": unit, "lines": _lines({f: sorted(p.items()) for f, p in flows.items()})})
    if _sharded(lag):
        shards = _aligned(lag, _where, worst=True)
        panels.append(
            {
                "title": "squeal lag per shard (its worst flow)",
                "unit": "s",
                "lines": _lines({s: sorted(p.items()) for s, p in shards.items()}),
            }
        )

    # a replica region's data behind its primary (each of its flows' lag above includes it); 0 for the master.
    # With shards each shard's copy replicates on its own: one line per region and shard.
    replication = _aligned(_shard_series(store.select("squeal_source_replication_lag_seconds")), _where, worst=True)
    panels.append(
        {
            "title": "Replica lag behind the primary per region" + (" and shard" if _sharded(lag) else ""),
            "unit": "s",
            "lines": _lines({r: sorted(p.items()) for r, p in replication.items()}),
        }
    )

    # Things squeal cannot fix by deleting keys and an operator must see: changes to ruled tables without row
    # images (TRUNCATE, DROP, RENAME, ... under on_truncate), binlog data loss, a halted region.
    alerts: dict[str, dict[float, float]] = {}
    for metric, label in (
        (
            "squeal_bulk_changes_total",
            lambda lab: f"{_where(lab)} {lab.get('statement')} {lab.get('table')} ({lab.get('policy')})",
        ),
        ("squeal_data_loss_total", lambda lab: f"{_where(lab)} binlog data loss ({lab.get('policy')})"),
        ("squeal_halted", lambda lab: f"{_where(lab)} HALTED"),
    ):
        alerts.update(_aligned(_shard_series(store.select(metric)), label))
    panels.append(
        {
            "title": "squeal alerts: changes without row images, data loss, halted (count)",
            "unit": "events",
            "lines": _lines({a: sorted(p.items()) for a, p in alerts.items()}),
        }
    )

    def flow(lab: dict) -> str:
        return f"{lab.get('region', '?')}/{lab.get('flow')}"

    deletes = _aligned(store.select("squeal_deletes_sent_total"), flow)
    writes = _aligned(store.select("squeal_delete_writes_total"), flow)
    panels.append(
        {"title": "Deletes sent per second", "unit": "/s", "lines": _lines({f: rate(p) for f, p in deletes.items()})}
    )
    panels.append(
        {
            "title": "Deletes per packet",
            "unit": "keys",
            "lines": _lines({f: ratio(rate(deletes[f]), rate(writes[f])) for f in deletes if f in writes}),
        }
    )

    def cluster_pool(kind: str) -> Callable[[dict], str | None]:
        def pick(lab: dict) -> str | None:
            if lab.get("pool") != kind and not (kind == "wildcard" and lab.get("pool") not in ("gutter", "regional")):
                return None
            return lab.get("cluster") or lab.get("region")

        return pick

    hit_rates = {}
    for suffix, kind in (("", "wildcard"), (" gutter", "gutter")):
        hits = _aligned(store.select("memcached_get_hits"), cluster_pool(kind))
        misses = _aligned(store.select("memcached_get_misses"), cluster_pool(kind))
        for cluster in hits:
            h, m = rate(hits[cluster]), dict((t, v) for t, v in rate(misses.get(cluster, {})))
            hit_rates[f"{cluster}{suffix}"] = [[t, v / (v + m.get(t, 0.0))] for t, v in h if v + m.get(t, 0.0) > 0]
    panels.append(
        {"title": "Cache hit rate per cluster (memcached get_hits / gets)", "unit": "ratio", "lines": _lines(hit_rates)}
    )

    gutter = _aligned(store.select("squeal_router_gutter_failovers_total"), lambda lab: lab.get("cluster"))
    panels.append(
        {
            "title": "Gutter failovers per second (router)",
            "unit": "/s",
            "lines": _lines({c: rate(p) for c, p in gutter.items()}),
        }
    )

    panels.extend(_pool_panels(store))

    lease_lines = {}
    for metric in (
        "squeal_client_lease_wins_total",
        "squeal_client_lease_waits_total",
        "squeal_client_stale_served_total",
        "squeal_client_fills_refused_total",
    ):
        summed = _aligned(store.select(metric), lambda lab: "all")
        if "all" in summed:
            lease_lines[metric.removeprefix("squeal_client_").removesuffix("_total")] = rate(summed["all"])
    panels.append({"title": "Lease activity (web tier) per second", "unit": "/s", "lines": _lines(lease_lines)})
    return panels


def _pool_panels(store: Store) -> list[dict]:
    """A pooled region's workers (issue 24, docs/runbooks/workers.md): none without `squeal_pool_*` series.
    `instance` is the worker's name (the dashboard's scrape labels)."""
    loads = _aligned(
        store.select("squeal_pool_worker_load"), lambda lab: f"{lab.get('region', '?')}/{lab.get('instance', '?')}"
    )
    if not loads:
        return []
    owned = _aligned(
        store.select("squeal_pool_shard_owned"),
        lambda lab: f"{lab.get('region', '?')}/{lab.get('shard')} on {lab.get('instance', '?')}",
    )
    moves = _aligned(
        store.select("squeal_pool_moves_total"), lambda lab: f"{lab.get('region', '?')} {lab.get('reason')}"
    )
    # only the controller sets these; a former controller's series are cleared, so the worst is the one that counts
    unowned = _aligned(store.select("squeal_pool_shard_unowned_seconds"), _where, worst=True)
    pauses = _histogram_by(store, "squeal_pool_unowned_seconds", lambda lab: f"{lab.get('region', '?')} move pause p99")
    return [
        {
            "title": "squeal pool: load per worker",
            "unit": "rows/s",
            "lines": _lines({w: sorted(p.items()) for w, p in loads.items()}),
        },
        {
            "title": "squeal pool: worker running each shard (1 while it runs it)",
            "unit": "",
            "lines": _lines({o: sorted(p.items()) for o, p in owned.items()}),
        },
        {
            "title": "squeal pool: shard moves per minute by reason",
            "unit": "/min",
            "lines": _lines({m: [[t, v * 60] for t, v in rate(p, window=300)] for m, p in moves.items()}),
        },
        {
            "title": "squeal pool: time a shard has run on no worker, and move pauses p99",
            "unit": "s",
            "lines": _lines(
                {
                    **{s: sorted(p.items()) for s, p in unowned.items()},
                    **{r: histogram_quantile(0.99, b, window=600) for r, b in pauses.items()},
                }
            ),
        },
    ]
