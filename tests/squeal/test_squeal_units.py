"""Fast unit tests of each pipeline stage on plain data (no servers)."""

from __future__ import annotations

import array
import decimal
import itertools
import json
import random
from dataclasses import replace

import pytest
from meta_memcache_socket import build_meta_delete
from twisted.internet.testing import MemoryReactorClock, StringTransport

from router_config import Address, Rule, predicate
from squeal.cli import main as cli_main
from squeal.delivery.batcher import DeleteProtocol, Sender
from squeal.delivery.flows import CATCHING_UP, LIVE, SHED, Batch, Committed, Dispatcher, Flow, split_keys
from squeal.keys.rules import (
    KeyExtractor,
    RowFilter,
    RuleError,
    Template,
    check_rules,
    comment_keys,
    delete_line,
    delete_lines,
    encode_key,
)
from squeal.markers.datamarkers import FileDatamarkerStore
from squeal.process.metrics import Metrics
from squeal.read import gtid as g
from squeal.read import reader as reader_module
from squeal.read.reader import ReaderConfigError, check_server
from squeal.read.transactions import (
    Annotate,
    Begin,
    Commit,
    JoinedLines,
    Query,
    Restart,
    Rows,
    Transaction,
    TransactionGrouper,
)

# -- gtid -------------------------------------------------------------------------------------------------


def test_positions_parse_compare_and_merge() -> None:
    pos = g.parse_position("0-1-42, 1-7-3")
    assert pos == {0: (1, 42), 1: (7, 3)}
    assert g.format_position(pos) == "0-1-42,1-7-3"
    assert g.covers(pos, (0, 1, 42)) and not g.covers(pos, (0, 1, 43)) and not g.covers(pos, (2, 1, 1))
    assert g.earliest([pos, {0: (1, 10), 1: (7, 9)}, {0: (2, 50)}]) == {0: (1, 10)}
    assert g.parse_position("") == {}
    with pytest.raises(g.GtidError):
        g.parse_position("0-1")


# -- transactions ---------------------------------------------------------------------------------------------


def rows(table: str, *images: dict, kind: str = "insert") -> Rows:
    return Rows("app", table, kind, tuple(images))


def feed(events) -> list[Transaction]:
    grouper = TransactionGrouper()
    return [t for t in (grouper.feed(e) for e in events) if t is not None]


def test_transactions_are_emitted_only_at_commit() -> None:
    events = [
        Begin((0, 1, 1), 100.0),
        Annotate(b"INSERT ..."),
        rows("users", {"id": 1}),
        rows("users", {"id": 2}),
        Commit(),
        Begin((0, 1, 2), 101.0),
        Annotate(b"INSERT ..."),  # a rolled-back group with no row images left: nothing persisted
        Query("ROLLBACK"),
        Begin((0, 1, 3), 102.0, standalone=True),
        Query("ALTER TABLE users ADD c INT"),
        Begin((0, 1, 4), 103.0),
        rows("users", {"id": 4}),
        Restart(),  # reconnect mid-transaction
        Begin((0, 1, 4), 103.0),
        rows("users", {"id": 4}),
        Query("COMMIT"),
    ]
    txns = feed(events)
    assert [t.gtid for t in txns] == [(0, 1, 1), (0, 1, 3), (0, 1, 4)]
    assert [len(t.rows) for t in txns] == [2, 0, 1]
    assert txns[0].statements == [b"INSERT ..."]
    assert txns[1].ddl == "ALTER TABLE users ADD c INT"


def test_a_transaction_without_commit_is_never_emitted() -> None:
    grouper = TransactionGrouper()
    for e in [Begin((0, 1, 1), 1.0), rows("users", {"id": 1}), Begin((0, 1, 2), 2.0), Commit()]:
        out = grouper.feed(e)
    assert out is not None and out.gtid == (0, 1, 2) and out.rows == []
    assert grouper.discarded == 1


# -- rules ----------------------------------------------------------------------------------------------------


RULES = [Rule("app.users", ("user:{id}", "user:email:{email}")), Rule("app.posts", ("post:{id}", "feed:{author_id}"))]


def test_keys_from_before_and_after_images_and_comments() -> None:
    txn = Transaction(
        (0, 1, 5),
        1.0,
        statements=[b"UPDATE users SET email='b' /* mcd:k1, k2 */ WHERE id=1"],
        rows=[
            rows("users", {"id": 1, "email": "a"}, {"id": 1, "email": "b"}, kind="update"),
            rows("posts", {"id": 9, "author_id": None}),
            rows("unruled", {"id": 1}),
        ],
    )
    keys, from_rules, from_comments = KeyExtractor(RULES).keys(txn)
    assert keys == ["k1", "k2", "user:1", "user:email:a", "user:email:b", "post:9"]
    assert (from_rules, from_comments) == (4, 2)  # NULL author_id renders no feed: key


def test_a_dropped_column_is_counted_not_fatal() -> None:
    ex = KeyExtractor(RULES)
    keys, _, _ = ex.keys(Transaction((0, 1, 1), 1.0, rows=[rows("users", {"id": 3})]))
    assert keys == ["user:3"]
    assert ex.missing_columns == {("app", "users", "email"): 1}


def test_the_missing_column_counter_counts_every_row_not_only_the_first() -> None:
    from squeal.keys.pipeline import KeyStage
    from squeal.process.metrics import Metrics

    metrics = Metrics()
    stage = KeyStage(KeyExtractor(RULES), (), metrics)
    for seq in (1, 2, 3):
        stage.process(Transaction((0, 1, seq), 1.0, rows=[rows("users", {"id": seq})]))
    assert (
        metrics.registry.get_sample_value("squeal_rule_missing_column_total", {"table": "app.users", "column": "email"})
        == 3
    )


