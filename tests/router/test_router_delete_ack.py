"""The invalidation path: squeal-router acknowledges a delete only when every destination it went to
has it, or has it durably spooled; otherwise the client (squeal) gets an error and retries. A server
whose spool is being replayed stays out of the read path until the replay is done."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from ops.harness import Memcached, free_port
from tests.router.conftest import FAST, Conn, wait_for


def gutter_config(normal: str, gutter: str) -> dict:
    return {
        "pools": {"normal": {"servers": [normal]}, "gutter": {"servers": [gutter]}},
        "route": {
            "type": "FailoverWithExptimeRoute",
            "normal": "PoolRoute|normal",
            "failover": "PoolRoute|gutter",
            "failover_exptime": 10,
        },
    }


def dead_address() -> str:
    return f"127.0.0.1:{free_port()}"  # nobody listens there


def spool_entry(address: str, key: str) -> str:
    host, port = address.rsplit(":", 1)
    return json.dumps(["AS2.0", 1700000000.0, "C", {"h": f"[{host}]:{port}", "p": "p", "k": key, "op": "delete"}])


def is_error(reply: bytes) -> bool:
    return reply.startswith(b"SERVER_ERROR")


def test_delete_refused_by_a_full_spool_is_not_acknowledged_behind_gutter(memcached_factory, router_factory) -> None:
    gutter = memcached_factory()
    normal = dead_address()
    # a spool bound of 0: every delete for the dead server is refused
    router = router_factory(gutter_config(normal, gutter.address), extra_args=FAST + ("--spool-max-mb", "0"))
    c = Conn(router.address)
    assert c.call(b"set k 0 0 1\r\nv\r\n") == b"STORED"  # lands in gutter (normal is down)
    reply = c.call(b"delete k\r\n")
    assert is_error(reply) and b"not spooled" in reply, reply
    assert c.call(b"md k2 q\r\nmn\r\n").startswith(b"SERVER_ERROR")  # squeal's batched form: the error shows
    assert c.line() == b"MN"
    # the gutter still got the delete (the key must not be served from there meanwhile)
    assert Conn(gutter.address).call(b"mg k\r\n") == b"EN"
    # with room in the spool the same delete is acknowledged (gutter's answer, spooled for normal)
    roomy = router_factory(gutter_config(normal, gutter.address), extra_args=FAST)
    assert Conn(roomy.address).call(b"delete k\r\n") in (b"DELETED", b"NOT_FOUND")


def test_all_sync_refused_replica_delete_is_not_acknowledged(router_factory, tmp_path) -> None:
    """Two dead replicas: the first one's delete is spooled, the second one's spool is full. The worst
    reply must be the refusal, never the spooled one's acknowledgement."""
    spooled, refused = dead_address(), dead_address()
    spool = tmp_path / "spool"
    spool.mkdir()
    line = spool_entry(refused, "old") + "\n"
    (spool / (refused.replace(":", "_") + ".asynclog")).write_text(line * (1024 * 1024 // len(line) + 1))
    router = router_factory(
        {"pools": {"p": {"servers": [spooled, refused]}}, "route": "AllSyncRoute|Pool|p"},
        spool_dir=spool,
        extra_args=FAST + ("--spool-max-mb", "1"),
    )
    c = Conn(router.address)
    reply = c.call(b"delete k\r\n")
    assert is_error(reply), reply
    assert c.call(b"md k q\r\nmn\r\n").startswith(b"SERVER_ERROR")
    assert c.line() == b"MN"
    # the replica whose spool had room still has the delete spooled
    entries = (spool / (spooled.replace(":", "_") + ".asynclog")).read_text().splitlines()
    assert [json.loads(e)[3]["k"] for e in entries] == ["k", "k"]


def test_reads_stay_off_a_server_until_its_spooled_deletes_are_replayed(memcached_factory, router_factory) -> None:
    """A server that missed deletes while it was down must not serve reads again before it has
    received them: until the replay is done, reads go to gutter (a miss here), never to the stale copy."""
    normal, gutter = memcached_factory(), memcached_factory()
    router = router_factory(gutter_config(normal.address, gutter.address), extra_args=FAST)
    n = 20_000
    keys = [b"user:%d" % i for i in range(n)]
    direct = Conn(normal.address)
    direct.send(b"".join(b"set %s 0 0 5 noreply\r\nstale\r\n" % k for k in keys) + b"mn\r\n")
    assert direct.line() == b"MN"
    c = Conn(router.address)
    assert c.call(b"get user:1\r\n") == b"VALUE user:1 0 5\r\nstale\r\nEND\r\n"
    normal.pause()  # hung: requests time out, three timeouts make it TKO
    try:
        c.send(b"get user:1\r\nget user:2\r\nget user:3\r\n")
        assert [c.reply() for _ in range(3)] == [b"END"] * 3  # timed out on normal, missed on gutter
        wait_for(lambda: "STAT servers_tko 1" in stats_text(router.address), what="normal marked TKO")
        # the invalidations arrive while it is down: spooled for it (and sent to gutter)
        c.send(b"".join(b"md %s q\r\n" % k for k in keys) + b"mn\r\n")
        replies = [c.line() for _ in range(n + 1)]
        assert replies[-1] == b"MN" and set(replies[:-1]) == {b"NF"}, set(replies)
    finally:
        normal.resume()
    # it is back with its stale copies; the probe finds it, the spool is replayed
    probe = keys[-100:]
    batch = b"".join(b"get %s\r\n" % k for k in probe)
    rounds = 0
    while Conn(normal.address).call(b"mg " + keys[-1] + b"\r\n") != b"EN":
        c.send(batch)
        got = [c.reply() for _ in probe]
        assert all(g == b"END" for g in got), [g for g in got if g != b"END"][:3]
        rounds += 1
        assert rounds < 20_000, "replay did not finish"
    wait_for(lambda: "STAT servers_tko 0" in stats_text(router.address), what="TKO cleared after the replay")
    assert c.call(b"get " + keys[0] + b"\r\n") == b"END"
    assert c.call(b"set fresh 0 0 1\r\nf\r\n") == b"STORED"
    assert Conn(normal.address).call(b"mg fresh v\r\n") == b"VA 1\r\nf\r\n"  # serving again


def stats_text(address: str) -> str:
    c = Conn(address)
    c.send(b"stats\r\n")
    lines = []
    while (line := c.line()) != b"END":
        lines.append(line.decode())
    return "\n".join(lines)


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def failing_fsync_dir(base: Path):
    """A directory whose files accept writes but whose fsync fails: ext4 on a loop device whose backing
    file lives on a small tmpfs; once that tmpfs is full (`fill()`), writeback of new blocks fails,
    so write() succeeds (page cache) and fsync() returns an error."""
    backing, mnt = base / "backing", base / "fs"
    backing.mkdir()
    mnt.mkdir()
    mounted, loop = [], None
    try:
        _run("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(backing))
        mounted.append(backing)
        image = backing / "disk.img"
        _run("truncate", "-s", "64M", str(image))
        _run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(image))
        loop = _run("losetup", "-f", "--show", str(image))
        _run("mount", loop, str(mnt))
        mounted.append(mnt)

        def fill() -> None:
            subprocess.run(["dd", "if=/dev/zero", f"of={backing / 'fill'}", "bs=1M", "count=64"], capture_output=True)

        yield mnt, fill
    finally:
        for path in reversed(mounted):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
            if path == mnt and loop:
                subprocess.run(["losetup", "-d", loop], capture_output=True)


@pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "mount")),
    reason="needs root, losetup and mkfs.ext4 to make a filesystem whose fsync fails",
)
def test_a_spool_fsync_failure_is_not_acknowledged(memcached_factory, router_factory, tmp_path) -> None:
    normal = dead_address()
    with failing_fsync_dir(tmp_path) as (mnt, fill):
        spool = mnt / "spool"
        router = router_factory({"pools": {"p": {"servers": [normal]}}, "route": "PoolRoute|p"}, spool_dir=spool)
        try:
            c = Conn(router.address)
            fill()
            reply = c.call(b"delete k\r\n")
            assert is_error(reply) and b"fsync" in reply, reply
            assert "fsync" in router.log_file.read_text()
        finally:
            router.stop()  # it holds the spool file open: stop it before unmounting


