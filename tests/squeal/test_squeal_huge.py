"""One huge transaction: keys rendered as the rows are read, deduplicated, never shedding a healthy flow.

Unit tests of the shed rule, the hand-off and the read loop on plain data, then two runs against real
MariaDB + memcached: a 20,000-row transaction through flows whose bound is far below its 40,000 keys, and a
dead cluster that must still shed while the healthy one takes a huge transaction without shedding.
"""

from __future__ import annotations

import threading

from squeal_helpers import scrape, wait_until

from router_config import Address, Rule
from squeal.delivery.flows import CATCHING_UP, LIVE, SHED, Committed, Flow
from squeal.keys.pipeline import Handoff, KeyStage, ReadLoop
from squeal.keys.rules import LINES, RENDERED, KeyExtractor, delete_line
from squeal.process.metrics import Metrics
from squeal.read import gtid as g
from squeal.read.transactions import Annotate, Begin, Commit, Restart, Rows, Transaction, XaPrepare

# -- the shed rule (plain data) ------------------------------------------------------------------------------------


def committed(seq: int, keys: list[str]) -> Committed:
    return Committed((0, 1, seq), 1000.0 + seq, 1000.0 + seq, tuple(delete_line(k)[0] for k in keys), ())


def keys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def make_flow(max_backlog: int = 10) -> tuple[Flow, list[Flow]]:
    f = Flow("c0", "cluster", [Address("127.0.0.1", 1)], {0: (1, 0)}, max_backlog, clock=lambda: 2000.0)
    shed: list[Flow] = []
    f.on_shed = shed.append
    return f, shed


def send_all(f: Flow, batch_size: int = 4) -> None:
    while (b := f.take_batch(batch_size)) is not None:
        f.ack(b)


def test_one_transaction_bigger_than_the_bound_does_not_shed_a_flow() -> None:
    f, shed = make_flow(max_backlog=10)
    f.offer_live(committed(1, keys("a", 3)))
    f.offer_live(committed(2, keys("huge", 25)))  # 28 keys queued, 25 of them one transaction
    assert f.state == LIVE and not shed and f.backlog == 28
    # Batches split the huge transaction; its position is acknowledged only once all 25 keys are.
    positions = []
    while (b := f.take_batch(4)) is not None:
        f.ack(b)
        positions.append(f.acked[0][1])
    assert positions == [1] * 6 + [2]  # a0-a2 + h0, then h1-h24 in six batches: the last one acknowledges it
    assert f.backlog == 0 and not f.queue


def test_the_other_keys_still_count_so_a_dead_destination_sheds() -> None:
    f, shed = make_flow(max_backlog=10)
    f.offer_live(committed(1, keys("huge", 25)))
    f.take_batch(4)  # in flight, never acknowledged: the destination is dead
    for seq in range(2, 7):
        f.offer_live(committed(seq, keys(f"s{seq}-", 2)))  # 10 keys behind the huge one: at the bound
    assert f.state == LIVE
    f.offer_live(committed(7, ["one-more"]))  # 11 > 10
    assert f.state == SHED and shed == [f] and f.backlog == 0 and not f.queue


def test_only_one_oversize_transaction_is_exempt_until_it_is_acknowledged() -> None:
    f, shed = make_flow(max_backlog=10)
    f.offer_live(committed(1, keys("h1-", 25)))
    f.offer_live(committed(2, keys("h2-", 11)))  # the second one counts in full: 11 > 10
    assert f.state == SHED
    # Once the first one is acknowledged, the next oversize transaction is exempt in turn.
    f, shed = make_flow(max_backlog=10)
    f.offer_live(committed(1, keys("h1-", 25)))
    send_all(f)
    f.offer_live(committed(2, keys("h2-", 30)))
    f.offer_live(committed(3, keys("s", 10)))
    assert f.state == LIVE and f.backlog == 40
    # Part of the exempt transaction acknowledged: only what is left of it is exempt.
    for _ in range(5):
        f.ack(f.take_batch(4))  # 20 of its 30 keys
    f.offer_live(committed(4, ["x"]))  # 10 left of it + 11 others: 11 > 10
    assert f.state == SHED