def test_comment_parsing() -> None:
    assert comment_keys(b"/* mcd:a,b */ INSERT /*mcd: c */ /* other */") == ["a", "b", "c"]
    assert comment_keys(b"INSERT INTO t VALUES (1)") == []


def test_key_encoding_matches_the_web_tier_client() -> None:
    """squeal must delete the very key meta-memcache stored: same plain / base64 / hashed choice."""
    rng = random.Random(7)
    alphabet = [b"a", b"Z", b":", b"_", b" ", b"\x01", b"\x7f", "é".encode(), b"~", b"\t"]
    keys = [b"user:1", b"k" * 186, b"k" * 187, b"k" * 250, b"k" * 251, b"a b", b"\x00"]
    keys += [b"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 260))) for _ in range(500)]
    for k in keys:
        line, how = delete_line(k.decode("utf-8", "surrogateescape"))
        assert line == build_meta_delete(k)[:-2] + b" q\r\n", (k, how)
    assert encode_key(b"a b")[1] == "base64" and encode_key(b"x" * 300)[1] == "hashed"
    # The batch form (fast path for printable ASCII) gives the very same lines, and counts the rewrites.
    texts = [k.decode("utf-8", "surrogateescape") for k in keys] + ["", "a\x7fb", "ok:" + "x" * 183]
    rewritten: dict[str, int] = {}
    assert delete_lines(texts, rewritten) == tuple(delete_line(k)[0] for k in texts)
    expected: dict[str, int] = {}
    for k in texts:
        how = delete_line(k)[1]
        if how != "plain":
            expected[how] = expected.get(how, 0) + 1
    assert rewritten == expected and set(rewritten) == {"base64", "hashed"}


def test_template_rendering_one_and_many_columns() -> None:
    one, two = Template.compile("user:{id}"), Template.compile("{a}-{b}!")
    for value, text in [(7, "7"), ("é", "é"), (b"\xff", "\udcff"), (1.5, "1.5"), (True, "True")]:
        assert one.render({"id": value}) == "user:" + text
        assert two.render({"a": value, "b": value}) == f"{text}-{text}!"
    assert one.render({"id": None}) is None and two.render({"a": 1, "b": None}) is None
    with pytest.raises(KeyError):
        one.render({"email": "x"})


def test_rule_check_names_the_rule_and_column() -> None:
    cols = {("app", "users"): ["id", "email"]}
    bad = [Rule("app.users", ("user:{id}", "user:nick:{nick}"))]
    with pytest.raises(RuleError, match=r"rules\[0\] \(table app.users\).*'nick'.*columns: id, email"):
        check_rules(bad, cols)
    warnings = check_rules([Rule("app.missing", ("m:{id}",))], cols)
    assert warnings and "does not exist" in warnings[0]


def test_rule_filter_check_names_the_rule_column_and_literal() -> None:
    cols = {("app", "users"): {"id": "int", "email": "varchar", "status": "varchar", "score": "decimal"}}
    with pytest.raises(RuleError, match=r"rules\[0\]\.when_changed .*no column 'nick'"):
        check_rules([Rule("app.users", ("user:{id}",), when_changed=("nick",))], cols)
    with pytest.raises(RuleError, match=r"rules\[0\]\.where .*names column 'state'"):
        check_rules([Rule("app.users", ("user:{id}",), where=predicate.parse("state = 'x'"))], cols)
    with pytest.raises(RuleError, match=r"score is decimal: compare it with a number, not 'high'"):
        check_rules([Rule("app.users", ("user:{id}",), where=predicate.parse("score > 'high'"))], cols)
    with pytest.raises(RuleError, match=r"status is varchar: compare it with a 'string', not '1'"):
        check_rules([Rule("app.users", ("user:{id}",), where=predicate.parse("status = 1"))], cols)
    assert (
        check_rules(
            [
                Rule(
                    "app.users",
                    ("user:{id}",),
                    when_changed=("email",),
                    where=predicate.parse("score >= 1.5 and status in ('a', 'b')"),
                )
            ],
            cols,
        )
        == []
    )


def test_row_filters_decide_like_sql() -> None:
    rule = Rule("app.a", ("a:{id}",), when_changed=("title",), where=predicate.parse("status != 'draft' OR n IN (7)"))
    f = RowFilter(rule.watched, rule.where)
    live = {"id": 1, "title": "t", "status": "live", "n": 1}
    assert f.reason_to_skip("insert", (live,)) is None
    assert f.reason_to_skip("update", (live, dict(live))) == "when_changed"  # nothing watched changed
    assert f.reason_to_skip("update", (live, live | {"id": 2})) is None  # a templated column counts
    draft = live | {"status": "draft"}
    assert f.reason_to_skip("delete", (draft,)) == "where"
    assert f.reason_to_skip("update", (live, draft | {"title": "u"})) is None  # leaving the set still sends
    assert f.reason_to_skip("insert", (draft | {"n": 7},)) is None
    assert f.reason_to_skip("insert", (live | {"status": None},)) == "where"  # NULL != 'draft' is unknown
    # a filter column the row lacks (dropped after start-up) lets the row through, and is reported
    assert f.reason_to_skip("update", ({"id": 1}, {"id": 1})) is None and f.missing == {"title"}
    numeric = RowFilter((), predicate.parse("score >= 1.5 AND NOT views < 10"))
    assert numeric.reason_to_skip("insert", ({"score": decimal.Decimal("2.50"), "views": 10},)) is None
    assert numeric.reason_to_skip("insert", ({"score": decimal.Decimal("1.49"), "views": 10},)) == "where"
    assert numeric.reason_to_skip("insert", ({"score": decimal.Decimal("9"), "views": None},)) == "where"


# -- reader settings ----------------------------------------------------------------------------------------------


class FakeConn:
    def __init__(self, row) -> None:
        self.row = row

    def cursor(self):
        conn = self

        class Cur:
            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

            def execute(self, sql):
                conn.sql = sql

            def fetchone(self):
                return conn.row

        return Cur()


def test_server_settings_check() -> None:
    check_server(FakeConn((1, "ROW", "FULL", "FULL", 1)))
    with pytest.raises(ReaderConfigError) as e:
        check_server(FakeConn((1, "MIXED", "MINIMAL", "NO_LOG", 0)))
    text = str(e.value)
    for needed in (
        "--binlog-format=ROW",
        "--binlog-row-image=FULL",
        "--binlog-row-metadata=FULL",
        "--binlog-annotate-row-events=ON",
    ):
        assert needed in text


# -- flows --------------------------------------------------------------------------------------------------------


def committed(seq: int, keys: list[str], regional: list[str] = ()) -> Committed:
    return Committed(
        (0, 1, seq),
        1000.0 + seq,
        1000.0 + seq,
        tuple(delete_line(k)[0] for k in keys),
        tuple(delete_line(k)[0] for k in regional),
    )


def make_flow(max_backlog: int = 1000, start: int = 0) -> Flow:
    return Flow("c0", "cluster", [Address("127.0.0.1", 1)], {0: (1, start)}, max_backlog, clock=lambda: 2000.0)


def test_batches_span_and_split_transactions_and_ack_in_order() -> None:
    f = make_flow()
    f.offer_live(committed(1, ["a", "b", "c"]))
    f.offer_live(committed(2, ["d"]))
    b1 = f.take_batch(2)
    assert b1.payload == b"md a q\r\nmd b q\r\nmn\r\n" and f.take_batch(2) is None  # one in flight
    f.ack(b1)
    assert f.acked == {0: (1, 0)}  # txn 1 is only partly acknowledged: the marker must not move
    b2 = f.take_batch(2)
    assert b2.payload == b"md c q\r\nmd d q\r\nmn\r\n"
    f.fail(b2)  # not acknowledged: sent again, identical
    b3 = f.take_batch(2)
    assert b3.payload == b2.payload
    f.ack(b3)
    assert f.acked == {0: (1, 2)} and f.backlog == 0 and not f.queue


def test_a_gated_flow_hands_out_nothing_while_its_gate_says_no() -> None:
    f = make_flow()
    lease = [False]
    f.may_send = lambda: lease[0]  # what a pool worker installs: its lease and ownership
    f.offer_live(committed(1, ["a", "b"]))
    assert f.take_batch(2) is None and f.pending_keys == 2  # queued, not sent, not lost
    lease[0] = True
    b = f.take_batch(2)
    assert b is not None and b.payload == b"md a q\r\nmd b q\r\nmn\r\n"
    f.ack(b)
    assert f.acked == {0: (1, 1)}


def test_pipelined_batches_ack_in_order_and_fail_back_together() -> None:
    f = make_flow()
    f.offer_live(committed(1, ["a", "b", "c"]))
    f.offer_live(committed(2, ["d", "e"]))
    b1, b2, b3 = (f.take_batch(2, max_in_flight=3) for _ in range(3))
    f.offer_live(committed(3, []))  # key-less, queued behind the batches in flight
    assert [b.payload for b in (b1, b2, b3)] == [
        b"md a q\r\nmd b q\r\nmn\r\n",
        b"md c q\r\nmd d q\r\nmn\r\n",
        b"md e q\r\nmn\r\n",
    ]
    assert f.take_batch(2, max_in_flight=4) is None  # only the key-less txn is left: not behind batches in flight
    assert f.pending_keys == 0 and f.in_flight is b1
    f.ack(b2)  # out of order: ignored
    assert f.acked == {0: (1, 0)} and f.in_flight is b1
    f.ack(b1)
    assert f.acked == {0: (1, 0)} and f.backlog == 3  # txn 1 is partly in b2
    f.fail(b2)  # the connection failed: b2 and b3 go back, and are sent again identically
    assert f.in_flight is None and f.pending_keys == 3
    r2, r3 = f.take_batch(2, max_in_flight=3), f.take_batch(2, max_in_flight=3)
    assert (r2.payload, r3.payload) == (b2.payload, b3.payload)
    f.ack(r2)
    assert f.acked == {0: (1, 1)}
    f.ack(r3)  # the re-sent last batch now also completes the key-less txn queued behind it
    assert f.acked == {0: (1, 3)} and f.backlog == 0 and not f.queue
    f.offer_live(committed(4, ["f"]))
    b4 = f.take_batch(2, max_in_flight=3)
    f.offer_live(committed(5, []))
    assert f.take_batch(2, max_in_flight=3) is None  # key-less behind a batch in flight: waits for its ack
    f.ack(b4)
    last = f.take_batch(2, max_in_flight=3)  # nothing ahead now: handed out, acknowledged without a round trip
    assert last.nkeys == 0 and last.payload == b"mn\r\n"
    f.ack(last)
    assert f.acked == {0: (1, 5)} and not f.queue


def test_keyless_and_duplicate_transactions() -> None:
    f = make_flow(start=5)
    f.offer_live(committed(4, ["old"]))  # already covered by the datamarker
    f.offer_live(committed(6, []))  # nothing to delete, nothing queued: done at once
    assert not f.queue and f.acked == {0: (1, 6)}


def test_shed_catch_up_and_rejoin() -> None:
    f = make_flow(max_backlog=3)
    shed = []
    f.on_shed = shed.append
    d = Dispatcher([f], {0: (1, 0)})
    d.dispatch(committed(1, ["a"]))
    batch = f.take_batch(10)
    d.dispatch(committed(2, ["b", "c"]))
    d.dispatch(committed(3, ["d", "e"]))  # backlog 5 > 3
    assert f.state == SHED and shed == [f] and not f.queue and f.backlog == 0
    f.ack(batch)  # the ack of the batch in flight before the shed is from the past: ignored
    assert f.acked == {0: (1, 0)}
    d.dispatch(committed(4, ["f"]))  # ignored while shed
    assert not f.queue
    assert f.start_catchup() == {0: (1, 0)} and f.state == CATCHING_UP
    for seq, keys in [(1, ["a"]), (2, ["b", "c"]), (3, ["d", "e"])]:
        f.offer_catchup(committed(seq, keys))
        assert not f.caught_up(d.live)
    f.offer_catchup(committed(4, ["f"]))
    assert f.caught_up(d.live)
    f.rejoin()
    d.dispatch(committed(4, ["f"]))  # a duplicate from the live stream is skipped
    assert f.state == LIVE and [e.gtid[2] for e in f.queue] == [1, 2, 3, 4]
    f.ack(f.take_batch(10))
    d.dispatch(committed(5, ["g"]))
    assert f.state == LIVE and [e.gtid[2] for e in f.queue] == [5] and f.acked == {0: (1, 4)}


def joined(lines: tuple[bytes, ...]) -> JoinedLines:
    ends = array.array("I", itertools.accumulate(len(line) for line in lines))
    return JoinedLines(b"".join(lines), ends.tobytes())


def test_joined_lines_are_the_lines_they_join() -> None:
    lines = tuple(delete_line(k)[0] for k in ["a", "bb", "ccc"])
    j = joined(lines)
    assert len(j) == 3 and tuple(j) == lines and len(joined(())) == 0
    assert bytes(j.span(0, 3)) == b"".join(lines) and bytes(j.span(1, 2)) == lines[1]


def test_batches_of_joined_lines_are_the_batches_of_their_lines() -> None:
    """A run's joined lines (the native reader's) and the same lines one object each, mixed with transactions of
    plain lines and flushes, make the same payloads, batch for batch, whatever the batch size."""

    def shape(batch: Batch | None) -> tuple | None:
        return batch and (batch.payload, batch.nkeys, batch.entries, batch.flushes)

    rng = random.Random(7)
    for _ in range(200):
        plain, mixed = make_flow(), make_flow()
        for seq in range(1, rng.randrange(2, 12)):
            keys = [f"k{seq}:{i}" for i in range(rng.randrange(0, 40))]
            c = committed(seq, keys)
            if rng.random() < 0.1:
                c.flush = True
            plain.offer_live(c)
            run = rng.random() < 0.6 and not c.flush
            mixed.offer_live(replace(c, cluster_lines=joined(c.cluster_lines)) if run else c)
        size = rng.randrange(1, 50)
        while True:
            a, b = plain.take_batch(size, 3), mixed.take_batch(size, 3)
            assert shape(a) == shape(b)
            if a is None:
                break
            if rng.random() < 0.5:
                plain.ack(a)
                mixed.ack(b)
        assert plain.acked == mixed.acked and plain.backlog == mixed.backlog


def test_every_acknowledgement_tells_the_catch_up_brake() -> None:
    f = make_flow()
    woken: list[int] = []
    f.on_acked = lambda: woken.append(f.backlog)  # (the daemon's brake: an Event's set)
    f.offer_live(committed(1, ["a", "b"]))
    f.offer_live(committed(2, ["c"]))
    first, second = f.take_batch(2, 2), f.take_batch(2, 2)
    assert first is not None and second is not None and woken == []
    f.ack(first)
    f.ack(second)
    assert woken == [1, 0]


def test_regional_split() -> None:
    assert split_keys(["regional:1", "user:1", "rmk:x"], ["regional:", "rmk:"]) == (["user:1"], ["regional:1", "rmk:x"])
    assert split_keys(["a"], []) == (["a"], [])


# -- batcher ------------------------------------------------------------------------------------------------------


def test_protocol_reads_replies_to_mn() -> None:
    replies = []
    p = DeleteProtocol(lambda n, errs, oks: replies.append((n, list(errs), oks)), lambda why: None)
    p.makeConnection(StringTransport())
    p.send(b"md a q\r\nmn\r\n")
    p.dataReceived(b"NF\r\nM")
    assert replies == []
    p.dataReceived(b"N\r\nCLIENT_ERROR bad\r\nSERVER_ERROR out of memory\r\nMN\r\nOK\r\nMN\r\n")
    assert replies == [(0, [], 0), (1, [b"CLIENT_ERROR bad", b"SERVER_ERROR out of memory"], 0), (0, [], 1)]
    # `NF` lines go in one pass; a line that only ends in NF is an error kept whole, and a split NF line is
    # put back together before it is read
    p.dataReceived(b"NF\r\nNF\r\nSERVER_ERROR xNF\r\nNF\r\nN")
    p.dataReceived(b"F\r\nCLIENT_ERROR NF\r\nNF\r\nMN\r\n")
    assert replies[-1] == (1, [b"SERVER_ERROR xNF", b"CLIENT_ERROR NF"], 0)


def test_protocol_reads_any_reply_stream_as_a_line_reader_would() -> None:
    """The fast path (only NF/HD/MN lines, counted in C) and the line loop read every stream, in every chunking,
    as a plain line-by-line reader does: random lines, near misses of the four-byte replies included."""
    rng = random.Random(33)
    common = [b"NF", b"HD", b"MN"]
    vocabulary = [*common, b"OK", b"SERVER_ERROR busy", b"CLIENT_ERROR NF", b"XNF", b"MNF", b"N", b"", b"HDD"]

    def by_lines(stream: bytes) -> list[tuple[int, list[bytes], int]]:
        out, errors, server, oks = [], [], 0, 0
        for line in stream.split(b"\r\n")[:-1]:
            if line == b"MN":
                out.append((server, errors, oks))
                errors, server, oks = [], 0, 0
            elif line == b"OK":
                oks += 1
            elif line not in (b"NF", b"HD"):
                errors.append(line)
                server += line.startswith(b"SERVER_ERROR")
        return out

    for _ in range(300):
        only_common = rng.random() < 0.5  # half the streams hold only NF/HD/MN (the fast path throughout)
        words = [rng.choice(common if only_common else vocabulary) for _ in range(rng.randrange(1, 60))]
        stream = b"".join(w + b"\r\n" for w in words)
        replies: list[tuple[int, list[bytes], int]] = []
        record = replies.append
        p = DeleteProtocol(lambda n, errs, oks, record=record: record((n, list(errs), oks)), lambda why: None)
        p.makeConnection(StringTransport())
        cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randrange(0, 8))))
        for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            p.dataReceived(stream[a:b])
        assert replies == by_lines(stream), (words, cuts)


