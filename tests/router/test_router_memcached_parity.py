"""What a client sees through squeal-router is what it would see from memcached 1.6.18 itself, for the
answers the router makes on its own: errors of `noreply` commands, values over the size limit, and
absurd value lengths. Each test sends the same bytes to a memcached and to a router in front of
another memcached and compares the bytes that come back (memcached's behaviour is measured, not
assumed)."""

from __future__ import annotations

import socket

import pytest
from pymemcache.client.base import Client as PyClient

from ops.harness import Memcached
from tests.router.conftest import Conn

BIG = 2 * 1024 * 1024  # over memcached's default item size limit (-I 1m) and the router's default


def pool(*mcs) -> dict:
    return {"pools": {"p": {"servers": [m.address for m in mcs]}}, "route": "PoolRoute|p"}


def exchange(address: str, data: bytes, until: bytes, timeout: float = 5.0) -> bytes:
    """Send `data`, read until the bytes end with `until` (the reply to a final marker command)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while not out.endswith(until):
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            out += chunk
        return out


def both(direct: Memcached, router, data: bytes, until: bytes = b"MN\r\n") -> tuple[bytes, bytes]:
    return exchange(direct.address, data, until), exchange(router.address, data, until)


def test_router_made_errors_honour_noreply_like_memcached(memcached_factory, router_factory) -> None:
    """memcached sends nothing at all for a `noreply` command that fails: an error the router makes
    itself must be hidden too, or every later reply on the connection answers the wrong request."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    stream = (
        b"set B 0 0 2\r\nbb\r\n"
        + b"set A 0 0 %d noreply\r\n" % BIG
        + b"a" * BIG
        + b"\r\n"  # object too large
        + b"delete k 10 noreply\r\n"  # a delete time memcached no longer takes
        + b"delete k noreply 0\r\n"  # not noreply (memcached looks at the last token): error shown
        + b"delete "
        + b"k" * 251
        + b" noreply\r\n"  # key too long
        + b"incr k x noreply\r\n"  # bad delta
        + b"touch k x noreply\r\n"  # bad exptime
        + b"set k 0 0 -1 noreply\r\n"  # bad length
        + b"add k x 0 1 noreply\r\nv\r\n"  # bad flags: line refused, `v` is then an unknown command
        + b"set k 0 0 1 noreply\r\nvv\r\n"  # bad data chunk: `\n` is then an empty command line
        + b"get B\r\nmn\r\n"
    )
    want, got = both(direct, router, stream)
    assert b"VALUE B 0 2\r\nbb\r\nEND\r\n" in want, want
    assert got == want
    # flush_all is refused without --enable-flush-cmd; with noreply the refusal is not shown either
    c = Conn(router.address)
    assert c.call(b"flush_all noreply\r\nflush_all x noreply\r\nget B\r\n") == b"VALUE B 0 2\r\nbb\r\nEND\r\n"
    # a stock client with noreply sets (pymemcache's default) keeps its replies in step
    client = PyClient(("127.0.0.1", router.port), timeout=5)
    client.set("A", b"a" * BIG, noreply=True)
    assert client.get("B") == b"bb"
    client.delete("k", noreply=True)
    assert client.get("B") == b"bb"


def test_noreply_hides_routing_errors(memcached_factory, router_factory) -> None:
    mc = memcached_factory()
    config = {"pools": pool(mc)["pools"], "routes": [{"aliases": ["/east/a/"], "route": "PoolRoute|p"}]}
    router = router_factory(config)
    c = Conn(router.address)
    c.send(b"set /north/x/k 0 0 1 noreply\r\nv\r\ndelete /north/x/k noreply\r\nmn\r\n")
    assert c.line() == b"MN"
    assert c.call(b"delete /north/x/k\r\n") == b"CLIENT_ERROR no route for this routing prefix"


