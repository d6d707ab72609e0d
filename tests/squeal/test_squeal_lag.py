"""Flow lag that does not lie (issue 13 item 7): lag against the source's commits, not only squeal's queue.

Unit tests drive `Flow.lag()` and `squeal.read.source.SourceLag` on a fake clock; the integration tests run a
daemon on a replica whose SQL thread is stopped (nothing reaches squeal's queues, the region is stale)
and on the primary with a SIGSTOPped destination.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from squeal_helpers import Cache, create_schema, healthz, scrape, unique_db, wait_gone, wait_until, write_topology

from ops.harness import MariaDB, SquealDaemon, free_port
from router_config import Address
from squeal.delivery.flows import Committed, Flow
from squeal.process.metrics import Metrics
from squeal.read import gtid as g
from squeal.read.reader import Source
from squeal.read.source import SourceLag, SourcePoller


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def pos(seq: int) -> g.Position:
    return {0: (1, seq)}


def commit(seq: int, commit_ts: float, keys: tuple[str, ...] = ("k",)) -> Committed:
    return Committed((0, 1, seq), commit_ts, commit_ts, tuple(f"md {k} q\r\n".encode() for k in keys), ())


def make(clock: FakeClock, start: int = 10, replica: bool = False) -> tuple[Flow, SourceLag]:
    source = SourceLag(replica=replica)
    flow = Flow("c0", "cluster", [Address("127.0.0.1", 1)], pos(start), 1000, clock=clock)
    flow.source_lag = source.behind
    return flow, source


def deliver(flow: Flow) -> None:
    """Send and acknowledge everything queued."""
    while (batch := flow.take_batch(100)) is not None:
        flow.ack(batch)


def slave_status(io: str = "Yes", sql: str = "Yes", behind: int | None = 0, io_pos: str = "0-1-10") -> dict:
    return {"Slave_IO_Running": io, "Slave_SQL_Running": sql, "Seconds_Behind_Master": behind, "Gtid_IO_Pos": io_pos}


# -- Flow.lag() and SourceLag on a fake clock ------------------------------------------------------------------


def test_idle_caught_up_flow_reads_zero_forever() -> None:
    clock = FakeClock(1000.0)
    flow, source = make(clock)
    source.observe_binlog(pos(10), 1000.0)
    for t in (1001.0, 5000.0, 90000.0):
        clock.t = t
        source.observe_binlog(pos(10), t)
        assert flow.lag() == 0.0


def test_source_position_the_flow_lacks_counts_from_first_seen_until_acknowledged() -> None:
    clock = FakeClock(1000.0)
    flow, source = make(clock)
    source.observe_binlog(pos(10), 1000.0)
    source.observe_binlog(pos(11), 1001.0)  # written, but squeal has not queued it (nothing in the queue)
    source.observe_binlog(pos(11), 1002.0)  # seen again: first seen stays 1001
    clock.t = 1006.0
    assert not flow.queue and flow.lag() == 5.0
    flow.offer_live(commit(11, 1000.5))  # now queued: the queue's own view (older commit) wins
    assert flow.lag() == 5.5
    deliver(flow)
    assert flow.acked == pos(11) and flow.lag() == 0.0


def test_fresh_commit_after_a_quiet_spell_does_not_jump_to_the_previous_commits_age() -> None:
    clock = FakeClock(1000.0)
    flow, source = make(clock)
    source.observe_binlog(pos(10), 1000.0)
    flow.offer_live(commit(10, 999.0))  # (already covered: ignored)
    clock.t = 5000.0  # an hour and more of nothing
    source.observe_binlog(pos(10), 5000.0)
    source.observe_binlog(pos(11), 5000.2)  # a commit at 5000
    clock.t = 5000.7
    assert flow.lag() == pytest.approx(0.5)
    flow.offer_live(commit(11, 5000.0))
    assert flow.lag() == pytest.approx(0.7)  # the queue: commit time 5000 (1 s resolution), not 999
    deliver(flow)
    assert flow.lag() == 0.0


def test_a_flow_that_keeps_up_under_load_stays_near_zero() -> None:
    clock = FakeClock(1000.0)
    flow, source = make(clock)
    worst = 0.0
    for i in range(1, 200):
        t = 1000.0 + i
        source.observe_binlog(pos(10 + i), t)  # the poller sees a new position every second
        clock.t = t + 0.01
        flow.offer_live(commit(10 + i, t))
        worst = max(worst, flow.lag())
        deliver(flow)  # acknowledged within milliseconds
        clock.t = t + 0.5
        worst = max(worst, flow.lag())
        source.prune([flow.acked])
    assert worst < 0.1
    assert len(source._history) == 1  # pruned as the flow covers it


def test_a_stalled_flow_keeps_its_lag_when_the_history_is_thinned() -> None:
    clock = FakeClock(0.0)
    source = SourceLag(replica=False, max_history=8)
    flow = Flow("c0", "cluster", [Address("127.0.0.1", 1)], pos(0), 1000, clock=clock)
    flow.source_lag = source.behind
    for i in range(1, 100):
        source.observe_binlog(pos(i), float(i))
    assert len(source._history) <= 8
    clock.t = 100.0
    assert flow.lag() == 99.0  # the oldest sample is kept
    flow.acked = pos(50)
    assert 0.0 < flow.lag() <= 50.0  # coarser, still a lower bound (true value: 100 - 51 = 49)
    flow.acked = pos(99)
    assert flow.lag() == 0.0


def test_replica_stalled_sql_thread_counts_time_plus_last_known_value() -> None:
    clock = FakeClock(100.0)
    flow, source = make(clock, replica=True)
    source.observe_binlog(pos(10), 100.0)
    source.observe_replication(slave_status(behind=3), "0-1-10", 100.0)
    assert source.replication_lag(100.0) == 3.0 and flow.lag() == 3.0  # caught up with the replica: its lag
    # SQL thread stopped while the IO thread keeps receiving: Seconds_Behind_Master is NULL
    source.observe_replication(slave_status(sql="No", behind=None, io_pos="0-1-12"), "0-1-10", 101.0)
    source.observe_replication(slave_status(sql="No", behind=None, io_pos="0-1-14"), "0-1-10", 102.0)
    clock.t = 106.0
    assert source.replication_lag(106.0) == 3.0 + 5.0  # last known + time since first seen stalled
    assert flow.lag() == 8.0  # nothing queued, the replica's binlog does not move: still lagging
    # applied again
    source.observe_replication(slave_status(behind=1, io_pos="0-1-14"), "0-1-14", 107.0)
    assert source.replication_lag(107.0) == 1.0
    source.observe_replication(slave_status(behind=0, io_pos="0-1-14"), "0-1-14", 108.0)
    assert source.replication_lag(200.0) == 0.0


def test_replica_with_sql_thread_stopped_but_nothing_waiting_is_not_lagging() -> None:
    source = SourceLag(replica=True)
    source.observe_replication(slave_status(behind=4), "0-1-10", 100.0)
    source.observe_replication(slave_status(sql="No", behind=None), "0-1-10", 101.0)
    assert source.replication_lag(150.0) == 0.0  # received == applied
    source.observe_replication(slave_status(sql="No", behind=None, io_pos="0-1-11"), "0-1-10", 160.0)
    assert source.replication_lag(165.0) == 5.0  # waiting work from 160 on; last known is 0 by then


@pytest.mark.parametrize(
    "status",
    [
        slave_status(io="No", behind=None),
        slave_status(io="Connecting", behind=None),
        slave_status(io="No", sql="No", behind=None),
        None,
    ],
    ids=["io-stopped", "io-connecting", "both-stopped", "not-configured"],
)
def test_replica_not_replicating_counts_time(status) -> None:
    source = SourceLag(replica=True)
    source.observe_replication(slave_status(behind=2), "0-1-10", 100.0)
    source.observe_replication(status, "0-1-10", 101.0)
    source.observe_replication(status, "0-1-10", 102.0)
    assert source.replication_lag(111.0) == 2.0 + 10.0


def test_primary_source_has_no_replication_lag() -> None:
    source = SourceLag(replica=False)
    source.observe_binlog(pos(10), 100.0)
    assert source.replication_lag(1e9) == 0.0 and source.behind(pos(10), 1e9) == 0.0


def test_replication_lag_is_not_counted_twice_for_queued_transactions() -> None:
    # On a replica the binlog's commit timestamps are the primary's: the queue's lag already includes the
    # replication delay, so lag = max(queued, binlog lag + replication lag), not their sum.
    clock = FakeClock(100.0)
    flow, source = make(clock, replica=True)
    source.observe_replication(slave_status(behind=2, io_pos="0-1-11"), "0-1-11", 99.0)
    source.observe_binlog(pos(11), 99.0)
    flow.offer_live(commit(11, 97.0))  # committed on the primary at 97, applied by the replica at 99
    assert flow.lag() == 3.0  # max(100 - 97, (100 - 99) + 2)
    deliver(flow)
    assert flow.lag() == 2.0  # caught up with the replica, which is 2 s behind the primary


def test_flow_without_a_source_keeps_the_queue_lag() -> None:
    clock = FakeClock(100.0)
    flow = Flow("c0", "cluster", [Address("127.0.0.1", 1)], pos(10), 1000, clock=clock)
    flow.offer_live(commit(11, 90.0))
    assert flow.lag() == 10.0
    deliver(flow)
    assert flow.lag() == 0.0


def test_poller_reports_a_source_it_cannot_reach_for_long_and_clears_it(primary: MariaDB) -> None:
    clock = FakeClock(100.0)
    problems: list[str | None] = []
    metrics = Metrics()
    dead = Source("127.0.0.1", free_port(), "nobody", "x")  # nothing listens: connection refused at once
    poller = SourcePoller(
        dead, replica=True, metrics=metrics, on_problem=problems.append, problem_after=30.0, timeout=1.0, clock=clock
    )
    assert not poller.tick()
    clock.t = 120.0
    assert not poller.tick() and problems == []  # 20 s: not yet
    clock.t = 131.0
    assert not poller.tick() and len(problems) == 1 and f":{dead.port} for 31s" in problems[0]
    clock.t = 140.0
    assert not poller.tick() and len(problems) == 1  # reported once
    assert metrics.registry.get_sample_value("squeal_source_up") == 0
    snap = poller.snapshot()
    assert snap["up"] is False and snap["role"] == "replica" and "OperationalError" in snap["error"]
    # the database is back (here: a reachable one, no replication configured on it)
    poller.source = Source(primary.host, primary.port, primary.user, primary.password)
    clock.t = 150.0
    assert poller.tick() and problems[-1] is None and len(problems) == 2
    snap = poller.snapshot()
    assert snap["up"] is True and snap["error"] is None and snap["binlog_pos"] == primary.gtid_binlog_pos()
    assert snap["replication"]["configured"] is False  # so: not replicating, counted as time from 150 on
    assert metrics.registry.get_sample_value("squeal_source_up") == 1
    clock.t = 154.0
    assert metrics.registry.get_sample_value("squeal_source_replication_lag_seconds") == 4.0
    poller.stop()
    poller._close()


# -- a daemon on a replica whose SQL thread stops -----------------------------------------------------------------


def replica_topology(primary: MariaDB, replica: MariaDB, schema: str, west_ports: list[int]) -> str:
    """Two regions: east (master, on `primary`) and west (on `replica`), west's clusters on `west_ports`."""
    out = [
        f'[squeal]\nbatch_size = 64\nflush_interval_ms = 0.5\ndatamarker_dir = "var/dm"\n'
        f"metrics_port_base = {free_port()}\nmax_lag_s = 3\n",
        f'[[rules]]\ntable = "{schema}.users"\nkeys = ["user:{{id}}"]\n',
    ]
    for name, db, master in (("east", primary, True), ("west", replica, False)):
        role = "primary" if master else "replica"
        out.append(
            f"[regions.{name}]\nmaster = {'true' if master else 'false'}\n"
            f'database = {{ role = "{role}", host = "127.0.0.1", port = {db.port}, server_id = {db.server_id},'
            f' user = "{db.user}", password = "{db.password}" }}\n'
            f'regional_pool = {{ servers = ["127.0.0.1:{free_port()}"], prefixes = ["regional:"] }}\n'
        )
        ports = west_ports if name == "west" else [free_port()]
        for i, port in enumerate(ports):
            out.append(
                f'[regions.{name}.clusters.{name[0]}{i}]\nrouters = ["127.0.0.1:{port}"]\n'
                f'pools.wildcard = {{ kind = "wildcard", servers = ["127.0.0.1:{free_port()}"] }}\n'
            )
    return "\n".join(out)


