"""squeal-router against real memcached: protocol behaviour, stock clients, observability."""

from __future__ import annotations

import base64
import shutil
import subprocess
import urllib.request

import pytest
from pymemcache.client.base import Client as PyClient

from ops.harness import free_port
from tests.binaries import needs_binary
from tests.router.conftest import Conn, furc_hash


def pool_config(*mcs, hash_func: str | None = None) -> dict:
    pool = {"servers": [m.address for m in mcs]}
    route: dict = {"type": "PoolRoute", "pool": "main"}
    if hash_func:
        route["hash"] = {"hash_func": hash_func}
    return {"pools": {"main": pool}, "route": route}


@pytest.fixture
def three(memcached_factory):
    return [memcached_factory() for _ in range(3)]


def test_python_furc_matches_published_vectors() -> None:
    assert furc_hash(b"sample", 100) == 97
    assert furc_hash(b"", 100) == 72
    assert furc_hash(b"", 8388608) == 6173600
    assert furc_hash(b"sample", 8388608) == 5167780


def test_hashing_spreads_100k_keys_where_mcrouter_would(three, router_factory, memcached_factory) -> None:
    mcs = three + [memcached_factory()]
    router = router_factory(pool_config(*mcs))
    c = Conn(router.address)
    n = 100_000
    c.send(b"".join(b"set key:%d 0 0 1 noreply\r\nx\r\n" % i for i in range(n)) + b"mn\r\n")
    assert c.line() == b"MN"
    counts = []
    for mc in mcs:
        stats = dict(line.split()[1:3] for line in _stats(mc.address))
        counts.append(int(stats[b"curr_items"]))
    assert sum(counts) == n
    mean = n / len(mcs)
    assert max(counts) <= 1.5 * mean, counts
    # placement is mcrouter's Ch3: check a sample against an independent furc_hash
    for i in range(0, n, 997):
        key = b"key:%d" % i
        owner = mcs[furc_hash(key, len(mcs))]
        assert Conn(owner.address).call(b"mg " + key + b"\r\n") == b"HD", key


def _stats(address: str) -> list[bytes]:
    return Conn(address).stat_lines()


def test_crc32_pool(three, router_factory) -> None:
    router = router_factory(pool_config(*three, hash_func="Crc32"))
    c = Conn(router.address)
    assert c.call(b"set sample 0 0 1\r\nv\r\n") == b"STORED"
    import zlib

    owner = three[(zlib.crc32(b"sample") & 0x7FFFFFFF) % 3]
    assert Conn(owner.address).call(b"mg sample v\r\n") == b"VA 1\r\nv\r\n"


def test_pipeline_replies_in_request_order_across_servers(three, router_factory) -> None:
    router = router_factory(pool_config(*three))
    c = Conn(router.address)
    n = 2000
    c.send(b"".join(b"set p%d 0 0 %d\r\n%d\r\n" % (i, len(str(i)), i) for i in range(n)))
    assert [c.line() for _ in range(n)] == [b"STORED"] * n
    # one write: gets, a multiget across servers, meta gets with opaques, then mn
    req = b"".join(b"get p%d\r\n" % i for i in range(n))
    req += b"get " + b" ".join(b"p%d" % i for i in range(50)) + b" missing\r\n"
    req += b"".join(b"mg p%d v O%d\r\n" % (i, i) for i in range(100))
    req += b"mg nothere v q\r\nmn\r\n"
    c.send(req)
    for i in range(n):
        assert c.reply() == b"VALUE p%d 0 %d\r\n%d\r\nEND\r\n" % (i, len(str(i)), i)
    multi = c.reply()
    assert multi == b"".join(b"VALUE p%d 0 %d\r\n%d\r\n" % (i, len(str(i)), i) for i in range(50)) + b"END\r\n"
    for i in range(100):
        assert c.reply() == b"VA %d O%d\r\n%d\r\n" % (len(str(i)), i, i)
    assert c.reply() == b"MN"  # quiet miss suppressed, mn last


