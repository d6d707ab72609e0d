"""Committed changes squeal once missed, and stalls nobody saw (issue 13, items 1-5).

Each integration test runs real MariaDB statements against a real binlog and checks real memcached:
XA two-phase commit (also across a restart between PREPARE and COMMIT), ROLLBACK TO SAVEPOINT inside a
committed transaction, rolled-back writes to MyISAM, TRUNCATE/DROP/RENAME of ruled tables under both
on_truncate policies, and a binlog purged past the datamarkers under both on_data_loss policies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from squeal_helpers import SquealEnv, accept_data_loss, healthz, scrape, unique_db, wait_gone, wait_until

from ops.harness import MariaDB
from router_config import Rule
from squeal.keys.bulk import BulkDetector, changed_columns, statement_kind
from squeal.read import gtid as g
from squeal.read.transactions import (
    Annotate,
    Begin,
    Commit,
    PreparedXa,
    Query,
    Rows,
    Transaction,
    TransactionGrouper,
    XaPrepare,
    xid_text,
)

# -- pure logic -------------------------------------------------------------------------------------------------


def _rows(table: str, *ids: int) -> Rows:
    return Rows("app", table, "insert", tuple({"id": i} for i in ids))


def _feed(events) -> list[Transaction]:
    grouper = TransactionGrouper()
    return [t for t in (grouper.feed(e) for e in events) if t is not None]


def test_grouper_xa_prepare_then_commit_or_rollback() -> None:
    x1, x2 = xid_text(b"x1", b"", 1), xid_text(b"x2", b"b", 7)
    out = _feed(
        [
            Begin((0, 1, 6), 1.0),
            Annotate(b"INSERT"),
            _rows("users", 1),
            Query("XA END X'7831',X'',1"),
            XaPrepare(x1),
            Begin((0, 1, 7), 2.0),
            Annotate(b"INSERT"),
            _rows("users", 2),
            Query("XA END X'7832',X'62',7"),
            XaPrepare(x2),
            Begin((0, 1, 8), 3.0, standalone=True),
            Query("XA COMMIT X'7831',X'',1"),
            Begin((0, 1, 9), 4.0, standalone=True),
            Query("xa rollback X'7832',X'62',7"),
            Begin((0, 1, 10), 5.0, standalone=True),
            Query("XA COMMIT X'7833',X'',1"),  # prepared before we read
        ]
    )
    assert [(t.gtid, t.xa) for t in out] == [
        ((0, 1, 6), "prepare"),
        ((0, 1, 7), "prepare"),
        ((0, 1, 8), "commit"),
        ((0, 1, 9), "rollback"),
        ((0, 1, 10), "commit"),
    ]
    committed = out[2]
    assert [r.images for r in committed.rows] == [({"id": 1},)] and committed.timestamp == 3.0
    assert out[3].rows == [] and not out[3].xa_unknown
    assert out[4].xa_unknown and out[4].rows == []


def test_grouper_savepoints_and_rollbacks_are_parsed_not_guessed() -> None:
    out = _feed(
        [
            Begin((0, 1, 1), 1.0),
            _rows("users", 4),
            Query("SAVEPOINT `s1`"),
            _rows("users", 5),
            Query("ROLLBACK TO `s1`"),
            Commit(),
            Begin((0, 1, 2), 1.0),
            _rows("users", 6),
            Query("/* app */ rollback work to savepoint s2"),
            Query("COMMIT"),
            Begin((0, 1, 3), 1.0),
            _rows("m", 7),
            Query("ROLLBACK"),  # rows that could not roll back (MyISAM)
            Begin((0, 1, 4), 1.0),
            Query("INSERT INTO users VALUES (1)"),
            Query("ROLLBACK"),  # nothing persisted
            Begin((0, 1, 5), 1.0),
            Query("UPDATE users SET a=1"),
            Query("COMMIT"),  # statement-logged change
        ]
    )
    assert [t.gtid[2] for t in out] == [1, 2, 3, 5]
    assert out[2].rolled_back and not out[0].rolled_back
    assert out[3].queries == [("", "UPDATE users SET a=1")]


def test_prepared_xa_holds_markers_until_the_decision_is_acknowledged() -> None:
    xa = PreparedXa()
    xa.prepared("x", (0, 1, 10), before={0: (1, 9)})
    assert xa.cap({0: (1, 8)}) == {0: (1, 8)}  # not past the prepare: unchanged
    assert xa.cap({0: (1, 12)}) == {0: (1, 9)}  # past it, undecided: held before it
    xa.decided("x", (0, 1, 15))
    assert xa.cap({0: (1, 12)}) == {0: (1, 9)}  # decided, but this flow has not acknowledged the decision
    assert xa.cap({0: (1, 15)}) == {0: (1, 15)}
    assert xa.cap({1: (2, 5)}) == {1: (2, 5)}  # another domain is not held
    xa.forget_decided([{0: (1, 15)}, {0: (1, 12)}])
    assert len(xa._holds) == 1
    xa.forget_decided([{0: (1, 15)}, {0: (1, 16)}])
    assert len(xa._holds) == 0


def test_bulk_statements_name_ruled_tables() -> None:
    rules = [Rule("app.users", ("user:{id}",)), Rule("app.posts", ("post:{id}",), on_truncate="flush")]
    d = BulkDetector(rules)

    def hits(sql: str, schema: str = "app") -> list[tuple[str, str]]:
        return [(c.rule.table, c.statement) for c in d.changes(Transaction((0, 1, 1), 1.0, ddl=sql, schema=schema))]

    assert hits("TRUNCATE TABLE users") == [("app.users", "truncate")]
    assert hits("TRUNCATE users", schema="other") == []
    assert hits("DROP TABLE IF EXISTS `users` /* generated by server */") == [("app.users", "drop")]
    assert hits("RENAME TABLE app.users TO app.users_old, app.users_new TO app.users", "x") == [("app.users", "rename")]
    assert hits("ALTER TABLE users RENAME TO u2") == [("app.users", "rename")]
    assert hits("ALTER TABLE posts TRUNCATE PARTITION p1") == [("app.posts", "partition")]
    assert hits("CREATE OR REPLACE TABLE posts (id INT)") == [("app.posts", "replace")]
    assert hits("DROP DATABASE app", "x") == [("app.posts", "drop database"), ("app.users", "drop database")]
    for keeps_rows in (
        "ALTER TABLE users ADD c INT",
        "ALTER TABLE users RENAME COLUMN a TO b",
        "CREATE TABLE users2 LIKE users",
        "ALTER TABLE users COMMENT 'rename to x'",
    ):
        assert hits(keeps_rows) == [], keeps_rows
    assert statement_kind("/* x */ update users set a=1") == "statement"


def test_drop_database_counts_only_the_ruled_tables_that_existed() -> None:
    rules = [Rule(f"ghost.t{i}", (f"t{i}:{{id}}",)) for i in range(3)] + [Rule("app.users", ("user:{id}",))]
    d = BulkDetector(rules)

    def hits(gtid: int, *statements: str, live: bool = True) -> list[str]:
        txn = Transaction((0, 1, gtid), 1.0, queries=[("app", sql) for sql in statements])
        return [c.rule.table for c in d.changes(txn, live=live)]

    drop = "DROP DATABASE IF EXISTS ghost"
    assert hits(5, drop) == ["ghost.t0", "ghost.t1", "ghost.t2"]  # nothing known: every ruled table counts
    d.know_existing({0: (1, 10)}, {("app", "users"), ("app", "other")})
    assert hits(9, drop) == ["ghost.t0", "ghost.t1", "ghost.t2"]  # at or before the snapshot: as if all existed
    assert hits(11, drop) == []  # ghost had none of them
    assert hits(12, "CREATE DATABASE ghost", "CREATE TABLE IF NOT EXISTS ghost.t1 (id INT)") == []
    assert hits(13, drop, live=False) == ["ghost.t0", "ghost.t1", "ghost.t2"]  # a catch-up reader: all
    assert hits(14, "/* x */ drop schema `ghost`") == ["ghost.t1"]
    assert hits(15, drop) == []  # dropped with its database
    assert hits(16, "DROP TABLE users") == ["app.users"]
    assert hits(17, "DROP DATABASE app") == []  # users was dropped before
    assert hits(18, "CREATE TABLE app.users LIKE app.u2", "RENAME TABLE ghost.x TO ghost.t2") == ["ghost.t2"]
    assert hits(19, "DROP DATABASE app", "DROP DATABASE ghost") == ["app.users", "ghost.t2"]
    assert d.existing == set()


def test_cascades_follow_foreign_key_chains_and_actions() -> None:
    rules = [Rule("app.posts", ("post:{id}",)), Rule("app.likes", ("like:{id}",))]
    d = BulkDetector(
        rules,
        cascades={
            ("app", "users"): [(("app", "posts"), "CASCADE", "RESTRICT", ("id",))],
            ("app", "posts"): [(("app", "comments"), "SET NULL", "CASCADE", ("id",))],
            ("app", "comments"): [(("app", "likes"), "CASCADE", "CASCADE", ("id",))],
        },
    )
    assert [c.rule.table for c in d.cascaded(("app", "users"), "delete")] == ["app.likes", "app.posts"]
    assert d.cascaded(("app", "users"), "update") == []  # ON UPDATE RESTRICT
    assert d.cascaded(("app", "users"), "insert") == []
    assert [c.rule.table for c in d.cascaded(("app", "comments"), "update")] == ["app.likes"]
    assert d.parents == {("app", "users"), ("app", "posts"), ("app", "comments")}


def test_only_an_update_of_a_referenced_column_cascades() -> None:
    """Both row images are logged: an update that leaves every referenced column as it was changes no child."""
    rules = [Rule("app.posts", ("post:{id}",)), Rule("app.tags", ("tag:{id}",))]
    d = BulkDetector(
        rules,
        cascades={
            ("app", "users"): [
                (("app", "posts"), "CASCADE", "CASCADE", ("id",)),
                (("app", "tags"), "RESTRICT", "SET NULL", ("handle", "realm")),
            ],
            ("app", "legacy"): [(("app", "posts"), "CASCADE", "CASCADE", ())],  # columns unknown: any update
        },
    )

    def update(table: str, *pairs: tuple[dict, dict]) -> list[str]:
        images = tuple(image for pair in pairs for image in pair)
        return [c.rule.table for c in d.cascaded(("app", table), "update", changed_columns(images))]

    row = {"id": 1, "handle": "h", "realm": "r", "last_seen": 10}
    assert update("users", (row, {**row, "last_seen": 11})) == []
    assert update("users", (row, {**row, "id": 2})) == ["app.posts"]
    assert update("users", (row, {**row, "realm": None})) == ["app.tags"]
    assert update("users", (row, {**row, "last_seen": 11}), (row, {**row, "handle": "g"})) == ["app.tags"]
    assert update("legacy", (row, {**row, "last_seen": 11})) == ["app.posts"]
    assert changed_columns(({"ID": 1, "x": 1}, {"ID": 2, "x": 1})) == {"id"}  # names compare in lower case
    # unknown changes (None) still cascade; deletes always do
    assert [c.rule.table for c in d.cascaded(("app", "users"), "update")] == ["app.posts", "app.tags"]
    assert [c.rule.table for c in d.cascaded(("app", "users"), "delete")] == ["app.posts"]


# -- real MariaDB + memcached -------------------------------------------------------------------------------------

MYISAM = "CREATE TABLE mtab (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=MyISAM"


def _with(text: str, table_suffix: str, line: str) -> str:
    """The topology text with `line` added to the rule whose table ends in `table_suffix`."""
    out = []
    for row in text.splitlines():
        out.append(row)
        if row.startswith("table = ") and row.rstrip('"').endswith(table_suffix):
            out.append(line)
    return "\n".join(out) + "\n"


def _flushing_posts(squeal_env) -> SquealEnv:
    """A SquealEnv (not started) whose posts rule says `on_truncate = "flush"`."""
    env = squeal_env()
    env.topology.write_text(_with(env.topology.read_text(), ".posts", 'on_truncate = "flush"'))
    return env


def _healthz(env: SquealEnv) -> tuple[int, dict]:
    return healthz(env.daemon.port)


def _set_everywhere(env: SquealEnv, keys: list[str]) -> None:
    for c in env.caches:
        c.set_many(keys)


def _still_cached(env: SquealEnv, keys: list[str]) -> bool:
    return all(c.present(keys) == set(keys) for c in env.caches)


def test_xa_commit_invalidates_and_xa_rollback_does_not(squeal_env) -> None:
    env = squeal_env().start()
    env.sql("INSERT INTO users VALUES (1, 'a@x', 'a'), (2, 'b@x', 'b')")
    env.fence()
    _set_everywhere(env, ["user:1", "user:email:a@x", "user:2"])
    for xid, change in (
        ("sq1", "UPDATE users SET email='a2@x' WHERE id=1"),
        ("sq2", "UPDATE users SET name='never' WHERE id=2"),
    ):
        with env.connect() as conn, conn.cursor() as cur:  # one prepared XA per session
            for stmt in (f"XA START '{xid}'", change, f"XA END '{xid}'", f"XA PREPARE '{xid}'"):
                cur.execute(stmt)
    env.sql("XA COMMIT 'sq1'", "XA ROLLBACK 'sq2'")
    wait_gone(env.caches, ["user:1", "user:email:a@x", "user:email:a2@x"])
    env.fence()
    assert _still_cached(env, ["user:2"])  # rolled back: nothing to invalidate


def test_xa_prepared_before_a_restart_and_committed_after_it(squeal_env) -> None:
    env = squeal_env().start()
    env.sql("INSERT INTO users VALUES (3, 'c@x', 'c')")
    env.fence()
    env.markers_cover()  # every flow checkpointed once: its write counter exists
    before = env.marker_writes()
    _set_everywhere(env, ["user:3", "user:email:c@x"])
    with env.connect() as conn, conn.cursor() as cur:
        for stmt in ("XA START 'sq3'", "UPDATE users SET email='c2@x' WHERE id=3", "XA END 'sq3'", "XA PREPARE 'sq3'"):
            cur.execute(stmt)
    env.fence()  # a later transaction is acknowledged: without the hold the marker would pass the prepare
    env.checkpointed(before)  # markers written since (held before the prepare)
    env.daemon.stop()
    env.daemon.start()
    assert _still_cached(env, ["user:3"])  # not committed yet
    with env.connect() as conn, conn.cursor() as cur:
        cur.execute("XA COMMIT 'sq3'")
    wait_gone(env.caches, ["user:3", "user:email:c@x", "user:email:c2@x"])


def test_rollback_to_savepoint_inside_a_committed_transaction(squeal_env) -> None:
    env = squeal_env().start()
    env.sql(MYISAM)
    env.fence()
    _set_everywhere(env, ["user:10", "user:11"])
    with env.connect() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO users VALUES (10, 'p@x', 'p')")
        cur.execute("SAVEPOINT s1")
        cur.execute("INSERT INTO mtab VALUES (1, 'persisted')")  # non-transactional, between SAVEPOINT and ROLLBACK TO
        cur.execute("INSERT INTO users VALUES (11, 'q@x', 'q')")
        cur.execute("ROLLBACK TO SAVEPOINT s1")
        cur.execute("COMMIT")
    wait_gone(env.caches, ["user:10"])


def test_rows_of_a_non_transactional_table_in_a_rolled_back_transaction(squeal_env) -> None:
    env = squeal_env()
    rule = f'[[rules]]\ntable = "{env.schema}.mtab"\nkeys = ["m:{{id}}"]\n\n[regions.east]'
    env.topology.write_text(env.topology.read_text().replace("[regions.east]", rule))
    env.sql(MYISAM)
    env.start()
    _set_everywhere(env, ["m:1", "m:2", "user:20"])
    with env.connect() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO users VALUES (20, 'r@x', 'r')")
        cur.execute("INSERT INTO mtab VALUES (1, 'a'), (2, 'b')")
        cur.execute("ROLLBACK")
    assert env.sql("SELECT COUNT(*) FROM mtab")[0][0] == 2  # MyISAM kept them
    wait_gone(env.caches, ["m:1", "m:2"])


def test_truncate_drop_and_rename_of_ruled_tables_alert(squeal_env) -> None:
    env = squeal_env().start()
    env.sql("INSERT INTO users VALUES (30, 'z@x', 'z')", "CREATE TABLE users_new LIKE users")
    env.fence()
    _set_everywhere(env, ["user:30", "post:1"])
    env.sql("TRUNCATE TABLE users")
    env.sql("RENAME TABLE users TO users_old, users_new TO users")
    env.sql("DROP TABLE posts")
    env.fence()
    assert _still_cached(env, ["user:30", "post:1"])  # "alert" deletes nothing...
    metrics = scrape(env.daemon.port)
    for table, statement in (
        (f"{env.schema}.users", "truncate"),
        (f"{env.schema}.users", "rename"),
        (f"{env.schema}.posts", "drop"),
    ):
        name = f'squeal_bulk_changes_total{{policy="alert",statement="{statement}",table="{table}"}}'
        assert metrics.get(name) == 1.0, (name, {k: v for k, v in metrics.items() if "bulk" in k})
    log = env.log()
    assert f"TRUNCATE of ruled table {env.schema}.users" in log and "ERROR" in log  # ...but says so, loudly
    assert "user:{id}, user:email:{email}" in log
    status, health = _healthz(env)
    assert [a["statement"] for a in health["alerts"]] == ["truncate", "rename", "drop"]
    assert status == 200  # an alert is not a stall


def test_truncate_with_the_flush_policy_flushes_every_destination(squeal_env) -> None:
    env = _flushing_posts(squeal_env)
    env.start()
    env.sql("INSERT INTO posts VALUES (1, 7, 't')")
    env.fence()
    unrelated = ["post:1", "feed:7", "some:other:key"]
    _set_everywhere(env, unrelated)
    env.sql("TRUNCATE TABLE users")  # policy alert: nothing flushed
    env.fence()
    assert _still_cached(env, unrelated)
    env.sql("TRUNCATE TABLE posts")
    wait_gone(env.caches, unrelated)
    metrics = scrape(env.daemon.port)
    assert sum(v for k, v in metrics.items() if k.startswith("squeal_flushes_total")) >= len(env.caches)


def test_foreign_key_cascades_to_a_ruled_table_apply_its_policy(squeal_env) -> None:
    """MariaDB does not log the child rows an ON DELETE CASCADE changes: the parent's delete must count."""
    env = _flushing_posts(squeal_env)
    env.sql(
        "CREATE TABLE authors (id INT PRIMARY KEY) ENGINE=InnoDB",
        "ALTER TABLE posts ADD FOREIGN KEY (author_id) REFERENCES authors (id) ON DELETE CASCADE",
        "INSERT INTO authors VALUES (1), (2)",
        "INSERT INTO posts VALUES (1, 1, 't'), (2, 2, 't')",
    )
    env.start()
    _set_everywhere(env, ["post:1", "feed:1", "post:2"])
    env.sql("INSERT INTO authors VALUES (3)")  # an insert cascades nothing
    env.fence()
    assert _still_cached(env, ["post:1", "feed:1", "post:2"])
    env.sql("DELETE FROM authors WHERE id = 1")
    assert env.sql("SELECT COUNT(*) FROM posts WHERE author_id = 1")[0][0] == 0  # InnoDB deleted post 1
    wait_gone(env.caches, ["post:1", "feed:1"])
    name = f'squeal_bulk_changes_total{{policy="flush",statement="cascade",table="{env.schema}.posts"}}'
    assert scrape(env.daemon.port).get(name) == 1.0