def test_catch_up_takes_an_oversize_transaction_and_the_flow_rejoins() -> None:
    f, _ = make_flow(max_backlog=10)
    f.offer_live(committed(1, keys("s", 6)))
    f.offer_live(committed(2, keys("t", 6)))  # a plain backlog over the bound: shed
    assert f.state == SHED
    assert f.start_catchup() == {0: (1, 0)} and f.state == CATCHING_UP
    braked: list[bool] = []
    f.on_acked = lambda: braked.append(True)  # the catch-up reader's brake (Daemon._start_catchup)
    f.offer_catchup(committed(1, keys("s", 6)))
    f.offer_catchup(committed(2, keys("t", 6)))
    f.offer_catchup(committed(3, keys("huge", 40)))  # catch-up never sheds (its reader is braked instead)
    assert f.caught_up({0: (1, 3)}) and f.backlog == 52
    f.rejoin()
    send_all(f)
    assert f.acked == {0: (1, 3)}
    assert f.on_acked is None and not braked, "a rejoined flow's acknowledgements no longer wake the old brake"
    f.offer_live(committed(4, keys("next", 40)))  # the exemption is free again
    assert f.state == LIVE and f.backlog == 40


# -- the hand-off -----------------------------------------------------------------------------------------------


class _Reactor:
    def __init__(self) -> None:
        self.woken: list = []
        self.later: list = []

    def callFromThread(self, f, *args) -> None:  # noqa: N802 - Twisted's name
        self.woken.append(f)

    def callLater(self, delay, f, *args) -> None:  # noqa: N802
        self.later.append(f)


def test_handoff_takes_an_item_heavier_than_its_bound_and_then_waits_for_the_drain() -> None:
    reactor = _Reactor()
    got: list = []
    h = Handoff(reactor, got.extend, bound=100, chunk=10, linger=0)
    h.put(committed(1, keys("huge", 1000)))  # an empty hand-off: no wait however heavy
    second = threading.Thread(target=h.put, args=(committed(2, ["a"]),), daemon=True)
    second.start()
    second.join(0.3)
    assert second.is_alive(), "the next put must wait while the hand-off holds more than its bound"
    reactor.woken.pop()()  # the reactor drains
    second.join(5)
    assert not second.is_alive()
    while reactor.later or reactor.woken:
        (reactor.later or reactor.woken).pop(0)()
    assert [c.gtid[2] for c in got] == [1, 2]


# -- rendering as the rows are read ----------------------------------------------------------------------------------

RULES = [Rule("app.users", ("user:{id}", "user:email:{email}")), Rule("app.posts", ("post:{id}", "feed:{author_id}"))]


def posts(*ids: int, authors: int = 3) -> Rows:
    return Rows("app", "posts", "insert", tuple({"id": i, "author_id": i % authors} for i in ids))


class FakeReader:
    name = "live"
    reconnects = 0
    stopped = False

    def __init__(self, events) -> None:
        self.events = events
        self.committed: g.Position = {}

    def __iter__(self):
        return iter(self.events)

    def commit(self, gtid) -> None:
        g.advance(self.committed, gtid)


def run_loop(events) -> tuple[list[Committed], list[Transaction], Metrics]:
    metrics = Metrics()
    stage = KeyStage(KeyExtractor(RULES), (), metrics)
    seen_txns: list[Transaction] = []
    process = stage.process

    def spy(txn, *args, **kwargs):
        seen_txns.append(txn)
        return process(txn, *args, **kwargs)

    stage.process = spy  # type: ignore[method-assign]
    out: list[Committed] = []
    loop = ReadLoop(FakeReader(events), stage, out.append, metrics)  # type: ignore[arg-type]
    loop.run()
    assert loop.error is None, loop.error
    return out, seen_txns, metrics


def lines(*ks: str) -> tuple[bytes, ...]:
    return tuple(delete_line(k)[0] for k in ks)


