"""The Rust flow (`squeal_native.NativeFlow`, squeal_native/src/flow.rs) against the Python one
(`squeal.delivery.flows.Flow`, the reference), operation by operation on seeded random sequences.

Each sequence offers transactions of every shape a flow meets (single ones, runs with a position, key-less ones,
flushes, huge ones in pieces — now and then with a piece missed —, ones the flow has already), takes batches of
random sizes with up to 3 in flight, acknowledges the oldest, fails one, and goes through shed → catch-up →
rejoin. After every operation both flows must agree on what they hand out (each batch's bytes, its keys and its
flushes), what they did with an offer, and where they stand (acked, enqueued, backlog, keys pending, state,
epoch). SQUEAL_FLOW_SEED replays one sequence (default: 200 random ones, each named in a failure).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from squeal.delivery.flows import Committed, Flow
from squeal.read import gtid as g
from squeal.read.native import native_module

MAX_BACKLOG = 40


def state_of(py: Flow, native: Any) -> tuple:
    """What both must agree on after every operation."""
    return (
        (py.acked, py.enqueued, py.backlog, py.pending_keys, py.state, py.epoch),
        (native.acked, native.enqueued, native.backlog, native.pending_keys, native.state, native.epoch),
    )


class Writer:
    """The transactions of one sequence: a GTID counter and the shapes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seq = 0
        self.keys = 0

    def lines(self, n: int) -> tuple[bytes, ...]:
        self.keys += n
        return tuple(f"md k{self.keys - i} q\r\n".encode() for i in range(n))

    def next(self) -> tuple[list[Committed], list[Committed]]:
        """(what the live stream hands on, what a catch-up reader reads): one transaction, a run, or a huge one's
        pieces (the live stream sometimes missing one; a catch-up reader reads them all)."""
        rng = self.rng
        self.seq += 1
        ts = float(self.seq)
        shape = rng.random()
        if shape < 0.1:  # a huge transaction in pieces
            pieces, rows = [], 0
            count = rng.randint(2, 4)
            for i in range(count):
                nrows = rng.randint(1, 3)
                pieces.append(
                    Committed(
                        (0, 1, self.seq),
                        ts,
                        ts,
                        self.lines(rng.randint(1, 30)),  # (often past the bound in all: the exemption)
                        (),
                        partial=i < count - 1,
                        rows_from=rows,
                        rows_to=rows + nrows,
                    )
                )
                rows += nrows
            live = list(pieces)
            if rng.random() < 0.2:
                del live[rng.randrange(len(live))]  # a piece the live stream's flow never saw
            return live, pieces
        if shape < 0.3:  # a run of transactions in two domains
            first = self.seq
            self.seq += rng.randint(1, 5)
            position = {0: (1, self.seq), 1: (2, self.seq)}
            n = rng.randint(0, 20)
            run = Committed(
                (0, 1, self.seq), float(first), float(first), self.lines(n), (), position=position, transactions=5
            )
            return [run], [run]
        n = 0 if shape < 0.4 else rng.randint(1, 8)
        one = Committed((0, 1, self.seq), ts, ts + 0.5, self.lines(n), (), flush=shape > 0.95)
        return [one], [one]


def offer(flow: Flow | Any, c: Committed, catchup: bool) -> Any:
    if isinstance(flow, Flow):
        return flow.offer_catchup(c) if catchup else flow.offer_live(c)
    args = (c.gtid, c.commit_ts, c.read_ts, list(c.cluster_lines))
    kwargs = dict(
        flush=c.flush,
        position=c.position,
        partial=c.partial,
        rows_from=c.rows_from,
        rows_to=c.rows_to,
        transactions=c.transactions,
    )
    return flow.offer(not catchup, *args, **kwargs)


