"""The native reader (squeal_native, Rust) against the reference (python-mysql-replication), differentially.

One binlog corpus written by a real MariaDB covers every change kind of docs/squeal.md's guarantees table:
single and multi-row INSERT/UPDATE/DELETE, key-column updates, NULL / utf8mb4 / binary / long / spaced keys,
every column type the native reader renders (and some it only skips), DDL mid-stream (a templated column
dropped and added back), XA (commit, rollback, one phase, a prepare across other transactions), savepoints,
MyISAM (alone, and in a rolled-back transaction), `/* mcd: */` comments, TRUNCATE, a statement-logged
change, foreign-key cascades, a transaction larger than the native reader's merge size, and tables without
rules. Both readers decode it through the same `ReadLoop` (grouping, key stage) and must hand on the
identical sequence of (GTID, delete lines per destination kind, flush). With its runs (the native data plane:
ordinary transactions grouped in Rust, `CommittedRun`), the native reader must hand on the same lines in the
same transaction order, each run ending where a transaction of the reference ends.
"""

from __future__ import annotations

import pytest
from differential import decode, regroup, stage_for
from squeal_helpers import unique_db

from router_config import Rule, predicate
from squeal.keys.bulk import load_cascades
from squeal.keys.pipeline import KeyStage, ReadLoop
from squeal.keys.rules import KeyExtractor, delete_line
from squeal.read import gtid as g
from squeal.read.native import NativeBinlogReader, NativeUnavailable, native_module, native_problems
from squeal.read.reader import BinlogReader, Source

# No skip when the extension is missing: it is part of the package (scripts/setup.sh, `pip install .`), and a
# skipped differential test would let CI pass without the default reader.
native_module()

TABLES = """
CREATE TABLE users (
  id INT PRIMARY KEY, email VARCHAR(300), name VARCHAR(200) CHARACTER SET utf8mb4, bin VARBINARY(300),
  amount DECIMAL(14,4), tiny DECIMAL(12,10), born DATE, seen DATETIME(3), y YEAR, big BIGINT UNSIGNED,
  neg SMALLINT, t TEXT, b BLOB, f FLOAT, kind ENUM('a','b','c'), tags SET('x','y'), ts TIMESTAMP NULL,
  c CHAR(10), m MEDIUMINT UNSIGNED
) ENGINE=InnoDB;
CREATE TABLE posts (id INT PRIMARY KEY, author_id INT, title VARCHAR(200)) ENGINE=InnoDB;
CREATE TABLE counters (id INT PRIMARY KEY, v INT) ENGINE=MyISAM;
CREATE TABLE other (id INT PRIMARY KEY, v VARCHAR(200)) ENGINE=InnoDB;
CREATE TABLE parent (id INT PRIMARY KEY, note VARCHAR(20)) ENGINE=InnoDB;
CREATE TABLE child (id INT PRIMARY KEY, parent_id INT, FOREIGN KEY (parent_id) REFERENCES parent(id)
  ON DELETE CASCADE ON UPDATE CASCADE) ENGINE=InnoDB;
CREATE TABLE evolving (id INT PRIMARY KEY, a VARCHAR(20), b VARCHAR(20)) ENGINE=InnoDB;
CREATE TABLE articles (id INT PRIMARY KEY, status VARCHAR(20), owner_id INT, views INT, title VARCHAR(100),
  body MEDIUMTEXT) ENGINE=InnoDB;
CREATE TABLE scores (id INT PRIMARY KEY, score DECIMAL(6,2), views INT) ENGINE=InnoDB;
"""


def rules_for(schema: str) -> list[Rule]:
    return [
        Rule(
            table=f"{schema}.users",
            keys=(
                "user:{id}",
                "user:email:{email}",
                "name:{name}",
                "bin:{bin}",
                "amt:{amount}",
                "tiny:{tiny}",
                "born:{born}",
                "seen:{seen}",
                "y:{y}",
                "big:{big}",
                "neg:{neg}",
                "t:{t}:{id}",
                "b:{b}",
                "c:{c}",
                "m:{m}",
                "region:user:{id}",
                "pair:{id}:{email}",
            ),
        ),
        Rule(table=f"{schema}.posts", keys=("post:{id}", "feed:{author_id}"), on_truncate="flush"),
        Rule(table=f"{schema}.counters", keys=("counter:{id}",)),
        Rule(table=f"{schema}.child", keys=("child:{id}",), on_truncate="flush"),
        Rule(table=f"{schema}.evolving", keys=("ev:{a}", "evb:{b}:{id}")),
        Rule(table=f"{schema}.latin", keys=("latin:{v}",)),
        # filters: when_changed (+ the templated id, owner_id) and a string/IN/NULL `where`; a numeric one
        Rule(
            table=f"{schema}.articles",
            keys=("art:{id}", "owner:{owner_id}"),
            when_changed=("title", "status"),
            where=predicate.parse("status != 'draft' OR owner_id IN (7, 8)"),
        ),
        Rule(table=f"{schema}.scores", keys=("score:{id}",), where=predicate.parse("score >= 1.5 AND NOT views < 10")),
    ]