def test_strict_parsing_keeps_connection(three, router_factory) -> None:
    router = router_factory(pool_config(*three))
    c = Conn(router.address)
    assert c.call(b"bogus\r\n") == b"ERROR"
    assert c.call(b"get " + b"k" * 251 + b"\r\n").startswith(b"CLIENT_ERROR")
    assert c.call(b"set x 0 0 notanumber\r\n").startswith(b"CLIENT_ERROR")
    big = 2 * 1024 * 1024
    c.send(b"set big 0 0 %d\r\n" % big + b"a" * big + b"\r\n")
    assert c.reply() == b"SERVER_ERROR object too large for cache"
    assert c.call(b"set x 0 0 1\r\nv\r\n") == b"STORED"
    assert c.call(b"get x\r\n") == b"VALUE x 0 1\r\nv\r\nEND\r\n"
    assert c.call(b"version\r\n").startswith(b"VERSION")


def test_pymemcache_through_router(three, router_factory) -> None:
    router = router_factory(pool_config(*three))
    client = PyClient(("127.0.0.1", router.port), timeout=5)
    assert client.set("a", b"1", expire=100)
    assert client.get("a") == b"1"
    client.set_many({f"m{i}": str(i).encode() for i in range(30)})
    got = client.get_many([f"m{i}" for i in range(30)] + ["none"])
    assert got == {f"m{i}": str(i).encode() for i in range(30)}
    assert client.add("a", b"2", noreply=False) is False
    assert client.incr("a", 5) == 6
    assert client.decr("a", 2) == 4
    value, cas = client.gets("a")
    assert client.cas("a", b"9", cas) is True
    assert client.cas("a", b"10", cas) is False
    assert client.append("a", b"x", noreply=False) and client.get("a") == b"9x"
    assert client.touch("a", 10, noreply=False) is True
    assert client.delete("a", noreply=False) is True
    assert client.get("a") is None
    assert client.version().startswith(b"1.6")
    assert b"cmd_get" in b"".join(k if isinstance(k, bytes) else k.encode() for k in client.stats())


def test_long_multi_get_lines(three, router_factory) -> None:
    """get/gets lines longer than other commands' 16 KiB line limit work (up to 1 MiB), as on memcached."""
    router = router_factory(pool_config(*three))
    client = PyClient(("127.0.0.1", router.port), timeout=10)
    values = {f"user:profile:{i:06d}": str(i).encode() for i in range(1000)}
    client.set_many(values)
    keys = list(values) + [f"absent:{i}" for i in range(200)]
    assert len(" ".join(keys)) > 16384
    assert client.get_many(keys) == values
    assert {k: v for k, (v, _cas) in client.gets_many(keys).items()} == values
    # a long line of 250-byte keys just under the bound; other commands keep their 16 KiB limit (a
    # longer line closes the connection without a reply, as on memcached)
    c = Conn(router.address, timeout=10)
    long_keys = [b"%06d" % i + b"x" * 244 for i in range(4000)]
    line = b"get " + b" ".join(long_keys) + b"\r\n"
    assert 16384 < len(line) < 1024 * 1024
    assert c.call(line) == b"END"
    c.send(b"set k 0 0 1" + b" " * 16374 + b"\r\nv\r\n")
    with pytest.raises(ConnectionError):
        c.line()
    # past 1 MiB: a clear error and the connection is closed (the rest of the line is not read)
    c = Conn(router.address, timeout=10)
    try:  # just over the bound, so the router has read (nearly) all of it before it closes
        c.send(b"get " + b"k " * (512 * 1024 + 8))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert c.line() == b"CLIENT_ERROR line too long (get/gets lines are limited to 1048576 bytes)"