def test_an_update_cascades_only_when_it_changes_the_referenced_column(squeal_env) -> None:
    """ON UPDATE CASCADE with on_truncate = "flush": an UPDATE of a parent column no foreign key references
    changes no child row, so it must not flush the region; changing the referenced column must."""
    env = _flushing_posts(squeal_env)
    env.sql(
        "CREATE TABLE authors (id INT PRIMARY KEY, handle VARCHAR(20), seen INT) ENGINE=InnoDB",
        "ALTER TABLE posts ADD FOREIGN KEY (author_id) REFERENCES authors (id) ON UPDATE CASCADE",
        "INSERT INTO authors VALUES (1, 'a', 0), (2, 'b', 0)",
        "INSERT INTO posts VALUES (1, 1, 't')",
    )
    env.start()
    unrelated = ["post:1", "feed:1", "other:key"]
    _set_everywhere(env, unrelated)
    env.sql("UPDATE authors SET seen = seen + 1, handle = 'c'")  # both rows, no referenced column
    env.fence()
    assert _still_cached(env, unrelated), "an update of unreferenced columns flushed the region"
    name = f'squeal_bulk_changes_total{{policy="flush",statement="cascade",table="{env.schema}.posts"}}'
    assert scrape(env.daemon.port).get(name) is None
    env.sql("UPDATE authors SET id = 3, seen = 5 WHERE id = 1")
    assert env.sql("SELECT author_id FROM posts WHERE id = 1")[0][0] == 3  # InnoDB changed the post
    wait_gone(env.caches, unrelated)
    assert scrape(env.daemon.port).get(name) == 1.0