def test_rows_are_rendered_as_read_deduplicated_per_transaction_and_sent_at_commit() -> None:
    events = [
        Begin((0, 1, 1), 1.0),
        Annotate(b"INSERT /* mcd:feed:0,k */ ..."),
        posts(1, 2, 3, 4, 5, 6),  # feed:0, feed:1, feed:2 twice each
        Rows("app", "users", "update", ({"id": 7, "email": "a"}, {"id": 7, "email": "b"})),
        Commit(),
        Begin((0, 1, 2), 2.0),
        posts(1, 4),  # the same keys again in another transaction: sent again
        Commit(),
        Begin((0, 1, 3), 3.0),
        posts(9),
        Restart(),  # a reconnect mid-transaction: it is read again whole
        Begin((0, 1, 3), 3.0),
        posts(9),
        Commit(),
    ]
    out, txns, metrics = run_loop(events)
    assert [c.gtid for c in out] == [(0, 1, 1), (0, 1, 2), (0, 1, 3)]
    assert set(out[0].cluster_lines) == set(
        lines(
            "feed:0",
            "k",
            "post:1",
            "feed:1",
            "post:2",
            "feed:2",
            "post:3",
            "post:4",
            "post:5",
            "post:6",
            "user:7",
            "user:email:a",
            "user:email:b",
        )
    )
    assert len(out[0].cluster_lines) == 13  # each key once
    assert out[1].cluster_lines == lines("post:1", "feed:1", "post:4")
    assert out[2].cluster_lines == lines("post:9", "feed:0")
    # The transactions held their keys, not their row images.
    assert all(r.kind == RENDERED for t in txns for r in t.rows)
    assert all(isinstance(k, str) for t in txns for r in t.rows for k in r.images)
    r = metrics.registry
    assert r.get_sample_value("squeal_keys_duplicates_total") == 3 + 1 + 1  # feed:0..2, user:7; feed:1 in txn 2
    assert r.get_sample_value("squeal_keys_total", {"source": "rule"}) == 11 + 3 + 2  # feed:0 came from the comment
    assert r.get_sample_value("squeal_rows_total", {"reader": "live"}) == 6 + 1 + 2 + 2  # read, re-read included


def test_rendered_rows_give_the_same_keys_as_row_images() -> None:
    ex = KeyExtractor(RULES)
    raw = [posts(*range(50), authors=7), Rows("app", "users", "delete", ({"id": 1, "email": None},))]
    seen: dict[str, None] = {}
    rendered = [ex.render(r, seen)[0] for r in raw]
    assert ex.keys(Transaction((0, 1, 1), 1.0, rows=rendered)) == ex.keys(Transaction((0, 1, 1), 1.0, rows=raw))
    assert len(seen) == 50 + 7 + 1


# -- real MariaDB + memcached ---------------------------------------------------------------------------------------


def user_keys(ids) -> list[str]:
    return [f"user:{i}" for i in ids] + [f"user:email:u{i}@example.com" for i in ids]


def insert_users(cur, ids, chunk: int = 1000) -> None:
    """INSERT `ids` into users in multi-row statements of `chunk` rows (the caller commits)."""
    ids = list(ids)
    for i in range(0, len(ids), chunk):
        part = ids[i : i + chunk]
        cur.execute(
            "INSERT INTO users VALUES " + ", ".join(["(%s, %s, 'n')"] * len(part)),
            [v for j in part for v in (j, f"u{j}@example.com")],
        )


def sheds(port: int) -> dict[str, float]:
    m = scrape(port)
    return {f: m.get(f'squeal_flow_sheds_total{{flow="{f}"}}', 0.0) for f in ("c0", "c1", "regional")}