def _connect(reactor: MemoryReactorClock, index: int) -> tuple[StringTransport, object]:
    host, port, factory, _timeout, _bind = reactor.tcpClients[index]
    proto = factory.buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    return transport, proto


def test_sender_batches_by_timer_fails_over_and_backs_off() -> None:
    reactor = MemoryReactorClock()
    f = Flow("c0", "cluster", [Address("127.0.0.1", 1001), Address("127.0.0.1", 1002)], {}, 1000)
    Sender(f, reactor, batch_size=3, flush_interval=0.0005, reply_timeout=1.0)
    f.offer_live(committed(1, ["a"]))
    f.offer_live(committed(2, ["b"]))
    assert reactor.tcpClients == []  # waiting for the flush timer to fill the batch
    reactor.advance(0.001)
    assert reactor.tcpClients[0][1] == 1001
    transport, proto = _connect(reactor, 0)
    assert transport.value() == b"md a q\r\nmd b q\r\nmn\r\n"  # one write, both transactions
    reactor.advance(1.0)  # no MN: timeout -> failed, next router after backoff
    assert f.acked == {} and f.in_flight is None
    reactor.advance(0.05)  # backoff ...
    reactor.advance(0.001)  # ... then the flush timer again
    assert reactor.tcpClients[1][1] == 1002
    transport2, proto2 = _connect(reactor, 1)
    assert transport2.value() == b"md a q\r\nmd b q\r\nmn\r\n"
    proto2.dataReceived(b"MN\r\n")
    assert f.acked == {0: (1, 2)} and f.backlog == 0
    f.offer_live(committed(3, ["c", "d", "e"]))  # a full batch leaves at the end of the reactor turn, no timer
    reactor.advance(0)
    assert transport2.value().endswith(b"md c q\r\nmd d q\r\nmd e q\r\nmn\r\n")


