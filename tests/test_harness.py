"""The harness starts real servers: a GTID primary/replica pair and memcached pools that answer."""

from __future__ import annotations

import pytest

from ops.harness import HarnessError, MariaDB, memcached_command, require_binary


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