def healthz_body(port: int) -> dict:
    return healthz(port)[1]  # a 503 carries the JSON too


def flow_lags(port: int) -> dict[str, float]:
    return {k: v for k, v in scrape(port).items() if k.startswith("squeal_flow_lag_seconds{")}


def test_stalled_replica_shows_as_lag_on_every_flow_and_recovers(
    mariadb_factory, memcached_factory, processes, tmp_path: Path
) -> None:
    primary = mariadb_factory(31)
    replica = mariadb_factory(32, replica=True)
    replica.replicate_from(primary)  # a pair of our own: the session's pair must keep replicating
    schema = unique_db("lag")
    create_schema(primary, schema)
    replica.wait_for_gtid(primary.gtid_binlog_pos())
    memcacheds = [memcached_factory(), memcached_factory()]
    topology = write_topology(
        tmp_path / "topology.toml", replica_topology(primary, replica, schema, [m.port for m in memcacheds])
    )
    daemon = processes.add(SquealDaemon(topology, "west", workdir=tmp_path / "squeal", state_dir=tmp_path / "st"))
    caches = [Cache(m.port) for m in memcacheds]
    try:
        # the pipeline works through the replica, and an idle caught-up region reads 0
        for c in caches:
            c.set("user:1")
        primary.execute(f"INSERT INTO {schema}.users VALUES (1, 'a@x', 'a')")
        wait_gone(caches, ["user:1"], timeout=20)
        wait_until(lambda: scrape(daemon.port)["squeal_source_up"] == 1, 10, "the source poller's first poll")
        lags = wait_until(
            lambda: (lg := flow_lags(daemon.port)) and all(v == 0 for v in lg.values()) and lg,
            20,
            "every flow's lag at 0 while caught up",
        )
        assert set(lags) == {
            'squeal_flow_lag_seconds{flow="w0"}',
            'squeal_flow_lag_seconds{flow="w1"}',
            'squeal_flow_lag_seconds{flow="regional"}',
        }

        replica.execute("STOP SLAVE SQL_THREAD")
        keys = []
        deadline = time.monotonic() + 5.0  # the primary keeps committing for ~5 s
        n = 100
        while time.monotonic() < deadline:
            n += 1
            keys.append(f"user:{n}")
            for c in caches:
                c.set(f"user:{n}")
            primary.execute(f"INSERT INTO {schema}.users VALUES ({n}, 'u{n}@x', 'u')")
            time.sleep(0.25)

        def stalled() -> dict[str, float] | None:
            m = scrape(daemon.port)
            lags = {k: v for k, v in m.items() if k.startswith("squeal_flow_lag_seconds{")}
            ok = len(lags) == 3 and all(v >= 3 for v in lags.values())
            return m if ok and m["squeal_source_replication_lag_seconds"] >= 3 else None

        m = wait_until(stalled, 30, "every flow's lag >= 3 s with the replica's SQL thread stopped", interval=0.2)
        assert m["squeal_source_up"] == 1
        assert all(c.present(keys) == set(keys) for c in caches)  # really stale: nothing was applied or deleted
        status = healthz_body(daemon.port)
        src = status["source"]
        assert src["role"] == "replica" and src["up"] is True and src["replication_lag"] >= 3
        assert src["replication"]["sql_running"] == "No" and src["replication"]["io_running"] == "Yes"
        assert src["binlog_pos"] == replica.gtid_binlog_pos()
        # past max_lag_s (3 s here) /healthz is 503 and names the stalled copy (issue 27 item 6)
        code, status = wait_until(lambda: (h := healthz(daemon.port))[0] == 503 and h, 15, "/healthz 503 on lag")
        lag_problems = {k: v for k, v in status["problems"].items() if k.startswith("lag:")}
        assert set(lag_problems) == {"lag:w0", "lag:w1", "lag:regional"}, status["problems"]
        assert all(
            "max_lag_s = 3" in v and "the replica west" in v and f"127.0.0.1:{replica.port}" in v and "sql No" in v
            for v in lag_problems.values()
        ), lag_problems

        replica.execute("START SLAVE SQL_THREAD")
        wait_gone(caches, keys, timeout=30)
        wait_until(
            lambda: all(v == 0 for v in flow_lags(daemon.port).values())
            and scrape(daemon.port)["squeal_source_replication_lag_seconds"] == 0,
            30,
            "every flow's lag back at 0 after the replica caught up",
            interval=0.2,
        )
        assert healthz_body(daemon.port)["source"]["replication"]["sql_running"] == "Yes"
        wait_until(lambda: healthz(daemon.port)[0] == 200, 15, "/healthz 200 once the copy caught up")
    finally:
        for c in caches:
            c.close()


