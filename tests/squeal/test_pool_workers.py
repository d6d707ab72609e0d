"""The elastic worker pool (issue 24) end to end: real MariaDB per shard, a 3-server ZooKeeper ensemble, memcached.

A region of 4 shards, `squeal_pool = true`, workers `squeal run --instance wN`. Under steady writes on every
shard (each row's key cached in both clusters before its INSERT commits):
* a third worker joins: shards move to it, and every committed row's key is gone from every cluster;
* a worker is drained (`squealctl drain`): its shards move to the others, 0 lost;
* a worker owning >= 2 shards is killed (-9): every shard resumes elsewhere after its session expires, 0 lost.
"0 lost" is checked key by key against the rows in each shard's database.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pool_support import NetnsSquealDaemon, ensemble, hosts, unique_root, write_ha_markers
from squeal_helpers import (
    SCHEMA,
    Cache,
    all_started,
    healthz,
    made_then_stopped,
    scrape,
    unique_db,
    wait_gone,
    wait_until,
)

from ops import harness
from ops.harness import MariaDB, Memcached, SquealDaemon, free_port
from squeal import current_position
from squeal.pool.zookeeper import shard_path
from squeal.read import gtid as g

SHARDS = ("p0", "p1", "p2", "p3")
SESSION_TIMEOUT = 2.0
DEADLINE = 60.0  # for things that must happen (a slow, shared machine): never a speed assertion


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    with ensemble(tmp_path_factory.mktemp("zk-pool-workers")) as members:
        yield members


@pytest.fixture(scope="module")
def shard_dbs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[MariaDB]]:
    """One primary per shard of the `p` group, GTID domains 30..33."""
    base = tmp_path_factory.mktemp("pool-shards")
    dbs = [MariaDB(server_id=300 + i, workdir=base / f"s{i}", gtid_domain_id=30 + i) for i in range(len(SHARDS))]
    with all_started(dbs):
        yield dbs


class Pool:
    """A schema on every shard, two memcached clusters, a pooled topology with workers w1..w3 (not started).

    `host`: where the databases, memcacheds and ZooKeeper listen; `netns`: worker -> (namespace, its address) for
    a worker that runs inside a network namespace (the partition test); `placement`: the body of
    `[regions.east.squeal_placement]`."""

    def __init__(
        self,
        base: Path,
        dbs: list[MariaDB],
        zk: list,
        host: str = "127.0.0.1",
        netns: dict[str, tuple[str, str]] | None = None,
        placement: str = "",
    ) -> None:
        self.base, self.dbs = base, dbs
        self.schema = unique_db("pool")
        for db in dbs:
            db.execute(f"CREATE DATABASE {self.schema}")
            with db.connect(self.schema) as conn, conn.cursor() as cur:
                for stmt in filter(str.strip, SCHEMA.split(";")):
                    cur.execute(stmt)
        self.memcacheds = [Memcached(workdir=base / "memcached", host=host).start() for _ in range(2)]
        self.caches = [Cache(m.port, host) for m in self.memcacheds]
        netns = netns or {}
        self.hosts = {n: netns[n][1] if n in netns else "127.0.0.1" for n in ("w1", "w2", "w3")}
        self.root = unique_root()
        self.zk, self.zk_hosts = zk, hosts(zk)
        # (The topology reserves each ZooKeeper server's port + 100 and + 200 for its peers, in use or not: a free
        # port that happens to be one of them makes the loader refuse the file.)
        reserved = {m.port + d for m in zk for d in (0, 100, 200)}

        def port() -> int:
            while (p := free_port()) in reserved:
                pass
            reserved.add(p)
            return p

        self.ports = {f"w{i}": port() for i in (1, 2, 3)}
        clusters = "".join(
            f'[regions.east.clusters.c{i}]\nrouters = ["{host}:{m.port}"]\n'
            f'pools.wildcard = {{ kind = "wildcard", servers = ["{host}:{port()}"] }}\n'
            for i, m in enumerate(self.memcacheds)
        )
        instances = "".join(
            f'[[regions.east.squeal_instances]]\nname = "{n}"\nmetrics_port = {p}\nhost = "{self.hosts[n]}"\n'
            for n, p in self.ports.items()
        )
        servers = ", ".join(f'"{h}"' for h in self.zk_hosts.split(","))
        self.topology = base / "topology.toml"
        self.topology.write_text(
            f'[squeal]\ndatamarker_dir = "var/dm"\nmetrics_port_base = {port()}\n\n'
            f"[zookeeper]\nservers = [{servers}]\nsession_timeout_s = {SESSION_TIMEOUT}\n"
            f'root = "{self.root}"\n\n'
            + "".join(
                f"[shards.{s}]\ngtid_domain_id = {30 + i}\n"
                f'east = {{ host = "{host}", port = {dbs[i].port}, server_id = {dbs[i].server_id} }}\n'
                for i, s in enumerate(SHARDS)
            )
            + f'\n[[rules]]\ntable = "{self.schema}.users"\nkeys = ["user:{{id}}"]\n\n'
            + "[regions.east]\nmaster = true\nsqueal_pool = true\n"
            + instances
            + clusters
            + (f"\n[regions.east.squeal_placement]\n{placement}\n" if placement else "")
        )
        self.workers = {
            n: (
                NetnsSquealDaemon(
                    netns[n][0], self.topology, "east", port=p, workdir=base / n, instance=n, host=self.hosts[n]
                )
                if n in netns
                else SquealDaemon(self.topology, "east", port=p, workdir=base / n, instance=n)
            )
            for n, p in self.ports.items()
        }

    def running(self, name: str) -> set[str]:
        """The shards whose pipeline runs in worker `name` now (empty if it does not answer)."""
        try:
            _, body = healthz(self.ports[name], self.hosts[name])
        except OSError:
            return set()
        return set(body.get("shards") or {}) - set(body.get("stopping") or [])

    def placed(self, names: tuple[str, ...]) -> dict[str, set[str]] | None:
        """Each worker's running shards, if every shard runs on exactly one of `names` (else None)."""
        now = {n: self.running(n) for n in names}
        every = [s for shards in now.values() for s in shards]
        return now if sorted(every) == sorted(SHARDS) else None

    def log(self, name: str) -> str:
        f = self.workers[name].log_file
        return f.read_text() if f.exists() else ""

    def stop(self) -> None:
        for w in self.workers.values():
            w.stop(grace=10)
        for c in self.caches:
            c.close()
        for m in self.memcacheds:
            m.stop(grace=5)