NOTED: dict[str, tuple[int, int, int]] = {}  # GTIDs of the workload's transactions that tests look at


def workload(conn, other, schema: str) -> None:
    """Every statement kind, committed one transaction at a time (PyMySQL sends comments as written)."""
    cur = conn.cursor()

    def tx(*statements: str) -> None:
        for s in statements:
            cur.execute(s)
        conn.commit()

    long_email = "x" * 240 + "@example.com"
    # latin1 (Windows-1252 to Python): every byte it defines, as stored bytes
    cp1252 = bytes(b for b in range(0x20, 0x100) if b not in (0x7F, 0x81, 0x8D, 0x8F, 0x90, 0x9D))
    tx(f"INSERT INTO latin VALUES (1, _latin1 x'{cp1252[:100].hex()}'), (2, _latin1 x'{cp1252[100:].hex()}')")
    tx(
        "INSERT INTO users (id, email, name, bin, amount, tiny, born, seen, y, big, neg, t, b, f, kind, tags, ts, c, m)"
        " VALUES (1, 'a@x', 'Ann', x'00ff10', 12.5, 0.0000001, '2024-02-29', '2024-01-02 03:04:05.678', 1999,"
        " 18446744073709551615, -32768, 'text one', x'cafe', 1.5, 'a', 'x,y', '2024-01-01 00:00:00', 'ch', 16777215)"
    )
    tx(
        "INSERT INTO users (id, email, name) VALUES (2, 'b@x', 'Bj\u00f6rk \U0001f600'), (3, NULL, NULL),"
        f" (4, '{long_email}', 'has space'), (5, 'e@x', '')"
    )
    tx(
        "INSERT INTO users (id, email, amount, tiny, born, seen) VALUES"
        " (6, 'f@x', -0.0001, 0.0000000000, '0000-00-00', '0000-00-00 00:00:00'),"
        " (7, 'g@x', 99999999.9999, 0.1, '1000-01-01', '9999-12-31 23:59:59.999')"
    )
    tx("UPDATE users SET email = 'a2@x' WHERE id = 1")  # key-column update: old and new key
    tx("UPDATE users SET name = CONCAT(name, '!') WHERE id IN (1, 2, 3, 4)")  # multi-row update
    tx("UPDATE users SET bin = x'80', y = 2155 WHERE id = 2", "DELETE FROM users WHERE id = 5")
    tx("/* mcd:comment:one,comment:two */ UPDATE users SET big = 0 WHERE id = 1")
    tx("/* mcd:on:other */ INSERT INTO other VALUES (1, 'unruled')")  # a comment on a table without rules
    tx("INSERT INTO other VALUES (2, 'no keys at all')")
    # posts: feed:{author_id} rendered again by every post of one author (sent once)
    tx(*(f"INSERT INTO posts VALUES ({i}, {i % 3}, 'p{i}')" for i in range(1, 40)))
    tx("UPDATE posts SET author_id = author_id + 10 WHERE id < 20")
    # DDL mid-stream: a templated column dropped (rendered nothing, counted missing) and added back
    tx("INSERT INTO evolving VALUES (1, 'a1', 'b1')")
    cur.execute("ALTER TABLE evolving DROP COLUMN b")
    tx("INSERT INTO evolving VALUES (2, 'a2')", "UPDATE evolving SET a = 'a1x' WHERE id = 1")
    cur.execute("ALTER TABLE evolving ADD COLUMN b VARCHAR(20) DEFAULT 'back'")
    tx("INSERT INTO evolving (id, a) VALUES (3, 'a3')")
    cur.execute("ALTER TABLE users ADD COLUMN late INT DEFAULT 7")  # column order moves nothing templated
    tx("UPDATE users SET late = 8 WHERE id = 1")
    # XA: prepare, other work, then commit; rollback; one phase
    for stmt in ("XA START 'x1'", "UPDATE users SET email = 'xa@x' WHERE id = 2", "XA END 'x1'", "XA PREPARE 'x1'"):
        cur.execute(stmt)
    with other.cursor() as cur2:  # another session commits between the prepare and its decision
        cur2.execute("INSERT INTO posts VALUES (100, 7, 'between')")
    other.commit()
    cur.execute("XA COMMIT 'x1'")
    for stmt in (
        "XA START 'x2'",
        "DELETE FROM users WHERE id = 7",
        "XA END 'x2'",
        "XA PREPARE 'x2'",
        "XA ROLLBACK 'x2'",
    ):
        cur.execute(stmt)
    for stmt in (
        "XA START 'x3'",
        "UPDATE users SET email = 'one@x' WHERE id = 6",
        "XA END 'x3'",
        "XA COMMIT 'x3' ONE PHASE",
    ):
        cur.execute(stmt)
    # savepoints
    cur.execute("BEGIN")
    cur.execute("INSERT INTO posts VALUES (200, 1, 'kept')")
    cur.execute("SAVEPOINT s1")
    cur.execute("INSERT INTO posts VALUES (201, 1, 'rolled back to the savepoint')")
    cur.execute("INSERT INTO counters VALUES (1, 1)")  # MyISAM after the savepoint: the rollback is logged
    cur.execute("ROLLBACK TO SAVEPOINT s1")
    cur.execute("INSERT INTO posts VALUES (202, 2, 'after')")
    conn.commit()
    # MyISAM alone, and inside a transaction that rolls back (its rows persisted)
    tx("INSERT INTO counters VALUES (2, 2), (3, 3)")
    cur.execute("BEGIN")
    cur.execute("INSERT INTO posts VALUES (300, 3, 'rolled back')")
    cur.execute("UPDATE counters SET v = v + 1 WHERE id = 2")
    conn.rollback()
    # a rolled-back InnoDB-only transaction never reaches the binlog
    cur.execute("INSERT INTO posts VALUES (301, 3, 'never')")
    conn.rollback()
    # foreign-key cascade: only the parent's row is logged
    tx("INSERT INTO parent VALUES (1, 'a'), (2, 'b'), (3, 'c')", "INSERT INTO child VALUES (10, 1), (20, 2)")
    tx("DELETE FROM parent WHERE id = 1")
    # an update of a parent column no foreign key references cascades nothing; one of the referenced one does
    tx("UPDATE parent SET note = 'n'")
    cur.execute("SELECT @@last_gtid")
    NOTED["parent update, no cascade"] = g.parse_gtid(cur.fetchone()[0])
    tx("UPDATE parent SET id = 4, note = 'm' WHERE id = 2")
    cur.execute("SELECT @@last_gtid")
    NOTED["parent update, cascade"] = g.parse_gtid(cur.fetchone()[0])
    # statement-logged change to a ruled table, then TRUNCATE (no row images)
    cur.execute("SET SESSION binlog_format = 'STATEMENT'")
    tx("UPDATE posts SET title = 'stmt' WHERE id = 1")
    cur.execute("SET SESSION binlog_format = 'ROW'")
    cur.execute(f"TRUNCATE TABLE {schema}.posts")
    # one transaction bigger than a merged native event (4,096 keys): 3,000 rows x 2+ keys
    cur.execute("BEGIN")
    for start in range(1000, 4000, 500):
        values = ", ".join(f"({i}, 'bulk{i}@x', 'n{i}')" for i in range(start, start + 500))
        cur.execute(f"INSERT INTO users (id, email, name) VALUES {values}")
    cur.execute("UPDATE users SET name = 'all' WHERE id >= 1000")
    conn.commit()
    tx("DELETE FROM users WHERE id >= 1000")
    # rule filters (FILTERED below counts what each statement skips)
    tx(
        "INSERT INTO articles VALUES (1, 'draft', 1, 0, 'a', 'x'), (2, 'live', 2, 0, 'b', 'x'),"
        " (3, NULL, 7, 0, 'c', NULL), (4, 'draft', 8, 0, 'd', 'x')"
    )  # 1: where
    tx("UPDATE articles SET views = views + 1, body = 'edited'")  # 4: when_changed
    tx("UPDATE articles SET status = 'live' WHERE id = 1", "UPDATE articles SET status = 'draft' WHERE id = 2")
    tx("UPDATE articles SET title = 'b2' WHERE id = 2")  # 1: where (a draft before and after)
    tx("UPDATE articles SET owner_id = 3 WHERE id = 3")  # a templated column changed: sent
    tx("DELETE FROM articles WHERE id = 4")
    tx("INSERT INTO scores VALUES (1, 2.50, 20), (2, 1.00, 20), (3, NULL, 20), (4, 9.99, 5), (5, 1.5, NULL)")  # 4
    cur.close()


