"""Remote markers across two regions: real MariaDB primary (east) + GTID replica (west), real memcached.

A memcached stands in for each cluster's router (as in squeal's own tests), so markers are written to
the regional pool directly (`regional_direct=True`).
"""

from __future__ import annotations

import contextlib
import os

import pytest
from client_support import SQUEAL_AVAILABLE, SQUEAL_SKIP, next_name

from leases import LeaseCache, connect
from loadtest import WebServer
from ops.harness import SquealDaemon, wait_until
from remote_markers import RemoteMarkers, SqlClient, marker_key, mcd_comment
from tests.binaries import needs_binary


def _email() -> str:
    return f"rm{next_name()}-{os.getpid()}@example.com"


@contextlib.contextmanager
def replication_paused(regions):
    """STOP SLAVE on the west replica for the block; always restarted (the pair is shared by the session)."""
    regions.replica.execute("STOP SLAVE")
    try:
        yield
    finally:
        regions.replica.execute("START SLAVE")


def _web(regions, region: str, **kwargs) -> WebServer:
    return WebServer(regions.topology, region, database=regions.database, regional_direct=True, **kwargs)


def _binlog_annotations_since(db, start: tuple[str, int]) -> list[str]:
    file, pos = start
    return [e[5] for e in db.execute(f"SHOW BINLOG EVENTS IN '{file}' FROM {pos}") if e[2] == "Annotate_rows"]


def test_mcd_comment_format():
    assert mcd_comment(["user:1", marker_key("user:1")]) == "/* mcd:user:1,rmk:user:1 */"
    with pytest.raises(ValueError):
        mcd_comment(["a,b"])
    with pytest.raises(ValueError):
        mcd_comment(["a*/b"])


def test_west_write_then_read_sees_it_while_replica_lags(regions):
    east, west = _web(regions, "east"), _web(regions, "west")
    west_no_markers = _web(regions, "west", markers=False)
    uid = east.create_user("before", _email())
    uid2 = east.create_user("before", _email())
    regions.caught_up()
    assert west.get_user(uid)["name"] == "before"  # cached in west from the replica
    assert west.stats.replica_reads == 1

    with replication_paused(regions):
        start = regions.primary.execute("SHOW MASTER STATUS")[0][:2]
        assert west.update_user(uid, name="after")
        key = f"user:{uid}"
        # (1) the marker is in west's regional pool, (3) the key is gone from west's cluster
        assert west.rm.has_marker(key) is True
        assert west.cache.get(key) is None
        # (2) the master's binlog carries both keys for squeal (the replica will copy this annotation)
        annotations = _binlog_annotations_since(regions.primary, start)
        assert any(f"/* mcd:{key},user:email:" in a and f"rmk:{key}" in a for a in annotations), annotations

        # The replica is behind...
        west_sql = SqlClient.for_database(regions.topology.region("west").database, regions.database)
        assert west_sql.query_one("SELECT name FROM users WHERE id = %s", (uid,))["name"] == "before"
        # ...but the west read finds the marker and reads the master.
        assert west.get_user(uid)["name"] == "after"
        assert west.stats.master_reads == 1
        assert west.get_user(uid)["name"] == "after"  # and it was cached (a hit now)

        # Markers off: same write, same read, and the lagging replica's old row is served (and cached).
        west_no_markers.update_user(uid2, name="after")
        assert west_no_markers.get_user(uid2)["name"] == "before"
        assert west_no_markers.stats.master_reads == 0
        west_sql.close()

    regions.caught_up()
    # Without squeal running here the marker stays until its TTL: squeal's delete is what ends it
    # (test_squeal_deletes_the_marker_after_replication).
    assert west.rm.has_marker(f"user:{uid}") is True


def test_master_region_writes_without_markers(regions):
    east = _web(regions, "east")
    uid = east.create_user("m", _email())
    assert east.get_user(uid)["name"] == "m"
    assert east.update_user(uid, name="m2")
    assert east.get_user(uid)["name"] == "m2"  # read-after-write in the master region: local delete
    assert east.stats.marker_sets == 0 and east.rm.has_marker(f"user:{uid}") is False


