"""squeal-router's opt-in `flush_all` (`--enable-flush-cmd`, mcrouter's flag) against real memcached.

The topology is east-a's emitted config (tests/router/conftest.py): pools wildcard (2 servers),
gutter, sessions (2 replicas, keys `session:*` by prefix), regional (`regional:*`): 6 servers.
"""

from __future__ import annotations

from tests.router.conftest import FAST, Conn, furc_hash, wait_for

DISABLED = b"SERVER_ERROR flush_all disabled (start the router with --enable-flush-cmd)"


def _has(address: str, key: bytes) -> bool:
    """Whether the server holds `key`, asked with `me` (meta debug), which does not count as a fetch. A second
    `mg` would make the item active, and memcached may then bump its last-access time asynchronously (an item
    in its cold LRU) past a delayed flush's deadline: the item survives `flush_all 3`. It did, once in CI."""
    reply = Conn(address).call(b"me " + key + b"\r\n")
    assert reply == b"EN" or reply.startswith(b"ME " + key + b" "), (address, key, reply)
    return reply != b"EN"


def _stat(address: str, name: bytes) -> int:
    c = Conn(address)
    c.send(b"stats\r\n")
    while (line := c.line()) != b"END":
        parts = line.split()
        if parts[1] == name:
            return int(parts[2])
    raise AssertionError(f"no {name!r} in stats of {address}")


def _fill(east_a) -> dict[str, list[bytes]]:
    """Keys in every pool, set through the router (gutter directly: no route writes it normally)."""
    c = Conn(east_a.router.address)
    placed: dict[str, list[bytes]] = {name: [] for name in east_a.servers}
    for i in range(20):  # wildcard: Ch3 over its 2 servers
        key = b"user:%d" % i
        assert c.call(b"set " + key + b" 0 0 1\r\nx\r\n") == b"STORED"
        placed[f"wildcard{furc_hash(key, 2)}"].append(key)
    for i in range(3):  # session:* is set on both replicas (AllSyncRoute), chosen by prefix
        key = b"session:%d" % i
        assert c.call(b"set " + key + b" 0 0 1\r\nx\r\n") == b"STORED"
        placed["sessions0"].append(key)
        placed["sessions1"].append(key)
    assert c.call(b"set regional:1 0 0 1\r\nx\r\n") == b"STORED"
    placed["regional"].append(b"regional:1")
    assert Conn(east_a.servers["gutter"].address).call(b"set user:g 0 0 1\r\nx\r\n") == b"STORED"
    placed["gutter"].append(b"user:g")
    for name, keys in placed.items():
        assert keys, f"no key landed on {name}"
        for key in keys:
            assert _has(east_a.servers[name].address, key), (name, key)
    return placed


def _flushing_router(east_a, router_factory):
    return router_factory(east_a.config, extra_args=FAST + ("--enable-flush-cmd",))


def test_without_the_flag_flush_all_is_refused_and_nothing_is_flushed(east_a) -> None:
    placed = _fill(east_a)
    c = Conn(east_a.router.address)
    assert c.call(b"flush_all\r\n") == DISABLED
    assert c.call(b"flush_all 10\r\n") == DISABLED
    # in order with the rest of a pipeline; noreply hides the refusal as memcached hides errors
    c.send(b"md user:0 q\r\nflush_all\r\nflush_all noreply\r\nmn\r\n")
    assert c.line() == DISABLED
    assert c.line() == b"MN"
    placed[f"wildcard{furc_hash(b'user:0', 2)}"].remove(b"user:0")
    # a malformed flush gets memcached's error either way, and the connection goes on
    assert c.call(b"flush_all soon\r\n") == b"CLIENT_ERROR invalid exptime argument"
    assert c.call(b"get session:1\r\n") == b"VALUE session:1 0 1\r\nx\r\nEND\r\n"
    for name, keys in placed.items():
        for key in keys:
            assert _has(east_a.servers[name].address, key), (name, key)
        assert _stat(east_a.servers[name].address, b"cmd_flush") == 0, name
    assert _stat(east_a.router.address, b"cmd_flush") == 4  # counted, refused or not
    assert _stat(east_a.router.address, b"route:none:cmd_flush") == 4