def test_too_large_set_unlinks_the_old_value_like_memcached(memcached_factory, router_factory) -> None:
    """memcached answers a too-large `set` (or `ms`, any mode) with SERVER_ERROR and drops the key's old
    value; add/replace/append/prepend/cas keep it. The router refuses the value itself (it never
    reaches the server) and must leave the cache as memcached would."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    blob = b"x" * BIG + b"\r\n"
    stream = b""
    for key, command in [
        (b"s1", b"set s1 0 0 %d\r\n"),
        (b"s2", b"set s2 0 0 %d noreply\r\n"),
        (b"m1", b"ms m1 %d\r\n"),
        (b"m2", b"ms m2 %d ME q\r\n"),
        (b"m3", b"ms m3 %d MA O5 k\r\n"),
        (b"a1", b"add a1 0 0 %d\r\n"),
        (b"r1", b"replace r1 0 0 %d\r\n"),
        (b"p1", b"append p1 0 0 %d\r\n"),
        (b"c1", b"cas c1 0 0 %d 1\r\n"),
    ]:
        stream += b"set " + key + b" 3 0 3\r\nold\r\n" + command % BIG + blob + b"get " + key + b"\r\n"
    stream += b"mn\r\n"
    want, got = both(direct, router, stream)
    assert want.count(b"SERVER_ERROR object too large for cache") == 8, want  # s2 is noreply
    assert b"VALUE s1" not in want and b"VALUE a1 3 3\r\nold" in want, want
    assert got == want
    assert Conn(behind.address).call(b"mg s1\r\n") == b"EN"
    # through a replicated pool, the old value goes from every replica
    r0, r1 = memcached_factory(), memcached_factory()
    router = router_factory({"pools": {"p": {"servers": [r0.address, r1.address]}}, "route": "AllSyncRoute|Pool|p"})
    for mc in (r0, r1):
        assert Conn(mc.address).call(b"set k 0 0 3\r\nold\r\n") == b"STORED"
    c = Conn(router.address)
    assert c.call(b"set k 0 0 %d\r\n" % BIG + blob) == b"SERVER_ERROR object too large for cache"
    assert Conn(r0.address).call(b"mg k\r\n") == b"EN" and Conn(r1.address).call(b"mg k\r\n") == b"EN"


class BigItemMemcached(Memcached):
    """memcached with a raised item size limit (`-I`)."""

    def __init__(self, max_item: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_item = max_item

    def command(self) -> list[str]:
        return super().command() + ["-I", self.max_item]


def test_value_limit_follows_max_item_size(processes, memcached_factory, router_factory) -> None:
    """The router's limit is configurable (`--max-item-size`, memcached's own option name and syntax)
    and defaults to memcached's default, 1 MiB."""
    mc = processes.add(BigItemMemcached("8m", workdir=processes.base / "memcached-8m"))
    router = router_factory(pool(mc), extra_args=("--max-item-size", "8m"))
    c = Conn(router.address, timeout=10)
    value = b"v" * (5 * 1024 * 1024)
    assert c.call(b"set five 0 0 %d\r\n" % len(value) + value + b"\r\n") == b"STORED"
    assert c.call(b"get five\r\n") == b"VALUE five 0 %d\r\n" % len(value) + value + b"\r\nEND\r\n"
    over = 8 * 1024 * 1024 + 1
    c.send(b"set nine 0 0 %d\r\n" % over + b"n" * over + b"\r\n")
    assert c.line() == b"SERVER_ERROR object too large for cache"
    assert c.call(b"get five\r\n").startswith(b"VALUE five 0 %d\r\n" % len(value))
    # the default is 1 MiB: a value of exactly 1 MiB is not refused by the router (memcached refuses it
    # itself: the item header counts against -I), one byte more is
    plain = router_factory(pool(memcached_factory()))
    c = Conn(plain.address)
    mib = 1024 * 1024
    c.send(b"set m 0 0 %d\r\n" % (mib + 1) + b"m" * (mib + 1) + b"\r\n")
    assert c.line() == b"SERVER_ERROR object too large for cache"
    assert c.call(b"set m 0 0 %d\r\n" % (mib - 1024) + b"m" * (mib - 1024) + b"\r\n") == b"STORED"