@pytest.fixture
def make_pool(shard_dbs, zk, tmp_path: Path) -> Iterator:
    yield from made_then_stopped(lambda n, **kwargs: Pool(tmp_path / f"pool{n}", shard_dbs, zk, **kwargs))


class Writer(threading.Thread):
    """Steady single-row INSERTs into users, round robin over the shards: row i on shard i % 4. Its key
    `user:i` is in both caches before the row commits (`prime`), so only squeal's delete removes it.
    `weights`: rows per round for each shard (default one each; (10, 1, 1, 1): p0 gets 10x the writes)."""

    def __init__(self, env: Pool, rate: float, first: int = 1, weights: tuple[int, ...] = (1, 1, 1, 1)) -> None:
        super().__init__(daemon=True)
        self.env, self.rate, self.next_id, self.first = env, rate, first, first
        self.rounds = [j for j, w in enumerate(weights) for _ in range(w)]
        n = len(weights)
        self.next_of = [first + (j - first) % n for j in range(n)]  # the next id with id % n == j
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self.written: list[int] = []

    def run(self) -> None:
        conns = [db.connect(self.env.schema) for db in self.env.dbs]
        try:
            t = time.monotonic()
            k = 0
            while not self.stop_flag.is_set():
                j = self.rounds[k % len(self.rounds)]
                k += 1
                i = self.next_of[j]
                with conns[j].cursor() as cur:
                    cur.execute("INSERT INTO users VALUES (%s, %s, 'w')", (i, f"u{i}@pool"))
                self.written.append(i)
                self.next_of[j] += len(conns)
                self.next_id = max(self.next_id, i + 1)
                t += 1.0 / self.rate
                time.sleep(max(0.0, t - time.monotonic()))
        except BaseException as e:  # noqa: BLE001
            self.error = e
        finally:
            for c in conns:
                c.close()

    def stop(self) -> list[int]:
        self.stop_flag.set()
        self.join(20)
        assert self.error is None, self.error
        return list(self.written)