def test_a_huge_transaction_is_deleted_everywhere_without_shedding_any_flow(squeal_env) -> None:
    env = squeal_env(max_backlog=5000).start()  # the transaction: 42,010 distinct keys
    users = range(1, 20001)
    post_ids = range(1, 2001)  # feed:{author_id} for 10 authors: 10 distinct keys out of 2,000
    want = user_keys(users) + [f"post:{i}" for i in post_ids] + [f"feed:{i}" for i in range(10)]
    for c in env.caches:
        c.set_many(want)
        assert len(c.present(want)) == len(want)
    with env.connect(autocommit=False) as conn, conn.cursor() as cur:  # one transaction
        insert_users(cur, users)
        cur.execute(
            "INSERT INTO posts VALUES " + ", ".join(["(%s, %s, 't')"] * len(post_ids)),
            [v for j in post_ids for v in (j, j % 10)],
        )
        conn.commit()

    def left() -> dict[int, int]:
        return {c.addr[1]: len(c.present(want)) for c in env.caches}

    wait_until(lambda: not any(left().values()), 90, "every key of the transaction deleted", interval=0.5)
    m = scrape(env.daemon.port)
    assert sheds(env.daemon.port) == {"c0": 0, "c1": 0, "regional": 0}
    assert m['squeal_keys_total{source="rule"}'] == len(want)
    assert m["squeal_keys_duplicates_total"] == 2000 - 10
    assert m['squeal_rows_total{reader="live"}'] == 22000
    assert m["squeal_transaction_pieces_total"] >= 42010 // 8192 - 1  # its deletes started while it was read
    env.fence()  # and the live stream goes on


def test_a_dead_cluster_still_sheds_while_the_healthy_one_takes_a_huge_transaction(squeal_env) -> None:
    env = squeal_env(max_backlog=2000, extra_args=("--reply-timeout", "0.5")).start()
    healthy, dead = env.caches
    huge = user_keys(range(1, 3001))  # 6,000 keys, three times the bound
    small_ids = range(1, 1501)  # 150 transactions of 10 posts: 3,000 keys more
    small = [f"post:{i}" for i in small_ids] + [f"feed:{i}" for i in range(1, 1501)]
    for c in env.caches:
        c.set_many(huge + small)
        assert len(c.present(huge + small)) == len(huge + small)
    env.memcacheds[1].pause()  # SIGSTOP: the port accepts, nothing answers
    try:
        with env.connect(autocommit=False) as conn, conn.cursor() as cur:
            insert_users(cur, range(1, 3001))
            conn.commit()
        wait_until(
            lambda: not healthy.present(huge), 30, "the healthy cluster to take the huge transaction", interval=0.2
        )
        assert sheds(env.daemon.port) == {"c0": 0, "c1": 0, "regional": 0}  # the dead one holds it, once
        with env.connect(autocommit=False) as conn, conn.cursor() as cur:
            for i in range(1, 1501, 10):
                cur.executemany("INSERT INTO posts VALUES (%s, %s, 't')", [(j, j) for j in range(i, i + 10)])
                conn.commit()
        wait_until(lambda: sheds(env.daemon.port)["c1"] >= 1, 30, "the dead cluster's flow to shed")
        assert sheds(env.daemon.port)["c0"] == 0
    finally:
        env.memcacheds[1].resume()
    wait_until(lambda: not dead.present(huge + small), 60, "the dead cluster to catch up", interval=0.5)
    assert not healthy.present(huge + small)
    m = scrape(env.daemon.port)
    assert m['squeal_flow_rejoins_total{flow="c1"}'] >= 1
    assert sheds(env.daemon.port)["c0"] == 0
    env.fence()


# -- a huge transaction handed on in pieces while it is read ---------------------------------------------------------


def piece(seq: int, ks: list[str], rows_from: int, rows_to: int, partial: bool = True) -> Committed:
    c = committed(seq, ks)
    c.partial, c.rows_from, c.rows_to = partial, rows_from, rows_to
    return c


