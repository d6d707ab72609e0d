"""What a flow's own logic costs per 1,000 rows, without I/O (not a test: a figure for docs/benchmarks.md).

    .venv/bin/python bench/squeal_flow_cost.py [--runs 3000] [--rows-per-run 60] [--batch-size 256] [--rounds 3]

The shape of a native-reader replay of 10-row transactions: runs of 6 transactions (one queue entry each, one
delete line a row) offered to one `squeal.delivery.flows.Flow`, batches of `--batch-size` taken and acknowledged
at once — the queue, batching and acknowledgement logic alone, then again with the flow's latency histograms
(`squeal.process.metrics.Metrics`). Set beside the reactor thread's CPU per 1,000 rows in bench/squeal_throughput.py
(~1.1 ms user) it says how much of the reactor is the flows themselves and how much the event loop around them.
"""

from __future__ import annotations

import argparse
import statistics
import time

from prometheus_client import CollectorRegistry

from squeal.delivery.flows import Committed, Flow
from squeal.process.metrics import Metrics


def one_round(lines: list[tuple[bytes, ...]], batch_size: int, metrics: Metrics | None) -> float:
    """µs per 1,000 rows."""
    flow = Flow("c", "cluster", (), {0: (1, 0)}, 10**9, metrics)
    started = time.perf_counter()
    for r, run in enumerate(lines):
        flow.offer_live(Committed((0, 1, r + 1), 1.0, 1.0, run, (), position={0: (1, r + 1)}, transactions=6))
        while (batch := flow.take_batch(batch_size, 4)) is not None:
            flow.ack(batch)
    return (time.perf_counter() - started) / sum(len(run) for run in lines) * 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3000)
    p.add_argument("--rows-per-run", type=int, default=60, help="six 10-row transactions, one key a row")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    per = args.rows_per_run
    lines = [tuple(f"md user:{r * per + i} q\r\n".encode() for i in range(per)) for r in range(args.runs)]
    alone = [one_round(lines, args.batch_size, None) for _ in range(args.rounds)]
    with_metrics = [one_round(lines, args.batch_size, Metrics(CollectorRegistry())) for _ in range(args.rounds)]
    print(
        f"flow logic per 1,000 rows: alone median {statistics.median(alone):.0f} µs "
        f"({', '.join(f'{v:.0f}' for v in alone)}); with its latency histograms median "
        f"{statistics.median(with_metrics):.0f} µs ({', '.join(f'{v:.0f}' for v in with_metrics)})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
