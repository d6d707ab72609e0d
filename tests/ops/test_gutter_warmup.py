"""Gutter sizing/TTL policy, and the warm-up controller's overlay, config rewrite and hit-rate status."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import gutter
import router_config
from ops.harness import Memcached, free_port
from warmup import WarmupController, WarmupError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local.toml"


@pytest.mark.parametrize(("servers", "expected"), [(0, 1), (1, 1), (99, 1), (100, 1), (101, 2), (250, 3)])
def test_gutter_is_about_one_percent_and_at_least_one(servers, expected):
    assert gutter.recommended_gutter_size(servers) == expected


def test_gutter_ttl_never_exceeds_the_cap():
    assert gutter.gutter_ttl(5, cap=10) == 5
    assert gutter.gutter_ttl(3600, cap=10) == 10
    assert gutter.gutter_ttl(0, cap=10) == 10  # "never expires" would outlive the failure


def test_sizing_advice_flags_a_cluster_without_gutter():
    topo = router_config.loads(
        EXAMPLE.read_text().replace(
            'pools.gutter = { kind = "gutter", servers = ["127.0.0.1:31103"], ttl = 10 }\n', "", 1
        )
    )
    advice = {a.cluster: a for a in gutter.check_topology(topo)}
    assert not advice["east-a"].ok and "too small: add 1" in str(advice["east-a"])
    assert advice["east-b"].ok


@pytest.fixture
def deployment(tmp_path: Path) -> tuple[Path, router_config.Topology]:
    topo = router_config.reassign_ports(router_config.load(EXAMPLE), free_port)
    topo_file = tmp_path / "topo.toml"
    topo_file.write_text(router_config.dumps(topo))
    state = tmp_path / "state"
    state.mkdir()
    (state / "components.json").write_text(json.dumps({"topology": str(topo_file), "components": []}))
    return state, topo


def test_warmup_start_and_finish_rewrite_the_cold_clusters_router_config(deployment):
    state, topo = deployment
    controller = WarmupController(state)
    path = controller.start("east-b")
    config = json.loads(path.read_text())
    route = config["route"]["wildcard"]
    assert route["type"] == "TransparentLeaseRoute", "the example's wildcard pools have leases, outermost"
    route = route["target"]
    assert route["type"] == "WarmUpRoute" and route["exptime"] == 3600
    warm_pool = route["warm"].split("|")[1]
    assert config["pools"][warm_pool]["servers"] == [str(a) for a in topo.cluster("east-a").wildcard.servers]
    assert controller.overlay()["east-b"]["warm"] == "east-a"
    with pytest.raises(WarmupError, match="east-b is itself warming up"):
        controller.start("east-a", warm_cluster="east-b")

    controller.finish("east-b", force=True)
    assert json.loads(path.read_text()) == router_config.cluster_config(topo, "east-b")
    assert controller.overlay() == {}


def test_warmup_errors_are_clear(deployment, tmp_path):
    state, _ = deployment
    controller = WarmupController(state)
    with pytest.raises(WarmupError, match="no cluster 'nope'"):
        controller.start("nope")
    with pytest.raises(WarmupError, match="not warming up"):
        controller.status("east-a")
    with pytest.raises(WarmupError, match="no deployment"):
        WarmupController(tmp_path / "empty")


def _gets(server: Memcached, hits: int, misses: int) -> None:
    with socket.create_connection((server.host, server.port)) as s:
        s.sendall(b"set k 0 0 1\r\nx\r\n")
        s.recv(100)
        for i in range(hits + misses):
            s.sendall(b"get k\r\n" if i < hits else f"get miss{i}\r\n".encode())
            reply = b""
            while not reply.endswith(b"END\r\n"):
                reply += s.recv(1000)


def test_warmup_status_compares_hit_rates_and_finish_waits_for_target(deployment, processes):
    state, topo = deployment
    servers = {
        name: [
            processes.add(Memcached(port=a.port, workdir=processes.base / "mc"))
            for a in topo.cluster(name).wildcard.servers
        ]
        for name in ("east-a", "east-b")
    }
    samples = iter([(servers["east-b"][0], 2, 8), (servers["east-a"][0], 8, 2)])

    def traffic(seconds: float) -> None:  # the "sleep" of the sample window: make gets happen in it
        for server, hits, misses in samples:
            _gets(server, hits, misses)

    controller = WarmupController(state, sleep=traffic)
    controller.start("east-b")
    status = controller.status("east-b")
    assert status.cold_hit_rate == pytest.approx(0.2) and status.warm_hit_rate == pytest.approx(0.8)
    assert status.progress == pytest.approx(0.25)
    assert "25% of east-a's hit rate" in status.bar()
    samples = iter([(servers["east-b"][1], 5, 5), (servers["east-a"][1], 8, 2)])
    with pytest.raises(WarmupError, match="not warm yet"):
        controller.finish("east-b")
    assert "east-b" in controller.overlay()


def test_gutter_health_reports_the_gutters_hit_rate_over_the_sample_window(deployment, processes):
    _, topo = deployment
    cluster = topo.cluster("east-a")
    assert cluster.gutter is not None
    gutter_server = processes.add(Memcached(port=cluster.gutter.servers[0].port, workdir=processes.base / "mc-gutter"))
    # the cluster's other pools stay down: reported as down, not counted

    def traffic(seconds: float) -> None:  # the sample window: 3 hits and 1 miss on the gutter
        _gets(gutter_server, 3, 1)

    health = gutter.gutter_health(cluster, sample_seconds=2.0, sleep=traffic)
    assert health.gutter_hit_rate == pytest.approx(0.75)
    up = {s.address: s.up for s in health.servers}
    assert up[str(cluster.gutter.servers[0])] is True
    assert {a for a, ok in up.items() if not ok} == {str(a) for p in cluster.pools for a in p.servers} - {
        str(cluster.gutter.servers[0])
    }
    assert set(map(str, cluster.wildcard.servers)) <= set(health.down)