def test_sender_pipelines_full_batches_and_keeps_replies_apart() -> None:
    reactor = MemoryReactorClock()
    f = Flow("c0", "cluster", [Address("127.0.0.1", 1001), Address("127.0.0.1", 1002)], {}, 1000)
    s = Sender(f, reactor, batch_size=2, flush_interval=0.0005, reply_timeout=1.0, max_in_flight=2)
    f.offer_live(committed(1, ["a", "b", "c", "d", "e"]))
    reactor.advance(0)  # (full batches leave at the end of the reactor turn)
    transport, proto = _connect(reactor, 0)
    # Two full batches in flight; the fifth key waits for an ack (no partial batch joins a pipeline).
    assert transport.value() == b"md a q\r\nmd b q\r\nmn\r\nmd c q\r\nmd d q\r\nmn\r\n"
    proto.dataReceived(b"MN\r\nSERVER_ERROR busy")  # first batch fine; the second one's reply half read
    assert len(s.batches) == 1 and f.backlog == 3 and transport.value().endswith(b"md d q\r\nmn\r\n")
    proto.dataReceived(b"\r\nMN\r\n")  # the error belongs to the second batch only: it goes back
    assert not s.batches and f.pending_keys == 3 and f.acked == {}
    reactor.advance(0.05)  # backoff, then the next router
    transport2, proto2 = _connect(reactor, 1)
    assert transport2.value() == b"md c q\r\nmd d q\r\nmn\r\n"
    proto2.dataReceived(b"MN\r\n")
    assert f.acked == {} and f.backlog == 1  # txn 1 still has "e" to go: the marker must not move
    reactor.advance(0.001)  # the partial batch leaves on the flush timer
    assert transport2.value().endswith(b"mn\r\nmd e q\r\nmn\r\n")
    proto2.dataReceived(b"MN\r\n")
    assert f.acked == {0: (1, 1)} and s.drained()


