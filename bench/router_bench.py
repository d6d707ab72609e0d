"""Router benchmark: the same load generator against direct memcached, squeal-router and
twemproxy (nutcracker), all on loopback, one memcached behind both proxies.

Reports requests/s, keys/s, p50/p99 round-trip latency for single gets and 10-key multigets at
several pipeline depths, CPU time per request of the proxy vs memcached's own (from
/proc/PID/stat utime+stime), and the router's RSS with 10,000 idle client connections.
Not a test: nothing here asserts on time. Run from the repository root:

    .venv/bin/python bench/router_bench.py [--seconds 3] [--depths 1,8,32] [--idle 10000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ops.harness import Memcached, Router, free_port, memcached_command, wait_until  # noqa: E402

KEYS = [f"bench:key:{i}".encode() for i in range(1000)]
VALUE = b"v" * 100
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker(port: int, multi: int, depth: int, seconds: float, seed: int, out: mp.Queue) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = len(KEYS)
    batches = []
    for b in range(64):
        reqs = []
        for r in range(depth):
            base = (seed * 7919 + b * depth * multi + r * multi) % n
            reqs.append(b"get " + b" ".join(KEYS[(base + j) % n] for j in range(multi)) + b"\r\n")
        batches.append(b"".join(reqs))
    done = 0
    lat: list[float] = []
    deadline = time.perf_counter() + seconds
    i = 0
    buf = b""
    while True:
        t0 = time.perf_counter()
        if t0 >= deadline:
            break
        s.sendall(batches[i % 64])
        i += 1
        ends = 0
        while ends < depth:
            chunk = s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
            ends += buf.count(b"END\r\n")
            # keep a tail in case END\r\n spans two reads
            cut = buf.rfind(b"END\r\n")
            buf = buf[cut + 5:] if cut >= 0 else buf[-4:]
        lat.append(time.perf_counter() - t0)
        done += depth
    out.put((done, lat))


def run_load(port: int, multi: int, depth: int, seconds: float, procs: int) -> dict:
    q: mp.Queue = mp.Queue()
    ps = [mp.Process(target=worker, args=(port, multi, depth, seconds, i, q)) for i in range(procs)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    results = [q.get() for _ in ps]
    for p in ps:
        p.join()
    elapsed = time.perf_counter() - t0
    total = sum(r[0] for r in results)
    lat = sorted(x for r in results for x in r[1])
    return {
        "requests": total,
        "rps": total / seconds,
        "keys_per_s": total * multi / seconds,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else 0,
        "p99_ms": lat[int(len(lat) * 0.99)] * 1000 if lat else 0,
        "elapsed": elapsed,
    }


class Nutcracker:
    def __init__(self, backend: str, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        conf = workdir / "nutcracker.yml"
        conf.write_text(
            "bench:\n"
            f"  listen: 127.0.0.1:{self.port}\n"
            "  hash: fnv1a_64\n  distribution: ketama\n  timeout: 1000\n"
            "  preconnect: true\n  auto_eject_hosts: false\n"
            f"  servers:\n   - {backend}:1\n"
        )
        self.log = workdir / "nutcracker.log"
        stats_port = free_port()
        self.proc = subprocess.Popen(
            ["/usr/sbin/nutcracker", "-c", str(conf), "-s", str(stats_port), "-o", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(lambda: memcached_command(("127.0.0.1", self.port), b"get x\r\n") == b"END", 10,
                   "nutcracker", self.proc, self.log)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def idle_connections_rss(router: Router, n: int) -> tuple[float, float, int]:
    before = rss_mb(router.pid)
    if n <= 0:  # --idle 0: skip the idle-connection run
        return before, before, 0
    socks = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection(("127.0.0.1", router.port)))
        # every connection is accepted and served: a version through the last one answers
        socks[-1].sendall(b"version\r\n")
        socks[-1].recv(100)
        time.sleep(0.5)
        after = rss_mb(router.pid)
    finally:
        for s in socks:
            s.close()
    return before, after, len(socks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--depths", default="1,8,32")
    ap.add_argument("--procs", type=int, default=2, help="load generator processes (one connection each)")
    ap.add_argument("--idle", type=int, default=10_000)
    ap.add_argument("--router-threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.idle + 1000
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))  # children inherit it

    work = Path(tempfile.mkdtemp(prefix="router-bench-"))
    mc = Memcached(workdir=work, memory_mb=256).start()
    cfg = work / "router.json"
    cfg.write_text(json.dumps({"pools": {"p": {"servers": [mc.address]}}, "route": "PoolRoute|p"}))
    extra = ("--threads", str(args.router_threads)) if args.router_threads else ()
    router = Router(cfg, workdir=work, extra_args=extra).start()
    nut = Nutcracker(mc.address, work)
    results = []
    try:
        s = socket.create_connection(("127.0.0.1", mc.port))
        s.sendall(b"".join(b"set %s 0 0 %d noreply\r\n%s\r\n" % (k, len(VALUE), VALUE) for k in KEYS) + b"mn\r\n")
        while not s.recv(100).endswith(b"MN\r\n"):
            pass
        targets = [("memcached", mc.port, None), ("squeal-router", router.port, router.pid),
                   ("nutcracker", nut.port, nut.proc.pid)]
        for multi in (1, 10):
            for depth in depths:
                for name, port, proxy_pid in targets:
                    mc0 = cpu_seconds(mc.pid)
                    px0 = cpu_seconds(proxy_pid) if proxy_pid else 0.0
                    r = run_load(port, multi, depth, args.seconds, args.procs)
                    r["memcached_cpu_us_per_req"] = (cpu_seconds(mc.pid) - mc0) / r["requests"] * 1e6
                    proxy_cpu = (cpu_seconds(proxy_pid) - px0) if proxy_pid else None
                    r["proxy_cpu_us_per_req"] = proxy_cpu / r["requests"] * 1e6 if proxy_cpu is not None else None
                    r.update(target=name, keys=multi, depth=depth)
                    results.append(r)
                    print(f"{name:14s} keys={multi:2d} depth={depth:3d} req/s={r['rps']:9.0f} "
                          f"keys/s={r['keys_per_s']:9.0f} p50={r['p50_ms']:.3f}ms p99={r['p99_ms']:.3f}ms "
                          f"mc_cpu={r['memcached_cpu_us_per_req']:.2f}us "
                          f"proxy_cpu={r['proxy_cpu_us_per_req'] or 0:.2f}us", flush=True)
        before, after, n = idle_connections_rss(router, args.idle)
        print(f"squeal-router RSS: {before:.1f} MB idle, {after:.1f} MB with {n} idle client connections")
    finally:
        nut.stop()
        router.stop()
        mc.stop()

    print("\n| keys/req | depth | memcached req/s | router req/s | nutcracker req/s | router/nutcracker "
          "| p50 ms (mc / router / nut) | p99 ms (mc / router / nut) | router CPU/req ÷ memcached CPU/req |")
    print("|---|---|---|---|---|---|---|---|---|")
    for multi in (1, 10):
        for depth in depths:
            row = {r["target"]: r for r in results if r["keys"] == multi and r["depth"] == depth}
            m, ro, nu = row["memcached"], row["squeal-router"], row["nutcracker"]
            ratio = ro["proxy_cpu_us_per_req"] / m["memcached_cpu_us_per_req"]
            print(f"| {multi} | {depth} | {m['rps']:.0f} | {ro['rps']:.0f} | {nu['rps']:.0f} | "
                  f"{ro['rps'] / nu['rps']:.2f}x | {m['p50_ms']:.3f} / {ro['p50_ms']:.3f} / {nu['p50_ms']:.3f} | "
                  f"{m['p99_ms']:.3f} / {ro['p99_ms']:.3f} / {nu['p99_ms']:.3f} | {ratio:.2f}x |")
    print(f"\nRSS with {n} idle client connections: {after:.1f} MB (before: {before:.1f} MB)")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "rss_idle_mb": after, "idle": n}, indent=2))


if __name__ == "__main__":
    main()