FILTERED = {("articles", "where"): 2, ("articles", "when_changed"): 4, ("scores", "where"): 4}


@pytest.fixture(scope="module")
def corpus(mariadb_pair):
    """(db, schema, rules, cascades, start, end): the binlog range holding the workload."""
    db, _replica = mariadb_pair
    schema = unique_db("native")
    db.execute(f"CREATE DATABASE {schema} CHARACTER SET utf8mb4")  # (the server's default is latin1)
    with db.connect(schema) as conn, conn.cursor() as cur:
        for stmt in filter(str.strip, TABLES.split(";")):
            cur.execute(stmt)
        cur.execute("CREATE TABLE latin (id INT PRIMARY KEY, v VARCHAR(200) CHARACTER SET latin1)")
        cur.execute("CREATE TABLE greek (id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET greek)")
    start = g.parse_position(db.gtid_binlog_pos())
    with db.connect(schema, autocommit=False) as conn, db.connect(schema, autocommit=False) as other:
        workload(conn, other, schema)
    end = g.parse_position(db.gtid_binlog_pos())
    with db.connect() as conn:
        cascades = load_cascades(conn)
    return db, schema, rules_for(schema), cascades, start, end


def decode_native(corpus, runs: bool) -> tuple[list[tuple], KeyStage]:
    db, schema, rules, cascades, start, end = corpus
    source = Source(db.host, db.port, db.user, db.password)
    stage = stage_for(rules, cascades)
    native = decode(
        lambda s: NativeBinlogReader(
            source,
            s,
            stage.extractor.tables | stage.bulk.parents,
            stage.extractor.templates,
            stage.bulk.parents,
            name="native",
            filters=stage.extractor.filters,
            regional_prefixes=stage.regional_prefixes,
            runs=runs,
        ),
        stage,
        start,
        end,
    )
    return native, stage


