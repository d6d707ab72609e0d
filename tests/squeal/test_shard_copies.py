"""Which copy of a shard a worker reads (issue 23, issue 24 item 2): its extra copy, then the region's copy.

Real parts: a shard's primary and an extra copy of it (a GTID replica, `[shards.s.replicas.r]`), a ZooKeeper
server, memcached, and one pool worker `squeal run --instance w1` that names the extra copy (`database = "r"`).
The worker must read the extra copy (the replica's own process list shows its binlog dump, the primary serves
only the replica); when that copy stops, it must fall back to the primary and keep invalidating; when the copy
is back and caught up, read it again. A writer runs across all of it: every committed row's key must be gone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pool_support import unique_root
from squeal_helpers import SCHEMA, Cache, healthz, unique_db, wait_gone, wait_until

from ops.harness import MariaDB, SquealDaemon, ZooKeeper, free_port

DOMAIN = 47
DEADLINE = 60.0  # for what must happen on a shared, loaded machine: never a speed check


def dumps(db: MariaDB) -> list[str]:
    """The users of the binlog dump threads `db` serves now (one per replica or squeal reader)."""
    rows = db.execute("SELECT USER FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'")
    return sorted(r[0] for r in rows)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[MariaDB, MariaDB]]:
    primary = MariaDB(470, workdir=tmp_path / "primary", gtid_domain_id=DOMAIN)
    extra = MariaDB(471, workdir=tmp_path / "extra", replica=True, gtid_domain_id=DOMAIN)
    try:
        primary.start()
        extra.start()
        extra.replicate_from(primary)
        yield primary, extra
    finally:
        extra.stop(grace=5)
        primary.stop(grace=5)


def test_a_worker_reads_its_extra_copy_falls_back_to_the_primary_and_comes_back(
    chain: tuple[MariaDB, MariaDB], zookeeper: ZooKeeper, memcached_factory, tmp_path: Path
) -> None:
    primary, extra = chain
    schema = unique_db("copies")
    primary.execute(f"CREATE DATABASE {schema}", f"USE {schema}", *filter(str.strip, SCHEMA.split(";")))
    extra.wait_for_gtid(primary.gtid_binlog_pos())
    memcached = memcached_factory()
    cache = Cache(memcached.port)
    port = free_port()
    topology = tmp_path / "topology.toml"
    topology.write_text(
        f'[squeal]\ndatamarker_dir = "var/dm"\nmetrics_port_base = {free_port()}\n'
        f'[zookeeper]\nservers = ["127.0.0.1:{zookeeper.port}"]\nsession_timeout_s = 2\nroot = "{unique_root()}"\n'
        f"[shards.s]\ngtid_domain_id = {DOMAIN}\neast = {{ port = {primary.port}, server_id = 470 }}\n"
        f'replicas.r = {{ region = "east", port = {extra.port}, server_id = 471 }}\n'
        f'[[rules]]\ntable = "{schema}.users"\nkeys = ["user:{{id}}"]\n'
        "[regions.east]\nmaster = true\nsqueal_pool = true\n"
        f'[[regions.east.squeal_instances]]\nname = "w1"\nmetrics_port = {port}\ndatabase = "r"\n'
        f'[regions.east.clusters.c0]\nrouters = ["127.0.0.1:{memcached.port}"]\n'
        f'pools.wildcard = {{ kind = "wildcard", servers = ["127.0.0.1:{free_port()}"] }}\n'
    )
    worker = SquealDaemon(topology, "east", port=port, workdir=tmp_path / "w1", instance="w1")
    worker.start()
    written: list[int] = []
    stop = threading.Event()

    def write() -> None:  # a key cached before each row commits; the row's delete must come, whichever copy is read
        with primary.connect(schema) as conn, conn.cursor() as cur:
            while not stop.is_set():
                row = len(written) + 1
                cache.set(f"user:{row}")
                cur.execute("INSERT INTO users (id, email, name) VALUES (%s, 'e', 'n')", (row,))
                written.append(row)
                stop.wait(0.05)

    def reads() -> str:
        shard = healthz(port)[1].get("shards", {}).get("s") or {}
        return (shard.get("reads") or {}).get("name", "")

    writer = threading.Thread(target=write, daemon=True)
    try:
        wait_until(lambda: reads() == "s@r", DEADLINE, "w1 to own shard s and read its extra copy s@r", interval=0.2)
        writer.start()
        wait_until(lambda: len(written) >= 20, DEADLINE, "rows written while w1 reads s@r")
        wait_gone([cache], [f"user:{r}" for r in list(written)], DEADLINE)
        # The replica serves squeal's binlog dump; the primary only the replica's.
        assert dumps(extra) == ["squeal"] and dumps(primary) == ["squeal"], (dumps(extra), dumps(primary))
        assert healthz(port)[1]["shards"]["s"]["reads"]["order"] == ["s@r", "s@east"]

        extra.stop(grace=5)  # the extra copy goes away under the writes
        wait_until(lambda: reads() == "s@east", DEADLINE, "w1 to fall back to the primary", interval=0.2)
        before = len(written)
        wait_until(lambda: len(written) >= before + 20, DEADLINE, "rows written while w1 reads the primary")
        wait_gone([cache], [f"user:{r}" for r in list(written)], DEADLINE)
        assert dumps(primary) == ["squeal"]  # (the replica is down: this dump is squeal's)

        extra.start()  # back, replicating again: once caught up, w1 reads it again
        wait_until(lambda: reads() == "s@r", DEADLINE, "w1 back on s@r once it caught up", interval=0.2)
        before = len(written)
        wait_until(lambda: len(written) >= before + 20, DEADLINE, "rows written after the return")
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(10)
    try:
        wait_gone([cache], [f"user:{r}" for r in written], DEADLINE)  # nothing lost: every committed row's key
        assert dumps(extra) == ["squeal"]
        assert "binlog reader live: reading MariaDB" in worker.log_file.read_text()
    finally:
        worker.stop(grace=10)
        cache.close()
