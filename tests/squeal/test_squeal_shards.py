"""Sharded regions (issue 23): one squeal process, one pipeline per shard, every shard's deletes to every cluster.

Real parts: three MariaDB primaries (one per shard, each with its own GTID domain), two memcached "clusters", the
`squeal run` process. Each test checks keys one by one; the isolation tests break one shard (purged binlog, a
killed primary) and prove with tracer keys that the others keep invalidating.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from squeal_helpers import (
    SCHEMA,
    Cache,
    accept_data_loss,
    all_started,
    healthz,
    made_then_stopped,
    scrape,
    wait_gone,
    wait_until,
)

import router_config
from ops.harness import MariaDB, Memcached, SquealDaemon, free_port

SHARDS = ("s0", "s1", "s2")
DOMAINS = {"s0": 20, "s1": 21, "s2": 22}


@pytest.fixture(scope="module")
def shard_dbs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, MariaDB]]:
    """One primary per shard, each in its own GTID domain (the loader insists: a GTID names its shard)."""
    base = tmp_path_factory.mktemp("shards")
    dbs = {name: MariaDB(60 + i, workdir=base / name, gtid_domain_id=DOMAINS[name]) for i, name in enumerate(SHARDS)}
    with all_started(dbs.values()):
        yield dbs


def shard_block(name: str, db: MariaDB, domain: int | None = None) -> str:
    return (
        f"[shards.{name}]\ngtid_domain_id = {domain or DOMAINS[name]}\n"
        f"east = {{ port = {db.port}, server_id = {db.server_id} }}\n"
    )


class Sharded:
    """A schema on every shard, two memcached clusters, a sharded topology and `squeal run --region east`."""

    def __init__(
        self, base: Path, dbs: dict[str, MariaDB], shards: tuple[str, ...] = SHARDS, on_data_loss: str = "halt"
    ) -> None:
        self.base, self.dbs = base, dbs
        self.schema = f"sh_{base.name[:12].replace('-', '_')}_{os.getpid() % 10000}"
        for db in dbs.values():
            db.execute(f"DROP DATABASE IF EXISTS {self.schema}", f"CREATE DATABASE {self.schema}")
            with db.connect(self.schema) as conn, conn.cursor() as cur:
                for stmt in filter(str.strip, SCHEMA.split(";")):
                    cur.execute(stmt)
        self.memcacheds = [Memcached(workdir=base / "memcached").start() for _ in range(2)]
        self.caches = [Cache(m.port) for m in self.memcacheds]
        self.on_data_loss = on_data_loss
        self.topology = base / "topology.toml"
        self.write_topology(shards)
        self.state_dir = base / "state"
        self.daemon = SquealDaemon(self.topology, "east", workdir=base / "squeal", state_dir=self.state_dir)
        self._n = iter(range(1_000_000, 2_000_000))

    def write_topology(self, shards: tuple[str, ...]) -> None:
        clusters = "".join(
            f'[regions.east.clusters.c{i}]\nrouters = ["127.0.0.1:{m.port}"]\n'
            f'pools.wildcard = {{ kind = "wildcard", servers = ["127.0.0.1:{free_port()}"] }}\n'
            for i, m in enumerate(self.memcacheds)
        )
        self.topology.write_text(
            f'[squeal]\ndatamarker_dir = "var/dm"\nmetrics_port_base = {free_port()}\n'
            f'on_data_loss = "{self.on_data_loss}"\n'
            + "".join(shard_block(s, self.dbs[s]) for s in shards)
            + f'[[rules]]\ntable = "{self.schema}.users"\nkeys = ["user:{{id}}", "user:email:{{email}}"]\n'
            + f'[[rules]]\ntable = "{self.schema}.posts"\nkeys = ["post:{{id}}"]\nshards = ["s1"]\n'
            + f'[[rules]]\ntable = "{self.schema}.nowhere"\nkeys = ["nowhere:{{id}}"]\n'  # on no shard
            + "[regions.east]\nmaster = true\n"
            + clusters
        )

    def sql(self, shard: str, *statements: str) -> None:
        self.dbs[shard].execute(f"USE {self.schema}", *statements)

    def tracer(self, shard: str, timeout: float = 20.0) -> str:
        """Cache a key in every cluster, change its row on `shard`, wait until the key is gone everywhere."""
        n = next(self._n)
        key = f"user:{n}"
        for c in self.caches:
            c.set(key)
        self.sql(shard, f"INSERT INTO users VALUES ({n}, 't{n}@{shard}', '{shard}')")
        wait_gone(self.caches, [key], timeout)
        return key

    def health(self) -> tuple[int, dict]:
        return healthz(self.daemon.port)

    def log(self) -> str:
        return self.daemon.log_file.read_text() if self.daemon.log_file.exists() else ""

    def stop(self) -> None:
        for c in self.caches:
            c.close()
        self.daemon.stop(grace=5)
        for m in self.memcacheds:
            m.stop(grace=5)


@pytest.fixture
def sharded(shard_dbs: dict[str, MariaDB], tmp_path: Path) -> Iterator:
    yield from made_then_stopped(lambda n, **kwargs: Sharded(tmp_path / f"env{n}", shard_dbs, **kwargs))


def test_every_shard_invalidates_every_cluster_key_by_key(sharded) -> None:
    env = sharded()
    env.daemon.start()
    keys: dict[str, list[str]] = {}
    for i, shard in enumerate(SHARDS):
        rows = range(100 * (i + 1), 100 * (i + 1) + 5)
        keys[shard] = [k for r in rows for k in (f"user:{r}", f"user:email:u{r}@{shard}")]
        for c in env.caches:
            c.set_many(keys[shard])
        env.sql(shard, *(f"INSERT INTO users VALUES ({r}, 'u{r}@{shard}', 'x')" for r in rows))
    for shard in SHARDS:
        wait_gone(env.caches, keys[shard])
    # A rule scoped to s1 fires there only: posts on s0 are not s0's business.
    for c in env.caches:
        c.set_many(["post:1", "post:2"])
    env.sql("s0", "INSERT INTO posts VALUES (1, 1, 'a')")
    env.sql("s1", "INSERT INTO posts VALUES (2, 1, 'b')")
    wait_gone(env.caches, ["post:2"])
    env.tracer("s0")  # everything s0 wrote before the tracer was processed
    assert all(c.has("post:1") for c in env.caches)
    status, health = env.health()
    assert status == 200 and set(health["shards"]) == set(SHARDS)
    assert {f for f in health["flows"]} == {f"{s}/c{i}" for s in SHARDS for i in range(2)}
    for shard in SHARDS:  # each shard's marker is in its own domain
        assert health["shards"][shard]["flows"]["c0"]["acked"].startswith(f"{DOMAINS[shard]}-")
    metrics = scrape(env.daemon.port)
    for shard in SHARDS:
        assert metrics[f'squeal_deletes_sent_total{{flow="c0",shard="{shard}"}}'] >= 1
    # one connection per cluster for all shards: the write-level series are per destination, with no shard
    assert metrics['squeal_delete_writes_total{flow="c0"}'] >= 1
    for shard in SHARDS:  # markers on disk per shard
        assert (env.state_dir / "shards" / shard / "c0.marker").exists()
    log = env.log()  # a rule whose table no shard has: a warning naming shard, rule and table, start goes on
    for shard in SHARDS:
        assert f"shard {shard}: rules[2] (table {env.schema}.nowhere): the table does not exist" in log


def test_a_purged_shard_halts_alone_and_recovers_by_its_own_command(sharded) -> None:
    env = sharded()
    env.daemon.start()
    for shard in SHARDS:
        env.tracer(shard)
    wait_until(
        lambda: all((env.state_dir / "shards" / s / "c0.marker").exists() for s in SHARDS),
        10,
        "every shard's markers written",
    )
    # Checkpointed: the markers hold the tracers. Now s1 commits while squeal is away and loses those binlogs.
    marker = (env.state_dir / "shards" / "s1" / "c0.marker").read_text()
    wait_until(
        lambda: (env.state_dir / "shards" / "s1" / "c0.marker").read_text() != marker or str(DOMAINS["s1"]) in marker,
        10,
        "s1's marker to hold its tracer",
    )
    env.daemon.stop()
    db = env.dbs["s1"]
    for i in range(3):
        env.sql("s1", f"INSERT INTO users VALUES ({500 + i}, 'lost{i}@x', 'lost')", "FLUSH BINARY LOGS")
    db.execute(f"PURGE BINARY LOGS TO '{db.execute('SHOW BINARY LOGS')[-1][0]}'")
    for c in env.caches:
        c.set("user:500")
    env.daemon.start()

    def halted() -> dict | None:
        status, health = env.health()
        return health if status == 503 and any("DATA LOSS" in p for p in health["problems"].values()) else None

    health = wait_until(halted, 30, "/healthz 503 naming the halted shard")
    ((key, why),) = health["problems"].items()
    assert key.startswith("s1: ") and "shard s1" in why and "lost GTIDs" in why and "--shard s1" in why
    assert health["shards"]["s0"]["ok"] and health["shards"]["s2"]["ok"] and not health["shards"]["s1"]["ok"]
    env.tracer("s0")  # the other shards keep invalidating while s1 is halted
    env.tracer("s2")
    assert all(c.has("user:500") for c in env.caches)  # s1 sent nothing: halted, not flushed
    assert scrape(env.daemon.port)['squeal_halted{shard="s1"}'] == 1.0
    wrong = accept_data_loss(env.topology, env.state_dir)
    assert wrong.returncode == 2 and "--shard" in wrong.stderr  # which shard? never a guess
    done = accept_data_loss(env.topology, env.state_dir, "--shard", "s1")
    assert done.returncode == 0, done.stderr
    wait_gone(env.caches, ["user:500"])  # s1 flushed the region's clusters and resumed
    wait_until(lambda: env.health()[0] == 200, 15, "/healthz 200 after recovery")
    env.tracer("s1")


def test_a_killed_shard_primary_lags_alone_and_its_pipeline_reconnects(sharded) -> None:
    env = sharded()
    env.daemon.start()
    env.tracer("s2")
    db = env.dbs["s2"]
    db.stop(grace=5)
    try:
        env.tracer("s0")  # s2's primary is down: the others never pause
        env.tracer("s1")
    finally:
        db.start()
    env.tracer("s2", timeout=40)  # its reader reconnects and resumes from its own last GTID
    assert scrape(env.daemon.port).get('squeal_reader_reconnects_total{reader="live",shard="s2"}', 0) >= 1


def test_a_shard_added_to_a_running_region_starts_alone(sharded) -> None:
    env = sharded(shards=("s0", "s1"))
    env.daemon.start()
    env.tracer("s0")
    pid = env.daemon.proc.pid
    env.write_topology(SHARDS)
    for c in env.caches:
        c.set("user:900")
    os.kill(pid, signal.SIGHUP)
    wait_until(lambda: "shard s2: pipeline started" in env.log(), 30, "s2's pipeline to start")
    env.tracer("s2")
    env.tracer("s0")
    log = env.log()
    assert log.count("flow c0 starts after") == 3  # s0's and s1's at start, s2's now: nobody else restarted
    assert env.daemon.proc.pid == pid and set(env.health()[1]["shards"]) == set(SHARDS)


def test_a_shard_added_while_its_database_is_down_is_a_health_problem_and_starts_when_it_answers(sharded) -> None:
    env = sharded(shards=("s0", "s1"))
    env.daemon.start()
    env.tracer("s0")
    db = env.dbs["s2"]
    db.stop(grace=5)
    try:
        env.write_topology(SHARDS)
        os.kill(env.daemon.proc.pid, signal.SIGHUP)
        health = wait_until(lambda: (h := env.health())[0] == 503 and h[1], 60, "/healthz naming the new shard")
        assert "s2: not started" in health["problems"], health["problems"]
        env.tracer("s1")  # the running shards never wait for it
    finally:
        db.start()
    wait_until(lambda: "shard s2: pipeline started" in env.log(), 60, "s2 to start once its database answers")
    env.tracer("s2")
    wait_until(lambda: env.health()[0] == 200, 15, "/healthz 200 once s2 runs")


def test_layout_errors_name_the_key(tmp_path: Path) -> None:
    base = (
        '[regions.east]\nmaster = true\n[regions.east.clusters.c0]\nrouters = ["127.0.0.1:1"]\n'
        'pools.wildcard = { servers = ["127.0.0.1:2"] }\n'
        '[regions.west]\n[regions.west.clusters.c1]\nrouters = ["127.0.0.1:3"]\n'
        'pools.wildcard = { servers = ["127.0.0.1:4"] }\n'
    )
    cases = [
        (  # a shard missing its copy in a region
            "[shards.a]\ngtid_domain_id = 1\neast = { port = 10, server_id = 1 }\n",
            "shards.a: shard 'a' has no copy in region 'west'",
        ),
        (  # two shards on one port
            "[shards.a]\ngtid_domain_id = 1\neast = { port = 10, server_id = 1 }\nwest = { port = 11, server_id = 2 }\n"
            "[shards.b]\ngtid_domain_id = 2\neast = { port = 10, server_id = 3 }\n"
            "west = { port = 12, server_id = 4 }\n",
            "shards.b.east.port: duplicate port: 127.0.0.1:10 is already used by shards.a.east.port",
        ),
        (  # a shard declared twice (a group's member and a single shard)
            "[shards.u]\ncount = 2\ngtid_domain_id = 1\neast = { port = 10, server_id = 1 }\n"
            "west = { port = 20, server_id = 10 }\n"
            "[shards.u-1]\ngtid_domain_id = 5\neast = { port = 30, server_id = 30 }\n"
            "west = { port = 31, server_id = 31 }\n",
            "shards.u-1: shard 'u-1' is already declared by shards.u (shard 1 of 2)",
        ),
        (  # two shards in one GTID domain
            "[shards.a]\ngtid_domain_id = 1\neast = { port = 10, server_id = 1 }\nwest = { port = 11, server_id = 2 }\n"
            "[shards.b]\ngtid_domain_id = 1\neast = { port = 12, server_id = 3 }\n"
            "west = { port = 13, server_id = 4 }\n",
            "shards.b.gtid_domain_id: GTID domain 1 (shard b) is already used by shard a",
        ),
        (  # server ids unique fleet-wide
            "[shards.a]\ngtid_domain_id = 1\neast = { port = 10, server_id = 1 }\n"
            "west = { port = 11, server_id = 1 }\n",
            "shards.a.west.server_id: server_id 1 (shard a, region west) is already used by shard a in region east",
        ),
        (  # a rule scoped to an unknown shard
            "[shards.a]\ngtid_domain_id = 1\neast = { port = 10, server_id = 1 }\nwest = { port = 11, server_id = 2 }\n"
            '[[rules]]\ntable = "app.t"\nkeys = ["t:{id}"]\nshards = ["b"]\n',
            "rules[0].shards[0]: unknown shard 'b' (have: a)",
        ),
    ]
    assert len(cases) == 6
    for shards, expected in cases:
        with pytest.raises(router_config.TopologyError) as e:
            router_config.loads(shards + base, source="t.toml")
        assert str(e.value).startswith(f"t.toml: {expected}"), str(e.value)
    with pytest.raises(router_config.TopologyError, match=r"regions.east.database: a topology with \[shards\]"):
        router_config.loads(
            "[shards.a]\ngtid_domain_id = 1\neast = { port = 10, server_id = 1 }\n"
            "west = { port = 11, server_id = 2 }\n"
            + base.replace(
                "master = true\n", 'master = true\ndatabase = { role = "primary", port = 5, server_id = 9 }\n'
            ),
            source="t.toml",
        )


LAYOUT_BASE = (
    '[regions.east]\nmaster = true\n[regions.east.clusters.c0]\nrouters = ["127.0.0.1:1"]\n'
    'pools.wildcard = { servers = ["127.0.0.1:2"] }\n'
    '[regions.west]\n[regions.west.clusters.c1]\nrouters = ["127.0.0.1:3"]\n'
    'pools.wildcard = { servers = ["127.0.0.1:4"] }\n'
)
GROUP = (
    "[shards.u]\ncount = 3\ngtid_domain_id = 1\neast = { port = 10, server_id = 1 }\n"
    "west = { port = 20, server_id = 10 }\n"
)


def test_extra_copies_per_shard_expand_like_the_shards() -> None:
    """`[shards.NAME.replicas.R]`: one extra copy per shard of the group, ports and server ids + i as the copies'."""
    topo = router_config.loads(
        GROUP
        + "replicas.east-b = { region = 'east', port = 30, server_id = 30 }\n"
        + "replicas.east-c = { region = 'east', port = 40, server_id = 40, replicates_from = 'east-b' }\n"
        + LAYOUT_BASE.replace("[regions.west]\n", "[regions.west]\n[regions.west.squeal]\nhost = '127.0.0.1'\n"),
        source="t.toml",
    )
    u2 = topo.shard("u-2")
    assert [(d.name, d.port, d.server_id, d.replicates_from, d.region, d.role) for d in u2.replicas] == [
        ("u-2@east-b", 32, 32, "u-2@east", "east", "replica"),
        ("u-2@east-c", 42, 42, "u-2@east-b", "east", "replica"),
    ]
    assert u2.replicas_in("west") == () and u2.replicas_in("east") == u2.replicas
    assert ("mariadb", "shards.u-1.replicas.east-c.port", router_config.Address("127.0.0.1", 41)) in topo.listeners()
    again = router_config.loads(router_config.dumps(topo), source="again")
    assert again.shards == topo.shards


