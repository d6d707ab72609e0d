"""`squealctl flush` against real squeal-routers and memcached: a cluster through its router (with the region's
regional pool), a region, one pool directly, a router without --enable-flush-cmd named in the error, and the
confirmation: none without a terminal or --yes, the name typed at a terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from pymemcache.client.base import Client

import router_config
from ops import cli
from ops import tls as pki
from ops.flush import main as flush_main
from ops.harness import REPO_ROOT, ROUTER_BIN, free_port, memcached_command
from tests.binaries import needs_binary

pytestmark = needs_binary(ROUTER_BIN.exists(), "router not built (scripts/setup.sh)")

TOPOLOGY = """
[regions.east]
master = true
database = {{ role = "primary", port = {db}, server_id = 1 }}
regional_pool = {{ servers = ["{regional}"], prefixes = ["regional:"] }}
[regions.east.clusters.a]
routers = ["127.0.0.1:{ra}"]
pools.wildcard = {{ servers = ["{wa}"] }}
pools.gutter = {{ kind = "gutter", servers = ["{ga}"] }}
[regions.east.clusters.b]
routers = ["127.0.0.1:{rb}"]
pools.wildcard = {{ servers = ["{wb}"] }}
"""


class World:
    def __init__(self, topo, path, servers, routers):
        self.topo, self.path, self.servers, self.routers = topo, path, servers, routers

    def fill(self) -> None:
        for name, server in self.servers.items():
            Client((server.host, server.port)).set(f"k:{name}", b"v", noreply=False)

    def holding(self) -> set[str]:
        """The memcached servers that still hold the key `fill` put there."""
        return {n for n, s in self.servers.items() if Client((s.host, s.port)).get(f"k:{n}") is not None}


@pytest.fixture
def world(memcached_factory, router_factory, tmp_path):
    """Cluster a's router flushes (--enable-flush-cmd, as `squealctl up` starts it); cluster b's does not."""
    servers = {n: memcached_factory() for n in ("wa", "ga", "wb", "regional")}
    ra, rb = free_port(), free_port()
    path = tmp_path / "topology.toml"
    path.write_text(TOPOLOGY.format(db=free_port(), ra=ra, rb=rb, **{n: s.address for n, s in servers.items()}))
    topo = router_config.load(path)
    routers = {
        "a": router_factory(router_config.cluster_config(topo, "a"), port=ra, extra_args=("--enable-flush-cmd",)),
        "b": router_factory(router_config.cluster_config(topo, "b"), port=rb),
    }
    w = World(topo, path, servers, routers)
    w.fill()
    assert w.holding() == set(servers)
    return w


def flush(capsys, world, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--state-dir", str(world.path.parent / "state"), "flush", *args, "--topology", str(world.path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_cluster_is_flushed_through_its_router_with_the_regional_pool(world, capsys):
    code, out, err = flush(capsys, world, "a", "--yes")
    assert code == 0 and out == "flushed cluster a\n" and err == "", (out, err)
    assert world.holding() == {"wb"}  # a's wildcard and gutter, and the regional pool its config routes to


def test_a_router_without_the_flush_flag_is_named_and_the_exit_status_is_1(world, capsys):
    code, out, err = flush(capsys, world, "b", "--yes")
    router = world.topo.cluster("b").routers[0]
    assert code == 1 and out == "", out
    assert f"cluster b: router {router}: ServerError: flush_all disabled" in err, err
    assert "NOT flushed: cluster b" in err and "--enable-flush-cmd" in err
    assert world.holding() == set(world.servers)  # the refusal flushed nothing

    code, out, err = flush(capsys, world, "east", "--yes")  # a region: cluster a flushed, b named as failed
    assert code == 1 and out == "flushed cluster a\n" and "NOT flushed: cluster b" in err, (out, err)
    assert world.holding() == {"wb"}


def test_a_router_that_is_down_is_named(world, capsys):
    world.routers["a"].stop()
    code, _, err = flush(capsys, world, "a", "--yes")
    assert code == 1 and f"router {world.topo.cluster('a').routers[0]}: does not answer" in err, err


def test_one_pool_is_flushed_directly_on_its_servers(world, capsys):
    code, out, err = flush(capsys, world, "a", "--pool", "gutter", "--yes")
    assert (code, out, err) == (0, "flushed pool a/gutter\n", "")
    assert world.holding() == {"wa", "wb", "regional"}

    code, out, _ = flush(capsys, world, "east", "--pool", "regional", "--yes")
    assert code == 0 and out == "flushed regional pool of east\n"
    assert world.holding() == {"wa", "wb"}

    code, out, _ = flush(capsys, world, "east", "--pool", "wildcard", "--yes")  # every cluster's, routers not asked
    assert code == 0 and out == "flushed pool a/wildcard\nflushed pool b/wildcard\n"
    assert world.holding() == set()


def test_unknown_names_flush_nothing_with_exit_2(world, capsys):
    code, _, err = flush(capsys, world, "nowhere", "--yes")
    assert code == 2 and "no cluster or region 'nowhere'" in err and "clusters: a, b" in err
    code, _, err = flush(capsys, world, "a", "--pool", "sessions", "--yes")
    assert code == 2 and "cluster a has no pool 'sessions' (pools: wildcard, gutter, regional)" in err
    assert world.holding() == set(world.servers)


def test_without_a_terminal_and_without_yes_nothing_is_flushed(world, capsys):
    code, out, err = flush(capsys, world, "a")  # pytest's stdin is not a terminal
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "not flushing a without confirmation: stdin is not a terminal (add --yes)" in err
    assert world.holding() == set(world.servers)


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_prompt_names_what_is_emptied_and_wants_the_name_typed(world):
    out, err = io.StringIO(), io.StringIO()
    code = flush_main(world.topo, "a", stdin=Tty("yes\n"), out=out, err=err)
    assert code == 1 and "not confirmed; nothing flushed" in err.getvalue()
    assert world.holding() == set(world.servers)
    prompt = out.getvalue()
    s = world.servers
    for line in (
        f"cluster a through router {world.topo.cluster('a').routers[0]}:",
        f"pool wildcard ({s['wa'].address})",
        f"pool gutter ({s['ga'].address})",
        f"the regional pool of east, shared by a, b ({s['regional'].address})",
        "Type 'a' to flush",
    ):
        assert line in prompt, prompt

    assert flush_main(world.topo, "a", stdin=Tty("a\n"), out=io.StringIO(), err=err) == 0
    assert world.holding() == {"wb"}


def test_squealctl_flush_asks_on_a_real_terminal(world):
    """The whole command on a pty: the prompt appears and typing the name flushes."""
    leader, follower = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "flush", "b", "--pool", "wildcard", "--topology", str(world.path)],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=REPO_ROOT,
    )
    os.close(follower)
    seen = b""
    try:
        while b"to flush" not in seen:
            chunk = os.read(leader, 4096)
            assert chunk, seen
            seen += chunk
        os.write(leader, b"b\n")
        assert proc.wait(timeout=30) == 0
        while b"flushed pool b/wildcard" not in seen:
            seen += os.read(leader, 4096)
    finally:
        proc.kill()
        os.close(leader)
    assert world.holding() == {"wa", "ga", "regional"}


def test_a_tls_pool_is_flushed_over_tls(memcached_factory, tmp_path, capsys):
    """With [tls] memcached runs -Z (its port speaks TLS only): `flush --pool` dials it over TLS."""
    d = tmp_path / "tls"
    ca = pki.make_ca(d)
    for name in ("memcached", "monitoring"):
        pki.issue(ca, d, name)
    server = memcached_factory(tls=(d / "memcached.crt", d / "memcached.key"), ssl_ca=ca.cert)
    ctx = router_config.verifying_context(str(ca.cert))
    address = (server.host, server.port)
    assert memcached_command(address, b"set k 0 0 1\r\nx\r\n", tls=ctx) == b"STORED"
    path = tmp_path / "topology.toml"
    text = TOPOLOGY.format(db=free_port(), ra=free_port(), rb=free_port(), wa=server.address, ga="127.0.0.1:1",
                           wb="127.0.0.1:2", regional="127.0.0.1:3")  # fmt: skip
    path.write_text('[tls]\ndir = "tls"\nrequire = true\n' + text)
    code = cli.main(["--state-dir", str(tmp_path / "state"), "flush", "a", "--pool", "wildcard", "--yes",
                     "--topology", str(path)])  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, "flushed pool a/wildcard\n", "")
    assert memcached_command(address, b"get k\r\n", tls=ctx) == b"END"