def test_absurd_value_lengths_are_refused_without_swallowing_the_stream(memcached_factory, router_factory) -> None:
    """A declared length memcached cannot hold (past 2^31 - 3 once cut to its 32-bit length)
    gets `CLIENT_ERROR bad command line format` and nothing is swallowed: what follows is read as
    commands, and a long run of bytes without a newline closes the connection, as on memcached."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    for length in (b"2147483646", b"2147483648", b"4294967295", b"99999999999999999999"):
        for command in (b"set h 0 0 %s\r\n", b"set h 0 0 %s noreply\r\n", b"ms h %s\r\n", b"ms h %s q\r\n"):
            stream = command % length + b"set B 0 0 2\r\nbb\r\nget B\r\nmn\r\n"
            want, got = both(direct, router, stream)
            assert b"VALUE B 0 2\r\nbb\r\nEND\r\n" in want, (command, length, want)
            assert got == want, (command, length)
    # 2^32 and above: memcached keeps only the low 32 bits of the length (4294967299 reads as 3 and
    # stores a value); the router reads them the same way (issue 26: a value framed differently
    # would be run as commands)
    for stream in (
        b"set h 0 0 4294967299\r\nabc\r\nget h\r\nmn\r\n",
        b"set h 0 0 4294967296\r\n\r\nget h\r\nmn\r\n",
        b"set h 0 0 -4294967293\r\nabc\r\nget h\r\nmn\r\n",
        b"ms h 4294967299 T0\r\nabc\r\nmg h v\r\nmn\r\n",
    ):
        want, got = both(direct, router, stream)
        assert b"VALUE h 0 " in want or b"VA " in want, (stream, want)
        assert got == want, stream
    c = Conn(router.address)
    # the value bytes of a refused length, without a newline, end the connection with no more said
    # (memcached closes after 2 KiB without a newline; it drops the answers it had not yet written, the
    # router sends them)
    c.send(b"set h 0 0 2147483648\r\n" + b"z" * 9000)
    assert c.line() == b"CLIENT_ERROR bad command line format"
    with pytest.raises(ConnectionError):
        c.line()
    assert c.buf == b""


def test_argument_errors_verbosity_and_gat_like_memcached(memcached_factory, router_factory) -> None:
    """Lines memcached's own test suite checks (cas.t, strtol-testing.t, getandtouch.t): a wrong
    number of tokens is `ERROR`, `verbosity` checks its level, and `gat`/`gats` get and touch."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    stream = (
        b"cas\r\ncas k 0 0 1\r\nset k\r\nincr k\r\ndecr\r\ntouch k\r\nappend k 0 0\r\n"
        + b"verbosity\r\nverbosity invalid\r\nverbosity x noreply\r\nverbosity 1 2 3\r\nverbosity 1\r\n"
        + b"verbosity 1 noreply\r\nstats nosuchgroup\r\n"
        + b"gat\r\ngat 10\r\ngat x foo1\r\ngat 10 foo1\r\n"
        + b"set foo1 3 2 7\r\nfooval1\r\nset foo2 0 2 7\r\nfooval2\r\n"
        + b"gats 10 foo1 nope foo2\r\ngat 10 foo1 foo2\r\ngat 100 foo2\r\nmn\r\n"
    )
    want, got = both(direct, router, stream)
    assert want.count(b"ERROR\r\n") >= 10 and b"VALUE foo1 3 7 " in want, want
    assert got == want


def test_a_gat_of_a_stale_item_leaves_its_win_token_to_the_meta_client(memcached_factory, router_factory) -> None:
    """memcached hands the right to recache an invalidated (stale) item to the first *meta* get
    (`W`, then `Z` to the rest); a classic `gat` reads the stale value without taking it. The router
    sent each key of a `gat` as `mg … T`, which took the token: the lease client after it saw `Z`
    and waited for a refill that the classic client never knew it owed (found by the fuzzer)."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    stream = (
        b"set n 0 0 1\r\n4\r\nset o 0 0 1\r\n5\r\nmd n I\r\nmd o I\r\n"
        + b"gat 1000 n\r\ngats 1000 o n\r\nmg n s v f\r\nmg o s v f\r\nmn\r\n"
    )
    want, got = both(direct, router, stream)
    assert want.count(b" X W\r\n") == 2, want  # both meta gets won the recache
    assert got == want


def test_stats_reset_answers_reset_like_memcached(memcached_factory, router_factory) -> None:
    """memcached 1.6.18 answers `RESET` to `stats reset` whatever follows it (`noreply` too: stats
    ignores it); the router answers the same once every server of the config has reset."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    stream = b"stats reset\r\nstats reset noreply\r\nstats reset x\r\nstats RESET\r\nmn\r\n"
    want, got = both(direct, router, stream)
    assert want == b"RESET\r\nRESET\r\nRESET\r\nERROR\r\nMN\r\n"
    assert got == want