def test_drop_database_if_exists_of_a_database_that_does_not_exist_alerts_for_nothing(squeal_env) -> None:
    """Only the ruled tables a DROP DATABASE removed may be stale: one that did not exist alerts for nothing."""
    ghost = f"{unique_db('ghost')}"
    env = squeal_env(extra_rules=[(f"{ghost}.t{i}", [f"g{i}:{{id}}"]) for i in range(4)]).start()
    env.fence()
    env.sql(f"DROP DATABASE IF EXISTS {ghost}")
    env.fence()
    assert env.log().count("may be stale") == 0, env.log()
    assert not [k for k in scrape(env.daemon.port) if k.startswith("squeal_bulk_changes_total")]
    env.sql(f"CREATE DATABASE {ghost}", f"CREATE TABLE {ghost}.t2 (id INT PRIMARY KEY)", f"DROP DATABASE {ghost}")
    env.fence()
    assert env.log().count("may be stale") == 1, env.log()
    assert f"DROP DATABASE of ruled table {ghost}.t2 " in env.log()
    assert (
        scrape(env.daemon.port).get(
            f'squeal_bulk_changes_total{{policy="alert",statement="drop database",table="{ghost}.t2"}}'
        )
        == 1.0
    )


# -- binlog data loss ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lonely_db(tmp_path_factory: pytest.TempPathFactory):
    """A primary of our own: these tests purge its binlogs."""
    db = MariaDB(41, workdir=tmp_path_factory.mktemp("purged") / "db").start()
    yield db
    db.stop(grace=5)