def test_a_delete_that_timed_out_keeps_the_server_out_until_replayed(processes, memcached_factory, router_factory):
    """A delete that timed out once (the server is not TKO) is spooled and acknowledged; the server must
    not serve reads until that delete has been replayed to it. Here the server hangs (accepts, never
    answers), then a memcached holding the stale value takes its place."""
    gutter = memcached_factory()
    port = free_port()
    hung = socket.create_server(("127.0.0.1", port))
    accepted: list[socket.socket] = []
    hung.settimeout(5)
    router = router_factory(
        gutter_config(f"127.0.0.1:{port}", gutter.address),
        extra_args=("--server-timeout-ms", "300", "--connect-timeout-ms", "300", "--probe-delay-initial-ms", "3000"),
    )
    c = Conn(router.address)
    c.send(b"delete k\r\n")
    accepted.append(hung.accept()[0])
    assert c.line() == b"NOT_FOUND"  # timed out, spooled (gutter had nothing)
    for s in accepted + [hung]:
        s.close()
    normal = processes.add(Memcached(port=port, workdir=processes.base / "normal"))
    assert Conn(normal.address).call(b"set k 0 0 5\r\nstale\r\n") == b"STORED"
    for _ in range(20):
        assert c.call(b"get k\r\n") == b"END"
    wait_for(lambda: Conn(normal.address).call(b"mg k\r\n") == b"EN", what="delete replayed")
    wait_for(lambda: "STAT servers_tko 0" in stats_text(router.address), what="back in the read path")
    assert c.call(b"set k 0 0 5\r\nfresh\r\n") == b"STORED"
    assert Conn(normal.address).call(b"mg k v\r\n") == b"VA 5\r\nfresh\r\n"