def test_sender_failure_after_a_shed_hands_back_the_current_batches() -> None:
    reactor = MemoryReactorClock()
    f = Flow("c0", "cluster", [Address("127.0.0.1", 1001)], {}, 3)
    s = Sender(f, reactor, batch_size=2, flush_interval=0.0005, reply_timeout=1.0, max_in_flight=4)
    f.offer_live(committed(1, ["a", "b"]))
    reactor.advance(0)
    transport, proto = _connect(reactor, 0)
    f.offer_live(committed(2, ["c", "d"]))  # backlog 4 > 3: shed while a batch is in flight
    assert f.state == SHED and f.in_flight is None and len(s.batches) == 1
    f.start_catchup()
    f.offer_catchup(committed(1, ["a", "b"]))  # re-read: sent behind the stale batch on the same connection
    reactor.advance(0)
    assert len(s.batches) == 2 and f.in_flight is s.batches[1][1]
    proto.connectionLost(None)  # nothing acknowledged: the current batch must go back to the flow
    assert f.in_flight is None and f.pending_keys == 2 and not s.batches


def test_sender_shares_one_connection_and_one_write_among_shards() -> None:
    """Two shards' flows to one destination: their batches leave in one write and each flow's marker moves only
    past what that destination acknowledged for it (issue 23, item 4)."""
    reactor = MemoryReactorClock()
    routers = [Address("127.0.0.1", 1001)]
    a = Flow("c0", "cluster", routers, {}, 1000)
    b = Flow("c0", "cluster", routers, {}, 1000)
    metrics = Metrics()
    s = Sender(a, reactor, batch_size=4, flush_interval=0.0005, reply_timeout=1.0, metrics=metrics)
    s.add_flow(b)
    a.offer_live(committed(1, ["a1"]))
    b.offer_live(committed(7, ["b1", "b2"]))
    reactor.advance(0.001)
    assert len(reactor.tcpClients) == 1  # one connection for both shards
    transport, proto = _connect(reactor, 0)
    payload = transport.value()
    assert payload.count(b"mn\r\n") == 2 and b"md a1 q" in payload and b"md b2 q" in payload
    assert metrics.writes.labels(flow="c0")._value.get() == 1  # ... in one write of 3 deletes
    assert metrics.deletes_per_write.labels(flow="c0")._sum.get() == 3
    first = s.batches[0][0]
    proto.dataReceived(b"MN\r\n")  # the first batch's MN: only its flow moves
    second = b if first is a else a
    assert first.acked and not second.acked
    proto.dataReceived(b"MN\r\n")
    assert a.acked == {0: (1, 1)} and b.acked == {0: (1, 7)} and s.drained()
    a.offer_live(committed(2, ["a2"]))
    b.offer_live(committed(8, ["b3"]))
    reactor.advance(0.001)
    proto.connectionLost(None)  # a lost connection hands every shard's batch back to its own flow
    assert a.pending_keys == 1 and b.pending_keys == 1 and not s.batches
    with pytest.raises(ValueError, match="not for destination"):
        s.add_flow(Flow("c1", "cluster", routers, {}, 1000))