def run_sequence(seed: int, steps: int = 300) -> None:
    native_module_ = native_module()
    rng = random.Random(seed)
    start: g.Position = {0: (1, 0)}
    py = Flow("c", "cluster", (), dict(start), MAX_BACKLOG)
    native = native_module_.NativeFlow(dict(start), MAX_BACKLOG)
    writer = Writer(rng)
    written: list[Committed] = []  # everything committed so far, whole, for a catch-up reader to read again
    in_flight: list[tuple[Any, Any]] = []  # (python batch, native batch), oldest first

    def check(what: str) -> None:
        p, n = state_of(py, native)
        assert p == n, f"seed {seed}, after {what}: python {p} != native {n}"

    for step in range(steps):
        op = rng.random()
        if op < 0.45 and py.state == "live":
            live, whole = writer.next()
            written.extend(whole)
            for c in live:
                offer(py, c, False)
                offer(native, c, False)
                check(f"step {step}: offer {c.gtid} ({len(c.cluster_lines)} lines)")
            if rng.random() < 0.05 and written:  # the live stream again after a reconnect: one it has already
                c = rng.choice(written)
                offer(py, c, False)
                offer(native, c, False)
                check(f"step {step}: an old transaction again")
        elif op < 0.7:
            size, most = rng.choice([1, 3, 8, 64]), rng.randint(1, 3)
            b_py, b_native = py.take_batch(size, most), native.take_batch(size, most)
            assert (b_py is None) == (b_native is None), f"seed {seed}, step {step}: one flow had a batch"
            if b_py is not None:
                got = (b_native.payload, b_native.nkeys, b_native.flushes)
                assert (b_py.payload, b_py.nkeys, b_py.flushes) == got, f"seed {seed}, step {step}: batches differ"
                in_flight.append((b_py, b_native))
            check(f"step {step}: take_batch({size}, {most})")
        elif op < 0.9 and in_flight:
            b_py, b_native = in_flight.pop(0)
            py.ack(b_py)
            native.ack(b_native)
            check(f"step {step}: ack")
        elif op < 0.93 and in_flight:
            b_py, b_native = in_flight[rng.randrange(len(in_flight))]
            py.fail(b_py)
            native.fail(b_native)
            in_flight.clear()
            check(f"step {step}: fail")
        elif py.state != "live":
            # the daemon's catch-up: read again from acked, then rejoin once caught up with the live stream
            if py.state == "shed":
                assert py.start_catchup() == native.start_catchup(), f"seed {seed}: catch-up starts differ"
                in_flight.clear()
            for c in written:
                offer(py, c, True)
                offer(native, c, True)
            live = dict(py.enqueued)
            assert py.caught_up(live) == native.caught_up(live), f"seed {seed}: caught_up differs"
            py.rejoin()
            native.rejoin()
            check(f"step {step}: catch-up and rejoin")
        elif op > 0.99:
            py.shed()
            native.shed()
            in_flight.clear()
            check(f"step {step}: shed")


def test_native_flow_differential_on_seeded_random_sequences() -> None:
    if os.environ.get("SQUEAL_FLOW_SEED"):
        run_sequence(int(os.environ["SQUEAL_FLOW_SEED"]))
        return
    first = random.randrange(1 << 30)
    for seed in range(first, first + 200):
        run_sequence(seed)


def test_the_differential_sees_a_difference() -> None:
    """The comparison can fail: a Python flow with a smaller bound sheds where the native one does not."""
    native = native_module().NativeFlow({0: (1, 0)}, MAX_BACKLOG)
    py = Flow("c", "cluster", (), {0: (1, 0)}, 2)
    for seq in (1, 2):
        lines = (f"md a{seq} q\r\n".encode(), f"md b{seq} q\r\n".encode())
        py.offer_live(Committed((0, 1, seq), 1.0, 1.0, lines, ()))
        native.offer(True, (0, 1, seq), 1.0, 1.0, list(lines))
    p, n = state_of(py, native)
    assert py.state == "shed" and native.state == "live"
    with pytest.raises(AssertionError):
        assert p == n
