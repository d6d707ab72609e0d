"""The paper's stale-set race with stock memcached clients, squeal deleting from a real binlog (issue 34).

examples/local.toml brought up for real, with `leases = true` on east-a's wildcard pool only (the router then
puts its TransparentLeaseRoute in front of it) and east-b's left plain. In each cluster, by hand, in order:

1. a reader misses (`get`) and reads the old row from the database;
2. a writer commits a new row; squeal reads the binlog and deletes the key in every cluster;
3. the reader fills the cache with the old row (`set`).

Without leases the old row stays cached: the race. With them the fill is refused (NOT_STORED) and the next
reader loads the new row. Clients: pymemcache, and libmemcached's command-line tools (`memccat`, `memccp`).

west-a's wildcard pool has leases with `stale_ttl` (stale-while-revalidate): there squeal's delete marks the
value stale instead of removing it, one reader refills it and the others read the old row meanwhile."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from pymemcache.client.base import Client

import router_config
from loadtest.webtier import schema_statements
from ops.harness import REPO_ROOT, ROUTER_BIN, wait_until
from squeal import fetch_health, parse_position
from tests.binaries import needs_binary, require_binary
from tests.conftest import run_threads
from tests.ops.deployments import squealctl, stable_port

pytestmark = [pytest.mark.slow, needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")]

WITH, WITHOUT, STALE = "east-a", "east-b", "west-a"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    topo = router_config.reassign_ports(router_config.load(REPO_ROOT / "examples" / "local.toml"), stable_port)
    regions = []
    for r in topo.regions:
        clusters = []
        for c in r.clusters:
            # a long wait budget: 200 reader threads share this process's GIL with the lease winner's fill
            leases = {
                WITH: router_config.Leases(retries=100),
                STALE: router_config.Leases(retries=100, stale_ttl=30),
            }.get(c.name)
            pools = tuple(dataclasses.replace(p, leases=leases) if p.kind == "wildcard" else p for p in c.pools)
            clusters.append(dataclasses.replace(c, pools=pools))
        regions.append(dataclasses.replace(r, clusters=tuple(clusters)))
    topo = dataclasses.replace(topo, regions=tuple(regions))
    path = tmp_path_factory.mktemp("leases") / "local.toml"
    path.write_text(router_config.dumps(topo))
    state = Path(tempfile.mkdtemp(prefix="squeal-lease-"))
    try:
        squealctl(state, "up", str(path), "--without", "monitoring")
        yield topo
    finally:
        squealctl(state, "down", check=False)
        shutil.rmtree(state, ignore_errors=True)


def _database(topo: router_config.Topology):
    """The master database with the demo schema (the web tier's, loadtest/schema.sql)."""
    conn = router_config.connect_database(topo.master.database, "webtier")
    with conn.cursor() as cur:
        for statement in schema_statements():
            cur.execute(statement)
    return conn


def _pymemcache_client(address: router_config.Address):
    c = Client((address.host, address.port), timeout=5)
    return (lambda key: c.get(key)), (lambda key, value: c.set(key, value, noreply=False))


def _libmemcached_client(address: router_config.Address, tmp: Path):
    require_binary(shutil.which("memccat") is not None, "libmemcached-tools not installed")
    servers = f"--servers={address.host}:{address.port}"

    def get(key: str) -> bytes | None:
        out = subprocess.run(["memccat", servers, key], capture_output=True, timeout=10)
        return out.stdout.removesuffix(b"\n") if out.returncode == 0 else None  # (memccat adds a newline)

    def set_(key: str, value: bytes) -> bool:
        (tmp / key).write_bytes(value)  # memccp stores a file under its name
        out = subprocess.run(["memccp", servers, "--set", str(tmp / key)], capture_output=True, timeout=10, cwd=tmp)
        return out.returncode == 0

    return get, set_


def _position(db) -> dict:
    with db.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        return parse_position(cur.fetchone()[0])


def _new_user(db, name: str, email: str) -> tuple[int, str]:
    """Insert a users row (autocommit): (its id, its key)."""
    with db.cursor() as cur:
        cur.execute("INSERT INTO app.users (name, email) VALUES (%s, %s)", (name, email))
        user = cur.lastrowid
    return user, f"user:{user}"


def _wait_delivered(topo: router_config.Topology, db, cluster: str, what: str) -> None:
    """Wait until squeal has delivered what `db` has committed so far to `cluster` (`what`: what is waited for)."""
    at = _position(db)
    wait_until(lambda: delivered(topo, cluster, at), 30, what)


def delivered(topo: router_config.Topology, cluster: str, position: dict) -> bool:
    """squeal has delivered everything up to `position` to `cluster`: a worker's flow for it (`/healthz` `flows`,
    "<shard>/<cluster>") acknowledged a position covering it (acked = the router answered every delete)."""
    for role, _, address in topo.listeners():
        if role != "squeal":
            continue
        try:
            _, health = fetch_health(str(address))
        except OSError:
            continue
        for name, flow in health.get("flows", {}).items():
            acked = parse_position(flow.get("acked", ""))
            if name.endswith(f"/{cluster}") and all(acked.get(d, (0, -1))[1] >= n for d, (_, n) in position.items()):
                return True
    return False


@pytest.mark.parametrize("client", ["pymemcache", "libmemcached"])
@pytest.mark.parametrize("cluster", [WITH, WITHOUT])
def test_a_fill_after_squeals_delete_is_refused_only_with_leases(fleet, cluster: str, client: str, tmp_path) -> None:
    topo = fleet
    router = topo.cluster(cluster).routers[0]
    get, set_ = _pymemcache_client(router) if client == "pymemcache" else _libmemcached_client(router, tmp_path)
    db = _database(topo)
    user, key = _new_user(db, "old", f"{cluster}-{client}-{time.time()}")
    _wait_delivered(topo, db, cluster, f"squeal's delete of {key} after the insert")

    # 1. the reader misses and reads the old row
    assert get(key) is None
    with db.cursor() as cur:
        cur.execute("SELECT name FROM app.users WHERE id = %s", (user,))
        old = cur.fetchone()[0].encode()
    # 2. the writer commits; squeal reads it from the binlog and deletes the key in every cluster
    with db.cursor() as cur:
        cur.execute("UPDATE app.users SET name = 'new' WHERE id = %s", (user,))
    _wait_delivered(topo, db, cluster, f"squeal's delete of {key} after the update")
    # 3. the reader's fill of the old row
    stored = set_(key, old)
    cached = get(key)
    if cluster == WITH:
        assert stored is False, "the fill after the invalidation must be refused (NOT_STORED)"
        assert cached is None, f"stale {cached!r} cached through the lease route"
        assert set_(key, b"new") is True, "the next reader (it won a fresh lease above) fills the new row"
        assert get(key) == b"new"
    else:
        assert stored is True and cached == old, "without leases the stale fill stays: the race"
    db.close()


@pytest.mark.parametrize("cluster", [WITH, WITHOUT])
def test_a_herd_of_stock_readers_after_squeals_delete_reads_the_database_at_most_twice_with_leases(
    fleet, cluster: str
) -> None:
    """200 pymemcache readers of one hot key, released together right after squeal deleted it: each misses,
    reads the database and fills. With leases the router lets one win and the others wait for its fill."""
    topo = fleet
    router = topo.cluster(cluster).routers[0]
    db = _database(topo)
    user, key = _new_user(db, "hot", f"herd-{cluster}-{time.time()}")
    Client((router.host, router.port), timeout=5).set(key, b"hot", noreply=False)  # cached and hot
    with db.cursor() as cur:
        cur.execute("UPDATE app.users SET name = 'hotter' WHERE id = %s", (user,))
    _wait_delivered(topo, db, cluster, f"squeal's delete of {key}")

    n = 200
    start = threading.Barrier(n)
    loads: list[int] = []
    seen: list[bytes] = []
    lock = threading.Lock()

    def reader() -> None:
        c = Client((router.host, router.port), timeout=30, connect_timeout=10)
        start.wait()
        value = c.get(key)
        if value is None:  # a miss: read the row and fill
            conn = router_config.connect_database(topo.master.database, "webtier")
            with conn.cursor() as cur:
                cur.execute("SELECT name FROM app.users WHERE id = %s", (user,))
                value = cur.fetchone()[0].encode()
            conn.close()
            with lock:
                loads.append(1)
            c.set(key, value, noreply=False)
        with lock:
            seen.append(value)
        c.close()

    run_threads(reader, n, 60)
    db.close()
    assert len(seen) == n and set(seen) == {b"hotter"}, "every reader got the new row"
    if cluster == WITH:
        assert len(loads) <= 2, f"{len(loads)} of {n} readers read the database"
    else:
        assert len(loads) > 2, f"without leases the herd reads the database: {len(loads)} of {n} did"


def test_with_stale_ttl_squeals_delete_leaves_the_old_row_readable_while_one_reader_refills(fleet) -> None:
    topo = fleet
    router = topo.cluster(STALE).routers[0]
    db = _database(topo)
    user, key = _new_user(db, "old", f"stale-{time.time()}")
    _wait_delivered(topo, db, STALE, f"squeal's delete of {key} after the insert")
    refiller = Client((router.host, router.port), timeout=5)
    other = Client((router.host, router.port), timeout=5)
    assert refiller.set(key, b"old", noreply=False) is True  # cached
    with db.cursor() as cur:
        cur.execute("UPDATE app.users SET name = 'new' WHERE id = %s", (user,))
    _wait_delivered(topo, db, STALE, f"squeal's delete of {key} after the update")
    assert refiller.get(key) is None, "the first reader after squeal's delete refills (a miss)"
    assert other.get(key) == b"old", "the others read the stale row at once while it is refilled"
    assert refiller.set(key, b"new", noreply=False) is True
    assert other.get(key) == b"new"
    db.close()