def test_removed_flow_batches_still_consume_their_mn_on_a_shared_connection() -> None:
    """A shard's flow leaves a shared sender (its pipeline retires) while its batch is on the wire: that batch's
    `MN` still arrives, and must not acknowledge the next shard's batch, whose marker would then move past keys the
    destination has not acknowledged. Its replies' errors are its own (no failover for the shards that stay)."""
    reactor = MemoryReactorClock()
    routers = [Address("127.0.0.1", 1001)]
    a = Flow("c0", "cluster", routers, {}, 1000)
    b = Flow("c0", "cluster", routers, {}, 1000)
    s = Sender(a, reactor, batch_size=4, flush_interval=0.0005, reply_timeout=1.0)
    s.add_flow(b)
    a.offer_live(committed(1, ["a1"]))
    b.offer_live(committed(7, ["b1"]))
    reactor.advance(0.001)
    transport, proto = _connect(reactor, 0)
    assert transport.value() == b"md a1 q\r\nmn\r\nmd b1 q\r\nmn\r\n"  # a's batch first, then b's
    s.remove_flow(a)
    assert a.in_flight is None and a.pending_keys == 1  # handed back at once: the retiring shard sees it unsent
    reactor.advance(0.5)
    proto.dataReceived(b"MN\r\n")  # answers a's batch, written first
    assert b.acked == {}, "b's marker moved on the MN of a removed flow's batch"
    assert a.acked == {} and not s.drained()
    reactor.advance(0.9)  # the MN gave b's batch a full reply_timeout of its own
    assert len(s.batches) == 1 and not transport.disconnecting
    proto.dataReceived(b"MN\r\n")
    assert b.acked == {0: (1, 7)} and s.drained() and s.timeout is None
    # A removed flow's batch answered with an error: nothing fails over, the next MN is still b's.
    c = Flow("c0", "cluster", routers, {}, 1000)
    s.add_flow(c)
    c.offer_live(committed(3, ["c1"]))
    b.offer_live(committed(8, ["b2"]))
    reactor.advance(0.001)
    assert transport.value().endswith(b"md c1 q\r\nmn\r\nmd b2 q\r\nmn\r\n")
    s.remove_flow(c)
    proto.dataReceived(b"SERVER_ERROR busy\r\nMN\r\n")
    assert not transport.disconnecting and len(s.batches) == 1 and b.acked == {0: (1, 7)}
    reactor.advance(1.0)  # then no MN for b's batch: the timeout hands it back to b alone
    assert transport.disconnecting and not s.batches and b.pending_keys == 1 and b.acked == {0: (1, 7)}


def test_full_batches_of_several_shards_share_a_write_while_others_are_in_flight() -> None:
    """While a write is in flight, the full batches that several shards have ready leave in one write (one batch per
    shard), not one write each; one shard alone still writes one batch per write (`batch_size = 1`: one delete)."""
    reactor = MemoryReactorClock()
    routers = [Address("127.0.0.1", 1001)]
    flows = [Flow("c0", "cluster", routers, {}, 1000) for _ in range(3)]
    metrics = Metrics()
    s = Sender(flows[0], reactor, batch_size=2, flush_interval=0.0005, reply_timeout=1.0, metrics=metrics)
    for f in flows[1:]:
        s.add_flow(f)
    flows[0].offer_live(committed(1, ["x"]))
    reactor.advance(0.001)
    transport, proto = _connect(reactor, 0)
    transport.clear()  # the first write (one delete) is in flight
    for i, f in enumerate(flows):  # then every shard has a full batch (each handed on by its own handoff)
        f.offer_live(committed(10 + i, [f"k{i}a", f"k{i}b"]))
    reactor.advance(0)  # the end of the reactor turn
    writes = metrics.writes.labels(flow="c0")._value.get()
    assert writes == 2, writes  # the first one, and one more carrying the three full batches
    assert transport.value().count(b"mn\r\n") == 3 and metrics.deletes_per_write.labels(flow="c0")._sum.get() == 7
    for _ in range(4):
        proto.dataReceived(b"MN\r\n")
    assert all(f.acked == {0: (1, 10 + i)} for i, f in enumerate(flows)) and s.drained()
    # one shard, batch_size 1: one delete per write, however many are ready
    one = Flow("c1", "cluster", routers, {}, 1000)
    alone = Sender(one, reactor, batch_size=1, flush_interval=0.0005, reply_timeout=1.0, metrics=metrics)
    one.offer_live(committed(20, ["a", "b", "c"]))
    reactor.advance(0.001)
    _connect(reactor, 1)
    assert metrics.writes.labels(flow="c1")._value.get() == 3 and alone.batches


