"""The whole platform on this machine: `squealctl up` of the example topology (on free ports), real
MariaDB primary + replica, memcached pools, one router per cluster, one squeal daemon per region and the
monitoring server with its prober. Updates at the master must disappear from every cluster of both regions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pymysql
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pymemcache.client.base import Client

import router_config
from ops.harness import ROUTER_BIN, free_port, wait_until
from tests.binaries import needs_binary

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local.toml"
UPDATES = 1000

pytestmark = needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")


def squealctl(state: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(state), *args], capture_output=True, text=True, timeout=300
    )
    if result.returncode != 0:
        raise AssertionError(f"squealctl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("platform")
    topo = router_config.reassign_ports(router_config.load(EXAMPLE), free_port)
    topo_file = base / "local.toml"
    topo_file.write_text(router_config.dumps(topo))
    topo = router_config.load(topo_file)  # its `source` now names the file squealctl runs
    state = base / "state"
    try:
        squealctl(state, "up", str(topo_file))
        yield topo, state
    finally:
        squealctl(state, "down")


def _router_client(cluster: router_config.Cluster) -> Client:
    r = cluster.routers[0]
    return Client((r.host, r.port), connect_timeout=2, timeout=2)


def _wait(predicate, timeout: float, what: str) -> None:
    wait_until(predicate, timeout, what, ignore=(), error=AssertionError)


def cached(client: Client) -> list[str]:
    """The user:N keys (N up to UPDATES) the client's cluster holds."""
    keys = [f"user:{i}" for i in range(1, UPDATES + 1)]
    return [k for start in range(0, UPDATES, 100) for k in client.get_many(keys[start : start + 100])]


def test_updates_at_master_invalidate_every_cluster_of_both_regions(platform):
    topo, _ = platform
    db = topo.master.database
    clients = {c.name: _router_client(c) for c in topo.clusters}
    conn = pymysql.connect(host=db.host, port=db.port, user=db.user, password=db.password, autocommit=True)
    last = f"user:{UPDATES}"
    # A sentinel for the insert's last row, cached before the insert: once the insert's delete of it has
    # arrived, so have all of the insert's (one transaction, delivered in order per cluster). Filling before
    # that would let a late insert delete pass for the UPDATE's.
    for client in clients.values():
        client.set(last, b"sentinel", expire=600)
        assert client.get(last) == b"sentinel"
    with conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO app.users (id, name, email) VALUES (%s, %s, %s)",
            [(i, f"user{i}", f"u{i}@example.com") for i in range(1, UPDATES + 1)],
        )
        _wait(lambda: all(c.get(last) is None for c in clients.values()), 30, "the insert's deletes")
        for client in clients.values():
            client.set_many({f"user:{i}": b"cached" for i in range(1, UPDATES + 1)}, expire=600)
        # Every key is there before the UPDATE: its absence below is then the UPDATE's deletes, not a set that
        # never landed.
        assert {name: len(cached(c)) for name, c in clients.items()} == {name: UPDATES for name in clients}
        for i in range(1, UPDATES + 1):
            cur.execute("UPDATE app.users SET name = %s WHERE id = %s", (f"renamed{i}", i))

    _wait(lambda: not any(cached(c) for c in clients.values()), 60, "every user:N key to leave every cluster")
    assert {name: cached(c) for name, c in clients.items()} == {name: [] for name in clients}


def _histogram(address: str, name: str) -> dict[tuple[str, str], dict[float, float]]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{name}_bucket":
                out.setdefault((s.labels["region"], s.labels["cluster"]), {})[float(s.labels["le"])] = s.value
    return out


def test_prober_measures_every_cluster_and_no_canary_is_lost(platform):
    """The prober runs against the live platform and every canary leaves every cluster.

    How fast (the nines under 1 s) is measured by bench/invalidation_nines.py and recorded in
    docs/benchmarks.md; a latency threshold here would fail whenever the machine is busy.
    """
    topo, state = platform
    monitor = f"127.0.0.1:{topo.monitoring.port}"

    def probes() -> dict:
        return _histogram(monitor, "squeal_probe_invalidation_seconds")

    _wait(
        lambda: len(probes()) == 4 and all(b[float("inf")] >= 20 for b in probes().values()),
        120,
        "20 probes per cluster",
    )
    for (region, cluster), buckets in probes().items():
        total = buckets[float("inf")]
        print(f"{region}/{cluster}: {buckets[1.0]:.0f}/{total:.0f} probes under 1 s")
        assert total - buckets[10.0] == 0, f"{cluster}: a canary stayed cached over 10 s"
    with urllib.request.urlopen(f"http://{monitor}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    missed = [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "squeal_probe_deadline_missed_total" and s.value > 0
    ]
    assert missed == []
    status = json.loads(squealctl(state, "status", "--json"))
    assert all(c["running"] for c in status)


def test_verify_finds_no_stale_keys_after_web_traffic_settles_and_finds_a_planted_one(platform):
    from loadtest.webtier import WebServer
    from monitoring.verify import verify

    topo, state = platform
    webs = [WebServer(topo, c.region, c.name) for c in topo.clusters]
    try:
        ids = [webs[0].create_user(f"verify{i}", f"verify{i}@example.com") for i in range(20)]
        for web in webs:  # fill every cluster of both regions through its router
            _wait(lambda web=web: all(web.get_user(i) is not None for i in ids), 30, f"{web.cluster.name} reads")
        for n, user_id in enumerate(ids[:10]):  # writes from both regions (west uses remote markers)
            webs[n % len(webs)].update_user(user_id, name=f"renamed{n}")
        keys = [f"user:{i}" for i in ids]

        def settled() -> bool:
            return verify(topo, keys=keys).ok

        _wait(settled, 30, "caches to agree with the database")
        for web in webs:
            for user_id in ids:
                web.get_user(user_id)
        report = verify(topo, keys=keys)
        assert report.ok and report.checked >= len(ids) * len(webs), report

        planted = topo.cluster("west-b").routers[0]
        Client((planted.host, planted.port)).set(keys[0], b'{"id": 0, "name": "ghost"}', expire=60, flags=64)
        stale = verify(topo, keys=keys).stale
        assert [(s.cluster, s.key) for s in stale] == [("west-b", keys[0])]
        cli = subprocess.run(
            [sys.executable, "-m", "ops.cli", "--state-dir", str(state), "verify", str(Path(topo.source)), "--all"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 1 and f"west-b: {keys[0]} is stale" in cli.stdout, cli.stdout + cli.stderr
    finally:
        for web in webs:
            web.close()
