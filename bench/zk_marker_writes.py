"""How many pool marker writes a local 3-server ZooKeeper ensemble takes (issue 24; not a test: a figure for
docs/squeal.md's datamarker model and docs/benchmarks.md).

    .venv/bin/python bench/zk_marker_writes.py [--shards 512] [--bytes 2400] [--seconds 10] [--in-flight 64]

A 3-server ensemble from ops/processes/zookeeper.py (tickTime 500 ms, data and logs in a temp dir on this
machine's disk, the servers' default fsync of every transaction log write), one kazoo client, `--shards` znodes of
`--bytes` each (2.4 KB: a pool shard's marker znode with 64 destinations, docs/squeal.md), and as fast as the ensemble
answers for `--seconds`: each write a multi-operation like `ShardMarkerStore.save_many` (check the shard's epoch
znode, set the markers znode), `--in-flight` outstanding at a time, round robin over the shards. Prints writes/s,
MB/s of znode data and the write latency p50/p99.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "squeal"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pool_support import client, ensemble, hosts
from squeal_latency_load import pct
from squeal_throughput import loadavg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=512)
    ap.add_argument("--bytes", type=int, default=2400)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--in-flight", type=int, default=64)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="squeal-zk-bench-"))
    try:
        with ensemble(base / "zk") as members:
            zk = client(hosts(members), 10.0)
            try:
                data = b"x" * args.bytes
                for s in range(args.shards):
                    zk.create(f"/bench/s{s}/epoch", b"{}", makepath=True)
                    zk.create(f"/bench/s{s}/markers", data)
                pending: deque = deque()
                latencies: list[float] = []
                done = 0
                print(
                    f"3-server ensemble, {args.shards} marker znodes of {args.bytes} B, {args.in_flight} in flight; "
                    f"{loadavg()}",
                    flush=True,
                )
                start = time.monotonic()
                i = 0
                while time.monotonic() - start < args.seconds:
                    while len(pending) < args.in_flight:
                        s = i % args.shards
                        i += 1
                        t = zk.transaction()
                        t.check(f"/bench/s{s}/epoch", 0)
                        t.set_data(f"/bench/s{s}/markers", data)
                        pending.append((time.monotonic(), t.commit_async()))
                    sent, result = pending.popleft()
                    result.get(timeout=30)
                    latencies.append(time.monotonic() - sent)
                    done += 1
                while pending:
                    sent, result = pending.popleft()
                    result.get(timeout=30)
                    latencies.append(time.monotonic() - sent)
                    done += 1
                took = time.monotonic() - start
                latencies.sort()
                print(
                    f"{done} writes in {took:.1f} s: {done / took:,.0f} writes/s, "
                    f"{done * args.bytes / took / 1e6:.1f} MB/s of znode data; latency p50 "
                    f"{pct(latencies, 0.5) * 1000:.1f} ms, p99 {pct(latencies, 0.99) * 1000:.1f} ms; {loadavg()}",
                    flush=True,
                )
            finally:
                zk.stop()
                zk.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
