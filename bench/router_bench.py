"""Router benchmark: the same load generator against direct memcached, squeal-router and
twemproxy (nutcracker), all on loopback, one memcached behind both proxies.

Reports requests/s, keys/s, p50/p99 round-trip latency for single gets and 10-key multigets at
several pipeline depths, CPU time per request of the proxy vs memcached's own (from
/proc/PID/stat utime+stime; against memcached serving the generator directly, and against the
memcached behind the proxy in the same run), and the router's RSS with 10,000 idle client connections.
Not a test: nothing here asserts on time. Run from the repository root:

    .venv/bin/python bench/router_bench.py [--seconds 3] [--depths 1,8,32] [--conns 2,32] [--keys 1,10]
        [--rounds 3] [--idle 10000] [--no-pin] [--forwarder]
    .venv/bin/python bench/router_bench.py --tls [--depths 8,32] [--conns 2,32] [--keys 1] [--handshakes 2000]

`--tls`: the router over TLS vs memcached `-Z` direct in the same run (a local CA from ops.tls; the
generator speaks TLS to both; the router reaches the same memcached over TLS, a pool with
`security_mech: tls`): CPU per request at each depth, and the CPU of one new connection (TCP + TLS
handshake + one `version`, the generator opening `--handshakes` connections in turn) for each.

By default memcached runs on CPU 0 and the generator and proxy share CPU 1, the way a router sits on
the web host next to its clients and memcached on a machine of its own; unpinned runs on this 2-core
VM swing by +-30% as the scheduler moves three busy processes between two cores.

The load generator is router/examples/loadgen.rs (built here with cargo), one thread by default.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ops.harness import Memcached, Router, free_port, memcached_command, wait_until

KEYS = [f"bench:key:{i}".encode() for i in range(1000)]
ROUTER_DIR = Path(__file__).resolve().parent.parent / "router"
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


LOADGEN = ROUTER_DIR / "target" / "release" / "examples" / "loadgen"


def build_examples() -> None:
    subprocess.run(
        ["cargo", "build", "--release", "--locked", "--example", "loadgen", "--example", "forwarder"],
        cwd=ROUTER_DIR,
        check=True,
    )


class _Proxy:
    """A proxy process on `self.port` that the bench starts and stops (logging to `self.log`)."""

    port: int
    log: Path
    proc: subprocess.Popen

    def _wait_answering(self, name: str) -> None:
        """Returns once a `get` through the proxy is answered (an empty `END`)."""
        wait_until(
            lambda: memcached_command(("127.0.0.1", self.port), b"get x\r\n") == b"END",
            10,
            name,
            self.proc,
            self.log,
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


class Forwarder(_Proxy):
    """router/examples/forwarder.rs: copies bytes between each client and its own backend connection.
    The floor of any TCP proxy's cost, to tell the router's own costs from those of proxying."""

    def __init__(self, backend: str, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "forwarder.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    str(ROUTER_DIR / "target" / "release" / "examples" / "forwarder"),
                    "--port",
                    str(self.port),
                    "--backend",
                    backend,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_answering("forwarder")


def pin(pid: int, cpu: int) -> None:
    """Pin every thread of `pid` to one CPU (threads a process starts later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {cpu})


def loadgen_command(
    port: int,
    multi: int,
    depth: int,
    conns: int,
    seconds: float,
    threads: int | None = None,
    tls_ca: Path | None = None,
) -> list[str]:
    """router/examples/loadgen.rs's command line for one load run against `port` over the bench's KEYS:
    `multi` keys a get, `conns` connections with `depth` requests in flight each, for `seconds`
    (`threads` None: the generator's default, one)."""
    return [
        str(LOADGEN),
        "--port",
        str(port),
        "--conns",
        str(conns),
        *(["--threads", str(threads)] if threads is not None else []),
        "--depth",
        str(depth),
        "--keys",
        str(multi),
        "--seconds",
        str(seconds),
        "--key-count",
        str(len(KEYS)),
        "--prefix",
        "bench:key:",
        *(["--tls-ca", str(tls_ca)] if tls_ca else []),
    ]


def run_load(
    port: int,
    multi: int,
    depth: int,
    conns: int,
    seconds: float,
    threads: int,
    cpu: int | None = None,
    tls_ca: Path | None = None,
) -> dict:
    """One run of router/examples/loadgen.rs against `port` (same generator for every target)."""
    out = subprocess.run(
        loadgen_command(port, multi, depth, conns, seconds, threads, tls_ca),
        check=True,
        capture_output=True,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None,
    ).stdout
    r = json.loads(out)
    r["rps"] = r["requests"] / r["seconds"]
    r["keys_per_s"] = r["rps"] * multi
    return r