def test_keys_with_control_bytes_like_memcached(memcached_factory, router_factory) -> None:
    """memcached 1.6.18 splits a command line on spaces only: a key may hold any other byte (control
    bytes, DEL, bytes over 0x7f, a CR inside it). The line ends at its first NUL (what follows it is
    not read), so a NUL never reaches a key. Every key command, classic and meta, takes them."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    stream = b""
    odd = [bytes([b]) for b in [*range(1, 10), *range(11, 32), 0x7F, 0x80, 0xFF]]
    for i, byte in enumerate(odd):
        key = b"a" + byte + b"z%d" % i
        stream += b"set " + key + b" 0 0 1\r\nv\r\nget " + key + b"\r\n"
    keys = [b"a" + byte + b"z%d" % i for i, byte in enumerate(odd)]
    stream += b"get " + b" ".join(keys) + b" nope\r\ngets \x01 " + keys[3] + b"\r\n"
    stream += (
        b"set \x01 0 0 1\r\n1\r\nset \x7f\x0b 5 0 1 noreply\r\n2\r\nget \x01 \x7f\x0b\r\n"
        + b"mg c\x01r v k\r\nms c\x01r 2 T0 F3\r\nhi\r\nmg c\x01r v k f\r\nma n\x02 N0 J5 v\r\n"
        + b"md c\x01r q\r\nmg c\x01r v\r\n"
        + b"set n\x03 0 0 1\r\n7\r\nincr n\x03 5\r\ndecr n\x03 2\r\ntouch n\x03 100\r\n"
        + b"gat 100 n\x03 a\x01z0\r\ngats 100 n\x03\r\ndelete n\x03\r\ndelete n\x03 noreply\r\nget n\x03\r\n"
        # a CR inside a key, and at the end of the last token (only the CR before the LF ends the line)
        + b"set c\rr 0 0 1\r\nc\r\nget c\rr\r\nget k\r\r\nset k\r 0 0 1\r\nk\r\nget k\r\r\n"
        + b"mg k\r v k\r\nmg c\rr k v\r\nmg c\rr v\r\n"
        # a tab is no separator: `k\t0` is one token, so the line has too few
        + b"set k\t0 0 1\r\nv\r\n"
        # NUL ends the line where it stands
        + b"set x\x00y 0 0 1\r\nv\r\nset x 0 0 1\x00junk\r\nX\r\nget x\x00 a\x01z0\r\nget x \x00a\x01z0\r\n"
        + b"mg x\x00 v\r\nmg x v\x00 k\r\n\x00get x\r\ndelete x\x00zzz\r\nget x\r\n"
        + b"set y 0 0 1 noreply\x00\r\nY\r\nset y 0 0 1 \x00noreply\r\nY\r\nget y\r\nmn\r\n"
    )
    want, got = both(direct, router, stream)
    assert want.count(b"STORED\r\n") > len(odd) and b"VALUE c\rr 0 1\r\nc\r\n" in want, want
    assert got == want
    # the keys reached the server as sent
    assert Conn(behind.address).call(b"get a\x1bz25\r\n") == b"VALUE a\x1bz25 0 1\r\nv\r\nEND\r\n"


def test_client_flags_keep_their_low_32_bits_like_memcached(memcached_factory, router_factory) -> None:
    """memcached 1.6.18 reads client flags as C's strtoul does and keeps the low 32 bits: anything up
    to 2^64 - 1 is taken (2^32 is 0, 2^64 - 1 is 4294967295), 2^64 and more are a bad line, and so are
    negative numbers down to -2^63; below that the wrapped value is positive again and taken. Leading
    whitespace bytes (tab, VT, FF, CR) are skipped, and the number may end at one."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    values = [
        b"4294967295", b"4294967296", b"4294967297", b"4294967301", b"9223372036854775807",
        b"9223372036854775808", b"18446744073709551615", b"18446744073709551616", b"99999999999999999999",
        b"-0", b"-1", b"-4294967297", b"-9223372036854775808", b"-9223372036854775809",
        b"-18446744073709551615", b"-18446744073709551616", b"+5", b"05", b"000000000000000000000000007",
        b"0x10", b"5a", b"+", b"-", b"--5", b"+-5", b"\t5", b"\t+5", b"\t-5", b"\t", b"5\t", b"5\tx",
        b"\x0b7", b"\x0c\x0c9\x0cq", b"\r5", b"5\rz", b"5\x01", b"\x80",
    ]  # fmt: skip
    stream = b""
    for flags in values:
        stream += b"set k 0 0 1\r\nv\r\nset k " + flags + b" 0 1\r\nw\r\nget k\r\n"
        stream += b"set k " + flags + b" 0 1 noreply\r\nn\r\nget k\r\n"
    for command in (b"add a%d", b"replace k", b"append k", b"prepend k", b"cas k"):
        for i, flags in enumerate((b"4294967297", b"18446744073709551615", b"-1")):
            line = command.replace(b"%d", b"%d" % i) + b" " + flags + b" 0 1"
            stream += line + (b" 1" if command == b"cas k" else b"") + b"\r\nz\r\ngets k a%d\r\n" % i
    stream += b"ms m 1 F4294967301\r\nm\r\nmg m v f\r\nmn\r\n"
    want, got = both(direct, router, stream)
    assert b"VALUE k 4294967295 1\r\nw\r\n" in want and b"VALUE k 1 1\r\nw\r\n" in want, want
    assert got == want


