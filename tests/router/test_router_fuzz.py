"""The differential fuzzer's CI run (see fuzz_protocol.py): every recorded divergence replayed,
then a bounded run of random command streams, router against memcached 1.6.18 byte for byte.

SQUEAL_FUZZ_SEED picks the seed (default: a random one, printed on failure), SQUEAL_FUZZ_SECONDS
the length of the bounded run (default 30). For a longer run: `python -m tests.router.fuzz_protocol`.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.router.fuzz_protocol import (
    KEYS,
    ROUTER_ARGS,
    Gen,
    Target,
    blank_arithmetic,
    clock_sensitive,
    load_regressions,
    overlong_get,
    quiet_autovivifying_ma,
    router_config,
    run,
    unpad,
)


@pytest.fixture
def target(memcached_factory, router_factory) -> Target:
    direct, behind = memcached_factory(), memcached_factory()
    router = router_factory(router_config(behind.address), extra_args=ROUTER_ARGS)
    return Target(direct.address, behind.address, router.address)


def test_recorded_divergences_stay_fixed(target: Target) -> None:
    cases = load_regressions()
    assert cases, "fuzz_regressions.txt is empty"
    failures = [f"{note}:\n{found}" for note, chunks in cases if (found := target.check(chunks))]
    assert not failures, "\n\n".join(failures)


def test_router_answers_random_streams_as_memcached(target: Target) -> None:
    seed = int(os.environ.get("SQUEAL_FUZZ_SEED", random.randrange(1 << 32)))
    seconds = float(os.environ.get("SQUEAL_FUZZ_SECONDS", "30"))
    cases = 0
    for cases, found in run(target, seed, seconds):
        assert found is None, (
            f"SQUEAL_FUZZ_SEED={seed}, case {cases}: {found}\n"
            f"(add the stream to tests/router/fuzz_regressions.txt once fixed)"
        )
    assert cases > 20, f"only {cases} cases in {seconds} s (seed {seed})"


def test_the_generator_covers_what_it_promises() -> None:
    """A fuzzer that never sends a junk token or a meta flag error finds nothing: check it does."""
    gen = Gen(random.Random(7))
    streams = b"".join(b"".join(gen.case()) for _ in range(400))
    for needle in [b"set ", b"cas ", b"append ", b" noreply\r\n", b"ms ", b"mg ", b"md ", b"ma ", b"mn\r\n",
                   b"gat ", b"incr ", b"touch ", b"flush_all", b"4294967309", b" b", b" q", b"\n"]:  # fmt: skip
        assert needle in streams, needle
    assert any(k in streams for k in KEYS)
    assert overlong_get(b"get k0\r\nget " + b"L" * 300 + b"\r\n")
    assert not overlong_get(b"get " + b"L" * 300 + b"\r\n")
    # what CI's run 1245719449 found: a mutation put `q` into an `ma … N1000` line (the known difference)
    assert quiet_autovivifying_ma(b"ma \x01c k M+ q N1000\r\ndecr k1 13 x q\r\n")
    assert not quiet_autovivifying_ma(b"ma k N1000\r\nma k q\r\nmg k q N30\r\n")
    # what CI's run 2484044196 found: `incr` of a value of one space, which memcached reads past its end
    assert blank_arithmetic(b"ms a\tb 1 T1000 F7 I\r\n \r\nincr a\tb 0 noreply\r\n")
    assert blank_arithmetic(b"set k 0 0 2\r\n\r\n\r\nma k\r\n")
    assert not blank_arithmetic(b"set k 0 0 2\r\n 7\r\nincr k 1\r\nget k\r\n")
    assert not blank_arithmetic(b"set k 0 0 1\r\n \r\nget k\r\n")
    # what CI's run 4073628866 found: `set k0 … 1 4` (exptime 1 s) expired on memcached, which the
    # fuzzer asked first, before the contents were read: two clocks compared, not the router
    assert clock_sensitive(b"get k0\r\nset k0 4294967301 1 4 noreply\r\nb e\n\r\n")
    for timed in [b"touch k 4294967309", b"gat +3 k", b"flush_all 5", b"mg k N\t7 v", b"ms k 1 T1 q", b"ma k N59"]:
        assert clock_sensitive(timed + b"\r\n"), timed
    for timeless in [b"set k 0 0 1", b"set k 1 -1 1", b"touch k 1000", b"gat 0 k", b"ms k 1 T1000 F1", b"mg k T60"]:
        assert not clock_sensitive(timeless + b"\r\n"), timeless


def test_a_number_padded_in_place_is_compared_as_the_number() -> None:
    """What the long run of seed 3072071627 found: `decr` of a 16-byte value left `0` and 15 spaces on
    memcached, a 1-byte `0` behind the router (the gats reply before it still held the item there)."""
    padded = b"VA 16 s16 f0 c13700\r\n0               \r\nEN\r\n"
    alone = b"VA 1 s1 f0 c13700\r\n0\r\nEN\r\n"
    assert unpad(padded) == unpad(alone) == alone
    # a value that is not a number with padding stays as it is, so a real difference still shows
    for kept in [b"VA 3 s3 f0 c1\r\n0 x\r\n", b"VA 2 s2 f5 c1\r\n 7\r\n", b"VA 1 s1 f0 c1\r\n0\r\n"]:
        assert unpad(kept) == kept


def test_a_divergence_is_reported(target: Target) -> None:
    """The comparison can fail: a stream whose answer depends on the server's version differs."""
    target.reset()
    found = target.check([b"stats\r\n"])
    assert found is not None and found.what == "replies"