def median_run(runs: list[dict]) -> dict:
    """Per-field median over the rounds of one cell and target (noise on a shared 2-core box)."""
    fields = ("rps", "p50_ms", "p99_ms", "memcached_cpu_us_per_req", "proxy_cpu_us_per_req")
    return {f: statistics.median(r[f] for r in runs) if runs[0][f] is not None else None for f in fields}


class Nutcracker(_Proxy):
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
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self._wait_answering("nutcracker")


def run_cells(
    cells: list[tuple[int, int, int]],
    targets: list[tuple[str, int, int | None]],
    mc: Memcached,
    args: argparse.Namespace,
    client_cpu: int | None,
    *,
    pin_proxies: bool,
    tls_ca: Path | None = None,
) -> list[dict]:
    """Each cell (keys, conns, depth) against each target (name, port, the proxy's pid or None), all targets in
    turn `args.rounds` times: a load run each, with memcached's and the proxy's CPU per request (`pin_proxies`:
    pin the proxy to the generator's CPU before each run). One result a run, printed as it comes."""
    results = []
    for multi, conns, depth in cells:
        for name, port, proxy_pid in [t for _ in range(args.rounds) for t in targets]:
            mc0 = cpu_seconds(mc.pid)
            px0 = cpu_seconds(proxy_pid) if proxy_pid else 0.0
            if pin_proxies and proxy_pid and client_cpu is not None:
                pin(proxy_pid, client_cpu)
            r = run_load(port, multi, depth, conns, args.seconds, args.loadgen_threads, client_cpu, tls_ca)
            r["memcached_cpu_us_per_req"] = (cpu_seconds(mc.pid) - mc0) / r["requests"] * 1e6
            proxy_cpu = (cpu_seconds(proxy_pid) - px0) if proxy_pid else None
            r["proxy_cpu_us_per_req"] = proxy_cpu / r["requests"] * 1e6 if proxy_cpu is not None else None
            r.update(target=name, keys=multi, depth=depth, conns=conns)
            results.append(r)
            print(
                f"{name:14s} keys={multi:2d} conns={conns:3d} depth={depth:3d} req/s={r['rps']:9.0f} "
                f"p50={r['p50_ms']:.3f}ms p99={r['p99_ms']:.3f}ms "
                f"mc_cpu={r['memcached_cpu_us_per_req']:.2f}us "
                f"proxy_cpu={r['proxy_cpu_us_per_req'] or 0:.2f}us",
                flush=True,
            )
    return results


def cell_medians(results: list[dict], cell: tuple[int, int, int], names: tuple[str, ...]) -> list[dict]:
    """`median_run` of the rounds of one cell (keys, conns, depth), for each target of `names`, in that order."""
    multi, conns, depth = cell
    return [
        median_run([r for r in results if (r["target"], r["keys"], r["conns"], r["depth"]) == (t, multi, conns, depth)])
        for t in names
    ]