def _purge_behind_squeal(env: SquealEnv) -> None:
    """Stop squeal, commit changes, rotate and purge the binlogs that hold them."""
    env.daemon.stop()
    for i in range(3):
        env.sql(f"INSERT INTO users VALUES ({100 + i}, 'lost{i}@x', 'lost')", "FLUSH BINARY LOGS")
    newest = env.db.execute("SHOW BINARY LOGS")[-1][0]
    env.db.execute(f"PURGE BINARY LOGS TO '{newest}'")


def _marker(env: SquealEnv, flow: str) -> g.Position:
    return g.parse_position(json.loads((env.state_dir / f"{flow}.marker").read_text())["position"])


def test_purged_binlog_with_flush_policy_flushes_and_resumes(lonely_db, tmp_path: Path) -> None:
    env = SquealEnv(tmp_path / "flush", lonely_db)
    try:
        env.topology.write_text(env.topology.read_text().replace("[squeal]\n", '[squeal]\non_data_loss = "flush"\n'))
        env.start()
        env.fence()
        env.markers_cover()  # the markers hold the fence
        _purge_behind_squeal(env)
        _set_everywhere(env, ["user:100", "user:101", "unrelated"])
        env.daemon.start()
        wait_gone(env.caches, ["user:100", "user:101", "unrelated"])  # everything flushed
        log = env.log()
        assert "DATA LOSS" in log and "lost GTIDs" in log and 'on_data_loss = "flush"' in log
        assert scrape(env.daemon.port).get('squeal_data_loss_total{policy="flush"}') == 1.0
        env.fence()  # and it delivers again
        assert _healthz(env)[0] == 200
    finally:
        env.stop()


