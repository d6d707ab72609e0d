"""The native delivery thread (squeal_native/src/delivery.rs) held to the Python flow's rules over real sockets.

The destinations here are recording servers on loopback that speak the replies of memcached's meta protocol
(`NF` per quiet delete, `MN`, `OK` per flush) and keep every line they got, so the tests can say what was sent
and in what order. `[squeal] delivery = "native"` inside the real daemon, against real memcached and routers, is
tested by the delivery, fault and TLS tests run with it (test_native_daemon.py and the suites parametrized there).
"""

from __future__ import annotations

import array
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from squeal.delivery.flows import FLUSH_LINE, Committed, Flow
from squeal.delivery.native import offered
from squeal.process.metrics import BATCH_BUCKETS, LATENCY_BUCKETS
from squeal.read import gtid as g
from squeal.read.native import native_module
from squeal.read.transactions import JoinedLines

WAIT_S = 10.0


class Recorder:
    """A destination that records the lines it gets and answers as memcached does (or as `answer` says)."""

    def __init__(self, answer: Callable[[Recorder, bytes], bytes | None] | None = None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.lines: list[bytes] = []
        self.connections = 0
        self.answer = answer or (lambda rec, line: memcached_reply(line))
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                *lines, buf = buf.split(b"\r\n")
                out = []
                for line in lines:
                    with self.lock:
                        self.lines.append(line)
                    reply = self.answer(self, line)
                    if reply is None:  # drop the connection here
                        return
                    out.append(reply)
                try:
                    conn.sendall(b"".join(out))
                except OSError:
                    return

    def deletes(self) -> list[bytes]:
        with self.lock:
            return [line for line in self.lines if line != b"mn"]

    def close(self) -> None:
        self.stopped = True
        self.sock.close()


def memcached_reply(line: bytes) -> bytes:
    if line == b"mn":
        return b"MN\r\n"
    if line == b"flush_all":
        return b"OK\r\n"
    return b"NF\r\n"


@pytest.fixture
def recorders() -> Iterator[list[Recorder]]:
    made: list[Recorder] = []
    yield made
    for r in made:
        r.close()


def delivery(**kwargs):
    settings = dict(
        batch_size=8,
        flush_interval=0.0005,
        reply_timeout=0.5,
        max_in_flight=2,
        latency_buckets=list(LATENCY_BUCKETS),
        batch_buckets=list(BATCH_BUCKETS),
        sample_every=3,
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    settings.update(kwargs)
    return native_module().NativeDelivery(**settings)


def offer(engine, ids: list[int], c: Committed, live: bool = True) -> list[int]:
    return engine.offer(ids, live, *offered(c))


def until(check: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < end, f"timed out waiting until {what}"
        time.sleep(0.005)


def random_transactions(rng: random.Random, shard: str, n: int) -> list[Committed]:
    """Single transactions (lines as bytes), runs (joined lines with a position), flushes and key-less ones."""
    out: list[Committed] = []
    seq = 0
    for _ in range(n):
        kind = rng.random()
        keys = [f"md {shard}:{seq}:{i} q\r\n".encode() for i in range(rng.choice((0, 1, 1, 2, 3, 10, 30)))]
        if kind < 0.3 and keys:  # a run of several transactions, as the native reader hands them on
            seq += rng.randint(2, 5)
            data = b"".join(keys)
            ends, end = [], 0
            for k in keys:
                end += len(k)
                ends.append(end)
            lines = JoinedLines(data, array.array("I", ends).tobytes())
            out.append(Committed((0, 1, seq), 1.0, 2.0, lines, (), position={0: (1, seq)}, transactions=3))
        else:
            seq += 1
            out.append(Committed((0, 1, seq), 1.0, 2.0, tuple(keys), (), flush=kind > 0.95))
    return out


def expected_lines(start: g.Position, transactions: list[Committed]) -> tuple[list[bytes], g.Position]:
    """What the Python flow sends for these transactions, in order, and where it ends once all is acknowledged."""
    flow = Flow("c", "cluster", (), start, max_backlog=10**9)
    sent: list[bytes] = []
    for c in transactions:
        flow.offer_live(c)
        while (batch := flow.take_batch(8)) is not None:
            sent.extend(line for line in batch.payload.split(b"\r\n") if line and line != b"mn")
            flow.ack(batch)
    return sent, dict(flow.acked)


def test_every_shard_gets_the_python_flows_lines_in_order_over_one_shared_connection(recorders: list[Recorder]) -> None:
    rec = Recorder()
    recorders.append(rec)
    engine = delivery()
    rng = random.Random(33)
    shards = {s: random_transactions(rng, s, 300) for s in ("s1", "s2", "s3")}
    ids = {s: engine.add_flow("c", [("127.0.0.1", rec.port)], False, s, {}, 10**9) for s in shards}
    try:
        for i in range(300):  # interleaved, as the shards' live streams arrive
            for s, txns in shards.items():
                assert offer(engine, [ids[s]], txns[i]) == []
        until(lambda: engine.drained("c"), "every flow is acknowledged")
        got = rec.deletes()
        for s, txns in shards.items():
            lines, acked = expected_lines({}, txns)
            prefix = f"md {s}:".encode()
            mine = [line for line in got if line.startswith(prefix)]
            assert mine == [line for line in lines if line.startswith(prefix)], (
                f"shard {s}: not the Python flow's lines"
            )
            assert engine.acked(ids[s]) == acked
        flushes = sum(1 for t in shards.values() for c in t if c.flush)
        assert got.count(FLUSH_LINE.strip()) == flushes
        assert rec.connections == 1, "the shards share one connection"
        flows, dests = engine.take_stats()
        assert sum(f[1] for f in flows) == len(got), "every acknowledged line is counted as a delete"
        (_, writes, (per_write, _), retries), *_ = dests
        assert retries == 0 and writes == sum(per_write) and writes < len(got)
        samples = engine.take_samples()
        plain = [line for line in got if line != FLUSH_LINE.strip()]
        assert 0 < len(samples) <= len(got) // 3 + 1  # (flush lines count as keys, as the Python sampler counts them)
        assert all(f"md {key} q".encode() in plain for _, key, _ in samples)
    finally:
        engine.stop()


def test_a_router_that_drops_the_connection_or_errs_fails_over_and_loses_nothing(recorders: list[Recorder]) -> None:
    calls = {"n": 0}

    def flaky(rec: Recorder, line: bytes) -> bytes | None:
        calls["n"] += 1
        if calls["n"] % 37 == 0:
            return None  # drop the connection mid-batch
        if calls["n"] % 53 == 0:
            return b"SERVER_ERROR out of memory\r\n"
        return memcached_reply(line)

    bad, good = Recorder(flaky), Recorder()
    silent = Recorder(lambda rec, line: b"")  # never answers: the reply timeout
    recorders.extend([bad, good, silent])
    engine = delivery()
    routers = [("127.0.0.1", bad.port), ("127.0.0.1", silent.port), ("127.0.0.1", good.port)]
    flow = engine.add_flow("c", routers, False, "s", {}, 10**9)
    txns = random_transactions(random.Random(7), "s", 200)
    try:
        for c in txns:
            offer(engine, [flow], c)
        until(lambda: engine.drained("c"), "the flow is acknowledged")
        lines, acked = expected_lines({}, txns)
        assert engine.acked(flow) == acked
        # Each line reached some router at least once, and each router first got them in commit order (a batch
        # sent again starts from the oldest one not acknowledged).
        every = bad.deletes() + silent.deletes() + good.deletes()
        assert set(lines) <= set(every)
        order = {line: i for i, line in enumerate(lines)}
        for rec in (bad, silent, good):
            first = [line for line in dict.fromkeys(rec.deletes()) if line != FLUSH_LINE.strip()]
            assert first == sorted(first, key=order.__getitem__)
        _, dests = engine.take_stats()
        assert dests[0][3] >= 1, "the failures were counted as retries"
        logged = "\n".join(m for _, m in engine.take_log())
        assert "retrying in" in logged and "no reply within" in logged
    finally:
        engine.stop()


def test_a_shut_window_sends_nothing_and_an_open_one_ends_on_time(recorders: list[Recorder]) -> None:
    rec = Recorder()
    recorders.append(rec)
    engine = delivery()
    flow = engine.add_flow("c", [("127.0.0.1", rec.port)], False, "s", {}, 10**9)
    try:
        engine.set_window("s", 0.0)
        offer(engine, [flow], Committed((0, 1, 1), 1.0, 2.0, (b"md k1 q\r\n",), ()))
        time.sleep(0.2)
        assert rec.deletes() == [] and engine.acked(flow) == {}
        engine.set_window("s", 0.3)
        until(lambda: engine.drained("c"), "the window opened")
        assert rec.deletes() == [b"md k1 q"]
        time.sleep(0.4)  # the window has ended: nothing more leaves
        offer(engine, [flow], Committed((0, 1, 2), 1.0, 2.0, (b"md k2 q\r\n",), ()))
        time.sleep(0.2)
        assert rec.deletes() == [b"md k1 q"] and engine.acked(flow) == {0: (1, 1)}
        engine.set_window("s", None)  # no gate
        until(lambda: engine.drained("c"), "the gate was taken away")
        assert engine.acked(flow) == {0: (1, 2)}
    finally:
        engine.stop()


def test_a_removed_flows_batches_still_take_their_replies() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(WAIT_S)
    port = srv.getsockname()[1]
    engine = delivery(reply_timeout=30.0, batch_size=1)  # (b's batch is full: it joins a's in flight)
    a = engine.add_flow("c", [("127.0.0.1", port)], False, "a", {}, 10**9)
    b = engine.add_flow("c", [("127.0.0.1", port)], False, "b", {}, 10**9)
    try:
        offer(engine, [a], Committed((0, 1, 1), 1.0, 2.0, (b"md a1 q\r\n",), ()))
        conn, _ = srv.accept()
        conn.settimeout(WAIT_S)
        got = b""
        while got.count(b"mn\r\n") < 1:
            got += conn.recv(4096)
        offer(engine, [b], Committed((1, 1, 1), 1.0, 2.0, (b"md b1 q\r\n",), ()))
        while got.count(b"mn\r\n") < 2:
            got += conn.recv(4096)
        assert got == b"md a1 q\r\nmn\r\nmd b1 q\r\nmn\r\n"
        engine.remove_flow(a)
        conn.sendall(b"NF\r\nMN\r\n")  # a's batch's replies: they must not acknowledge b's
        time.sleep(0.2)
        assert engine.acked(b) == {}, "b's position moved on the MN of a removed flow's batch"
        conn.sendall(b"NF\r\nMN\r\n")
        until(lambda: engine.drained("c"), "b is acknowledged")
        assert engine.acked(b) == {1: (1, 1)}
        conn.close()
    finally:
        engine.stop()
        srv.close()


def test_the_bound_sheds_and_the_catch_up_brake_waits_for_room(recorders: list[Recorder]) -> None:
    gate = threading.Event()

    def held(rec: Recorder, line: bytes) -> bytes | None:
        gate.wait(WAIT_S)
        return memcached_reply(line)

    rec = Recorder(held)
    recorders.append(rec)
    engine = delivery()
    flow = engine.add_flow("c", [("127.0.0.1", rec.port)], False, "s", {}, 20)
    try:
        txns = [
            Committed((0, 1, n), 1.0, 2.0, tuple(f"md k{n}:{i} q\r\n".encode() for i in range(5)), ())
            for n in (1, 2, 3, 4, 5)
        ]
        shed = [offer(engine, [flow], c) for c in txns]
        assert shed[:4] == [[], [], [], []] and shed[4] == [flow], "the fifth transaction passes the bound of 20"
        assert engine.flow(flow)[3] == "shed" and engine.backlog(flow) == 0
        assert engine.start_catchup(flow) == {}
        for c in txns[:4]:
            assert offer(engine, [flow], c, live=False) == [], "catch-up never sheds"
        assert engine.wait_room(flow, 10, 0.05) is False, "nothing acknowledged yet: no room"
        gate.set()
        assert engine.wait_room(flow, 10, WAIT_S) is True
    finally:
        engine.stop()


def test_a_stale_push_of_the_gates_never_reopens_a_window_the_lease_just_shut() -> None:
    """The reactor pushes every gate each collect, the lease's threads push at once when it pauses: a push that
    read "may send" before the pause must not land after the pause's push and reopen the window for the rest of
    the lease (the quorum-loss pool test once saw 7 keys deleted that way, while /healthz said paused)."""
    from twisted.internet.task import Clock

    from router_config import SquealSettings
    from squeal.delivery.native import NativeHub
    from squeal.delivery.sampler import DeleteSampler
    from squeal.process.metrics import WriteMetrics

    hub = NativeHub(Clock(), SquealSettings(), WriteMetrics(), DeleteSampler(), reply_timeout=1.0)
    real = hub.engine
    windows: list[float | None] = []

    class Recording:  # the real thread, its windows recorded in the order they were set
        def set_window(self, shard: str, seconds: float | None) -> None:
            windows.append(seconds)
            real.set_window(shard, seconds)

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

    class Gate:  # SendGate's shape; the reactor's read of it stalls until the lease has paused
        def __init__(self) -> None:
            self.paused = False
            self.reading, self.go_on = threading.Event(), threading.Event()

        def __call__(self) -> bool:
            if threading.current_thread().name == "reactor":
                self.reading.set()
                self.go_on.wait(5)
                return True  # (what it read before the pause)
            return not self.paused

        def left(self) -> float:
            return 30.0 if not self.paused or threading.current_thread().name == "reactor" else 0.0

    gate = Gate()
    hub._gates["s"] = gate
    hub.engine = Recording()
    try:
        reactor_push = threading.Thread(target=hub.push_gates, name="reactor")
        reactor_push.start()
        assert gate.reading.wait(5)
        gate.paused = True  # the lease pauses and pushes at once (PoolWorker._paused)
        lease_push = threading.Thread(target=hub.push_gates, name="lease")
        lease_push.start()
        lease_push.join(0.5)  # (it finishes now, or waits for the reactor's push: either order is allowed)
        gate.go_on.set()
        reactor_push.join(5)
        lease_push.join(5)
        assert windows[-1] == 0.0, f"the window was reopened after the pause: {windows}"
    finally:
        hub.engine = real
        hub.stop()