def test_flush_all_empties_every_server_of_every_pool(east_a, router_factory) -> None:
    router = _flushing_router(east_a, router_factory)
    placed = _fill(east_a)
    c = Conn(router.address)
    assert c.call(b"flush_all\r\n") == b"OK"
    for name, keys in placed.items():
        assert _stat(east_a.servers[name].address, b"cmd_flush") == 1, name
        for key in keys:
            assert not _has(east_a.servers[name].address, key), (name, key)
    for key in (b"user:0", b"session:1", b"regional:1"):
        assert c.call(b"get " + key + b"\r\n") == b"END", key
    assert c.call(b"mg session:2 v\r\n") == b"EN"
    # noreply: no answer, but done before the next request's answer
    assert c.call(b"set user:1 0 0 1\r\nx\r\n") == b"STORED"
    c.send(b"flush_all noreply\r\nmn\r\n")
    assert c.line() == b"MN"
    assert not _has(east_a.servers[f"wildcard{furc_hash(b'user:1', 2)}"].address, b"user:1")
    assert _stat(router.address, b"cmd_flush") == 2


def test_flush_all_delay_is_passed_through(east_a, router_factory) -> None:
    router = _flushing_router(east_a, router_factory)
    placed = _fill(east_a)
    assert Conn(router.address).call(b"flush_all 3\r\n") == b"OK"
    # memcached drops the items only once the delay has passed (its clock ticks per second)
    for name, keys in placed.items():
        assert _has(east_a.servers[name].address, keys[0]), name
    for name, keys in placed.items():
        wait_for(lambda a=east_a.servers[name].address, k=keys[0]: not _has(a, k), 10, f"delayed flush on {name}")


def test_pipelined_flush_is_answered_and_applied_in_order(east_a, router_factory) -> None:
    router = _flushing_router(east_a, router_factory)
    c = Conn(router.address)
    assert c.call(b"set a 0 0 1\r\nx\r\n") == b"STORED"
    c.send(b"md a q\r\nflush_all\r\nmn\r\n")  # squeal's batch shape: md ... q, flush_all, mn
    assert c.exact(len(b"OK\r\nMN\r\n")) == b"OK\r\nMN\r\n"
    c.send(b"md a q\r\nflush_all\r\nmn\r\n")  # a miss shows (NF) before the flush's OK
    assert c.exact(len(b"NF\r\nOK\r\nMN\r\n")) == b"NF\r\nOK\r\nMN\r\n"
    # each server runs the flush between the requests sent before and after it on the connection
    keys = [b"k%d" % i for i in range(12)]
    before, after = keys[:6], keys[6:]
    c.send(
        b"".join(b"set " + k + b" 0 0 1\r\nx\r\n" for k in before)
        + b"flush_all\r\n"
        + b"".join(b"set " + k + b" 0 0 1\r\ny\r\n" for k in after)
        + b"get "
        + b" ".join(keys)
        + b"\r\nmn\r\n"
    )
    for _ in before:
        assert c.line() == b"STORED"
    assert c.line() == b"OK"
    for _ in after:
        assert c.line() == b"STORED"
    assert c.reply() == b"".join(b"VALUE " + k + b" 0 1\r\ny\r\n" for k in after) + b"END\r\n"
    assert c.line() == b"MN"
    assert {furc_hash(k, 2) for k in keys} == {0, 1}  # both wildcard servers took part


def test_flush_all_with_a_server_down_fails_until_it_is_back(east_a, router_factory) -> None:
    router = _flushing_router(east_a, router_factory)
    placed = _fill(east_a)
    down = east_a.servers["sessions1"]
    down.stop()
    c = Conn(router.address)
    reply = c.call(b"flush_all\r\n")
    assert reply.startswith(b"SERVER_ERROR flush_all failed on 1 of 6 servers: " + down.address.encode() + b" ("), reply
    # the servers that answered were flushed all the same
    assert not _has(east_a.servers["wildcard0"].address, placed["wildcard0"][0])
    # now TKO (failing fast): still an error, never OK; noreply hides it (the router logs it)
    assert c.call(b"flush_all\r\n").startswith(b"SERVER_ERROR flush_all failed on 1 of 6 servers: ")
    c.send(b"flush_all noreply\r\nmn\r\n")
    assert c.line() == b"MN"
    down.start()
    # the caller retries: once the TKO probe brings the server back, the flush succeeds
    wait_for(lambda: c.call(b"flush_all\r\n") == b"OK", 10, "flush_all OK after the server is back")
    assert _stat(router.address, b"errors") >= 3
    assert b"flush_all (noreply) failed on 1 of 6 servers" in router.log_file.read_bytes()
