"""Differential fuzzer: squeal-router against memcached 1.6.18, byte for byte.

Each case is a random command stream — valid commands, wrong token counts, junk tokens, bad and
huge lengths, values without their CRLF, `noreply`, pipelining, meta commands with bad flags —
sent in random pieces to a memcached and, over another connection, through a router to a second
memcached. The replies must be the same bytes, and so must what the two memcacheds hold afterwards.
Only the differences listed in docs/router.md ("Known differences") are normalised (`normalise`).

The bounded run is part of the normal pytest run (`test_router_fuzz.py`); a longer one:

    python -m tests.router.fuzz_protocol --seconds 600 [--seed N] [--record]

(from the checkout's root, with the router built). `--record` appends every divergence found to
`fuzz_regressions.txt`, which `test_router_fuzz.py` replays on every run.
"""

from __future__ import annotations

import argparse
import ast
import base64
import json
import random
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REGRESSIONS = Path(__file__).with_name("fuzz_regressions.txt")

# Keys: plain, with bytes memcached takes in a key (a tab, a control byte, a byte over 0x7f), one
# of 250 bytes and one too long. Values and numbers are small so that the state stays comparable.
KEYS = [b"k0", b"k1", b"k2", b"n", b"a\tb", b"\x01c", b"\xffd", b"L" * 250]
BAD_KEYS = [b"L" * 251]
NUMBERS = [
    b"0", b"1", b"2", b"13", b"-1", b"+3", b"007", b"\t4", b"5\t", b"x", b"1x", b"-0",
    b"4294967296", b"4294967309", b"-4294967293", b"2147483647", b"2147483648", b"2147483645",
    b"18446744073709551615", b"18446744073709551616", b"-9223372036854775809", b"9223372036854775808",
    b"1000", b"100000",
]  # fmt: skip
JUNK = [b"x", b"noreply", b"NOREPLY", b"0", b"junk", b"\x01", b"HTTPx", b"q", b"b"]
MG_FLAGS = [b"v", b"f", b"c", b"k", b"s", b"q", b"O1", b"Oabc", b"T1000", b"N1000", b"u", b"h", b"b", b"E5"]
MS_FLAGS = [b"T1000", b"T-1", b"F7", b"F4294967301", b"C1", b"C3", b"I", b"q", b"O9", b"k", b"b", b"c",
            b"ME", b"MA", b"MP", b"MR", b"MS"]  # fmt: skip
MD_FLAGS = [b"q", b"I", b"T1000", b"C1", b"C3", b"O5", b"k", b"b"]
MA_FLAGS = [b"N1000", b"J5", b"D2", b"T1000", b"MI", b"MD", b"M+", b"M-", b"q", b"O2", b"k", b"v", b"c", b"b"]
BAD_FLAGS = [b"9", b"!", b"Tx", b"Nx", b"Fx", b"Cx", b"Mxx", b"M", b"MZ", b"Jx", b"Dx", b"O" + b"o" * 33,
             b"\x80", b"zz", b"qq", b"bq", b"T"]  # fmt: skip
CLOCK_FREE_NOTE = "no flag that reports time (t, l, me): two memcacheds' clocks tick apart"


def b64(key: bytes) -> bytes:
    return base64.b64encode(key)


