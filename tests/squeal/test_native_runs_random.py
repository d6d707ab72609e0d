"""The native data plane's runs against the reference reader, on a seeded random transaction mix.

A run (`CommittedRun`) holds ordinary transactions the native reader grouped itself; any transaction that needs
a decision (XA, savepoints, `/* mcd: */` comments, MyISAM, rollbacks that persisted rows, DDL, FK cascades)
must end the run before it and come as plain events. The mix below interleaves those with the common shape
(single-row autocommit transactions, which form the runs) so run boundaries meet every kind of transaction.
Both readers decode the same binlog range; the native reader's lines per destination kind must equal the
reference's, transaction by transaction within a run (`regroup`).

SQUEAL_RUNS_SEED picks the mix (default: a random one, named in every failure).
"""

from __future__ import annotations

import os
import random

from differential import decode, regroup, stage_for
from squeal_helpers import unique_db

from router_config import Rule
from squeal.keys.bulk import load_cascades
from squeal.read import gtid as g
from squeal.read.native import NativeBinlogReader
from squeal.read.reader import BinlogReader, Source

TABLES = """
CREATE TABLE acct (id INT PRIMARY KEY, email VARCHAR(100), name VARCHAR(100)) ENGINE=InnoDB;
CREATE TABLE feed (id INT PRIMARY KEY, owner INT) ENGINE=InnoDB;
CREATE TABLE tally (id INT PRIMARY KEY, v INT) ENGINE=MyISAM;
CREATE TABLE plain (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB;
CREATE TABLE parent (id INT PRIMARY KEY) ENGINE=InnoDB;
CREATE TABLE child (id INT PRIMARY KEY, parent_id INT, FOREIGN KEY (parent_id) REFERENCES parent(id)
  ON DELETE CASCADE) ENGINE=InnoDB;
"""


def rules(schema: str) -> list[Rule]:
    return [
        Rule(table=f"{schema}.acct", keys=("acct:{id}", "acct:email:{email}", "region:acct:{id}")),
        Rule(table=f"{schema}.feed", keys=("feed:{owner}", "item:{id}")),
        Rule(table=f"{schema}.tally", keys=("tally:{id}",)),
        Rule(table=f"{schema}.child", keys=("child:{id}",), on_truncate="flush"),
    ]