def test_both_readers_hand_on_identical_transactions(corpus):
    db, schema, rules, cascades, start, end = corpus
    source = Source(db.host, db.port, db.user, db.password)

    py_stage = stage_for(rules, cascades)
    tables = py_stage.extractor.tables | py_stage.bulk.parents
    python = decode(lambda s: BinlogReader(source, s, tables, name="python"), py_stage, start, end)

    for runs in (False, True):
        native, native_stage = decode_native(corpus, runs)
        expected = regroup(python, native) if runs else python
        assert len(native) == len(expected)
        for p, n in zip(expected, native, strict=True):
            assert n[:4] == p[:4], f"runs={runs}, GTID {p[0]}: python {p[1:]!r}\nnative {n[1:]!r}"
            assert n[5] == p[5]
        # the same transactions came in pieces
        assert [n[4] > 1 for n in native] == [p[4] > 1 for p in expected], f"runs={runs}"
        assert native_stage.extractor.missing_columns == py_stage.extractor.missing_columns
        assert native_stage.extractor.filtered == py_stage.extractor.filtered
        if runs:
            assert any(n[5] > 1 for n in native), "the corpus read from the binlog gave no run to compare"
        else:
            assert all(n[5] == 1 for n in native)
    assert {(t, why): n for (_, t, why), n in py_stage.extractor.filtered.items()} == FILTERED
    # the corpus really exercises what it claims
    lines = {line for _, cluster, regional, *_ in python for line in cluster + regional}
    for key in (
        "user:email:a@x",
        "user:email:a2@x",
        "comment:one",
        "on:other",
        "amt:12.5000",
        "tiny:1.000E-7",
        "seen:2024-01-02 03:04:05.678000",
        "born:2024-02-29",
        "y:1999",
        "region:user:1",
        "big:18446744073709551615",
        "neg:-32768",
        "name:Bj\u00f6rk \U0001f600",
        "bin:\udc80",
        "counter:2",
        "counter:3",
        "post:200",
        "post:201",
        "ev:a3",
        "evb:back:3",
        "user:3999",
        "art:1",
        "owner:1",
        "art:2",
        "art:3",
        "owner:7",
        "owner:3",
        "art:4",
        "owner:8",
        "score:1",
    ):
        assert delete_line(key)[0] in lines, key
    cp1252 = bytes(b for b in range(0x20, 0x100) if b not in (0x7F, 0x81, 0x8D, 0x8F, 0x90, 0x9D))
    assert delete_line("latin:" + cp1252[100:].decode("cp1252"))[0] in lines
    for key in ("score:2", "score:3", "score:4", "score:5"):  # filtered out
        assert delete_line(key)[0] not in lines, key
    for key in ("post:300", "post:301"):  # rolled back (the MyISAM row beside 300 persisted: counter:2)
        assert delete_line(key)[0] not in lines
    assert any(flush for _, _, _, flush, *_ in python), "TRUNCATE / cascade with on_truncate = flush"
    flushed = {gtid: flush for gtid, _, _, flush, *_ in python}
    assert flushed[NOTED["parent update, cascade"]]
    assert not flushed[NOTED["parent update, no cascade"]], "an update of no referenced column flushed"
    assert any(pieces > 1 for *_, pieces, _ in python), "a transaction big enough to be handed on in pieces"
    assert py_stage.extractor.missing_columns == {(schema, "evolving", "b"): 3}  # an insert, an update (2 images)


