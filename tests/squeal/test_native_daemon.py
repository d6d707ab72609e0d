"""`squeal run` with `[squeal] reader = "native"`: the Rust reader inside the real daemon.

The keys and the grouping are proven identical to the python reader by test_native_reader.py; this checks
the wiring: the daemon picks the native reader, deletes reach every cluster after the commit, `/* mcd: */`
comments and regional keys work, squeal (not the extension) reconnects after a lost binlog connection and
resumes from its last committed GTID, and a rule the native reader cannot render makes the daemon fall
back to python-mysql-replication with a warning instead of guessing keys.
"""

from __future__ import annotations

import time

import pytest
from squeal_helpers import SquealEnv, scrape, wait_gone, wait_until

from squeal.read.native import native_module

# No skip when the extension is missing: it is part of the package (scripts/setup.sh, `pip install .`), and a
# skipped differential test would let CI pass without the default reader.
native_module()


def native_env(base, db, extra_rules=()) -> SquealEnv:
    e = SquealEnv(base, db, extra_rules=extra_rules)
    e.topology.write_text(e.topology.read_text().replace("[squeal]\n", '[squeal]\nreader = "native"\n', 1))
    return e.start()


@pytest.fixture(scope="module")
def env(primary, tmp_path_factory):
    e = native_env(tmp_path_factory.mktemp("native"), primary)
    yield e
    e.stop()


def test_the_daemon_reads_with_the_native_reader(env: SquealEnv) -> None:
    keys = ["user:1", "user:email:one@x", "user:email:uno@x", "post:1", "feed:1", "by:comment"]
    for c in env.caches:
        c.set_many(keys)
    env.sql("INSERT INTO users VALUES (1, 'one@x', 'One')")
    with env.connect(autocommit=False) as conn, conn.cursor() as cur:
        cur.execute("/* mcd:by:comment */ UPDATE users SET email = 'uno@x' WHERE id = 1")
        cur.execute("INSERT INTO posts VALUES (1, 1, 'p')")
        conn.commit()
    wait_gone(env.caches, keys)
    assert "binlog reader: native (squeal_native)" in env.log()
    metrics = scrape(env.daemon.port)
    assert metrics['squeal_rows_total{reader="live"}'] >= 3
    assert metrics['squeal_keys_total{source="comment"}'] >= 1


def test_squeal_reconnects_the_native_reader_from_its_last_commit(env: SquealEnv) -> None:
    env.fence()
    before = scrape(env.daemon.port).get('squeal_reader_reconnects_total{reader="live"}', 0)
    dumps = [row[0] for row in env.db.execute("SHOW PROCESSLIST") if row[4] == "Binlog Dump"]
    assert dumps, "no binlog dump thread"
    for thread in dumps:
        env.db.execute(f"KILL {thread}")
    keys = ["user:2", "user:email:two@x"]
    for c in env.caches:
        c.set_many(keys)
    env.sql("INSERT INTO users VALUES (2, 'two@x', 'Two')")
    wait_gone(env.caches, keys, timeout=20)
    wait_until(
        lambda: scrape(env.daemon.port).get('squeal_reader_reconnects_total{reader="live"}', 0) > before,
        10,
        "the reconnect to be counted",
    )


def test_a_rule_the_native_reader_cannot_render_falls_back_to_python(primary, tmp_path) -> None:
    e = SquealEnv(tmp_path, primary)
    try:
        e.sql("CREATE TABLE floaty (id INT PRIMARY KEY, f FLOAT)")
        text = e.topology.read_text().replace("[squeal]\n", '[squeal]\nreader = "native"\n', 1)
        text += f'\n[[rules]]\ntable = "{e.schema}.floaty"\nkeys = ["f:{{f}}"]\n'
        e.topology.write_text(text)
        e.start()
        for c in e.caches:
            c.set("f:1.5")
        e.sql("INSERT INTO floaty VALUES (1, 1.5)")
        wait_gone(e.caches, ["f:1.5"])
        deadline = time.monotonic() + 5
        while "reading with python-mysql-replication instead" not in e.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"{e.schema}.floaty.f is float" in e.log()
    finally:
        e.stop()


FILTERED_RULE = """
[[rules]]
table = "{schema}.articles"
keys = ["art:{{id}}"]
when_changed = ["title", "status"]
where = "status != 'draft'"
"""


@pytest.mark.parametrize("reader", ["native", "python"])
def test_rule_filters_in_the_daemon(primary, tmp_path, reader: str) -> None:
    """An UPDATE changing no watched column, and a draft, send nothing: their cached copies stay (proven by a
    later change's delete arriving, in commit order); the rest is deleted; both are counted."""
    e = SquealEnv(tmp_path, primary)
    try:
        e.sql(
            "CREATE TABLE articles (id INT PRIMARY KEY, status VARCHAR(20), views INT, title VARCHAR(50))",
            "INSERT INTO articles VALUES (1, 'live', 0, 'a'), (2, 'draft', 0, 'b'), (3, 'live', 0, 'c')",
        )
        text = e.topology.read_text().replace("[squeal]\n", f'[squeal]\nreader = "{reader}"\n', 1)
        e.topology.write_text(text + FILTERED_RULE.format(schema=e.schema))
        e.start()
        for c in e.caches:
            c.set_many(["art:1", "art:2", "art:3"])
        e.sql(
            "UPDATE articles SET views = views + 1",  # when_changed: nothing watched changed (3 rows)
            "UPDATE articles SET title = 'b2' WHERE id = 2",  # where: a draft before and after
            "UPDATE articles SET title = 'c2' WHERE id = 3",
        )  # sent
        wait_gone(e.caches, ["art:3"])
        e.fence()
        for c in e.caches:
            assert c.present(["art:1", "art:2"]) == {"art:1", "art:2"}
        e.sql("UPDATE articles SET status = 'live' WHERE id = 2")  # leaving the filtered set: sent
        wait_gone(e.caches, ["art:2"])
        metrics = scrape(e.daemon.port)
        assert metrics[f'squeal_rule_filtered_total{{reason="when_changed",table="{e.schema}.articles"}}'] == 3
        assert metrics[f'squeal_rule_filtered_total{{reason="where",table="{e.schema}.articles"}}'] == 1
        assert ("binlog reader: native" in e.log()) == (reader == "native")
    finally:
        e.stop()