class _ThreadReactor:
    """`callFromThread` recorded (run by the test), `callLater` on a fake clock."""

    def __init__(self) -> None:
        from twisted.internet.task import Clock

        self.clock = Clock()
        self.woken: list = []
        self.callLater = self.clock.callLater

    def callFromThread(self, f, *args) -> None:  # noqa: N802 - Twisted's name
        self.woken.append((f, args))


def test_handoffs_of_a_group_wake_the_reactor_once_and_drain_in_one_turn() -> None:
    """A region's shards share one `HandoffGroup`: transactions read by several shards cost one wake-up and reach
    the flows in the same reactor turn; a closed hand-off is still drained, then forgotten."""
    from squeal.keys.pipeline import Handoff, HandoffGroup

    reactor = _ThreadReactor()
    group = HandoffGroup(reactor, chunk=10, linger=0.001)
    got: list[tuple[str, list[int]]] = []
    a = Handoff(reactor, lambda items: got.append(("a", [c.gtid[2] for c in items])), group=group)
    b = Handoff(reactor, lambda items: got.append(("b", [c.gtid[2] for c in items])), group=group)
    a.put(committed(1, ["x"]))
    b.put(committed(2, ["y"]))
    a.put(committed(3, ["z"]))
    assert len(reactor.woken) == 1  # one wake-up for both shards
    f, args = reactor.woken.pop()
    f(*args)
    assert got == [("a", [1, 3]), ("b", [2])]  # one turn
    b.put(committed(4, ["w"]))  # busy: the group looks again after `linger`, no wake-up
    assert reactor.woken == []
    b.close()
    reactor.clock.advance(0.001)
    assert got[-1] == ("b", [4]) and group.members == [a]  # delivered, then forgotten
    reactor.clock.advance(0.001)  # a look that finds nothing: the next transaction wakes the reactor again
    a.put(committed(5, ["v"]))
    assert len(reactor.woken) == 1
    # `chunk` bounds a turn for all the hand-offs together (sockets are served between turns), and each turn
    # starts from the next hand-off, so a shard with a backlog does not hold the others back
    reactor = _ThreadReactor()
    group = HandoffGroup(reactor, chunk=3, linger=0.001)
    delivered: list[list[int]] = []
    several = [Handoff(reactor, lambda items: delivered.append([c.gtid[2] for c in items]), group=group) for _ in "xy"]
    for i, h in enumerate(several):
        for k in range(6 if i == 0 else 3):  # the first has a backlog
            h.put(committed(10 * i + k, ["k"]))
    f, args = reactor.woken.pop()
    f(*args)
    assert delivered == [[0, 1, 2]]  # one turn: three transactions, not three of each hand-off
    reactor.clock.advance(0)  # (more is waiting: the next turns at once, from the next hand-off on)
    assert delivered == [[0, 1, 2], [10, 11, 12], [3, 4, 5]]


def test_a_turn_is_bounded_by_keys_too() -> None:
    """The native reader's runs carry thousands of lines each: a turn of `chunk` of them could put more than a
    flow's `max_backlog` into it at once. `chunk_keys` bounds a turn's keys (its first item always goes)."""
    from squeal.keys.pipeline import Handoff, HandoffGroup

    reactor = _ThreadReactor()
    group = HandoffGroup(reactor, chunk=200, linger=0.001, chunk_keys=250)
    delivered: list[list[int]] = []
    h = Handoff(reactor, lambda items: delivered.append([c.gtid[2] for c in items]), group=group)
    for k in range(5):
        h.put(committed(k, [f"k{k}:{i}" for i in range(99)]))  # weight 100 each
    h.put(committed(5, [f"huge:{i}" for i in range(999)]))
    f, args = reactor.woken.pop()
    f(*args)
    assert delivered == [[0, 1, 2]]  # 300 keys: the turn stops once it reached 250
    reactor.clock.advance(0)
    assert delivered[1:] == [[3, 4, 5]]
    reactor.clock.advance(0.001)
    assert delivered[2:] == []
    h.put(committed(6, [f"huge:{i}" for i in range(999)]))
    h.put(committed(7, ["after"]))
    f, args = reactor.woken.pop()  # (quiet before: the put woke the reactor)
    f(*args)
    assert delivered[2:] == [[6]]  # heavier than the bound on its own: alone in its turn


def test_handoff_wakes_once_then_lingers_while_busy() -> None:
    from squeal.keys.pipeline import Handoff

    reactor = _ThreadReactor()
    got: list[list] = []
    h = Handoff(reactor, got.append, bound=1000, chunk=2, linger=0.001)
    h.put(committed(1, ["a"]))
    h.put(committed(2, ["b"]))
    assert len(reactor.woken) == 1  # one wake-up for both
    f, args = reactor.woken.pop()
    f(*args)
    assert [[c.gtid[2] for c in batch] for batch in got] == [[1, 2]]
    h.put(committed(3, ["c"]))  # busy: the reactor looks again after `linger`, no wake-up needed
    h.put(committed(4, ["d"]))
    h.put(committed(5, ["e"]))
    assert reactor.woken == []
    reactor.clock.advance(0.001)
    reactor.clock.advance(0)  # the rest of a chunked drain follows at once
    assert [c.gtid[2] for batch in got for c in batch] == [1, 2, 3, 4, 5]
    reactor.clock.advance(0.001)  # a look that finds nothing: quiet again
    h.put(committed(6, ["f"]))
    assert len(reactor.woken) == 1  # so the next transaction wakes the reactor at once


