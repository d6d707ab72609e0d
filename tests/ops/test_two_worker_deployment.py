"""`squealctl up` of a topology whose region east has two squeal workers on two copies (what HA mode was: one
shard, two workers): the ZooKeeper ensemble, the region's extra replica and its workers, `status` (who owns the
shard, the ensemble's quorum), replay and accept-data-loss through ZooKeeper, and a hand-over forced by stopping the
owner's component. One deployment (tests/conftest.py `two_worker_deployment`) for all."""

from __future__ import annotations

import json
import subprocess
import sys

from kazoo.client import KazooClient

import router_config
from ops.harness import REPO_ROOT, memcached_command, wait_until
from router_config.model import IMPLICIT_SHARD
from squeal.pool.zookeeper import shard_path
from squeal.read import gtid as g
from tests.ops.deployments import TwoWorkerDeployment, run_sql, squealctl, stable_port

WITHIN = 30.0  # a deadline for something that must happen, not a speed check


def _sql(topo: router_config.Topology, *statements: str) -> list[tuple]:
    return run_sql(topo.master.database, *statements)


def _cache(topo: router_config.Topology, region: str) -> tuple[str, int]:
    a = topo.region(region).clusters[0].pools[0].servers[0]  # the cluster's whole wildcard pool
    return a.host, a.port


def _set(address: tuple[str, int], key: str) -> None:
    assert memcached_command(address, f"set {key} 0 0 6\r\ncached\r\n".encode()) == b"STORED"


def _has(address: tuple[str, int], key: str) -> bool:
    return memcached_command(address, f"get {key}\r\n".encode()).startswith(b"VALUE")


def _committed_and_gone(deployment: TwoWorkerDeployment, user_id: int) -> str:
    """Cache user:ID in both regions, commit a change to it, wait until both copies are gone; returns the
    primary's GTID position from before the change."""
    east, west = _cache(deployment.topo, "east"), _cache(deployment.topo, "west")
    for cache in (east, west):
        _set(cache, f"user:{user_id}")
    before = _sql(deployment.topo, "SELECT @@gtid_binlog_pos")[0][0]
    _sql(
        deployment.topo,
        f"INSERT INTO app.users (id, name, email) VALUES ({user_id}, 'n', 'u{user_id}@x') "
        "ON DUPLICATE KEY UPDATE name = CONCAT(name, '+')",
    )
    for cache in (east, west):
        wait_until(lambda cache=cache: not _has(cache, f"user:{user_id}"), WITHIN, f"user:{user_id} deleted")
    return before


def _zk(deployment: TwoWorkerDeployment) -> KazooClient:
    assert deployment.topo.zookeeper is not None
    client = KazooClient(hosts=deployment.topo.zookeeper.hosts)
    client.start(timeout=10)
    return client


def _shard(deployment: TwoWorkerDeployment) -> str:
    """The znode of east's one shard (its owner, epoch, markers, operator requests)."""
    assert deployment.topo.zookeeper is not None
    return shard_path(deployment.topo.zookeeper.root, "east", IMPLICIT_SHARD)


def test_up_starts_the_ensemble_the_replica_and_the_workers_and_status_shows_who_owns_what(two_worker_deployment):
    rows = two_worker_deployment.status()
    zookeepers = [r for r in rows.values() if r["role"] == "zookeeper"]
    assert sorted(r["name"] for r in zookeepers) == ["zookeeper/1", "zookeeper/2", "zookeeper/3"]
    assert all(r["running"] and r["serving"] for r in zookeepers), zookeepers
    assert sorted(r["mode"] for r in zookeepers) == ["follower", "follower", "leader"]
    replica = rows["mariadb/east/east-r1"]
    assert replica["role"] == "mariadb-replica" and replica["answering"] and replica["instance"] == "east-r1"
    owner = rows["squeal/east/east-1"]  # the preferred worker (on the primary)
    assert (owner["state"], owner["owns"]) == ("worker", [IMPLICIT_SHARD])
    idle = rows["squeal/east/east-2"]
    assert (idle["state"], idle["owns"], idle["instance"]) == ("worker", [], "east-2")
    # west has no instances: its single daemon (no worker keys in its row)
    assert rows["squeal/west"]["running"] and "state" not in rows["squeal/west"]
    assert "squeal/east" not in rows

    table = squealctl(two_worker_deployment.state, "status").stdout
    line = {ln.split()[0]: ln for ln in table.splitlines() if ln.startswith(("squeal/", "zookeeper/"))}
    assert f"WORKER (owns {IMPLICIT_SHARD}), up" in line["squeal/east/east-1"]
    assert "WORKER (owns nothing), up" in line["squeal/east/east-2"]
    assert "up, serving (" in line["zookeeper/1"]