def test_a_transaction_in_pieces_completes_only_with_its_last_piece() -> None:
    f, shed = make_flow(max_backlog=10)
    f.offer_live(piece(1, keys("p", 8), 0, 2))
    f.offer_live(piece(1, keys("q", 8), 2, 4))  # 16 keys queued, over the bound, but one transaction: exempt
    assert f.state == LIVE and not shed and f.backlog == 16
    assert f.enqueued == {0: (1, 0)}  # not yet: more of it may come
    send_all(f)
    assert f.acked == {0: (1, 0)}, "every piece so far acknowledged, but the transaction is not complete"
    f.offer_live(piece(1, keys("r", 3), 4, 5, partial=False))  # the last piece
    assert f.enqueued == {0: (1, 1)}
    send_all(f)
    assert f.acked == {0: (1, 1)} and f.backlog == 0
    f.offer_live(piece(1, keys("p", 8), 0, 2))  # a piece of a transaction the flow has: ignored
    assert not f.queue


def test_a_piece_after_a_gap_sheds_so_the_transaction_is_read_again_whole() -> None:
    f, shed = make_flow(max_backlog=100)
    f.offer_live(piece(1, keys("p", 3), 0, 2))
    f.offer_live(piece(1, keys("q", 3), 3, 4))  # rows 2-3 never arrived
    assert f.state == SHED and shed == [f] and not f.queue
    assert f.enqueued == {0: (1, 0)} and f.acked == {0: (1, 0)}  # the catch-up reader starts before it
    f, shed = make_flow(max_backlog=100)
    f.offer_live(piece(1, keys("q", 3), 2, 4, partial=False))  # a last piece whose start it never saw
    assert f.state == SHED and f.enqueued == {0: (1, 0)}


def test_a_piece_read_again_after_a_reconnect_starts_the_transaction_again() -> None:
    f, shed = make_flow(max_backlog=100)
    f.offer_live(piece(1, keys("p", 3), 0, 2))
    f.offer_live(piece(1, keys("p", 3), 0, 2))  # the reader reconnected and reads it again from its start
    f.offer_live(piece(1, keys("q", 3), 2, 3, partial=False))
    assert f.state == LIVE and not shed
    send_all(f)
    assert f.acked == {0: (1, 1)}


def test_a_catching_up_flow_rejoins_only_between_transactions() -> None:
    f, _ = make_flow(max_backlog=10)
    f.offer_live(committed(1, keys("s", 11)))  # over the bound: shed
    f.start_catchup()
    f.offer_catchup(committed(1, keys("s", 11)))
    # The live stream has handed on part of transaction 2: this flow did not get those pieces.
    assert not f.caught_up({0: (1, 1)}, live_pieces=(0, 1, 2))
    assert f.caught_up({0: (1, 1)}, live_pieces=None)


def native_rows(*ks: str, regional: tuple[str, ...] = ()) -> Rows:
    return Rows("app", "users", LINES, (lines(*ks), lines(*regional)), changed=len(ks))


def run_streaming(events, stream_lines: int) -> list[Committed]:
    metrics = Metrics()
    out: list[Committed] = []
    loop = ReadLoop(
        FakeReader(events), KeyStage(KeyExtractor(RULES), (), metrics), out.append, metrics, stream_lines=stream_lines
    )  # type: ignore[arg-type]
    loop.run()
    assert loop.error is None, loop.error
    assert metrics.registry.get_sample_value("squeal_transaction_pieces_total") == sum(c.partial for c in out)
    return out


def test_the_read_loop_hands_a_huge_transaction_on_in_pieces_and_its_rest_at_commit() -> None:
    events = [
        Begin((0, 1, 1), 1.0),
        Annotate(b"INSERT /* mcd:k */ ..."),
        native_rows("a1", "a2", "a3"),
        native_rows("b1", "b2", "b3"),  # 6 lines waiting >= 4: a piece of row events 0-1
        native_rows("c1"),
        Commit(),  # the rest: row event 2, and the comment's key
        Begin((0, 1, 2), 2.0),
        native_rows("d1"),
        Commit(),  # small: whole, as before
    ]
    out = run_streaming(events, stream_lines=4)
    assert [(c.gtid[2], c.partial, c.rows_from, c.rows_to) for c in out] == [
        (1, True, 0, 2),
        (1, False, 2, 0),
        (2, False, 0, 0),
    ]
    assert out[0].cluster_lines == lines("a1", "a2", "a3", "b1", "b2", "b3")
    assert out[1].cluster_lines == lines("k", "c1")
    assert out[2].cluster_lines == lines("d1")
    assert all(not c.flush for c in out)


