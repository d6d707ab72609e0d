"""Differential decoding for the native reader's tests: what `ReadLoop` hands on from a binlog range, per
reader, and the reference's transactions regrouped at the native reader's run boundaries."""

from __future__ import annotations

import threading
from collections.abc import Callable

from router_config import Rule
from squeal.delivery.flows import Committed
from squeal.keys.pipeline import KeyStage, ReadLoop
from squeal.keys.rules import KeyExtractor
from squeal.read import gtid as g
from squeal.read.transactions import PreparedXa


def decode(
    make_reader: Callable[[g.Position], object],
    stage: KeyStage,
    start: g.Position,
    end: g.Position,
    timeout: float = 60,
) -> list[tuple]:
    """Everything `ReadLoop` hands on from `start` up to `end`, as (GTID, cluster lines, regional lines, flush,
    pieces, transactions): a transaction handed on in pieces is put back together (the readers group row events
    differently, so the pieces' bounds differ; what they send in all must not), `pieces` says how many it came
    in; `transactions` > 1 for a run of them (the native reader's), GTID its last."""
    out: list[tuple] = []
    pieces: list[Committed] = []
    done = threading.Event()
    reader = make_reader(start)

    def sink(c: Committed) -> None:
        if c.partial:
            if pieces and pieces[-1].gtid != c.gtid or not c.continued:
                pieces.clear()  # (a first piece, or one read again after a reconnect)
            pieces.append(c)
            return
        before = [p for p in pieces if p.gtid == c.gtid] if c.continued else []
        pieces.clear()
        out.append(
            (
                c.gtid,
                tuple(line for p in [*before, c] for line in p.cluster_lines),
                tuple(line for p in [*before, c] for line in p.regional_lines),
                c.flush,
                len(before) + 1,
                c.transactions,
            )
        )
        if g.covers_position({c.gtid[0]: (c.gtid[1], c.gtid[2])}, end):
            done.set()

    loop = ReadLoop(reader, stage, sink, xa=PreparedXa())  # type: ignore[arg-type]
    loop.start()
    try:
        assert done.wait(timeout), f"{type(reader).__name__} stopped at {out[-1][0] if out else 'nothing'}"
    finally:
        loop.stop()
    assert loop.error is None, loop.error
    return out


def stage_for(rules: list[Rule], cascades) -> KeyStage:
    stage = KeyStage(KeyExtractor(rules), ("region:",), rules=rules)
    stage.bulk.set_cascades(cascades)
    return stage


def regroup(python: list[tuple], native: list[tuple]) -> list[tuple]:
    """The reference's transactions cut where the native reader's items end: a run's transactions become one
    item with their lines concatenated in order (each must end on a transaction of the reference)."""
    out, i = [], 0
    for gtid, *_, transactions in native:
        j = next((k for k in range(i, len(python)) if python[k][0] == gtid), None)
        assert j is not None, f"the native reader handed on {gtid}, where no transaction of the reference ends"
        part = python[i : j + 1]
        assert len(part) == transactions, f"{gtid}: a run of {transactions}, the reference has {len(part)} there"
        if transactions > 1:
            assert not any(flush or pieces > 1 for _, _, _, flush, pieces, _ in part), f"run to {gtid}"
        out.append(
            (
                gtid,
                tuple(line for p in part for line in p[1]),
                tuple(line for p in part for line in p[2]),
                part[-1][3],
                part[-1][4],
                transactions,
            )
        )
        i = j + 1
    assert i == len(python), f"the reference went on after the native reader's last, {native[-1][0]}"
    return out