def fill_keys(port: int) -> None:
    """Store the bench's KEYS (VALUE each) through `port`; returns once they all are."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"".join(b"set %s 0 0 %d noreply\r\n%s\r\n" % (k, len(VALUE), VALUE) for k in KEYS) + b"mn\r\n")
    while not s.recv(100).endswith(b"MN\r\n"):
        pass
    s.close()


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
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each cell's run")
    ap.add_argument("--depths", default="1,8,32", help="pipeline depths per connection (requests per batch)")
    ap.add_argument("--conns", default="2,32", help="concurrent client connections (comma list)")
    ap.add_argument("--keys", default="1,10", help="keys per get request (comma list)")
    ap.add_argument(
        "--rounds", type=int, default=3, help="runs per cell and target, interleaved; the table shows medians"
    )
    ap.add_argument("--loadgen-threads", type=int, default=1, help="threads of the load generator")
    ap.add_argument("--idle", type=int, default=10_000, help="idle connections for the RSS check (0: skip)")
    ap.add_argument("--router-threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write every cell here")
    ap.add_argument(
        "--forwarder",
        action="store_true",
        help="also measure a bytes-copying forwarder (router/examples/forwarder.rs), the floor of "
        "any TCP proxy's CPU per request",
    )
    ap.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="let the scheduler place everything (default: memcached on CPU 0; generator and proxy "
        "on CPU 1, as a router runs on the web host and memcached on its own machine)",
    )
    ap.add_argument(
        "--tls",
        action="store_true",
        help="TLS mode: the router over TLS vs memcached -Z direct, and the cost of a new connection",
    )
    ap.add_argument("--handshakes", type=int, default=2000, help="new connections per target in --tls mode")
    args = ap.parse_args()
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        sys.exit("router_bench: pinning needs 2 CPUs; run with --no-pin")
    if args.tls:
        build_examples()
        tls_main(args)
        return
    depths = [int(d) for d in args.depths.split(",")]
    conn_counts = [int(c) for c in args.conns.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.idle + 1000
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))  # children inherit it
    build_examples()

    work = Path(tempfile.mkdtemp(prefix="router-bench-"))
    mc = Memcached(workdir=work, memory_mb=256).start()
    cfg = work / "router.json"
    cfg.write_text(json.dumps({"pools": {"p": {"servers": [mc.address]}}, "route": "PoolRoute|p"}))
    extra = ("--threads", str(args.router_threads)) if args.router_threads else ()
    router = Router(cfg, workdir=work, extra_args=extra).start()
    nut = Nutcracker(mc.address, work)
    fwd = Forwarder(mc.address, work) if args.forwarder else None
    results = []
    key_counts = [int(k) for k in args.keys.split(",")]
    cells = [(multi, conns, depth) for multi in key_counts for conns in conn_counts for depth in depths]
    try:
        fill_keys(mc.port)
        targets = [
            ("memcached", mc.port, None),
            ("squeal-router", router.port, router.pid),
            ("nutcracker", nut.port, nut.proc.pid),
        ]
        if fwd:
            targets.append(("forwarder", fwd.port, fwd.proc.pid))
        client_cpu = None
        if args.pin:
            server_cpu, client_cpu = sorted(os.sched_getaffinity(0))[:2]
            pin(mc.pid, server_cpu)
        results += run_cells(cells, targets, mc, args, client_cpu, pin_proxies=True)
        before, after, n = idle_connections_rss(router, args.idle)
        print(f"squeal-router RSS: {before:.1f} MB idle, {after:.1f} MB with {n} idle client connections")
    finally:
        nut.stop()
        if fwd:
            fwd.stop()
        router.stop()
        mc.stop()

    print(
        "\n| keys/req | conns | depth | memcached req/s | router req/s | nutcracker req/s | router/nutcracker "
        "| p50 ms (mc / router / nut) | p99 ms (mc / router / nut) | CPU/req ÷ memcached's (router / nut) "
        "| same, memcached's in the same run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for multi, conns, depth in cells:
        m, ro, nu = cell_medians(results, (multi, conns, depth), ("memcached", "squeal-router", "nutcracker"))
        base = m["memcached_cpu_us_per_req"]
        print(
            f"| {multi} | {conns} | {depth} | {m['rps']:.0f} | {ro['rps']:.0f} | {nu['rps']:.0f} | "
            f"{ro['rps'] / nu['rps']:.2f}x | {m['p50_ms']:.3f} / {ro['p50_ms']:.3f} / {nu['p50_ms']:.3f} | "
            f"{m['p99_ms']:.3f} / {ro['p99_ms']:.3f} / {nu['p99_ms']:.3f} | "
            f"{ro['proxy_cpu_us_per_req'] / base:.2f}x / {nu['proxy_cpu_us_per_req'] / base:.2f}x | "
            f"{ro['proxy_cpu_us_per_req'] / ro['memcached_cpu_us_per_req']:.2f}x / "
            f"{nu['proxy_cpu_us_per_req'] / nu['memcached_cpu_us_per_req']:.2f}x |"
        )
    if args.forwarder:
        print("\n| keys/req | conns | depth | forwarder req/s | CPU/req ÷ memcached's (forwarder / router / nut) |")
        print("|---|---|---|---|---|")
        for multi, conns, depth in cells:
            m, ro, nu, fw = cell_medians(
                results, (multi, conns, depth), ("memcached", "squeal-router", "nutcracker", "forwarder")
            )
            base = m["memcached_cpu_us_per_req"]
            print(
                f"| {multi} | {conns} | {depth} | {fw['rps']:.0f} | {fw['proxy_cpu_us_per_req'] / base:.2f}x / "
                f"{ro['proxy_cpu_us_per_req'] / base:.2f}x / {nu['proxy_cpu_us_per_req'] / base:.2f}x |"
            )
    print(f"\nRSS with {n} idle client connections: {after:.1f} MB (before: {before:.1f} MB)")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "rss_idle_mb": after, "idle": n}, indent=2))


def tls_main(args: argparse.Namespace) -> None:
    """--tls: squeal-router (TLS port, TLS pool) vs memcached -Z direct, one memcached, same run."""
    from ops import tls

    depths = [int(d) for d in args.depths.split(",")]
    conn_counts = [int(c) for c in args.conns.split(",")]
    key_counts = [int(k) for k in args.keys.split(",")]
    work = Path(tempfile.mkdtemp(prefix="router-bench-tls-"))
    ca = tls.make_ca(work / "pki")
    server = tls.issue(ca, work / "pki", "memcached")
    mine = tls.issue(ca, work / "pki", "router")
    mc = Memcached(workdir=work, memory_mb=256, tls=(server.cert, server.key)).start()
    cfg = work / "router.json"
    cfg.write_text(
        json.dumps({"pools": {"p": {"servers": [mc.address], "security_mech": "tls"}}, "route": "PoolRoute|p"})
    )
    extra = ("--pem-cert-path", str(mine.cert), "--pem-key-path", str(mine.key), "--pem-ca-path", str(ca.cert))
    if args.router_threads:
        extra += ("--threads", str(args.router_threads))
    router = Router(cfg, workdir=work, extra_args=extra, ssl_port=free_port()).start()
    results = []
    cells = [(multi, conns, depth) for multi in key_counts for conns in conn_counts for depth in depths]
    handshake = {}
    try:
        filler = Router(cfg, workdir=work / "filler", extra_args=extra).start()  # a plaintext way in, to fill
        fill_keys(filler.port)
        filler.stop()
        targets = [("memcached -Z", mc.port, None), ("router TLS", router.ssl_port, router.pid)]
        client_cpu = None
        if args.pin:
            server_cpu, client_cpu = sorted(os.sched_getaffinity(0))[:2]
            pin(mc.pid, server_cpu)
            pin(router.pid, client_cpu)
        results += run_cells(cells, targets, mc, args, client_cpu, pin_proxies=False, tls_ca=ca.cert)
        for name, port, pid in [
            ("memcached -Z", mc.port, mc.pid),
            ("router TLS", router.ssl_port, router.pid),
            ("router plaintext", router.port, router.pid),
        ]:
            c0 = cpu_seconds(pid)
            out = subprocess.run(
                [
                    str(LOADGEN),
                    "--port",
                    str(port),
                    "--handshakes",
                    str(args.handshakes),
                    *(["--tls-ca", str(ca.cert)] if "plaintext" not in name else []),
                ],
                check=True,
                capture_output=True,
                text=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, {client_cpu})) if client_cpu is not None else None,
            )
            h = json.loads(out.stdout)
            handshake[name] = ((cpu_seconds(pid) - c0) / h["handshakes"] * 1e6, h["seconds"] / h["handshakes"] * 1e3)
            print(f"{name}: {handshake[name][0]:.0f} us CPU, {handshake[name][1]:.2f} ms wall per new connection")
    finally:
        router.stop()
        mc.stop()
    print(
        "\n| keys/req | conns | depth | memcached -Z req/s | router TLS req/s | p50 ms (mc / router) "
        "| p99 ms (mc / router) | router CPU/req ÷ memcached's direct | same, memcached's behind the router |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for multi, conns, depth in cells:
        m, ro = cell_medians(results, (multi, conns, depth), ("memcached -Z", "router TLS"))
        print(
            f"| {multi} | {conns} | {depth} | {m['rps']:.0f} | {ro['rps']:.0f} | "
            f"{m['p50_ms']:.3f} / {ro['p50_ms']:.3f} | {m['p99_ms']:.3f} / {ro['p99_ms']:.3f} | "
            f"{ro['proxy_cpu_us_per_req'] / m['memcached_cpu_us_per_req']:.2f}x | "
            f"{ro['proxy_cpu_us_per_req'] / ro['memcached_cpu_us_per_req']:.2f}x |"
        )
    print(
        "\n| new connection (connect, handshake, one version, close) | CPU of the server side | wall, one at a time |"
    )
    print("|---|---|---|")
    for name, (cpu_us, wall_ms) in handshake.items():
        print(f"| {name} | {cpu_us:.0f} us | {wall_ms:.2f} ms |")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "handshake": handshake}, indent=2))


if __name__ == "__main__":
    main()
