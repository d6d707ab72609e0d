"""MariaDB GTID positions as plain data.

A GTID is `domain-server-seq`. A *position* is what MariaDB calls a GTID list (`0-1-42,1-7-3`): for each
replication domain, the last transaction already applied. squeal uses the same meaning everywhere:
a datamarker, `--from-gtid` and `squeal replay --from` all name the last transaction that is *done*;
reading resumes with the transaction after it (MariaDB's `@slave_connect_state` semantics).

Within a domain sequence numbers only grow (squeal's reads run in GTID strict mode), so "has this flow
already seen transaction d-s-n" is a per-domain comparison of sequence numbers.
"""

from __future__ import annotations

import re

Gtid = tuple[int, int, int]  # (domain, server_id, seq_no)
# domain -> (server_id, seq_no) of the last transaction done in that domain
Position = dict[int, tuple[int, int]]

_GTID = re.compile(r"^\s*(\d+)-(\d+)-(\d+)\s*$")


class GtidError(ValueError):
    """A GTID or GTID list that does not parse."""


def parse_gtid(text: str) -> Gtid:
    """`"0-1-42"` -> `(0, 1, 42)`."""
    m = _GTID.match(text)
    if not m:
        raise GtidError(f"{text!r} is not a MariaDB GTID like 0-1-42 (domain-server_id-sequence)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def parse_position(text: str) -> Position:
    """`"0-1-42,1-7-3"` -> `{0: (1, 42), 1: (7, 3)}`; `""` is the empty position (start of the binlog)."""
    pos: Position = {}
    for part in (p for p in text.split(",") if p.strip()):
        d, s, n = parse_gtid(part)
        if d in pos:
            raise GtidError(f"{text!r} names domain {d} twice")
        pos[d] = (s, n)
    return pos


def format_position(pos: Position) -> str:
    """The GTID list form MariaDB's `auto_position` expects, domains in order."""
    return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(pos.items()))


def covers(pos: Position, gtid: Gtid) -> bool:
    """True if the transaction `gtid` is at or before `pos` (already done)."""
    last = pos.get(gtid[0])
    return last is not None and last[1] >= gtid[2]


def covers_position(pos: Position, other: Position) -> bool:
    """True if every transaction done in `other` is also done in `pos`."""
    return all(covers(pos, (d, s, n)) for d, (s, n) in other.items())


def advance(pos: Position, gtid: Gtid) -> None:
    """Record `gtid` as done in `pos` (in place)."""
    pos[gtid[0]] = (gtid[1], gtid[2])


def merge(pos: Position, other: Position) -> None:
    """Move `pos` forward (in place) to cover everything `other` covers, domain by domain."""
    for d, (s, n) in other.items():
        if d not in pos or pos[d][1] < n:
            pos[d] = (s, n)


def earliest(positions: list[Position]) -> Position:
    """A position from which every one of `positions` can be served.

    A domain missing from any position means "from the start" for that domain, so it is dropped.
    """
    if not positions:
        return {}
    common = set(positions[0])
    for p in positions[1:]:
        common &= set(p)
    return {d: min((p[d] for p in positions), key=lambda sn: sn[1]) for d in common}