@needs_binary(shutil.which("memcstat") is not None, "libmemcached-tools not installed")
def test_libmemcached_tools_through_router(three, router_factory) -> None:
    router = router_factory(pool_config(*three))
    servers = f"--servers=127.0.0.1:{router.port}"
    out = subprocess.run(["memcstat", servers], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert "pid" in out.stdout and "curr_connections" in out.stdout
    PyClient(("127.0.0.1", router.port)).set("greeting", b"hello from libmemcached")
    out = subprocess.run(["memccat", servers, "greeting"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hello from libmemcached"


META_SEQUENCE = [
    b"mg lease N30 v c t\r\n",  # W: first caller wins the lease
    b"mg lease N30 v c t\r\n",  # Z: others wait
    b"ms lease 3 C{cas} T30\r\nbar\r\n",  # winner fills with the lease cas
    b"mg lease v t\r\n",
    b"mg gone N30 c\r\n",  # lease, then a delete in between: fill is refused (NF)
    b"md gone\r\n",
    b"ms gone 3 C{cas}\r\nold\r\n",
    b"mg inv N30 c\r\n",  # lease, then an invalidate: fill is refused (EX)
    b"md inv I T30\r\n",
    b"ms inv 3 C{cas}\r\nold\r\n",
    b"ms swr 3 T60\r\nval\r\n",  # stale-while-revalidate
    b"md swr I T30\r\n",
    b"mg swr v c\r\n",
    b"mg swr v c\r\n",
    b"ms hold 0 ME T3 q\r\n\r\n",  # hold-off on an absent key
    b"md hold I T3 q\r\n",
    b"ms hold 1 ME\r\nz\r\n",
    b"mg " + base64.b64encode(b"bin key") + b" b v k O77\r\n",
    b"ma counter N0 J5 v\r\n",
    b"ma counter v\r\n",
    b"ma counter MD D3 v q\r\n",
    b"mn\r\n",
]


def _run_meta(address: str) -> list[bytes]:
    c = Conn(address)
    out = []
    cas = b"0"
    for cmd in META_SEQUENCE:
        c.send(cmd.replace(b"{cas}", cas))
        if b" q\r\n" in cmd:
            continue  # quiet: any reply shows up before the final MN
        reply = c.reply()
        out.append(reply)
        for tok in reply.split(b"\r\n")[0].split()[1:]:
            if tok.startswith(b"c"):
                cas = tok[1:]
    return out


def test_meta_lease_commands_behave_as_on_memcached(memcached_factory, router_factory) -> None:
    direct = memcached_factory()
    behind = memcached_factory()
    router = router_factory(pool_config(behind))
    assert _run_meta(router.address) == _run_meta(direct.address)


def _router_after_a_set_and_a_get(three, router_factory) -> tuple[Conn, int]:
    """A router over `three` serving /metrics, after a `set m` and a `get m`: (the connection that sent them, the
    metrics port)."""
    mport = free_port()
    router = router_factory(pool_config(*three), metrics_port=mport)
    c = Conn(router.address)
    c.call(b"set m 0 0 1\r\n1\r\n")
    c.call(b"get m\r\n")
    return c, mport


def test_stats_and_metrics(three, router_factory) -> None:
    c, mport = _router_after_a_set_and_a_get(three, router_factory)
    stats = dict(line.split()[1:3] for line in c.stat_lines())
    assert stats[b"cmd_get"] == b"1" and stats[b"cmd_set"] == b"1"
    body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
    for name in (
        'squeal_router_requests_total{op="get",route="default"} 1',
        "squeal_router_tko_events_total",
        "squeal_router_gutter_failovers_total",
        "squeal_router_warmup_fills_total",
        "squeal_router_spooled_deletes_total",
        "squeal_router_replayed_deletes_total",
        "squeal_router_errors_total",
        "squeal_router_request_duration_seconds_bucket",
    ):
        assert name in body, name
    assert all(line.startswith(("squeal_router_", "#")) for line in body.splitlines() if line)


def test_prefixed_multi_get_across_routes_and_servers(memcached_factory, router_factory) -> None:
    """Keys of two routing prefixes and several servers in one get: values come back in the order
    asked, with the client's (prefixed) keys, and stats count every key on its own route."""
    east, west = [memcached_factory() for _ in range(2)], [memcached_factory() for _ in range(2)]
    config = {
        "pools": {"east": {"servers": [m.address for m in east]}, "west": {"servers": [m.address for m in west]}},
        "routes": [
            {"aliases": ["/east/a/"], "route": "PoolRoute|east"},
            {"aliases": ["/west/b/"], "route": "PoolRoute|west"},
        ],
    }
    router = router_factory(config)
    c = Conn(router.address)
    keys = [b"/east/a/k%d" % i for i in range(6)] + [b"/west/b/k%d" % i for i in range(6)]
    for k in keys[::2]:  # every other key is stored; the rest miss
        assert c.call(b"set " + k + b" 0 0 2\r\n" + k[-2:] + b"\r\n") == b"STORED"
    assert all(int(_stat_map(m.address)[b"curr_items"]) > 0 for m in east + west), "keys should reach every server"
    order = keys[::-1]
    c.send(b"get " + b" ".join(order) + b"\r\n")
    got = []
    while (line := c.line()) != b"END":
        assert line.startswith(b"VALUE "), line
        got.append((line.split()[1], c.line()))
    assert got == [(k, k[-2:]) for k in order if k in keys[::2]]
    # meta replies echo the client's key, prefix included, as VALUE lines do
    assert c.call(b"mg /east/a/k0 v k O9\r\n") == b"VA 2 k/east/a/k0 O9\r\nk0\r\n"
    assert c.call(b"md /west/b/k0 k q\r\nmn\r\n") == b"MN"
    assert c.call(b"md /west/b/k0 k\r\n") == b"NF k/west/b/k0"
    stats = _stat_map(router.address)
    assert stats[b"route:/east/a/:cmd_get"] == b"6" and stats[b"route:/west/b/:cmd_get"] == b"6"
    assert stats[b"route:/east/a/:cmd_set"] == b"3" and stats[b"route:/west/b/:cmd_set"] == b"3"
    assert stats[b"cmd_get"] == b"12"


def _stat_map(address: tuple[str, int]) -> dict[bytes, bytes]:
    stats = {}
    for line in Conn(address).stat_lines():
        _, name, value = line.split(b" ", 2)
        stats[name] = value
    return stats


def test_stats_reset_resets_every_server_and_the_routers_counters(memcached_factory, router_factory) -> None:
    """`stats reset` goes to every server of the config and is `RESET` only when all of them
    answered `RESET`; the router's own counters start again from zero too (gauges stay)."""
    servers = [memcached_factory() for _ in range(3)]
    router = router_factory({"pools": {"p": {"servers": [m.address for m in servers]}}, "route": "PoolRoute|p"})
    c = Conn(router.address)
    for i in range(20):
        assert c.call(b"set k%d 0 0 1\r\nv\r\n" % i) == b"STORED"
        assert c.call(b"get k%d\r\n" % i).startswith(b"VALUE")
    assert all(int(_stat_map(m.address)[b"cmd_get"]) > 0 for m in servers)
    assert _stat_map(router.address)[b"cmd_get"] == b"20"
    assert c.call(b"stats reset\r\n") == b"RESET"
    assert [_stat_map(m.address)[b"cmd_get"] for m in servers] == [b"0"] * 3
    after = _stat_map(router.address)
    assert after[b"cmd_get"] == b"0" and after[b"cmd_set"] == b"0" and b"route:default:cmd_get" not in after
    assert after[b"curr_connections"] != b"0"  # a gauge, not a counter: not reset
    assert int(_stat_map(servers[0].address)[b"curr_items"]) > 0  # stats only: no item is touched


def test_stats_reset_fails_if_a_server_did_not_reset(memcached_factory, router_factory) -> None:
    alive = memcached_factory()
    dead = f"127.0.0.1:{free_port()}"
    router = router_factory({"pools": {"p": {"servers": [alive.address, dead]}}, "route": "PoolRoute|p"})
    c = Conn(router.address)
    reply = c.call(b"stats reset\r\n")
    assert reply.startswith(b"SERVER_ERROR stats reset failed on 1 of 2 servers: " + dead.encode()), reply
    assert _stat_map(alive.address)[b"cmd_get"] == b"0"


# The HELP and TYPE lines of /metrics, as the hand-written exposition served them before the
# endpoint moved to hyper: dashboards, alerts and docs/metrics.md rely on these names.
METRICS_HEAD = [
    "# HELP squeal_router_requests_total client requests by command and route (get/gets: keys)",
    "# TYPE squeal_router_requests_total counter",
    "# HELP squeal_router_get_hits_total gets answered with a value (get/gets keys, mg VA/HD), by route",
    "# TYPE squeal_router_get_hits_total counter",
    "# HELP squeal_router_pool_get_hits_total gets answered with a value (get/gets keys, mg VA/HD), by pool",
    "# TYPE squeal_router_pool_get_hits_total counter",
    "# HELP squeal_router_get_misses_total gets answered without a value (get/gets keys, mg EN), by route",
    "# TYPE squeal_router_get_misses_total counter",
    "# HELP squeal_router_pool_get_misses_total gets answered without a value (get/gets keys, mg EN), by pool",
    "# TYPE squeal_router_pool_get_misses_total counter",
    "# HELP squeal_router_errors_total replies that were errors",
    "# TYPE squeal_router_errors_total counter",
    "# HELP squeal_router_client_errors_total malformed client commands",
    "# TYPE squeal_router_client_errors_total counter",
    "# HELP squeal_router_tko_events_total servers marked TKO",
    "# TYPE squeal_router_tko_events_total counter",
    "# HELP squeal_router_tko_recoveries_total TKO servers brought back by a probe",
    "# TYPE squeal_router_tko_recoveries_total counter",
    "# HELP squeal_router_failovers_total requests answered by a failover child",
    "# TYPE squeal_router_failovers_total counter",
    "# HELP squeal_router_gutter_failovers_total requests sent to a FailoverWithExptimeRoute failover (gutter)",
    "# TYPE squeal_router_gutter_failovers_total counter",
    "# HELP squeal_router_warmup_fills_total values copied from warm to cold by WarmUpRoute",
    "# TYPE squeal_router_warmup_fills_total counter",
    "# HELP squeal_router_spooled_deletes_total failed deletes written to the spool",
    "# TYPE squeal_router_spooled_deletes_total counter",
    "# HELP squeal_router_spool_dropped_deletes_total failed deletes the full spool refused",
    "# TYPE squeal_router_spool_dropped_deletes_total counter",
    "# HELP squeal_router_replayed_deletes_total spooled deletes replayed to their server",
    "# TYPE squeal_router_replayed_deletes_total counter",
    "# HELP squeal_router_config_loads_total configs loaded",
    "# TYPE squeal_router_config_loads_total counter",
    "# HELP squeal_router_config_rejects_total configs rejected",
    "# TYPE squeal_router_config_rejects_total counter",
    "# HELP squeal_router_rejected_connections_total clients refused at the connection limit",
    "# TYPE squeal_router_rejected_connections_total counter",
    "# HELP squeal_router_tls_handshakes_total clients of a TLS port whose handshake succeeded",
    "# TYPE squeal_router_tls_handshakes_total counter",
    "# HELP squeal_router_tls_handshake_failures_total clients of a TLS port refused at the handshake",
    "# TYPE squeal_router_tls_handshake_failures_total counter",
    "# HELP squeal_router_lease_won_total lease route: plain get misses that won a lease",
    "# TYPE squeal_router_lease_won_total counter",
    "# HELP squeal_router_lease_waits_total lease route: waits on a lease another client held",
    "# TYPE squeal_router_lease_waits_total counter",
    "# HELP squeal_router_lease_gave_up_total lease route: gets that waited out their retries (a miss)",
    "# TYPE squeal_router_lease_gave_up_total counter",
    "# HELP squeal_router_lease_fills_stored_total lease route: sets with a lease token, stored",
    "# TYPE squeal_router_lease_fills_stored_total counter",
    "# HELP squeal_router_lease_fills_refused_total lease route: sets with a lease token refused as stale",
    "# TYPE squeal_router_lease_fills_refused_total counter",
    "# HELP squeal_router_lease_tokens_evicted_total lease route: tokens dropped at max_tokens, oldest first",
    "# TYPE squeal_router_lease_tokens_evicted_total counter",
    "# HELP squeal_router_lease_stale_marks_total lease route: deletes sent as stale marks (md I T<stale_ttl>)",
    "# TYPE squeal_router_lease_stale_marks_total counter",
    "# HELP squeal_router_lease_stale_served_total lease route: gets answered with a stale value while another "
    "reader refills it",
    "# TYPE squeal_router_lease_stale_served_total counter",
    "# HELP squeal_router_lease_pairing_redirects_total lease pairing: lease-sets sent to the failover child that "
    "issued their token, not the first",
    "# TYPE squeal_router_lease_pairing_redirects_total counter",
    "# HELP squeal_router_connections open client connections",
    "# TYPE squeal_router_connections gauge",
    "# HELP squeal_router_max_connections client connection limit",
    "# TYPE squeal_router_max_connections gauge",
    "# HELP squeal_router_servers_tko servers currently marked TKO",
    "# TYPE squeal_router_servers_tko gauge",
    "# HELP squeal_router_lease_tokens lease tokens the lease route holds now",
    "# TYPE squeal_router_lease_tokens gauge",
    "# HELP squeal_router_request_duration_seconds client request latency",
    "# TYPE squeal_router_request_duration_seconds histogram",
]


def test_metrics_format_parses_with_prometheus_client(three, router_factory) -> None:
    """/metrics parses with the Prometheus client's own parser, and its names, types, help texts,
    labels and values are the ones monitoring relies on."""
    from prometheus_client.parser import text_string_to_metric_families

    c, mport = _router_after_a_set_and_a_get(three, router_factory)
    c.call(b"get nope\r\n")
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        body = response.read().decode()
    head = [line for line in body.splitlines() if line.startswith("#")]
    assert head == METRICS_HEAD
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["squeal_router_requests"].type == "counter"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("squeal_router_requests_total", (("op", "get"), ("route", "default")))] == 2
    assert samples[("squeal_router_requests_total", (("op", "set"), ("route", "default")))] == 1
    assert samples[("squeal_router_config_loads_total", ())] == 1
    assert samples[("squeal_router_connections", ())] >= 1
    assert families["squeal_router_request_duration_seconds"].type == "histogram"
    buckets = [s for s in families["squeal_router_request_duration_seconds"].samples if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in buckets][:2] == ["0.00005", "0.0001"] and buckets[-1].labels["le"] == "+Inf"
    assert buckets[-1].value == samples[("squeal_router_request_duration_seconds_count", ())] >= 3


def test_metrics_endpoint_speaks_http_1_1(three, router_factory) -> None:
    """Two requests on one kept-alive connection (a scraper reuses its connection), /healthz, and
    404 for any other path."""
    import http.client

    mport = free_port()
    router_factory(pool_config(*three), metrics_port=mport)
    conn = http.client.HTTPConnection("127.0.0.1", mport, timeout=5)
    conn.request("GET", "/metrics")
    sock = conn.sock
    first = conn.getresponse()
    assert first.status == 200 and first.read().startswith(b"# HELP squeal_router_requests_total")
    assert first.getheader("Connection") != "close"
    conn.request("GET", "/healthz?verbose=1")
    second = conn.getresponse()
    assert (second.status, second.read()) == (200, b"ok\n")
    assert sock is not None and conn.sock is sock, "the connection was not kept alive"
    conn.request("GET", "/nope")
    missing = conn.getresponse()
    assert missing.status == 404 and missing.read() == b"not found\n"
    conn.request("HEAD", "/metrics")
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    conn.close()


@pytest.mark.parametrize(
    "line",
    [b"gat 1000 k k2 L", b"gats 1000 k L k2", b"gat -1 k L", b"gats -1 k2 k L"],
    ids=["gat-1000", "gats-1000-stops-at-the-long-key", "gat-expire", "gats-expire"],
)
def test_gat_with_a_key_over_250_bytes_touches_the_keys_before_it_as_memcached_does(
    line, memcached_factory, router_factory
) -> None:
    """memcached 1.6.18 touches a gat/gats line's keys up to the one over 250 bytes, then answers only
    CLIENT_ERROR (issue 37): through the router the same line must leave the same TTLs behind."""
    line = line.replace(b"L", b"L" * 251) + b"\r\n"
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool_config(behind))
    answers, ttls = [], []
    for client_side, server in ((Conn(direct.address), direct), (Conn(router.address), behind)):
        for key in (b"k", b"k2"):
            assert Conn(server.address).call(b"set " + key + b" 0 0 1\r\nv\r\n") == b"STORED"
        answers.append(client_side.call(line))
        ttls.append([Conn(server.address).call(b"mg " + key + b" t\r\n") for key in (b"k", b"k2")])
    assert answers[0] == answers[1] == b"CLIENT_ERROR bad command line format"
    # t1000 may read t999 on one of them: the two memcacheds' clocks tick apart
    norm = [[t.replace(b"t999", b"t1000") for t in pair] for pair in ttls]
    assert norm[1] == norm[0], (ttls, line[:30])
    assert norm[0] != [b"HD t-1", b"HD t-1"], "the line touched nothing on memcached: the test checks nothing"
