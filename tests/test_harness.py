"""The harness starts real servers: a GTID primary/replica pair and memcached pools that answer."""

from __future__ import annotations

import socket

import pymysql
import pytest

from ops import tls as pki
from ops.harness import HarnessError, MariaDB, ZooKeeper, memcached_command, require_binary, wait_until


def test_row_on_primary_reaches_replica_binlog_with_same_gtid(mariadb_pair):
    primary, replica = mariadb_pair
    primary.execute(
        "CREATE DATABASE harness_gtid",
        "CREATE TABLE harness_gtid.t (id INT PRIMARY KEY, v TEXT)",
        "INSERT INTO harness_gtid.t VALUES (1, 'hello')",
    )
    position = primary.gtid_binlog_pos()
    replica.wait_for_gtid(position)

    assert replica.execute("SELECT v FROM harness_gtid.t WHERE id = 1") == [("hello",)]
    # log_slave_updates: the replica wrote the same transaction, under the same GTID, to its own binlog.
    last_gtid = position.split(",")[-1]
    replica_log = replica.execute("SHOW BINARY LOGS")[-1][0]
    events = replica.execute(f"SHOW BINLOG EVENTS IN '{replica_log}'")
    gtids = [e[5] for e in events if e[2] == "Gtid"]
    assert any(info.endswith(f"GTID {last_gtid}") for info in gtids), gtids
    annotated = [e[5] for e in events if e[2] == "Annotate_rows"]
    assert any("INSERT INTO harness_gtid.t" in info for info in annotated), annotated


def test_binlog_settings_are_what_squeal_needs(mariadb_pair):
    primary, _ = mariadb_pair
    settings = dict(
        primary.execute(
            "SHOW VARIABLES WHERE Variable_name IN ('binlog_format', 'binlog_row_image', "
            "'binlog_row_metadata', 'binlog_annotate_row_events', 'log_bin')"
        )
    )
    assert settings == {
        "binlog_format": "ROW",
        "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL",
        "binlog_annotate_row_events": "ON",
        "log_bin": "ON",
    }


def test_memcached_pool_members_answer_and_are_separate(memcached_factory):
    a, b = memcached_factory(), memcached_factory()
    assert memcached_command((a.host, a.port), b"set k 0 0 1\r\nA\r\n") == b"STORED"
    assert memcached_command((a.host, a.port), b"mg k v\r\n").startswith(b"VA 1")
    assert memcached_command((b.host, b.port), b"mg k v\r\n") == b"EN"


def test_stop_by_pid_leaves_nothing(memcached_factory):
    server = memcached_factory()
    pid = server.pid
    server.stop()
    assert server.proc.poll() is not None, f"memcached pid {pid} still running"


def test_missing_binary_says_what_to_install():
    with pytest.raises(HarnessError, match="apt-get install no-such-package"):
        require_binary("no-such-binary-squeal", "no-such-package")


def test_failed_start_shows_log_tail(tmp_path):
    server = MariaDB(7, workdir=tmp_path)
    server.command = lambda: [server.mariadbd, "--no-defaults", "--no-such-option-squeal"]  # type: ignore[method-assign]
    with pytest.raises(HarnessError, match="exited with code"):
        server.start()


class _Exited:
    """Has the `poll()`/`returncode` wait_until watches, like a Popen that has exited."""

    returncode = 3

    def poll(self) -> int:
        return self.returncode


def test_wait_until_returns_the_first_truthy_result_and_counts_oserror_as_not_yet():
    calls = []

    def check():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("not listening yet")
        return {"ready": len(calls)}

    assert wait_until(check, 5, "the thing", interval=0.001) == {"ready": 3}


def test_wait_until_times_out_with_the_callers_error_or_returns_the_last_result():
    with pytest.raises(HarnessError, match="timed out after 0.05s waiting for the thing"):
        wait_until(lambda: False, 0.05, "the thing", interval=0.01)
    with pytest.raises(AssertionError, match="waiting for the thing"):
        wait_until(lambda: 0, 0.05, "the thing", interval=0.01, error=AssertionError)
    assert wait_until(lambda: [], 0.05, "the thing", interval=0.01, error=None) == []
    calls = []
    assert wait_until(lambda: calls.append(1), -1, "the thing", error=None) is None
    assert calls == [1]  # checked once even with no time left


def test_wait_until_lets_other_exceptions_through_and_fails_when_the_process_exits(tmp_path):
    with pytest.raises(OSError, match="refused"):
        wait_until(lambda: (_ for _ in ()).throw(ConnectionRefusedError("refused")), 5, "x", ignore=())
    log = tmp_path / "x.log"
    log.write_text("first\nlast words\n")
    with pytest.raises(HarnessError, match="(?s)x exited with code 3 during start-up.*last words"):
        wait_until(lambda: False, 5, "x", _Exited(), log)  # type: ignore[arg-type]


def test_a_datadir_reused_with_and_without_tls_follows_the_current_setting(processes, tmp_path):
    """`squealctl up --tls`, `down`, `up` on one state dir: the account's REQUIRE SSL and a replica's MASTER_SSL
    follow the current start, not the first one (CREATE USER IF NOT EXISTS and CHANGE MASTER keep old settings)."""
    d = tmp_path / "tls"
    ca = pki.make_ca(d)
    pki.issue(ca, d, "mariadb")
    tls = {"ssl_cert": d / "mariadb.crt", "ssl_key": d / "mariadb.key", "ssl_ca": ca.cert, "require_ssl": True}
    primary = processes.add(MariaDB(1, workdir=tmp_path / "p", **tls))
    replica = processes.add(MariaDB(2, workdir=tmp_path / "r", replica=True, **tls))
    replica.replicate_from(primary)
    replica.wait_for_gtid(primary.gtid_binlog_pos())
    with replica.connect() as conn, conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SHOW SLAVE STATUS")
        assert (cur.fetchone() or {}).get("Master_SSL_Allowed") == "Yes"
    for server in (replica, primary):
        server.stop()
    again_primary = processes.add(MariaDB(1, port=primary.port, workdir=tmp_path / "p"))
    again_replica = processes.add(MariaDB(2, port=replica.port, workdir=tmp_path / "r", replica=True))
    again_replica.replicate_from(again_primary)
    again_primary.execute("CREATE DATABASE IF NOT EXISTS after_tls")
    again_replica.wait_for_gtid(again_primary.gtid_binlog_pos())  # replicating in plaintext
    with pymysql.connect(  # a plaintext login of the account: REQUIRE SSL is gone
        host=again_primary.host, port=again_primary.port, user="squeal", password="squeal", ssl_disabled=True
    ):
        pass


def test_a_zookeeper_that_cannot_start_says_why_in_its_log(tmp_path):
    """ZooKeeper logs through SLF4J: without a binding on its classpath it logs nothing at all, and a server that
    fails (here: its client port taken) leaves an operator — and the harness's error — no reason."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = ZooKeeper(port=taken.getsockname()[1], workdir=tmp_path)
        with pytest.raises(HarnessError) as failed:
            server.start()
        server.stop()
    assert "Address already in use" in str(failed.value), str(failed.value)