# -- datamarkers and replay -----------------------------------------------------------------------------------------


def test_file_datamarkers_are_atomic_and_replay_requests_taken_once(tmp_path) -> None:
    store = FileDatamarkerStore(tmp_path)
    assert store.load("east-a") is None
    store.save("east-a", "0-1-5")
    store.save("east-a", "0-1-9")
    assert store.load("east-a") == "0-1-9"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["east-a.marker"]  # no temporary files left
    store.request_replay("east-a", "0-1-2")
    assert store.take_replay_requests() == {"east-a": "0-1-2"} and store.take_replay_requests() == {}
    (tmp_path / "bad.marker").write_text(json.dumps({"position": "garbage"}))
    with pytest.raises(g.GtidError):
        store.load("bad")
    with pytest.raises(ValueError):
        store.save("../escape", "0-1-1")


def test_cli_replay_rewrites_the_marker(tmp_path, capsys) -> None:
    topo = tmp_path / "t.toml"
    topo.write_text(
        '[[rules]]\ntable = "app.users"\nkeys = ["user:{id}"]\n'
        '[regions.east]\nmaster = true\ndatabase = { role = "primary", port = 3306, server_id = 1 }\n'
        '[regions.east.clusters.a]\nrouters = ["127.0.0.1:7001"]\n'
        'pools.wildcard = { servers = ["127.0.0.1:7002"] }\n'
    )
    state = tmp_path / "state"
    state.mkdir()  # replay never creates a marker dir (a wrong --state-dir is an error, not a new dir)
    assert (
        cli_main(
            ["replay", str(topo), "--region", "east", "--flow", "a", "--from", "0-1-17", "--state-dir", str(state)]
        )
        == 0
    )
    assert FileDatamarkerStore(state).load("a") == "0-1-17"
    assert (
        cli_main(
            ["replay", str(topo), "--region", "east", "--flow", "nope", "--from", "0-1-1", "--state-dir", str(state)]
        )
        == 2
    )
    assert "no flow 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["run", "--help"])
    assert "--state-dir" in capsys.readouterr().out


def test_delete_sampler_keeps_every_nth_plain_key_across_batches():
    from squeal.delivery.sampler import DeleteSampler

    sampler = DeleteSampler(every=3, keep=10)
    keys = [f"k{i}" for i in range(1, 11)]
    lines = [f"md {k} q\r\n".encode() for k in keys]
    sampler.offer("a", b"".join(lines[:4]) + b"mn\r\n", 4, 1.0)  # k1..k4: samples k3
    sampler.offer("a", b"".join(lines[4:5]) + b"mn\r\n", 1, 2.0)  # k5: none
    sampler.offer("b", b"".join(lines[5:]) + b"mn\r\n", 5, 3.0)  # k6..k10: samples k6, k9
    assert [(s.flow, s.key) for s in sampler.recent()] == [("a", "k3"), ("b", "k6"), ("b", "k9")]
    assert [s.key for s in sampler.recent(since=2.0)] == ["k6", "k9"]


def test_delete_sampler_skips_base64_keys():
    from squeal.delivery.sampler import DeleteSampler

    sampler = DeleteSampler(every=1)
    sampler.offer("a", b"md a2V5 b q\r\nmd plain q\r\nmn\r\n", 2, 1.0)
    assert [s.key for s in sampler.recent()] == ["plain"]


class _ScriptedReader(reader_module._Reconnecting):
    """A reader whose connections follow a script per copy: "lost" (a connection that fails), "behind" (error
    1236: the copy cannot serve the position), or a list of events to stream before stopping."""

    def __init__(self, sources: list, script: dict[int, list]) -> None:
        super().__init__(sources, {1: (1, 5)}, set(), name="t")
        self.script = script
        self.opened: list[int] = []

    def _read_once(self):
        self.opened.append(self.current)
        step = self.script[self.current].pop(0) if self.script[self.current] else "lost"
        if step == "lost":
            raise reader_module._StreamEnded(2013, "lost")
        if step == "behind":
            raise reader_module._StreamEnded(reader_module.BINLOG_GONE, "not in the master's binlog")
        self._on_connected()
        yield from step
        self.stop()


def test_a_reader_leaves_a_failing_or_lagging_copy_for_the_next_and_judges_data_loss_only_on_the_last(
    monkeypatch,
) -> None:
    monkeypatch.setattr(reader_module, "PROBE_S", 3600.0)  # (the probe needs a server: not in this test)
    copies = [reader_module.Source("h", 1, "u", "p", copy="s@r"), reader_module.Source("h", 2, "u", "p", copy="s@east")]
    # one lost connection is retried on the same copy; the second in a row moves to the next copy
    r = _ScriptedReader(copies, {0: ["lost", "lost"], 1: [["event"]]})
    r._backoff = 0.0
    events = list(r)
    assert r.opened == [0, 0, 1] and r.current == 1 and r.switches == 1
    assert not [e for e in events if isinstance(e, reader_module.DataLoss)]
    # a copy behind the position to resume from (1236) is left at once: not data loss, which only the last judges
    r = _ScriptedReader(copies, {0: ["behind"], 1: [["event"]]})
    events = list(r)
    assert r.opened == [0, 1] and not [e for e in events if isinstance(e, reader_module.DataLoss)]
    monkeypatch.setattr(reader_module._Reconnecting, "_data_loss", lambda self, message: ("loss", self.current))
    r = _ScriptedReader(copies, {0: ["behind"], 1: ["behind", ["event"]]})
    events = list(r)
    assert ("loss", 1) in events and r.opened == [0, 1, 1]