# -- a daemon on the primary with a stopped destination -------------------------------------------------------------


def test_stopped_destination_lag_grows_and_returns_to_zero(squeal_env) -> None:
    env = squeal_env(clusters=2, extra_args=("--reply-timeout", "1"))
    env.start()
    env.fence()
    port = env.daemon.port
    wait_until(lambda: all(v == 0 for v in flow_lags(port).values()), 20, "lags at 0")
    src = healthz_body(port)["source"]
    assert src["role"] == "primary" and src["up"] is True and "replication" not in src
    wait_until(
        lambda: healthz_body(port)["source"]["binlog_pos"] == env.db.gtid_binlog_pos(),
        10,
        "/healthz showing the primary's binlog position",
    )
    assert scrape(port)["squeal_source_replication_lag_seconds"] == 0

    env.memcacheds[0].pause()
    try:
        for c in env.caches[1:]:
            c.set("user:7")
        env.sql("INSERT INTO users VALUES (7, 'seven@x', 'seven')")
        wait_gone(env.caches[1:], ["user:7"])  # the other cluster is not held up
        wait_until(
            lambda: flow_lags(port)['squeal_flow_lag_seconds{flow="c0"}'] >= 3,
            30,
            "c0's lag to grow while its memcached is stopped",
            interval=0.2,
        )
        assert flow_lags(port)['squeal_flow_lag_seconds{flow="c1"}'] == 0
    finally:
        env.memcacheds[0].resume()
    wait_until(lambda: all(v == 0 for v in flow_lags(port).values()), 30, "every flow's lag back at 0", interval=0.2)
    env.fence()