@dataclass
class Gen:
    """Random command streams from one seeded `random.Random`."""

    rng: random.Random

    def pick(self, seq):
        return self.rng.choice(seq)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def key(self) -> bytes:
        return self.pick(BAD_KEYS) if self.chance(0.03) else self.pick(KEYS)

    def number(self, usual: list[bytes]) -> bytes:
        return self.pick(NUMBERS) if self.chance(0.15) else self.pick(usual)

    def value(self) -> bytes:
        if self.chance(0.3):
            return str(self.rng.randint(0, 30)).encode()  # numeric, for incr/decr
        n = self.rng.randint(0, 40)
        alphabet = b"abcdefgh \r\n\x00set k 0 0 1"
        return bytes(self.pick(alphabet) for _ in range(n))

    def tail(self) -> list[bytes]:
        """What may follow a classic line's fixed tokens."""
        r = self.rng.random()
        if r < 0.15:
            return [b"noreply"]
        if r < 0.3:
            return [self.pick(JUNK)]
        if r < 0.34:
            return [self.pick(JUNK), self.pick(JUNK)]
        return []

    def drop_or_add(self, tokens: list[bytes]) -> list[bytes]:
        """Sometimes a wrong number of tokens."""
        if self.chance(0.06) and len(tokens) > 1:
            del tokens[self.rng.randrange(1, len(tokens))]
        elif self.chance(0.04):
            tokens.insert(self.rng.randrange(1, len(tokens) + 1), self.pick(JUNK))
        return tokens

    def line(self, tokens: list[bytes]) -> bytes:
        sep = b"  " if self.chance(0.03) else b" "
        end = b"\n" if self.chance(0.05) else b"\r\n"
        return sep.join(tokens) + end

    def data(self, value: bytes, declared: bytes) -> bytes:
        """The data block: usually `value` and CRLF, sometimes one byte off or without its CRLF."""
        if self.chance(0.06):
            return value + b"X\r\n"
        if self.chance(0.04):
            return value + b"\n"
        return value + b"\r\n"

    def storage(self) -> bytes:
        cmd = self.pick([b"set", b"set", b"add", b"replace", b"append", b"prepend", b"cas"])
        value = self.value()
        length = str(len(value)).encode()
        if self.chance(0.12):
            length = self.pick(NUMBERS)
        tokens = [
            cmd,
            self.key(),
            self.number([b"0", b"0", b"5", b"4294967301"]),
            self.number([b"0", b"0", b"1000", b"-1"]),
            length,
        ]
        if cmd == b"cas":
            tokens.append(self.number([b"1", b"2", b"3", b"5", b"8", b"13"]))
        tokens += self.tail()
        return self.line(self.drop_or_add(tokens)) + self.data(value, length)

    def too_large(self) -> bytes:
        cmd = self.pick([b"set", b"add", b"ms"])
        size = 1024 * 1024 + self.rng.randint(1, 200)
        # newlines inside: if a line is refused, what it carried is read as short command lines
        value = (b"z" * 98 + b"\r\n") * (size // 100) + b"z" * (size % 100)
        if cmd == b"ms":
            tokens = [cmd, self.key(), str(len(value)).encode()] + self.meta_flags(MS_FLAGS)
        else:
            tokens = [cmd, self.key(), b"0", b"0", str(len(value)).encode()] + self.tail()
        return self.line(tokens) + value + b"\r\n"

    def retrieval(self, first: bool = False) -> bytes:
        """A get; a key over 250 bytes only in a stream's first command (see `overlong_get`)."""
        cmd = self.pick([b"get", b"gets", b"gat", b"gats", b"bget"])
        tokens = [cmd]
        if cmd.startswith(b"gat"):
            tokens.append(self.number([b"0", b"1000", b"-1"]))
        key = self.key if first else lambda: self.pick(KEYS)
        tokens += [key() for _ in range(self.rng.randint(0 if self.chance(0.05) else 1, 4))]
        return self.line(tokens)

    def touch_then_refuse(self) -> bytes:
        """`gat`/`gats` whose keys go on with one over 250 bytes: memcached touches the keys before it, then
        answers only CLIENT_ERROR. Only ever a stream's first command, on seeded keys (`seeded`), so the touch
        shows in the contents (an exptime of -1 expires them) and no earlier answer is pending."""
        tokens = [self.pick([b"gat", b"gats"]), self.pick([b"-1", b"-1", b"0", b"1000"])]
        tokens += [self.pick(KEYS) for _ in range(self.rng.randint(1, 3))] + [self.pick(BAD_KEYS)]
        if self.chance(0.5):
            tokens.append(self.pick(KEYS))  # a key after the refused one: memcached never reaches it
        return b" ".join(tokens) + b"\r\n"

    def delete(self) -> bytes:
        tokens = [b"delete", self.key()]
        r = self.rng.random()
        if r < 0.15:
            tokens.append(b"0")
        elif r < 0.3:
            tokens.append(b"noreply")
        elif r < 0.4:
            tokens += [b"0", b"noreply"]
        elif r < 0.5:
            tokens += [self.pick(JUNK)] * self.rng.randint(1, 3)
        return self.line(tokens)

    def arith(self) -> bytes:
        tokens = [self.pick([b"incr", b"decr"]), self.key(), self.number([b"1", b"2", b"10"])] + self.tail()
        return self.line(self.drop_or_add(tokens))

    def touch(self) -> bytes:
        tokens = [b"touch", self.key(), self.number([b"0", b"1000", b"-1"])] + self.tail()
        return self.line(self.drop_or_add(tokens))

    def meta_flags(self, usual: list[bytes]) -> list[bytes]:
        flags = self.rng.sample(usual, self.rng.randint(0, min(4, len(usual))))
        if self.chance(0.15):
            flags.insert(self.rng.randint(0, len(flags)), self.pick(BAD_FLAGS))
        if self.chance(0.04):
            flags += [self.pick(usual)]  # perhaps a duplicate
        if self.chance(0.02):
            flags += [b"O%d" % i for i in range(18)]  # too many tokens
        return flags

    def meta_key(self, flags: list[bytes]) -> bytes:
        key = self.key()
        if b"b" in flags:
            return b"!!!" if self.chance(0.1) else b64(key)
        return key

    def meta(self) -> bytes:
        cmd = self.pick([b"mg", b"mg", b"ms", b"ms", b"md", b"ma", b"mn"])
        if cmd == b"mn":
            return self.line([cmd])
        usual = {b"mg": MG_FLAGS, b"ms": MS_FLAGS, b"md": MD_FLAGS, b"ma": MA_FLAGS}[cmd]
        flags = self.meta_flags(usual)
        if cmd == b"ma" and any(f.startswith(b"q") for f in flags):
            flags = [f for f in flags if not f.startswith(b"N")]  # known difference: `ma q N`
        tokens = [cmd, self.meta_key(flags)]
        if cmd == b"ms":
            value = self.value()
            length = self.pick(NUMBERS) if self.chance(0.1) else str(len(value)).encode()
            tokens.append(length)
            return self.line(self.drop_or_add(tokens + flags)) + self.data(value, length)
        return self.line(self.drop_or_add(tokens + flags))

    def misc(self) -> bytes:
        return self.pick([
            b"version\r\n", b"mn\r\n", b"verbosity 0\r\n", b"verbosity 0 noreply\r\n", b"verbosity 0 x\r\n",
            b"verbosity x\r\n", b"verbosity\r\n", b"flush_all\r\n", b"flush_all 0\r\n", b"flush_all -1\r\n",
            b"flush_all noreply\r\n", b"flush_all 0 x\r\n", b"flush_all x\r\n", b"flush_all x y\r\n",
            b"flush_all 0 0 0\r\n", b"\r\n", b"\n", b"bogus\r\n", b"m\r\n", b"mz k\r\n", b"GET\r\n", b"sets k\r\n",
            b"get\r\n", b"gets\r\n", b"delete\r\n", b"incr\r\n", b"set\r\n", b"cas k 0 0 1\r\n",
            b"set k0 0 0 1\0junk\r\nv\r\n", b"ms\r\n", b"mg\r\n", b"md\r\n", b"ma\r\n", b"ms k0\r\n",
        ])  # fmt: skip

    def last(self) -> bytes:
        """A command that ends the connection (on both sides), only ever at the end."""
        return self.pick([b"quit\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"foo HTTP/1.0\r\n"])

    def command(self, first: bool = False) -> bytes:
        r = self.rng.random()
        if first and r < 0.03:
            return self.touch_then_refuse()
        if first and r < 0.05:
            return self.retrieval(first=True)
        if r < 0.30:
            return self.storage()
        if r < 0.45:
            return self.retrieval()
        if r < 0.52:
            return self.delete()
        if r < 0.60:
            return self.arith()
        if r < 0.64:
            return self.touch()
        if r < 0.90:
            return self.meta()
        if r < 0.905:
            return self.too_large()
        return self.misc()

    def mutate(self, stream: bytes) -> bytes:
        """A byte-level change: a byte dropped, doubled, or replaced (lines stay short)."""
        if not stream:
            return stream
        i = self.rng.randrange(len(stream))
        r = self.rng.random()
        if r < 0.33:
            return stream[:i] + stream[i + 1 :]
        if r < 0.66:
            return stream[:i] + stream[i : i + 1] * 2 + stream[i + 1 :]
        return stream[:i] + bytes([self.pick(b" \r\n\x000123456789xq-")]) + stream[i + 1 :]

    def case(self) -> list[bytes]:
        """One stream, cut into the pieces it is sent in."""
        while True:
            stream = b"".join(self.command(first=i == 0) for i in range(self.rng.randint(1, 10)))
            for _ in range(self.rng.choice([0, 0, 0, 1, 2])):
                stream = self.mutate(stream)
            # (a lone `\n` that a mutation dropped leaves nothing to send)
            if stream and not any(
                known(stream) for known in (overlong_get, quiet_autovivifying_ma, clock_sensitive, blank_arithmetic)
            ):
                break
        if self.chance(0.05):
            stream += self.last()
        cuts = sorted(self.rng.sample(range(1, len(stream)), min(len(stream) - 1, self.rng.randint(0, 3))))
        return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]


# Appended to every stream: its answer (`NF Oend`) marks the end of the replies. The CRLF first ends
# a line the stream left unfinished (both sides then answer it); a stream that leaves a value to
# be read eats the marker, and the replies end when the server goes quiet instead.
END_MARK = b"\r\nmd __fuzz_end__ Oend\r\n"
END_REPLY = b"NF Oend\r\n"


_RETRIEVAL = re.compile(rb"^ *(get|gets|gat|gats|bget) ")


_ARITHMETIC = re.compile(rb"^ *ma ")


def quiet_autovivifying_ma(stream: bytes) -> bool:
    """Whether an `ma` line carries both a `q` and an `N` flag (mutation can make one out of any `ma`):
    memcached answers the item's creation, the router cannot tell it from an increment (a known
    difference, docs/router.md), and the fuzzer does not generate it."""
    for line in stream.split(b"\n"):
        if _ARITHMETIC.match(line):
            flags = line.rstrip(b"\r").split()[2:]  # after `ma KEY`
            if any(f.startswith(b"q") for f in flags) and any(f.startswith(b"N") for f in flags):
                return True
    return False


_ARITHMETIC_LINE = re.compile(rb"^ *(incr|decr|ma) ")


def blank_arithmetic(stream: bytes) -> bool:
    """Whether the stream does arithmetic and may store a value made only of whitespace. memcached
    1.6.18 reads such a value with `strtoull`, which skips the spaces and the item's own CRLF and goes
    on into whatever bytes follow the item in its slab: `incr` of `" "` answers a number left there
    by an earlier item, or refuses, so two memcacheds disagree with each other (seen by hand: after
    `set y 0 0 5` of `00000` and `delete y`, an `incr x 0` of `" "` stores `0`). A whitespace-only
    line anywhere in the stream is taken as such a value, which only ever rejects a harmless stream."""
    lines = stream.split(b"\n")
    if not any(_ARITHMETIC_LINE.match(line) for line in lines):
        return False
    return any(not line.strip(b" \t\r\x0b\x0c") for line in lines[:-1])


_TOUCH_THEN_REFUSE = re.compile(rb"^(gat|gats) [^\r\n]* L{251,}(?: |\r)")


def seeded(stream: bytes) -> bool:
    """Whether the stream starts with a `gat`/`gats` line a key over 250 bytes ends (`Gen.touch_then_refuse`): its
    case runs on servers where every key holds a value, or the touches it makes would touch nothing."""
    return bool(_TOUCH_THEN_REFUSE.match(stream))


SEED = b"".join(b"set %s 0 0 1\r\ns\r\n" % k for k in KEYS)


def overlong_get(stream: bytes) -> bool:
    """Whether a retrieval line after the first carries a token over 250 bytes. memcached 1.6.18
    answers such a line by dropping every answer of the connection not yet written — those of the
    commands pipelined before it too — so what it answers depends on timing; the router answers
    them (a known difference, docs/router.md), and the fuzzer does not generate it."""
    lines = stream.split(b"\n")[1:]
    return any(_RETRIEVAL.match(line) and any(len(t) > 250 for t in line.split(b" ")) for line in lines)


_EXPTIME_AT = {b"set": 3, b"add": 3, b"replace": 3, b"append": 3, b"prepend": 3, b"cas": 3,
               b"touch": 2, b"gat": 1, b"gats": 1, b"flush_all": 1}  # fmt: skip
_META = {b"mg", b"ms", b"md", b"ma"}
# An item that expires this many seconds from now (or a flush that waits as long) may be gone on
# one memcached and not yet on the other: each ticks its own one-second clock, and a case's two
# exchanges are up to a few seconds apart.
_CLOCK_SENSITIVE = range(1, 60)


def _strtol32(tok: bytes) -> int | None:
    """memcached's `safe_strtol` into an int32 field, as the router's protocol/numbers.rs reads it."""
    m = re.fullmatch(rb"[ \t\n\x0b\x0c\r]*([-+]?)(\d+)(?:[ \t\n\x0b\x0c\r].*)?", tok, re.S)
    if not m:
        return None
    value = int(m.group(2)) * (-1 if m.group(1) == b"-" else 1)
    if not -(1 << 63) <= value < (1 << 63):
        return None
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def clock_sensitive(stream: bytes) -> bool:
    """Whether a line gives an exptime (or a flush delay) of under a minute: the two memcacheds
    would expire it at different moments, so the comparison would judge their clocks, not the
    router (mutation can make one out of `1000`, or of a number past 2^32). Lines inside values
    are read as commands too, which only ever rejects a harmless stream."""
    for line in stream.split(b"\n"):
        tokens = [t for t in line.rstrip(b"\r").split(b" ") if t]
        if not tokens:
            continue
        numbers: list[bytes] = []
        at = _EXPTIME_AT.get(tokens[0])
        if at is not None and len(tokens) > at:
            numbers.append(tokens[at])
        if tokens[0] in _META:
            numbers += [t[1:] for t in tokens[2:] if t[:1] in (b"T", b"N")]
        if any(_strtol32(n) in _CLOCK_SENSITIVE for n in numbers):
            return True
    return False


def exchange(address: str, chunks: list[bytes], quiet: float = 0.6, timeout: float = 10.0) -> bytes:
    """Send the pieces (a short pause between them) and the end marker; read the replies up to the
    marker's, or until the server closes, or has been quiet for `quiet` seconds; then half-close
    and read what is left. (Half-closing at once would not do: memcached closes on end-of-file
    without writing the answers it has not yet written.)"""
    host, port = address.rsplit(":", 1)
    out = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for i, chunk in enumerate(chunks):
                if i:
                    time.sleep(0.002)
                s.sendall(chunk)
            s.sendall(END_MARK)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed (quit, an HTTP line): what it answered is still to be read
        try:
            s.settimeout(quiet)
            while not out.endswith(END_REPLY):
                chunk = s.recv(1 << 16)
                if not chunk:
                    return out
                out += chunk
        except TimeoutError:
            pass
        except ConnectionResetError:
            return out
        try:
            s.settimeout(timeout)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(1 << 16):
                out += chunk
        except (OSError, TimeoutError):
            pass
    return out


def contents(address: str) -> bytes:
    """What a memcached holds for every key the fuzzer uses (value, flags, cas, stale/win flags)."""
    stream = b"".join(b"mg %s s v f c\r\n" % k for k in KEYS)
    return exchange(address, [stream])


_VERSION = re.compile(rb"^VERSION [^\r\n]*\r\n", re.M)
# An incr/decr whose result is shorter than the value rewrites the item in place, padded with spaces to
# its old length — but only when no reply still being written holds the item; otherwise memcached stores
# a new item of the result's own length. Through the router the backend's replies go out pipelined, so
# which one happens depends on timing (docs/router.md, "Known differences").
_PADDED_NUMBER = re.compile(rb"^VA (\d+) s(\d+)( [^\r\n]*)?\r\n(\d+) +\r\n", re.M)


def unpad(held: bytes) -> bytes:
    """`contents` with a number padded in place by incr/decr written as the number alone."""

    def one(m: re.Match[bytes]) -> bytes:
        n = len(m.group(4))
        return b"VA %d s%d%s\r\n%s\r\n" % (n, n, m.group(3) or b"", m.group(4))

    return _PADDED_NUMBER.sub(one, held)


def normalise(replies: bytes) -> bytes:
    """The differences docs/router.md lists as known: `version` answers the router's own version."""
    return _VERSION.sub(b"VERSION *\r\n", replies)


def cut_short(replies: bytes) -> bool:
    """memcached's replies end without the end marker's: it closed the connection (an HTTP request
    line, or a value left unread when the fuzzer half-closed). memcached then drops the answers it
    had not yet written (docs/router.md), where the router sends them: its replies may go on."""
    return not replies.endswith(END_REPLY)


@dataclass
class Divergence:
    chunks: list[bytes]
    what: str
    memcached: bytes
    router: bytes

    def __str__(self) -> str:
        return (
            f"{self.what} differ for the stream {self.chunks!r}\n"
            f"  memcached: {self.memcached!r}\n  router:    {self.router!r}"
        )


@dataclass
class Target:
    """A memcached to compare with, and a router in front of another memcached."""

    direct: str
    behind: str
    router: str

    def reset(self) -> None:
        for address in (self.direct, self.behind):
            assert exchange(address, [b"flush_all\r\n"]) == b"OK\r\nERROR\r\n" + END_REPLY

    def check(self, chunks: list[bytes]) -> Divergence | None:
        self.reset()
        if seeded(b"".join(chunks)):
            for address in (self.direct, self.behind):
                assert exchange(address, [SEED]) == b"STORED\r\n" * len(KEYS) + b"ERROR\r\n" + END_REPLY
        want = normalise(exchange(self.direct, chunks))
        got = normalise(exchange(self.router, chunks))
        if cut_short(want) and got.startswith(want):
            want = got  # known difference: memcached drops the answers it had not yet written
        if got != want:
            return Divergence(chunks, "replies", want, got)
        want, got = unpad(contents(self.direct)), unpad(contents(self.behind))
        if got != want:
            return Divergence(chunks, "contents", want, got)
        return None


def router_config(behind: str) -> dict:
    return {"pools": {"p": {"servers": [behind]}}, "route": "PoolRoute|p"}


ROUTER_ARGS = ("--enable-flush-cmd",)


def load_regressions(path: Path = REGRESSIONS) -> list[tuple[str, list[bytes]]]:
    """The recorded cases: a `# ...` comment line naming each, then the pieces as a Python list of bytes."""
    cases, note = [], ""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            note = line[1:].strip()
        elif line.strip():
            chunks = ast.literal_eval(line)
            assert isinstance(chunks, list) and all(isinstance(c, bytes) for c in chunks), line
            cases.append((note, chunks))
    return cases


def record(found: Divergence, seed: int, path: Path = REGRESSIONS) -> None:
    with path.open("a") as f:
        f.write(f"# seed {seed}: {found.what} differed\n{found.chunks!r}\n")


def run(
    target: Target, seed: int, seconds: float, max_cases: int | None = None
) -> Iterator[tuple[int, Divergence | None]]:
    """Fuzz for `seconds` (or `max_cases`): each case's number and its divergence, if any."""
    gen = Gen(random.Random(seed))
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline and (max_cases is None or n < max_cases):
        n += 1
        yield n, target.check(gen.case())


def _processes(workdir: Path) -> tuple[Target, Callable[[], None]]:
    from ops.harness import Memcached, Router

    direct = Memcached(workdir=workdir / "direct").start()
    behind = Memcached(workdir=workdir / "behind").start()
    config = workdir / "router.json"
    config.write_text(json.dumps(router_config(behind.address)))
    router = Router(config, workdir=workdir / "router", extra_args=ROUTER_ARGS).start()

    def stop() -> None:
        for p in (router, behind, direct):
            p.stop(grace=5)

    return Target(direct.address, behind.address, router.address), stop


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="how long to fuzz (default 300)")
    ap.add_argument("--seed", type=int, default=None, help="the seed (default: random, printed)")
    ap.add_argument("--record", action="store_true", help=f"append divergences to {REGRESSIONS.name}")
    ap.add_argument("--max-divergences", type=int, default=20, help="stop after this many (default 20)")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(f"fuzz_protocol: seed {seed}, {args.seconds:.0f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="squeal-fuzz-") as tmp:
        target, stop = _processes(Path(tmp))
        found = cases = 0
        try:
            for cases, divergence in run(target, seed, args.seconds):
                if divergence is None:
                    continue
                found += 1
                print(f"case {cases}: {divergence}", flush=True)
                if args.record:
                    record(divergence, seed)
                if found >= args.max_divergences:
                    break
        finally:
            stop()
    print(f"fuzz_protocol: seed {seed}: {cases} cases, {found} divergence(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