class Mix:
    """Random statements and transactions on the tables above, from one seeded `random.Random`."""

    def __init__(self, rng: random.Random, conn) -> None:
        self.rng, self.conn, self.cur = rng, conn, conn.cursor()
        self.next_id = 1
        self.xa = 0

    def new_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def some_id(self) -> int:
        return self.rng.randrange(1, max(2, self.next_id))

    def statement(self) -> str:
        r, rng = self.rng.random(), self.rng
        if r < 0.35:
            rows = ", ".join(f"({i}, 'e{i}@x', 'n{i}')" for i in self.new_ids(rng.choice([1, 1, 1, 3, 20])))
            return f"INSERT INTO acct VALUES {rows}"
        if r < 0.5:
            return f"UPDATE acct SET email = 'u{rng.randrange(10**6)}@x' WHERE id = {self.some_id()}"
        if r < 0.6:
            return f"UPDATE acct SET name = 'same' WHERE id BETWEEN {self.some_id()} AND {self.next_id}"
        if r < 0.7:
            return f"DELETE FROM acct WHERE id = {self.some_id()}"
        if r < 0.85:
            rows = ", ".join(f"({i}, {i % 4})" for i in self.new_ids(rng.choice([1, 2, 6])))
            return f"INSERT INTO feed VALUES {rows}"
        return f"INSERT INTO plain VALUES ({self.new_ids(1)[0]}, 'unruled')"

    def run(self, statements: list[str]) -> None:
        for s in statements:
            self.cur.execute(s)

    def transaction(self) -> None:
        rng, r = self.rng, self.rng.random()
        stmts = [self.statement() for _ in range(rng.choice([1, 1, 2, 4]))]
        if r < 0.55:  # the common shape: one statement, autocommit (what runs are made of)
            self.run(stmts[:1])
            self.conn.commit()
        elif r < 0.7:
            self.run(["BEGIN", *stmts])
            self.conn.commit()
        elif r < 0.74:
            self.run(["BEGIN", f"/* mcd:note:{rng.randrange(99)} */ {stmts[0]}", *stmts[1:]])
            self.conn.commit()
        elif r < 0.78:
            self.run(["BEGIN", *stmts, "SAVEPOINT s", self.statement(), "ROLLBACK TO SAVEPOINT s"])
            self.conn.commit()
        elif r < 0.81:
            self.run(["BEGIN", *stmts])
            self.conn.rollback()  # InnoDB only: never reaches the binlog
        elif r < 0.84:  # MyISAM rows persist through a rollback
            self.run(["BEGIN", *stmts, f"INSERT INTO tally VALUES ({self.new_ids(1)[0]}, 1)"])
            self.conn.rollback()
        elif r < 0.87:
            self.run([f"INSERT INTO tally VALUES ({self.new_ids(1)[0]}, 2)"])
            self.conn.commit()
        elif r < 0.92:
            self.xa += 1
            xid = f"'rx{self.xa}'"
            self.run([f"XA START {xid}", *stmts, f"XA END {xid}"])
            if rng.random() < 0.3:
                self.run([f"XA COMMIT {xid} ONE PHASE"])
            else:
                self.run([f"XA PREPARE {xid}", f"XA {rng.choice(['COMMIT', 'COMMIT', 'ROLLBACK'])} {xid}"])
        elif r < 0.95:
            p = self.new_ids(1)[0]
            self.run([f"INSERT INTO parent VALUES ({p})", f"INSERT INTO child VALUES ({p}, {p})"])
            self.conn.commit()
            self.run([f"DELETE FROM parent WHERE id = {p}"])  # cascades to child: not in the binlog
            self.conn.commit()
        else:
            column = f"c{self.next_id}"
            self.run([f"ALTER TABLE plain ADD COLUMN {column} INT", f"ALTER TABLE plain DROP COLUMN {column}"])


def test_runs_hand_on_what_the_reference_does_for_a_random_mix(mariadb_pair) -> None:
    seed = int(os.environ.get("SQUEAL_RUNS_SEED", random.randrange(1 << 32)))
    db, _replica = mariadb_pair
    schema = unique_db("runs")
    db.execute(f"CREATE DATABASE {schema}")
    with db.connect(schema) as conn, conn.cursor() as cur:
        for stmt in filter(str.strip, TABLES.split(";")):
            cur.execute(stmt)
    start = g.parse_position(db.gtid_binlog_pos())
    with db.connect(schema, autocommit=False) as conn:
        mix = Mix(random.Random(seed), conn)
        for _ in range(400):
            mix.transaction()
    end = g.parse_position(db.gtid_binlog_pos())
    with db.connect() as conn:
        cascades = load_cascades(conn)
    source = Source(db.host, db.port, db.user, db.password)

    py_stage = stage_for(rules(schema), cascades)
    tables = py_stage.extractor.tables | py_stage.bulk.parents
    python = decode(lambda s: BinlogReader(source, s, tables, name="python"), py_stage, start, end)
    stage = stage_for(rules(schema), cascades)
    native = decode(
        lambda s: NativeBinlogReader(
            source,
            s,
            tables,
            stage.extractor.templates,
            stage.bulk.parents,
            name="native",
            regional_prefixes=stage.regional_prefixes,
        ),
        stage,
        start,
        end,
    )

    expected = regroup(python, native)
    for p, n in zip(expected, native, strict=True):
        assert n[:4] == p[:4], f"SQUEAL_RUNS_SEED={seed}, GTID {p[0]}: python {p[1:]!r}\nnative {n[1:]!r}"
    assert sum(n[5] for n in native) == len(python), f"SQUEAL_RUNS_SEED={seed}"
    assert max(n[5] for n in native) > 5, f"SQUEAL_RUNS_SEED={seed}: no run formed"
    in_runs = sum(n[5] for n in native if n[5] > 1)
    assert in_runs > len(python) / 4, f"SQUEAL_RUNS_SEED={seed}: only {in_runs} transactions in runs"
    assert any(n[3] for n in native), f"SQUEAL_RUNS_SEED={seed}: the mix had no cascade (flush) to meet"