def test_purged_binlog_with_halt_policy_stops_loudly_until_accepted(lonely_db, tmp_path: Path) -> None:
    env = SquealEnv(tmp_path / "halt", lonely_db)  # on_data_loss defaults to "halt"
    try:
        env.start()
        env.fence()
        env.markers_cover()
        _purge_behind_squeal(env)
        _set_everywhere(env, ["user:100", "unrelated"])
        env.daemon.start()  # started: it serves /healthz, with a 503 while halted

        def halted() -> bool:
            try:
                status, health = _healthz(env)
            except OSError:
                return False
            return status == 503 and any("DATA LOSS" in p for p in health["problems"].values())

        wait_until(halted, 30, "/healthz to report the halt")
        status, health = _healthz(env)
        reason = next(iter(health["problems"].values()))
        assert "accept-data-loss" in reason and "lost GTIDs" in reason
        assert scrape(env.daemon.port).get("squeal_halted") == 1.0
        assert _still_cached(env, ["user:100", "unrelated"])  # halted: nothing flushed, nothing sent
        # The documented one-command recovery.
        done = accept_data_loss(env.topology, env.state_dir)
        assert done.returncode == 0, done.stderr
        wait_gone(env.caches, ["user:100", "unrelated"])
        wait_until(lambda: _healthz(env)[0] == 200, 15, "/healthz 200 after recovery")
        env.fence()
        assert scrape(env.daemon.port).get("squeal_halted") == 0.0
    finally:
        env.stop()