def test_regional_pool_down_reads_go_to_master(regions):
    """No answer about a marker must not be read as "no marker": the miss is read from the master."""
    west = _web(regions, "west")
    uid = _web(regions, "east").create_user("x", _email())
    regions.caught_up()
    regions.west_regional.kill()
    with replication_paused(regions):
        west.update_user(uid, name="y")  # marker cannot be set: logged and counted, the write still happens
        assert west.get_user(uid)["name"] == "y"
        assert west.stats.master_reads == 1
        assert west.rm.markers.stats.errors >= 2
    regions.caught_up()


def test_read_through_without_webserver(regions):
    """The package API on its own: write_with_marker / read_through with hand-made clients."""
    west = regions.topology.region("west")
    cache = LeaseCache(connect(west.clusters[0].routers), name="rm-api")
    markers = LeaseCache(connect(west.regional_pool.servers), name="rm-api-regional")
    master = SqlClient.for_database(regions.topology.master.database, regions.database)
    replica = SqlClient.for_database(west.database, regions.database)
    rm = RemoteMarkers(cache, master=master, local=replica, is_master_region=False, markers=markers)
    _, uid = master.execute("INSERT INTO users (name, email) VALUES ('a', %s)", (_email(),))
    regions.caught_up()

    def query(db):
        return db.query_one("SELECT name FROM users WHERE id = %s", (uid,))

    with replication_paused(regions):
        rm.write_with_marker([f"user:{uid}"], "UPDATE users SET name = 'b' WHERE id = %s", (uid,))
        assert rm.read_through(f"user:{uid}", query, ttl=60) == {"name": "b"}
    regions.caught_up()
    master.close()
    replica.close()


def _wait_gone(check, what: str, timeout: float = 15.0) -> None:
    wait_until(
        lambda: not check(),
        timeout,
        f"squeal to delete {what} after replication resumed",
        ignore=(),
        error=AssertionError,
    )


@needs_binary(SQUEAL_AVAILABLE, SQUEAL_SKIP)
def test_squeal_deletes_key_and_sends_marker_delete(regions, processes, tmp_path):
    """Resume replication: west's squeal reads `/* mcd:k,rmk:k */` from the replica's binlog, deletes `k`
    in west's cluster and sends the `rmk:k` delete to west's router (here a memcached standing in for it;
    the router's prefix route to the regional pool is covered by the routed test below)."""
    processes.add(SquealDaemon(regions.path, "west", workdir=tmp_path / "squeal-west"))
    east, west = _web(regions, "east"), _web(regions, "west")
    uid = east.create_user("before", _email())
    regions.caught_up()
    key, mk = f"user:{uid}", marker_key(f"user:{uid}")
    stand_in = LeaseCache(connect([regions.west_mc.address]), name="west-router-stand-in")
    with replication_paused(regions):
        west.update_user(uid, name="after")
        assert west.get_user(uid)["name"] == "after"
        assert west.cache.get(key) is not None
        assert stand_in.set(mk, 1, 300)  # where the router-bound marker delete will land
    regions.caught_up()
    _wait_gone(lambda: west.cache.get(key) is not None or stand_in.exists(mk), f"{key} and {mk}")


@needs_binary(SQUEAL_AVAILABLE, SQUEAL_SKIP)
def test_squeal_deletes_the_marker_through_the_router(routed_regions, processes, tmp_path):
    """The whole path with real routers: marker written through west's router lands in the regional pool;
    after replication resumes, squeal's delete (through the router) removes it, and the next miss reads
    the caught-up replica."""
    regions = routed_regions
    processes.add(SquealDaemon(regions.path, "west", workdir=tmp_path / "squeal-west"))
    east = WebServer(regions.topology, "east", database=regions.database)
    west = WebServer(regions.topology, "west", database=regions.database)
    regional = LeaseCache(connect([regions.west_regional.address]), name="west-regional-direct")
    uid = east.create_user("before", _email())
    regions.caught_up()
    key, mk = f"user:{uid}", marker_key(f"user:{uid}")
    with replication_paused(regions):
        west.update_user(uid, name="after")
        assert regional.exists(mk) is True  # the router sent rmk: to the regional pool
        assert west.get_user(uid)["name"] == "after"
        assert west.stats.master_reads == 1
    regions.caught_up()
    _wait_gone(lambda: regional.exists(mk) or west.cache.get(key) is not None, f"{key} and {mk}")
    reads = west.stats.replica_reads
    assert west.get_user(uid)["name"] == "after"
    assert west.stats.replica_reads == reads + 1