def test_extra_copy_layout_errors_name_the_key() -> None:
    instances = (
        '[zookeeper]\nservers = ["127.0.0.1:50"]\n'
        '[[regions.east.squeal_instances]]\nname = "e1"\nmetrics_port = 60\ndatabase = "{copy}"\n'
    )
    cases = [
        (  # an extra copy in a region the topology does not have
            "replicas.r = { region = 'north', port = 30, server_id = 30 }\n",
            "shards.u.replicas.r.region: unknown region 'north' (have: east, west)",
        ),
        (  # on a port another copy uses (shard u-0's copy in west listens on 20)
            "replicas.r = { region = 'east', port = 19, server_id = 30 }\n",
            "shards.u.replicas.r.port (+1, shard u-1): duplicate port: 127.0.0.1:20 is already used by "
            "shards.u.west.port (+0, shard u-0)",
        ),
        (  # a server id another copy uses, fleet-wide
            "replicas.r = { region = 'west', port = 30, server_id = 11 }\n",
            "shards.u-0.replicas.r.server_id: server_id 11 (shard u-0, replica r) is already used by "
            "shard u-1 in region west",
        ),
        (  # named like a region: `u-0@east` would name two copies
            "replicas.east = { region = 'west', port = 30, server_id = 30 }\n",
            "shards.u.replicas.east: 'east' names a region",
        ),
        (  # replicating from another region's copy would be ahead of the caches it invalidates
            "replicas.r = { region = 'west', port = 30, server_id = 30, replicates_from = 'east' }\n",
            "shards.u.replicas.r.replicates_from: 'east' is not a copy of this shard in region west",
        ),
        (  # a loop
            "replicas.r = { region = 'east', port = 30, server_id = 30, replicates_from = 's' }\n"
            "replicas.s = { region = 'east', port = 40, server_id = 40, replicates_from = 'r' }\n",
            "shards.u.replicas.r.replicates_from: replication loop: r -> s -> r",
        ),
        (  # an instance preferring a copy nobody declared
            "replicas.r = { region = 'east', port = 30, server_id = 30 }\n" + instances.format(copy="q"),
            "regions.east.squeal_instances[0].database: unknown copy 'q'",
        ),
        (  # a region's `replicas` beside [shards]
            "",
            "regions.east.replicas: a topology with [shards] gives each shard's copies under [shards.NAME]",
        ),
    ]
    assert len(cases) == 8
    for extra, expected in cases:
        base = LAYOUT_BASE
        if not extra:
            base = base.replace("master = true\n", "master = true\nreplicas.r = { port = 30, server_id = 30 }\n")
        copies, _, tail = extra.partition("[zookeeper]")
        with pytest.raises(router_config.TopologyError) as e:
            router_config.loads(GROUP + copies + base + (f"[zookeeper]{tail}" if tail else ""), source="t.toml")
        assert str(e.value).startswith(f"t.toml: {expected}"), str(e.value)
    # an instance may name an extra copy, or its region (the region's copy of every shard)
    for copy in ("r", "east"):
        topo = router_config.loads(
            GROUP
            + "replicas.r = { region = 'east', port = 30, server_id = 30 }\n"
            + LAYOUT_BASE
            + instances.format(copy=copy),
            source="t.toml",
        )
        assert topo.instance("e1").prefer == copy