def until_closed(address: str, data: bytes, pause_after: int | None = None) -> bytes:
    """Send `data` (in two writes split at `pause_after` if given), read until the peer closes."""
    host, port = address.rsplit(":", 1)
    out = b""
    with socket.create_connection((host, int(port)), timeout=5) as s:
        try:
            s.sendall(data)
            while chunk := s.recv(1 << 20):
                out += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    return out


def padded(line: bytes, n: int) -> bytes:
    """`line` padded with spaces to `n` bytes, CRLF included (memcached ignores spaces between tokens)."""
    return line + b" " * (n - len(line) - 2) + b"\r\n"


def test_long_command_lines_like_memcached(memcached_factory, router_factory) -> None:
    """memcached 1.6.18 reads a command line whose newline is within 16 KiB of its start when it
    arrives in one piece (its read buffer is 16 KiB), and closes the connection without a reply when
    2 KiB or more are buffered without a newline (a get/gets line excepted): a 9 KB `set` line is
    served, a 16,385-byte one closes the connection, as does a run of 2,049 bytes without a newline."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    for n in (2049, 9000, 16384):
        # one long line per write: memcached reads 16 KiB at a time, and a second long line cut by that
        # read would be 2 KiB without a newline
        for line, want in (
            (padded(b"set k%d 0 0 1" % n, n) + b"v\r\n", b"STORED\r\n"),
            (padded(b"mg k%d v" % n, n), b"VA 1\r\nv\r\n"),
            (padded(b"bogus", n), b"ERROR\r\n"),
            (padded(b"delete k%d" % n, n), b"DELETED\r\n"),
        ):
            answers = both(direct, router, line + b"mn\r\n")
            assert answers == (want + b"MN\r\n",) * 2, (n, line[:10], answers)
    # a 9 KB line with a key too long: refused, and the value is read as the next command
    want, got = both(direct, router, b"set " + b"k" * 9000 + b" 0 0 1\r\nv\r\nmn\r\n")
    assert want == b"CLIENT_ERROR bad command line format\r\nERROR\r\nMN\r\n", want
    assert got == want
    # past 16 KiB, or 2 KiB without a newline: closed, nothing answered
    for data in (
        padded(b"set k 0 0 1", 16385) + b"v\r\n",
        padded(b"mg k v", 20000),
        b"x" * 65536 + b"\r\n",
        b"set k 0 0 1" + b" " * 2038,
    ):
        assert until_closed(direct.address, data) == b"", data[:20]
        assert until_closed(router.address, data) == b"", data[:20]
    # 2,048 bytes without a newline are waited on
    for mc in (direct, router):
        c = Conn(mc.address)
        c.send(b"set w 0 0 1" + b" " * 2037)
        c.send(b"\r\nw\r\nmn\r\n")
        assert (c.line(), c.line()) == (b"STORED", b"MN")


def test_bget_is_a_get_like_memcached(memcached_factory, router_factory) -> None:
    """memcached 1.6.18 still serves `bget`, an old alias of `get` (the same code in its
    proto_text.c: VALUE blocks without cas, END, counted in cmd_get); its line is not exempt from
    the 2 KiB partial-line bound as `get`/`gets` lines are."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    stream = (
        b"set a 5 0 2\r\naa\r\nset b 0 0 3\r\nbbb\r\n"
        + b"bget a\r\nbget a nope b\r\nbget  b  a \r\nbget\r\nbget a noreply\r\nmn\r\n"
    )
    want, got = both(direct, router, stream)
    assert b"VALUE a 5 2\r\naa\r\nEND\r\nVALUE a 5 2\r\naa\r\nVALUE b 0 3\r\nbbb\r\nEND\r\n" in want, want
    assert b"END\r\nERROR\r\nVALUE a" in want, want
    assert got == want
    # counted as gets, hits and misses, by both
    stats = {}
    for name, mc in (("memcached", direct), ("router", router)):
        lines = exchange(mc.address, b"stats\r\n", b"END\r\n").decode().splitlines()
        stats[name] = {ln.split()[1]: ln.split()[2] for ln in lines if ln.startswith("STAT ")}
    # 8 keys asked (`noreply` is a key here), 6 found
    for stat, n in (("cmd_get", "8"), ("get_hits", "6"), ("get_misses", "2")):
        assert stats["memcached"][stat] == stats["router"][stat] == n, (stat, stats)
    # a key over 250 bytes refuses the whole line (on its own: memcached drops the unwritten answers
    # of earlier pipelined commands then, a known difference, docs/router.md)
    want, got = both(direct, router, b"bget a " + b"k" * 251 + b"\r\nmn\r\n")
    assert want == b"CLIENT_ERROR bad command line format\r\nMN\r\n", want
    assert got == want
    # past 2 KiB without a newline: closed without a reply, as any non-get line
    data = b"bget " + b"k " * 1100
    assert until_closed(direct.address, data) == b""
    assert until_closed(router.address, data) == b""