def test_an_xa_prepare_is_never_handed_on_early_and_a_reconnect_starts_over() -> None:
    events = [
        Begin((0, 1, 1), 1.0, prepared_xa=True),  # not committed: its decision may roll it back
        native_rows("x1", "x2", "x3", "x4", "x5"),
        XaPrepare("x'61',x'',1"),
        Begin((0, 1, 2), 2.0),
        native_rows("a1", "a2", "a3", "a4"),  # a piece
        Restart(),  # reconnect: the group is read again from its start
        Begin((0, 1, 2), 2.0),
        native_rows("a1", "a2", "a3", "a4"),  # its first piece again
        native_rows("b1"),
        Commit(),
    ]
    out = run_streaming(events, stream_lines=4)
    assert [(c.gtid[2], c.partial, c.rows_from) for c in out] == [(2, True, 0), (2, True, 0), (2, False, 1)]
    assert out[2].cluster_lines == lines("b1")


def test_the_python_readers_rendered_rows_are_handed_on_in_pieces_too() -> None:
    out = run_streaming([Begin((0, 1, 1), 1.0), posts(1, 2), posts(3), Commit()], stream_lines=3)
    assert [(c.partial, c.rows_from) for c in out] == [(True, 0), (False, 1)]
    assert set(out[0].cluster_lines) == set(lines("post:1", "post:2", "feed:1", "feed:2"))
    assert set(out[1].cluster_lines) == set(lines("post:3", "feed:0"))


def test_a_shed_cluster_catches_up_through_a_transaction_sent_in_pieces(squeal_env) -> None:
    """The live stream hands a 20,000-key transaction on in pieces while one cluster is shed and catching up:
    its catch-up reader re-reads the transaction (in pieces too) and the flow rejoins only between
    transactions, so it never takes the live stream's pieces from the middle of one."""
    env = squeal_env(max_backlog=2000, extra_args=("--reply-timeout", "0.5")).start()
    healthy, dead = env.caches
    before = [f"post:{i}" for i in range(1, 1501)] + [f"feed:{i}" for i in range(1, 1501)]  # 3,000 keys: a shed
    huge = user_keys(range(1, 10001))
    after = [f"post:{i}" for i in range(1501, 1601)] + [f"feed:{i}" for i in range(1501, 1601)]
    every = before + huge + after
    for c in env.caches:
        c.set_many(every)
        assert len(c.present(every)) == len(every)

    def posts_in_txns(first: int, last: int) -> None:
        with env.connect(autocommit=False) as conn, conn.cursor() as cur:
            for i in range(first, last, 10):
                cur.executemany("INSERT INTO posts VALUES (%s, %s, 't')", [(j, j) for j in range(i, i + 10)])
                conn.commit()

    env.memcacheds[1].pause()
    try:
        posts_in_txns(1, 1501)
        wait_until(lambda: sheds(env.daemon.port)["c1"] >= 1, 30, "the stopped cluster's flow to shed")
        with env.connect(autocommit=False) as conn, conn.cursor() as cur:
            insert_users(cur, range(1, 10001))
            conn.commit()
        posts_in_txns(1501, 1601)
        wait_until(lambda: not healthy.present(every), 60, "the healthy cluster to take everything", interval=0.2)
        assert scrape(env.daemon.port)["squeal_transaction_pieces_total"] >= 2
        assert sheds(env.daemon.port)["c0"] == 0
    finally:
        env.memcacheds[1].resume()
    wait_until(lambda: not dead.present(every), 90, "the shed cluster to catch up", interval=0.5)
    assert scrape(env.daemon.port)['squeal_flow_rejoins_total{flow="c1"}'] >= 1
    env.fence()