def prime(env: Pool, ids: range) -> None:
    for c in env.caches:
        c.set_many(f"user:{i}" for i in ids)


def assert_nothing_lost(env: Pool, written: list[int]) -> None:
    """Key by key against each shard's database: every committed row's key is gone from every cluster."""
    in_db = sorted(
        r[0]
        for i, db in enumerate(env.dbs)
        for r in db.execute(f"SELECT id FROM {env.schema}.users WHERE email LIKE '%@pool'")
    )
    assert in_db == sorted(written), "the writer's rows are the databases' rows"
    keys = [f"user:{i}" for i in in_db]
    left: dict[int, set[str]] = {}

    def gone() -> bool:
        left.update({c.addr[1]: c.present(keys) for c in env.caches})
        return not any(left.values())

    harness.wait_until(gone, DEADLINE, "keys gone", interval=0.2, error=None)
    lost = {port: sorted(k)[:10] for port, k in left.items() if k}
    assert not lost, f"{sum(len(k) for k in left.values())} of {len(keys)} committed rows' keys survived: {lost}"


def squealctl(env: Pool, *args: str) -> str:
    """squealctl against the pool's topology; its stdout (a failure fails the test with its stderr)."""
    out = subprocess.run(
        [sys.executable, "-m", "ops.cli", "--state-dir", str(env.base / "ctl"), *args, "--topology", str(env.topology)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"squealctl {' '.join(args)}: exit {out.returncode}: {out.stderr}"
    return out.stdout


def owned(env: Pool) -> dict[str, set[str]]:
    """`squealctl workers --json`: each worker's shards, as the per-shard owner znodes say."""
    return {w["name"]: set(w["shards"]) for w in json.loads(squealctl(env, "workers", "--json"))}


def pool_of(env: Pool):
    from pool_support import client

    return client(env.zk_hosts, SESSION_TIMEOUT)


def start_spread(env: Pool, names: tuple[str, ...]) -> dict[str, set[str]]:
    """Start the workers `names` and wait for the pool's 4 shards to run on them, each with at least one: where."""
    for name in names:
        env.workers[name].start()
    return wait_until(
        lambda: (p := env.placed(names)) and all(p.values()) and p,
        DEADLINE,
        f"all 4 shards running, each of {', '.join(names)} with at least one",
    )


def test_a_joining_worker_takes_shards_a_move_and_a_drain_nothing_lost(make_pool) -> None:
    env = make_pool()
    prime(env, range(1, 20001))
    env.workers["w1"].start()
    env.workers["w2"].start()
    wait_until(lambda: env.placed(("w1", "w2")), DEADLINE, "all 4 shards running on w1 and w2")
    writer = Writer(env, rate=60)
    writer.start()
    wait_until(lambda: len(writer.written) > 100, DEADLINE, "writes before the join")

    env.workers["w3"].start()  # joins under load: the controller fills the empty worker at once
    placed = wait_until(
        lambda: (p := env.placed(("w1", "w2", "w3"))) and p["w3"] and p,
        DEADLINE,
        "a shard running on the new worker w3",
    )
    assert sorted(len(s) for s in placed.values()) == [1, 1, 2], placed
    at_join = len(writer.written)
    wait_until(lambda: len(writer.written) > at_join + 100, DEADLINE, "writes after the join")

    # `squealctl workers` (the owner znodes in ZooKeeper) agrees with what runs; markers: one znode per shard.
    rows = json.loads(squealctl(env, "workers", "--json"))
    assert {w["name"]: set(w["shards"]) for w in rows} == placed
    assert all(w["region"] == "east" and w["pid"] == env.workers[w["name"]].proc.pid for w in rows), rows
    assert all(isinstance(w["load"], float | int) for w in rows)
    assert "w3" in squealctl(env, "workers")
    zk = pool_of(env)
    try:
        for shard in SHARDS:
            doc = json.loads(zk.get(f"{shard_path(env.root, 'east', shard)}/markers")[0])
            assert set(doc["positions"]) == {"c0", "c1"}, doc
    finally:
        zk.stop()
        zk.close()

    # An operator's move under load: one of w1's shards to w3.
    shard = sorted(placed["w1"])[0]
    squealctl(env, "move", shard, "--to", "w3")
    wait_until(lambda: shard in env.running("w3") and shard in owned(env)["w3"], DEADLINE, f"{shard} moved to w3")
    at_move = len(writer.written)
    wait_until(lambda: len(writer.written) > at_move + 100, DEADLINE, "writes after the move")

    # Drain w3 under load: its shards go to w1 and w2.
    assert "draining" in squealctl(env, "drain", "w3")
    wait_until(
        lambda: (p := env.placed(("w1", "w2", "w3"))) and not p["w3"], DEADLINE, "w3 drained: every shard on w1 and w2"
    )
    assert owned(env)["w3"] == set()
    at_drain = len(writer.written)
    wait_until(lambda: len(writer.written) > at_drain + 100, DEADLINE, "writes after the drain")
    written = writer.stop()
    assert_nothing_lost(env, written)
    assert "handing it on" in env.log("w3") and "released shard" in env.log("w3")
    metrics = scrape(env.ports["w3"])
    assert metrics.get("squeal_pool_shard_starts_total", 0) >= 1
    assert metrics.get("squeal_pool_shard_stops_total", 0) >= 1


def test_workers_check_shards_ahead_and_a_new_owner_starts_from_the_markers_without_rewriting_them(make_pool) -> None:
    """The new owner's part of a move's pause is only what needs ownership: every worker (a region of 4 shards)
    has checked the pipelines of the shards it does not run ahead, and a new owner starts from the markers its
    predecessor wrote without writing them again (before, one ZooKeeper write per destination at every start)."""
    env = make_pool()
    prime(env, range(1, 20001))
    env.workers["w1"].start()
    env.workers["w2"].start()
    placed = wait_until(
        lambda: (p := env.placed(("w1", "w2"))) and all(p.values()) and p,
        DEADLINE,
        "all 4 shards running, on w1 and w2",
    )

    def ahead(name: str) -> set[str]:
        return set(healthz(env.ports[name], env.hosts[name])[1].get("checked_ahead") or [])

    for name, mine in placed.items():
        others = set(SHARDS) - mine
        wait_until(
            lambda name=name, others=others: ahead(name) == others,
            DEADLINE,
            f"{name} has checked {sorted(others)} ahead",
        )
    shard = sorted(placed["w1"])[0]
    path = f"{shard_path(env.root, 'east', shard)}/markers"
    zk = pool_of(env)
    try:
        before = zk.get(path)
        squealctl(env, "move", shard, "--to", "w2")
        wait_until(lambda: shard in env.running("w2") and shard in owned(env)["w2"], DEADLINE, f"{shard} moved to w2")
        after = zk.get(path)
        assert after[1].version == before[1].version, (
            f"nothing was written to {shard}'s markers across a move without writes: {before[0]!r} -> {after[0]!r}"
        )
        assert json.loads(after[0])["positions"] == json.loads(before[0])["positions"]
    finally:
        zk.stop()
        zk.close()
    assert f"shard {shard} delivering" in env.log("w2") and "checked ahead" in env.log("w2")
    wait_until(lambda: shard in ahead("w1"), DEADLINE, f"w1 has checked {shard} ahead again (it may get it back)")
    writer = Writer(env, rate=60)
    writer.start()
    wait_until(lambda: len(writer.written) > 100, DEADLINE, "writes after the move")
    assert_nothing_lost(env, writer.stop())


def test_a_region_whose_markers_an_ha_leader_wrote_runs_on_the_pool_from_them_nothing_lost(make_pool) -> None:
    """Upgrade: the markers an HA leader left (one znode per destination under `<region>/shards/<shard>/markers/`)
    are where the pool's first owner of each shard starts. Rows committed after those markers while no squeal ran
    are invalidated once the workers start (before, a shard without a pool markers znode started from "now": all
    of them stayed cached), and the shard's own markers znode carries on from there."""
    env = make_pool()
    prime(env, range(1, 20001))
    zk = pool_of(env)
    try:
        for shard, db in zip(SHARDS, env.dbs, strict=True):  # what the HA leader acknowledged: everything so far
            with db.connect() as conn:
                position = g.format_position(current_position(conn))
            write_ha_markers(zk, env.root, "east", shard, {"c0": position, "c1": position}, by="east-1")
        writer = Writer(env, rate=60)  # committed with nobody delivering
        writer.start()
        wait_until(lambda: len(writer.written) > 60, DEADLINE, "rows committed while no squeal runs")
        written = writer.stop()
        env.workers["w1"].start()
        env.workers["w2"].start()
        wait_until(lambda: env.placed(("w1", "w2")), DEADLINE, "every shard running on w1 or w2")
        assert_nothing_lost(env, written)
        for shard in SHARDS:  # each shard's own znode now, written by its owner
            wait_until(
                lambda shard=shard: zk.exists(f"{shard_path(env.root, 'east', shard)}/markers"),
                DEADLINE,
                f"{shard}'s pool markers znode",
            )
    finally:
        zk.stop()
        zk.close()
    assert "starting from the HA layout's" in env.log("w1") + env.log("w2")


def test_kill_9_of_a_worker_with_two_shards_resumes_them_elsewhere_nothing_lost(make_pool) -> None:
    env = make_pool()
    prime(env, range(1, 20001))
    placed = start_spread(env, ("w1", "w2", "w3"))
    writer = Writer(env, rate=60)
    writer.start()
    wait_until(lambda: len(writer.written) > 100, DEADLINE, "writes before the crash")
    victim = next(n for n, s in placed.items() if len(s) >= 2)
    others = tuple(n for n in ("w1", "w2", "w3") if n != victim)
    env.workers[victim].kill()  # SIGKILL: no flush, no marker, no release: its session must expire
    wait_until(lambda: env.placed(others), DEADLINE, f"every shard of {victim} resumed on {others}")
    at = len(writer.written)
    wait_until(lambda: len(writer.written) > at + 100, DEADLINE, "writes after the crash")
    written = writer.stop()
    assert_nothing_lost(env, written)


class MarkerWatch(threading.Thread):
    """Polls every shard's marker znode: records each version's positions and writer; `went_back` lists any
    flow whose marker ever moved to a position that does not cover the one before."""

    def __init__(self, env: Pool) -> None:
        super().__init__(daemon=True)
        self.client = pool_of(env)
        self.paths = {s: f"{shard_path(env.root, 'east', s)}/markers" for s in SHARDS}
        self.seen: dict[str, list[tuple[int, dict[str, str], str]]] = {s: [] for s in SHARDS}
        self.writes: dict[str, list[tuple[int, int | None, str, int]]] = {s: [] for s in SHARDS}  # version, token,
        # writer, mtime (ms: when ZooKeeper's leader took the write)
        self.went_back: list[str] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        from kazoo.exceptions import NoNodeError

        from squeal.read import gtid as g

        while not self.stop_flag.wait(0.05):
            for shard, path in self.paths.items():
                try:
                    data, stat = self.client.get(path)
                except NoNodeError:
                    continue
                except Exception:  # noqa: BLE001 - a slow answer: the next round
                    continue
                doc = json.loads(data)
                seen = self.seen[shard]
                if seen and seen[-1][0] == stat.version:
                    continue
                if seen:
                    for flow, position in doc["positions"].items():
                        before = seen[-1][1].get(flow)
                        if before is not None and not g.covers_position(
                            g.parse_position(position), g.parse_position(before)
                        ):
                            self.went_back.append(f"{shard}/{flow}: {before} -> {position} by {doc.get('by')}")
                seen.append((stat.version, doc["positions"], doc.get("by", "")))
                self.writes[shard].append((stat.version, doc.get("token"), doc.get("by", ""), stat.mtime))

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(10)
        self.client.stop()
        self.client.close()

    def one_sender_per_token(self) -> dict[str, list[tuple[int | None, str]]]:
        """Every shard's marker writers in order, as (token, worker) runs. Fails unless tokens only rise and each
        token was written by one worker: no two owners of a shard ever wrote its markers in turn."""
        runs: dict[str, list[tuple[int | None, str]]] = {}
        for shard, writes in self.writes.items():
            run: list[tuple[int | None, str]] = []
            for _, token, by, _ in writes:
                if not run or run[-1] != (token, by):
                    run.append((token, by))
            tokens = [t for t, _ in run]
            assert None not in tokens, f"{shard}: a marker written without a fencing token: {run}"
            assert tokens == sorted(set(tokens)), f"{shard}: a token wrote again after a newer one: {run}"
            runs[shard] = run
        return runs


def test_a_paused_worker_is_fenced_its_shards_resume_elsewhere_and_no_marker_goes_back(make_pool) -> None:
    env = make_pool()
    prime(env, range(1, 20001))
    placed = start_spread(env, ("w1", "w2"))
    watch = MarkerWatch(env)
    watch.start()
    writer = Writer(env, rate=60)
    writer.start()
    wait_until(lambda: len(writer.written) > 100, DEADLINE, "writes before the pause")
    victim, other = ("w1", "w2") if placed["w1"] else ("w2", "w1")
    env.workers[victim].pause()  # SIGSTOP past its session timeout: a worker that is slow, not dead
    wait_until(lambda: env.placed((other,)), DEADLINE, f"every shard running on {other} while {victim} is stopped")
    at = len(writer.written)
    wait_until(lambda: len(writer.written) > at + 100, DEADLINE, "writes while the old owner is stopped")
    env.workers[victim].resume()  # its lease is long over: it sends nothing, writes no marker, starts over
    wait_until(lambda: "starting over" in env.log(victim), DEADLINE, f"{victim} to notice its session is gone")
    wait_until(lambda: env.placed((other, victim)), DEADLINE, f"{victim} back in the pool, every shard running")
    at = len(writer.written)
    wait_until(lambda: len(writer.written) > at + 100, DEADLINE, "writes after the resume")
    written = writer.stop()
    assert_nothing_lost(env, written)
    watch.stop()
    assert not watch.went_back, watch.went_back
    for shard, seen in watch.seen.items():
        assert len({json.dumps(p, sort_keys=True) for _, p, _ in seen}) >= 2, f"{shard}'s markers never moved"
    moved = {s for s in placed[victim]}
    assert all({by for _, _, by in watch.seen[s]} >= {victim, other} for s in moved), (
        "each shard of the paused worker was written by it, then by its new owner"
    )

    # `squeal replay` in a pooled region: the request lands beside the shard's markers; its owner applies it.
    from squeal.cli import main as squeal_main

    again = [f"user:{i}" for i in written if i % len(SHARDS) == 1][:20]  # rows of shard p1, invalidated already
    for c in env.caches:
        c.set_many(again)
    assert (
        squeal_main(["replay", str(env.topology), "--region", "east", "--shard", "p1", "--flow", "all", "--from", ""])
        == 0
    )
    wait_gone(env.caches, again, DEADLINE)


# Seconds, not the production minutes: the imbalance must last 3 s, a moved shard rests 5 s, loads smoothed
# with a 3 s half-life; threshold 1.5 keeps 4 equal shards on 3 workers (2, 1, 1) balanced.
FAST_PLACEMENT = "threshold = 1.5\npersist_s = 3\ncooldown_s = 5\nhalf_life_s = 3\n"


def test_a_shard_with_ten_times_the_writes_ends_alone_on_its_worker_nothing_lost(make_pool) -> None:
    env = make_pool(placement=FAST_PLACEMENT)
    prime(env, range(1, 40001))
    placed = start_spread(env, ("w1", "w2", "w3"))
    hot_worker = next(n for n, s in placed.items() if "p0" in s)
    if placed[hot_worker] == {"p0"}:  # give p0 company first: the rebalance must be what leaves it alone
        crowded = next(n for n, s in placed.items() if len(s) == 2)
        squealctl(env, "move", sorted(placed[crowded])[0], "--to", hot_worker)
        placed = wait_until(
            lambda: (p := env.placed(("w1", "w2", "w3"))) and len(p[hot_worker]) == 2 and p,
            DEADLINE,
            f"a second shard running beside p0 on {hot_worker}",
        )
    company = placed[hot_worker] - {"p0"}

    writer = Writer(env, rate=65, weights=(10, 1, 1, 1))  # p0: 50 rows/s, the others 5 each
    writer.start()
    alone = wait_until(
        lambda: owned(env)[hot_worker] == {"p0"} and env.running(hot_worker) == {"p0"},
        DEADLINE,
        f"p0 alone on {hot_worker} after the rebalance",
    )
    assert alone
    at = len(writer.written)
    wait_until(lambda: len(writer.written) > at + 200, DEADLINE, "writes after the rebalance")

    def published() -> dict | None:
        """`squealctl workers --json` by worker, once p0's binlog bytes/s is in it: the meter samples every 5 s
        and needs two samples that saw the binlog grow, which a quick rebalance can outrun."""
        rows = {w["name"]: w for w in json.loads(squealctl(env, "workers", "--json"))}
        return rows if rows[hot_worker]["loads"].get("p0", {}).get("bytes_s", 0) > 0 else None

    rows = wait_until(published, DEADLINE, "p0's binlog bytes/s measured and published")
    p0 = rows[hot_worker]["loads"]["p0"]
    others = {s: v for w in rows.values() for s, v in w["loads"].items() if s != "p0"}
    assert p0["rows_s"] > 0 and p0["bytes_s"] > 0, p0  # both terms measured
    assert all(p0["load"] > 3 * v["load"] for v in others.values()), (p0, others)
    written = writer.stop()
    assert_nothing_lost(env, written)
    logs = "".join(env.log(n) for n in env.workers)
    assert any(f"shard {s}: {hot_worker} -> " in logs and "(rebalance:" in logs for s in company), (
        "the company left by a rebalance"
    )
    metrics = scrape(env.ports[hot_worker])
    assert metrics.get('squeal_pool_shard_binlog_bytes_per_second{shard="p0"}', 0) > 0


def test_zookeeper_losing_its_quorum_pauses_every_owner_and_quorum_back_resumes_nothing_lost(make_pool, zk) -> None:
    from ops.harness import ZooKeeper

    env = make_pool()
    prime(env, range(1, 20001))
    start_spread(env, ("w1", "w2"))
    watch = MarkerWatch(env)
    watch.start()
    writer = Writer(env, rate=60)
    writer.start()
    wait_until(lambda: len(writer.written) > 100, DEADLINE, "writes before the outage")
    killed = list(zk[:2])
    try:
        for member in killed:
            member.kill()

        def paused(name: str) -> bool:
            try:
                return "lease" in healthz(env.ports[name])[1].get("problems", {})
            except OSError:
                return False

        wait_until(lambda: paused("w1") and paused("w2"), DEADLINE, "both workers' leases to lapse (paused)")
        paused_ms = time.time() * 1000
        at = len(writer.written)
        wait_until(lambda: len(writer.written) > at + 100, DEADLINE, "writes while ZooKeeper has no quorum")
        held = [f"user:{i}" for i in writer.written[at : at + 100]]
        for c in env.caches:  # committed while every owner was paused: still cached (paused, not lost)
            assert c.present(held) == set(held), f"{len(held) - len(c.present(held))} keys deleted without a quorum"
        assert all(w.proc.poll() is None for n, w in env.workers.items() if n in ("w1", "w2"))
        back_ms = time.time() * 1000
        for member in killed:
            member.start()
        ZooKeeper.wait_serving(zk)
        killed.clear()
    finally:
        for member in killed:  # the module's ensemble stays whole for the next test, whatever happened
            member.start()
    wait_gone(env.caches, held, DEADLINE)  # resumed
    wait_until(lambda: env.placed(("w1", "w2")), DEADLINE, "every shard running again")
    at = len(writer.written)
    wait_until(lambda: len(writer.written) > at + 100, DEADLINE, "writes after the quorum is back")
    written = writer.stop()
    assert_nothing_lost(env, written)

    def not_written_since() -> list[str]:
        return [s for s, w in watch.writes.items() if not any(m > back_ms for *_, m in w)]

    try:
        wait_until(lambda: not not_written_since(), DEADLINE, "every shard's markers written after the quorum is back")
    except AssertionError as e:
        said = [line for n in env.workers for line in env.log(n).splitlines() if "datamarker" in line]
        shards = ", ".join(not_written_since())
        raise AssertionError(f"{e}: not {shards}; the workers said:\n" + "\n".join(said[-20:])) from None
    watch.stop()
    assert not watch.went_back, watch.went_back
    during = {s: [(v, by, m) for v, _, by, m in w if paused_ms < m < back_ms] for s, w in watch.writes.items()}
    assert not any(during.values()), f"markers written while every owner was paused: {during}"
    assert all(any(m < paused_ms for *_, m in w) for w in watch.writes.values()), "the watch saw writes before"
    watch.one_sender_per_token()


def test_accept_data_loss_of_a_purged_shard_goes_through_its_owner(make_pool) -> None:
    """Shard p1's binlog purged past its markers while the pool is down: its owner halts p1 alone (503 naming
    it), the other shards invalidate; `squeal accept-data-loss --shard p1` (a znode beside p1's markers) is taken
    by whichever worker owns p1: it flushes the clusters and p1 resumes."""
    from squeal.cli import main as squeal_main

    env = make_pool()
    p1 = env.dbs[1]

    def tracer(i: int) -> None:  # row i lives on shard i % 4; its key cached first, then gone by squeal
        for c in env.caches:
            c.set_many([f"user:{i}"])
        with env.dbs[i % len(SHARDS)].connect(env.schema) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO users VALUES (%s, %s, 'w')", (i, f"u{i}@tracer"))
        wait_gone(env.caches, [f"user:{i}"], DEADLINE)

    start_spread(env, ("w1", "w2"))
    tracer(101)
    zk = pool_of(env)
    try:
        path = f"{shard_path(env.root, 'east', 'p1')}/markers"
        wait_until(lambda: "31-301-" in zk.get(path)[0].decode(), DEADLINE, "p1's markers holding its tracer")
    finally:
        zk.stop()
        zk.close()
    for w in ("w1", "w2"):
        env.workers[w].stop(grace=10)  # SIGTERM: markers written, shards released
    lost = [501, 505, 509]
    for c in env.caches:
        c.set_many([f"user:{i}" for i in lost])
    with p1.connect(env.schema) as conn, conn.cursor() as cur:
        for i in lost:
            cur.execute("INSERT INTO users VALUES (%s, %s, 'lost')", (i, f"u{i}@lost"))
            cur.execute("FLUSH BINARY LOGS")
    p1.execute(f"PURGE BINARY LOGS TO '{p1.execute('SHOW BINARY LOGS')[-1][0]}'")
    env.workers["w1"].start()
    env.workers["w2"].start()
    # (whichever worker came back first may hold every shard: the other is filled once the cooldown allows)
    wait_until(lambda: env.placed(("w1", "w2")), DEADLINE, "all 4 shards running again")

    def halted() -> tuple[str, str] | None:
        for w in ("w1", "w2"):
            with contextlib.suppress(OSError):
                status, body = healthz(env.ports[w])
                problems = [v for v in body.get("problems", {}).values() if "DATA LOSS" in v]
                if status == 503 and problems and "p1" in body.get("owns", []):
                    return w, problems[0]
        return None

    owner, why = wait_until(halted, DEADLINE, "p1's owner answering 503 for p1's data loss")
    assert "shard p1" in why and "--shard p1" in why, why
    tracer(104)  # the other shards keep invalidating while p1 is halted
    tracer(106)
    for c in env.caches:  # p1 sent nothing: halted, not flushed
        assert c.present([f"user:{i}" for i in lost]) == {f"user:{i}" for i in lost}
    assert squeal_main(["accept-data-loss", str(env.topology), "--region", "east", "--shard", "p1"]) == 0
    wait_gone(env.caches, [f"user:{i}" for i in lost], DEADLINE)  # p1's owner flushed the clusters, resumed
    wait_until(
        lambda: all(healthz(env.ports[w])[0] == 200 for w in ("w1", "w2")),
        DEADLINE,
        "both workers healthy after the recovery",
    )
    owner = next(w for w in ("w1", "w2") if "p1" in env.running(w))
    assert "data loss accepted by the operator" in env.log(owner)
    tracer(113)  # p1 invalidates again