def test_a_gat_with_an_overlong_key_touches_the_keys_before_it_like_memcached(
    memcached_factory, router_factory
) -> None:
    """memcached 1.6.18 reads a `gat`/`gats` line key by key: the keys before one over 250 bytes are
    touched (found, their TTL set) before the long one is refused, and the VALUE lines already
    built are dropped, so the answer is the error alone; the keys after it are not touched. A plain
    `get`/`gets` line with a long key answers the same bare error. Each line goes first on its own
    connection: memcached drops the unwritten answers pipelined before such a line (a known
    difference, docs/router.md)."""
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(pool(behind))
    long_key = b"L" * 251
    setup = b"set k 0 0 1\r\na\r\nset j 0 0 1\r\nb\r\nset e 0 0 1\r\nc\r\nset f 0 0 1\r\nd\r\nmn\r\n"
    both(direct, router, setup)
    bad = b"CLIENT_ERROR bad command line format\r\n"
    for line in (
        b"gat 1000 k " + long_key + b" j\r\n",
        b"gats 1000 f " + long_key + b"\r\n",
        b"gat -1 e " + long_key + b"\r\n",
        b"get k j " + long_key + b"\r\n",
        b"gets k " + long_key + b" j\r\n",
        b"gat 1000 " + long_key + b" j\r\n",
    ):
        want, got = both(direct, router, line, until=bad)
        assert want == bad, (line[:20], want)
        assert got == want, line[:20]
    # TTLs in whole seconds, from each server's own clock: 1000 (or 999 a second later) vs -1
    check = b"mg k v t\r\nmg j v t\r\nmg e v t\r\nmg f v t\r\nmn\r\n"
    want, got = both(direct, router, check)
    assert want.startswith(b"VA 1 t") and b"VA 1 t-1\r\nb\r\nEN\r\nVA 1 t" in want, want
    assert got.replace(b"t999", b"t1000") == want.replace(b"t999", b"t1000")