def test_the_owner_invalidates_both_regions(two_worker_deployment):
    _committed_and_gone(two_worker_deployment, 7001)


def test_replay_goes_to_the_owner_through_zookeeper(two_worker_deployment):
    before = _committed_and_gone(two_worker_deployment, 7002)
    east = _cache(two_worker_deployment.topo, "east")
    _set(east, "user:7002")  # cached again after its delete: only a replay deletes it now
    out = squealctl(two_worker_deployment.state, "replay", "--region", "east", "--flow", "all", "--from", before).stdout
    assert "/replay/east-a" in out and "worker east-1" in out, out
    wait_until(lambda: not _has(east, "user:7002"), WITHIN, "user:7002 deleted again by the replay")
    client = _zk(two_worker_deployment)
    try:
        replay = f"{_shard(two_worker_deployment)}/replay"
        wait_until(lambda: client.get_children(replay) == [], WITHIN, "the owner to take the requests")
    finally:
        client.stop()
        client.close()


def test_accept_data_loss_goes_to_the_owner_through_zookeeper(two_worker_deployment):
    out = squealctl(two_worker_deployment.state, "accept-data-loss", "--region", "east").stdout
    path = f"{_shard(two_worker_deployment)}/accept-data-loss"
    assert path in out and "worker east-1" in out, out
    client = _zk(two_worker_deployment)
    try:
        wait_until(lambda: client.exists(path) is None, WITHIN, "the owner to take the acceptance")
    finally:
        client.stop()
        client.close()
    log = two_worker_deployment.state / "squeal" / "squeal-east-1.log"
    # nothing was halted: the owner's pipeline got the request and says so
    wait_until(
        lambda: "accept-data-loss request ignored: no reader is halted" in log.read_text(),
        WITHIN,
        f"the daemon's answer in {log}",
    )


def test_stopping_the_owner_hands_the_shard_over_and_starting_it_hands_it_back(two_worker_deployment):
    deployment = two_worker_deployment
    squealctl(deployment.state, "stop", "squeal/east/east-1")
    try:
        wait_until(lambda: deployment.owner() == "east-2", WITHIN, "east-2 to own the shard")
        _committed_and_gone(deployment, 7003)  # the other copy's worker delivers now
    finally:
        squealctl(deployment.state, "start", "squeal/east/east-1")
    # the preferred worker, back and healthy for handback_after_s, gets the shard back
    wait_until(lambda: deployment.owner() == "east-1", WITHIN, "east-1 to own the shard again")
    rows = deployment.status()
    assert rows["squeal/east/east-2"]["owns"] == [] and rows["squeal/east/east-1"]["restarts"] == 0
    _committed_and_gone(deployment, 7004)


def test_replay_and_accept_data_loss_name_zookeeper_when_it_does_not_answer(tmp_path):
    topo = router_config.reassign_ports(
        router_config.load(REPO_ROOT / "examples" / "local.toml"), stable_port
    )  # nothing listens on any of its ports
    path = tmp_path / "deployment.toml"
    path.write_text(router_config.dumps(topo))
    servers = topo.zookeeper.hosts
    for args in (
        ["replay", str(path), "--region", "west", "--flow", "all", "--from", "0-1-5"],
        ["accept-data-loss", str(path), "--region", "west"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "squeal.cli", *args], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
        )
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert f"cannot reach ZooKeeper {servers} (zookeeper.servers in {path})" in result.stderr, result.stderr
        assert "nothing requested" in result.stderr
        assert result.stdout == ""
        # one clear line, not a stream of kazoo's connection warnings (issue 27 item 7)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_down_and_up_keep_the_ensemble_data_and_the_markers(two_worker_deployment):
    """ZooKeeper's data is durable under the state dir like MariaDB's: after `down` + `up` the region's
    markers are where the owner left them (or later), and the preferred worker owns the shard again."""
    deployment = two_worker_deployment
    _committed_and_gone(deployment, 7005)

    def markers() -> dict[str, g.Position]:
        client = _zk(deployment)
        try:
            doc = json.loads(client.get(f"{_shard(deployment)}/markers")[0])
            return {flow: g.parse_position(position) for flow, position in doc["positions"].items()}
        finally:
            client.stop()
            client.close()

    before = markers()
    assert before, "no markers in ZooKeeper"
    squealctl(deployment.state, "down")
    squealctl(deployment.state, "up", str(deployment.topology))
    # `up` returns once every shard runs on a worker; on the preferred one, at the latest after a hand-back
    wait_until(lambda: deployment.owner() == "east-1", WITHIN, "east-1 to own the shard after up")
    after = markers()
    assert sorted(after) == sorted(before)
    assert all(g.covers_position(after[flow], old) for flow, old in before.items()), (before, after)
    _committed_and_gone(deployment, 7006)