def test_compact_shard_groups_expand_and_round_trip() -> None:
    topo = router_config.load(Path(__file__).resolve().parents[2] / "examples" / "sharded.toml")
    assert [s.name for s in topo.shards] == ["users-0", "users-1", "users-2", "users-3"]
    s3 = topo.shard("users-3")
    assert (s3.gtid_domain_id, s3.copy("east").port, s3.copy("west").server_id) == (13, 13403, 413)
    assert s3.copy("east").role == "primary" and s3.copy("west").role == "replica"
    again = router_config.loads(router_config.dumps(topo), source="again")
    assert again.shards == topo.shards and again.rules == topo.rules
    local = router_config.load(Path(__file__).resolve().parents[2] / "examples" / "local.toml")
    assert not local.sharded and [s.name for s in local.shards] == ["main"]


def test_a_shard_down_at_start_holds_nobody_back_and_starts_when_it_answers(sharded) -> None:
    env = sharded()
    db = env.dbs["s2"]
    db.stop(grace=5)
    try:
        env.daemon.start()  # ready once /healthz answers: s2 waits ~20 s for its database first, alone
        health = wait_until(lambda: (h := env.health())[0] == 503 and h[1], 60, "/healthz naming the shard")
        assert "s2: not started" in health["problems"], health["problems"]
        assert "does not answer" in health["problems"]["s2: not started"]
        env.tracer("s0")  # the others invalidate meanwhile
        env.tracer("s1")
    finally:
        db.start()
    wait_until(lambda: "shard s2: pipeline started" in env.log(), 90, "s2's pipeline to start once it answers")
    env.tracer("s2")
    wait_until(lambda: env.health()[0] == 200, 30, "/healthz 200 with every shard running")
    assert env.daemon.proc.poll() is None  # the same process all along