def test_templates_on_columns_the_native_reader_cannot_render_are_found_at_start_up(corpus):
    db, schema, *_ = corpus
    rules = [
        Rule(
            table=f"{schema}.users",
            keys=("f:{f}", "k:{kind}", "user:{id}", "e:{email}"),
            where=predicate.parse("ts IS NULL"),
        ),  # a column only a filter compares is checked too
        Rule(table=f"{schema}.latin", keys=("l:{v}",)),
        Rule(table=f"{schema}.greek", keys=("g:{v}",)),
    ]
    with db.connect() as conn:
        problems = native_problems(conn, KeyExtractor(rules).text_columns)
    assert sorted(problems) == [
        f"{schema}.greek.v has character set greek",
        f"{schema}.users.f is float",
        f"{schema}.users.kind is enum",
        f"{schema}.users.ts is timestamp",
    ]


def test_a_template_on_an_unsupported_column_stops_the_native_reader_loudly(corpus):
    """Should a column's type change under a running daemon, the native reader stops (never a guessed key)."""
    db, schema, _rules, cascades, start, end = corpus
    rules = [Rule(table=f"{schema}.users", keys=("f:{f}",))]
    stage = stage_for(rules, cascades)
    source = Source(db.host, db.port, db.user, db.password)
    reader = NativeBinlogReader(source, start, stage.extractor.tables, stage.extractor.templates, name="bad")
    loop = ReadLoop(reader, stage, lambda c: None)
    loop.start()
    loop.thread.join(30)  # the read loop ends by itself on a rule it cannot render
    loop.stop()
    assert isinstance(loop.error, NativeUnavailable), loop.error
    assert 'column "f" of type FLOAT' in str(loop.error)


def test_native_reader_data_loss_and_reconnect(mariadb_pair):
    """A position the server never had: error 1236 becomes DataLoss, as with the python reader."""
    db, _ = mariadb_pair
    source = Source(db.host, db.port, db.user, db.password)
    from squeal.read.reader import DataLoss
    from squeal.read.transactions import Restart

    reader = NativeBinlogReader(source, {0: (1, 10**12)}, set(), {}, name="loss")
    seen = []
    for ev in reader:
        seen.append(type(ev))
        if type(ev) is DataLoss:
            assert ev.requested == {0: (1, 10**12)}
            reader.stop()
            break
    assert seen[:2] == [Restart, DataLoss]
    assert reader.errors == 1


@pytest.mark.parametrize("key", ["reader", "delivery"])
def test_the_native_settings_are_validated_and_round_trip(key: str) -> None:
    """`[squeal] reader` and `delivery`: "native" by default, "python" kept, anything else named."""
    from router_config import TopologyError, dumps, loads

    base = """
[squeal]
{setting}
[[rules]]
table = "app.users"
keys = ["user:{{id}}"]
[regions.east]
master = true
database = {{ role = "primary", port = 3306, server_id = 1, user = "u", password = "p" }}
[regions.east.clusters.a]
routers = ["127.0.0.1:5000"]
pools.wildcard = {{ kind = "wildcard", servers = ["127.0.0.1:5001"] }}
"""
    assert getattr(loads(base.format(setting="")).squeal, key) == "native"
    topo = loads(base.format(setting=f'{key} = "python"'))
    assert getattr(topo.squeal, key) == "python"
    assert getattr(loads(dumps(topo)).squeal, key) == "python"
    with pytest.raises(TopologyError, match=f'squeal.{key}: must be "native" or "python", got \'rust\''):
        loads(base.format(setting=f'{key} = "rust"'))
