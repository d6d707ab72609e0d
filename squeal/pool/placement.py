"""Which squeal worker of a region runs which shard: the load-aware placement policy (issue 24), as pure data.

A region runs a pool of squeal workers; each shard of the region has exactly one owner among them (the
ownership itself — membership, epochs, leases — lives in ZooKeeper and is not this module's business). One
elected controller calls `plan()` with what it knows and writes the moves it returns. `plan()` does no I/O,
reads no clock and draws no random number: the same inputs always give the same `Plan`, so the controller
can be replaced at any moment and a test can state exact outcomes.

**Load.** A shard's load is one number in *rows/s equivalents* (`shard_load`):
``rows/s + binlog bytes/s ÷ bytes_per_row`` (default 500), never below `floor` (default 1). The rows term is
what squeal does per changed row (render keys, send deletes); the bytes term is reading and decoding the
binlog, which a shard costs even for tables without rules (their transactions still stream past). 500 bytes
is about one row event of a small table with FULL images, so for ordinary tables both terms weigh alike and
a shard of wide rows (BLOBs) counts for more; it is a default, not a measurement (calibrate it per
deployment from `bench/squeal_throughput.py`). The floor: an idle shard still holds a binlog connection and
a reader thread. Workers report raw rates; `smooth()` (an exponentially weighted average with a half-life,
default 60 s) keeps one burst from moving anything. All workers are taken as equal (no capacities).

**The level and hot shards.** Balance is judged against the *level* `L`, not the plain mean: a shard that
alone outweighs the mean worker load cannot share a worker without that worker being the maximum, so
`level()` sets such *hot* shards apart, one worker each, and takes the mean of what is left over the
workers that are left, repeatedly (water-filling). A hot shard is one whose load exceeds `L`. With no hot
shard, `L` is the mean worker load. The target is then:

* every hot shard alone on its worker (whenever there are more workers than hot shards, which `level()`
  guarantees by never setting apart the last worker);
* every other worker's load within ``[L ÷ threshold, L × threshold]`` (default threshold 1.15: so its
  max/mean, over the workers that share shards, stays at most 1.15).

A worker outside that band — or a hot shard with company — is a *violation*; `Plan.imbalance` is the
largest ratio of load to `L` among the sharing workers (or `L` to load, for an underloaded one).

**Rules, in the order `plan()` applies them.**

1. *Eligible* workers are the alive, healthy ones (their own copy answers) that do not drain. A shard whose
   owner is not eligible — a new shard (`unassigned`), one whose worker died or left the pool (`orphaned`), one
   whose worker drains (`drain`), one whose worker's copy does not answer (`unhealthy`) — is placed at once, with
   no hysteresis and no cooldown: greedily by decreasing load (LPT), each on the least-loaded eligible worker
   (ties: fewer shards, then better rank, then name). A *hot* orphan (a crash took the
   worker it was alone on) goes instead to an empty worker if there is one, else to the sharing worker
   whose shards are the fewest that fit into the other sharing workers' room below the band's top, and
   those shards move there at once (`_room_for_hot`): the least-loaded worker may hold dozens of small
   shards. A shard that fits nowhere counts as the moves its target then needs to shed the excess (one for
   a shard a hair too big, dozens for a shard near the level among small ones).
   *Hand-back*: a shard alone on its worker goes to an empty eligible worker of better `rank` once that one is
   `settled` (a healthy member for the region's `handback_after_s`): the region of one shard and two workers
   (what HA mode was) gets its shard back on the instance on the primary. Both workers' loads swap, nothing else
   changes, so no rebalance answers it; the cooldown does not hold it back (`settled` is its delay).
2. Rebalancing waits for the imbalance to persist: `plan()` takes `imbalanced_since` (None when the last
   plan found the pool balanced) and returns the new value for the caller to keep; only after
   `settings.persist_s` of continuous violation does it move shards (`rebalance`). One exception: a worker
   that holds nothing while the level says it should (it just joined) is filled at once
   (`settings.fill_empty_at_once`), since an empty worker is a fact, not a noisy measurement.
3. Fewest moves: repeatedly take the worst violation. An overloaded worker sends one shard to the
   least-loaded sharing worker: the one that best evens the pair (load closest to half the gap) among
   those that leave both inside the band. An underloaded worker takes, from any worker that stays inside
   the band, the smallest shard that closes its deficit, else the largest that fits. If no shard keeps
   both inside the band, the one that best evens the pair while the target stays below the source
   ("never the new max"). Workers that start empty (joined) are filled from one plan instead
   (`plan_fills`): each other worker offers the largest shard it can give and stay in the band, the
   largest offers are dealt out, each to the worker that lacks the most, until they add up to what the
   joined workers lack; one still short then trades a shard for a larger offer, or with a joined worker
   that has more than it needs, and only then takes one more shard (the smallest that closes it). Topping
   up each worker on its own left many a hair short, each one move more (the placement benchmark's
   "join 10%": 135 moves against 126). A hot shard with company keeps its worker and the others leave
   (rule 1 chooses where an orphaned hot shard lands so that its company is small: the placement
   benchmark's "crash (hot)") — unless moving the hot shard is fewer moves: to an empty worker being
   filled, when the company outnumbers the hot shard's own move plus the refill of the company it leaves
   less the fill the empty worker no longer needs (a join that lowers the level makes a shard hot: it
   moves to the new worker, not its small companions); else to the worker `_room_for_hot` finds cheapest
   to clear, when that, the hot shard's move and the company's refill are fewer than the company (a load
   shift that makes a shard hot among twenty small ones). The loop stops as soon as nothing violates, or
   when no move improves anything, or at `settings.max_moves`; each round moves a shard that has not moved
   in this plan (rule 4), so the loop always ends.
4. Cooldown: a shard moved less than `settings.cooldown_s` ago (`last_moved`, kept by the caller for every
   move of every kind) is never moved by a rebalance, nor is any shard moved twice in one plan.

**Which copy a worker reads** (`read_order()`: the copies in the order the worker tries them, each with why).
A GTID names the same transaction on every copy of a shard, so any copy gives the same deletes and markers;
what differs is *when* a change reaches it and what reading it costs. The candidates are the region's own
copy of the shard (the primary in the master region, a GTID replica elsewhere: what the region's web tier
reads and refills its caches from) and the shard's extra copies in the region (GTID replicas of that copy,
`[shards.NAME.replicas.R]`). Never another region's copy: a delete taken from a copy that is *ahead* of the
region's would reach the caches before the region's copy has the change, and a read in between would put the
old row back. An extra copy is always behind or level with the region's copy, so its deletes come late (by its
replication lag), never early. In order of preference:

1. the copy the worker names (`Worker.prefer`, an instance's `database`), then the region's copy;
2. else the extra copies on the worker's own host (distance 0: no network between the dump thread and the
   reader, and the primary keeps its binlog dump threads for its replicas), then the region's copy;
3. else the region's own copy (also when it is on the worker's host: it is the default and the freshest).

The region's copy comes last in every order: it is upstream of every extra copy, so a reader that falls back
to it has everything the extra copy had (squeal/read/reader.py switches when the preferred copy stops answering, or
is behind the position it must resume from, and goes back once that copy has caught up). `read_copy()` is the
first of the order; each `Move` carries it. Placement cost ignores distance in this version: every eligible
worker of a region is as good as any other for every shard, and no placement is chosen because of the copy it
would read.

`consistent_hash_assignment()` is the baseline the placement benchmark compares with (a hash ring with
virtual nodes, blind to load).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

UNASSIGNED = "unassigned"  # a shard nobody owns yet (new, or its owner is unknown)
ORPHANED = "orphaned"  # its worker is dead or left the pool
DRAIN = "drain"  # its worker drains (leaving gracefully)
REBALANCE = "rebalance"  # moved to fix a persistent imbalance
UNHEALTHY = "unhealthy"  # its worker's own copy does not answer
HANDBACK = "handback"  # handed back to a better-ranked worker that is back and settled


@dataclass(frozen=True)
class Worker:
    """One squeal worker of the region. `prefer`: shard name → the copy it would rather read; `host`: where it
    runs (for the distance to a copy). `healthy`: its own copy answers (False: it may own nothing); `rank`: its
    place in the topology's `squeal_instances` (lower is preferred: the one on the primary first); `settled`: it
    has been a healthy member for the region's `handback_after_s` (only then is anything handed back to it);
    `restarted`: a new process of a worker whose previous process held shards and died (a supervisor restarts a
    crashed worker within a second) — its shards are orphans, and it takes none until it has settled, unless no
    other worker can: it must not win the vacancy its own failure made."""

    name: str
    alive: bool = True
    draining: bool = False
    region: str = ""
    prefer: Mapping[str, str] = field(default_factory=dict)
    host: str = ""
    healthy: bool = True
    rank: int = 0
    settled: bool = True
    restarted: bool = False


@dataclass(frozen=True)
class Copy:
    """A copy of a shard that a worker of the region may read: the region's own copy (`region_copy`), or one of
    the shard's extra copies there (a GTID replica of it)."""

    name: str
    host: str = ""
    region_copy: bool = False


@dataclass(frozen=True)
class Shard:
    """A shard with its smoothed load (`shard_load`). `copies`: the copies a worker of the region may read (the
    region's own among them); () = only the region's own copy, named after the region."""

    name: str
    load: float
    copies: tuple[Copy, ...] = ()


@dataclass(frozen=True)
class Settings:
    threshold: float = 1.15  # a sharing worker within [L / threshold, L * threshold] is balanced
    persist_s: float = 60.0  # a violation must last this long before a rebalance moves anything
    cooldown_s: float = 300.0  # a shard moved this recently is not moved by a rebalance
    max_moves: int | None = None  # at most this many rebalance moves per plan (placements are never capped)
    fill_empty_at_once: bool = True  # an empty worker the level wants filled (a join) skips the hysteresis


@dataclass(frozen=True)
class Move:
    shard: str
    source: str | None  # None: nobody held it
    target: str
    reason: str  # UNASSIGNED | ORPHANED | DRAIN | UNHEALTHY | REBALANCE | HANDBACK
    detail: str  # why, in words
    load: float
    copy: str  # the copy `target` reads for this shard (read_copy)
    copy_reason: str


@dataclass(frozen=True)
class Balance:
    """How balanced an assignment is (`balance()`)."""

    level: float  # L: the load of a sharing worker when perfectly balanced
    hot: frozenset[str]  # shards heavier than L: each should be alone on its worker
    high: float  # L * threshold
    low: float  # L / threshold
    imbalance: float  # max over sharing workers of load / L (or L / load when underloaded); 1.0 = perfect
    max_over_mean: float  # plain max worker load / mean worker load (hot shards included)
    hot_not_alone: int  # hot shards whose worker holds anything else
    violations: tuple[str, ...]  # workers outside the band or with a hot shard in company, worst first


@dataclass(frozen=True)
class Plan:
    moves: tuple[Move, ...]
    assignment: dict[str, str]  # shard → worker after the moves
    loads: dict[str, float]  # eligible worker → load after the moves
    before: Balance  # after the placements, before any rebalance
    after: Balance
    imbalanced_since: float | None  # keep it and pass it to the next plan()
    unplaced: tuple[str, ...]  # shards no eligible worker could take (no eligible worker at all)
    notes: tuple[str, ...]  # why a rebalance waited or stopped short


def shard_load(
    rows_per_s: float, binlog_bytes_per_s: float, *, bytes_per_row: float = 500.0, floor: float = 1.0
) -> float:
    """A shard's load in rows/s equivalents: rows/s + binlog bytes/s ÷ `bytes_per_row`, at least `floor`."""
    return max(floor, rows_per_s + binlog_bytes_per_s / bytes_per_row)


def smooth(previous: float | None, sample: float, elapsed_s: float, half_life_s: float = 60.0) -> float:
    """Exponentially weighted average: a sample `half_life_s` old weighs half as much as a new one."""
    if previous is None:
        return sample
    keep = 0.5 ** (max(0.0, elapsed_s) / half_life_s)
    return keep * previous + (1.0 - keep) * sample


def read_order(worker: Worker, shard: Shard) -> tuple[tuple[str, str], ...]:
    """The copies of `shard` that `worker` reads, in the order it tries them, each with why (see the module
    docstring). The region's own copy is always last: the fallback of every other."""
    own = next((c for c in shard.copies if c.region_copy), Copy(worker.region, region_copy=True))
    extra = [c for c in shard.copies if not c.region_copy]
    fallback = (own.name, "the region's own copy: the fallback (it has everything its extra copies have)")
    preferred = worker.prefer.get(shard.name)
    if preferred == own.name:
        return ((own.name, "the region's own copy, named by the worker"),)
    named = next((c for c in extra if c.name == preferred), None)
    if named is not None:
        return (named.name, "the extra copy the worker names"), fallback
    unknown = f" (the worker names {preferred}, not a copy of {shard.name} in its region)" if preferred else ""
    if worker.host and own.host != worker.host:
        local = [c for c in extra if c.host == worker.host]
        if local:
            return *((c.name, f"an extra copy on the worker's host {worker.host}{unknown}") for c in local), fallback
    where = " on the worker's host" if worker.host and own.host == worker.host else ""
    return ((own.name, f"the region's own copy{where} (no extra copy is nearer){unknown}"),)


def read_copy(worker: Worker, shard: Shard) -> tuple[str, str]:
    """The copy `worker` reads first for `shard`, and why (`read_order`)."""
    return read_order(worker, shard)[0]


def level(loads: Iterable[float], workers: int) -> tuple[float, float]:
    """(L, hot limit): the balanced load of a sharing worker, and the load above which a shard is hot.

    Water-filling: while the heaviest remaining shard outweighs the mean of the remaining load over the
    remaining workers, it gets a worker of its own; the last worker is never set apart.
    """
    ordered = sorted(loads, reverse=True)
    if workers <= 0:
        return 0.0, math.inf
    rest = math.fsum(ordered)
    n = workers
    k = 0
    while k < len(ordered) and n > 1 and ordered[k] > rest / n * (1 + 1e-12):
        rest -= ordered[k]
        n -= 1
        k += 1
    mean = max(0.0, rest) / n
    return mean, mean * (1 + 1e-12)


def balance(
    loads: Mapping[str, float], assignment: Mapping[str, str], workers: Iterable[str], threshold: float
) -> Balance:
    """Judge `assignment` (shard → worker) of shards with `loads` over `workers` (the eligible ones)."""
    names = sorted(set(workers))
    held: dict[str, set[str]] = {w: set() for w in names}
    for shard, w in assignment.items():
        if w in held and shard in loads:
            held[w].add(shard)
    wload = {w: math.fsum(loads[s] for s in sorted(held[w])) for w in names}
    lvl, hot_above = level(loads.values(), len(names))
    hot = frozenset(s for s, x in loads.items() if x > hot_above)
    return _judge(loads, held, wload, lvl, hot, threshold)


def _judge(
    loads: Mapping[str, float],
    held: Mapping[str, set[str]],
    wload: Mapping[str, float],
    lvl: float,
    hot: frozenset[str],
    threshold: float,
) -> Balance:
    high, low = lvl * threshold, lvl / threshold
    eps = 1e-9 * max(lvl, 1e-12)
    worst: list[tuple[float, str]] = []
    imbalance = 1.0
    hot_not_alone = 0
    for w, load in wload.items():
        hots = held[w] & hot
        if hots:
            if len(held[w]) > 1:
                hot_not_alone += len(hots)
                worst.append((load / max(loads[s] for s in hots), w))
            continue
        if lvl > 0:
            ratio = load / lvl if load >= lvl else (lvl / load if load > 0 else math.inf)
            imbalance = max(imbalance, ratio)
        if load > high + eps or load < low - eps:
            worst.append((math.inf if load <= 0 else max(load / lvl, lvl / load), w))
    worst.sort(key=lambda t: (-t[0], t[1]))
    total = math.fsum(wload.values())
    mean = total / len(wload) if wload else 0.0
    return Balance(
        level=lvl,
        hot=hot,
        high=high,
        low=low,
        imbalance=imbalance,
        max_over_mean=(max(wload.values()) / mean) if mean > 0 else 1.0,
        hot_not_alone=hot_not_alone,
        violations=tuple(w for _, w in worst),
    )


def plan(
    workers: Iterable[Worker],
    shards: Iterable[Shard],
    assignment: Mapping[str, str],
    last_moved: Mapping[str, float],
    now: float,
    imbalanced_since: float | None = None,
    settings: Settings | None = None,
    pinned: frozenset[str] = frozenset(),
) -> Plan:
    """The moves that place every unowned shard and, once an imbalance has persisted, fix it.

    `pinned`: shards an operator moved (`squealctl move`) within the cooldown: no hand-back takes them away.

    `assignment`: shard → worker as it stands (shards missing from it are new); `last_moved`: shard → the
    time of its last move (any reason); `now`: the controller's clock, in the same unit (seconds);
    `imbalanced_since`: what the previous plan returned. The caller applies `Plan.moves`, records `now` in
    `last_moved` for each moved shard and keeps `Plan.imbalanced_since` for the next call.
    """
    cfg = settings or Settings()
    by_name = {w.name: w for w in sorted(workers, key=lambda w: w.name)}
    shard_of = {s.name: s for s in sorted(shards, key=lambda s: s.name)}
    loads = {name: s.load for name, s in shard_of.items()}
    able = [w for w in by_name.values() if w.alive and not w.draining and w.healthy]
    # a restarted worker waits until it has settled, unless nobody else can take anything
    eligible = [w for w in able if not (w.restarted and not w.settled)] or able
    ranks = {w.name: w.rank for w in eligible}
    held: dict[str, set[str]] = {w.name: set() for w in eligible}
    owner: dict[str, str] = {}
    orphans: list[tuple[str, str, str | None, str]] = []  # (shard, reason, old owner, detail)
    for name in shard_of:
        old = assignment.get(name)
        if old in held:
            owner[name] = old
            held[old].add(name)
        elif old is None:
            orphans.append((name, UNASSIGNED, None, "a new shard"))
        elif old not in by_name:
            orphans.append((name, ORPHANED, old, f"worker {old} left the pool"))
        elif not by_name[old].alive:
            orphans.append((name, ORPHANED, old, f"worker {old} is dead"))
        elif by_name[old].restarted and by_name[old].healthy and not by_name[old].draining:
            orphans.append((name, ORPHANED, old, f"worker {old} restarted: the process that held it died"))
        elif by_name[old].draining:
            orphans.append((name, DRAIN, old, f"worker {old} drains"))
        else:
            orphans.append((name, UNHEALTHY, old, f"worker {old}'s copy does not answer"))
    wload = {w: math.fsum(loads[s] for s in sorted(held[w])) for w in held}
    moves: list[Move] = []

    def record(shard: str, source: str | None, target: str, reason: str, detail: str) -> None:
        copy, why = read_copy(by_name[target], shard_of[shard])
        moves.append(Move(shard, source, target, reason, detail, loads[shard], copy, why))

    def movable(shard: str) -> bool:
        """A rebalance may move it: not moved in this plan, not within its cooldown."""
        if shard in moved_now:
            return False
        at = last_moved.get(shard)
        return at is None or now - at >= cfg.cooldown_s

    def place(name: str, source: str | None, target: str, reason: str, detail: str) -> None:
        if source is not None and source in held:
            held[source].discard(name)
            wload[source] -= loads[name]
        owner[name] = target
        held[target].add(name)
        wload[target] += loads[name]
        moved_now.add(name)
        record(name, source, target, reason, detail)

    # 1. placements: a hot orphan onto the worker whose company is cheapest to move away (`_room_for_hot`),
    # the rest LPT onto the least-loaded eligible worker
    lvl, hot_above = level(loads.values(), len(held))
    hot = frozenset(s for s, x in loads.items() if x > hot_above)
    high, low = lvl * cfg.threshold, lvl / cfg.threshold
    moved_now: set[str] = set()
    unplaced: tuple[str, ...] = ()
    if not eligible:
        unplaced = tuple(name for name, _, _, _ in orphans)
    else:
        ordered = sorted(orphans, key=lambda o: (-loads[o[0]], o[0]))
        lpt: list[tuple[str, str, str | None, str]] = []
        for name, reason, old, detail in ordered:
            room = _room_for_hot(held, wload, loads, hot, high, movable, ranks) if name in hot else None
            if room is None:
                lpt.append((name, reason, old, detail))
                continue
            target, evictions, _ = room
            place(name, old, target, reason, detail)
            for shard, to in evictions:
                place(shard, target, to, REBALANCE, f"making room for hot shard {name} on {target}")

        heap = [(wload[w], len(held[w]), by_name[w].rank, w) for w in held]
        heapq.heapify(heap)
        for name, reason, old, detail in lpt:
            _, _, _, target = heapq.heappop(heap)
            place(name, old, target, reason, detail)
            heapq.heappush(heap, (wload[target], len(held[target]), by_name[target].rank, target))

    # 1b. hand-back: a shard alone on its worker goes to an empty, settled worker of better rank (the region's
    # "one shard, two workers": the instance on the primary gets its shard back once it has been back a while).
    # Every worker's load stays what it was, only their names swap, so balance is untouched and nothing moves
    # back; the cooldown does not hold it (the `settled` delay is its hysteresis).
    for name in sorted(shard_of):
        source = owner.get(name)
        if source is None or name in moved_now or name in pinned or held[source] != {name}:
            continue
        better = [w for w in held if not held[w] and by_name[w].settled and by_name[w].rank < by_name[source].rank]
        if better:
            target = min(better, key=lambda w: (by_name[w].rank, w))
            place(name, source, target, HANDBACK, f"{target} (rank {by_name[target].rank}) is back and settled")

    before = _judge(loads, held, wload, lvl, hot, cfg.threshold)
    notes: list[str] = []
    if not before.violations:
        return _done(moves, owner, wload, before, before, None, unplaced, notes)

    # 2. hysteresis
    since = now if imbalanced_since is None else imbalanced_since
    only_targets: set[str] | None = None
    if now - since < cfg.persist_s:
        empty = {w for w in before.violations if not held[w] and wload[w] < before.low}
        if not (cfg.fill_empty_at_once and empty):
            notes.append(f"imbalance {_figure(before)} for {now - since:g} s of the {cfg.persist_s:g} s it must last")
            return _done(moves, owner, wload, before, before, since, unplaced, notes)
        only_targets = empty
        notes.append(f"filling {len(empty)} empty worker(s) at once; other imbalance waits for the hysteresis")

    # 3. rebalance: fewest moves, worst violation first
    eps = 1e-9 * max(lvl, 1e-12)
    kept: dict[str, str | None] = {w: _kept_hot(held[w], hot, loads) for w in held}

    offers: dict[str, tuple[list[float], list[str]]] = {}  # worker → its movable shards by (load, name)

    def offer(w: str) -> tuple[list[float], list[str]]:
        if w not in offers:
            pairs = sorted((loads[s], s) for s in held[w] if s != kept[w] and movable(s))
            offers[w] = ([x for x, _ in pairs], [s for _, s in pairs])
        return offers[w]

    def candidates(w: str) -> list[str]:
        return sorted(offer(w)[1])

    def send_from(source: str) -> tuple[str, str] | None:
        """An overloaded worker sends one shard to the least-loaded sharing worker: (shard, target)."""
        targets = [w for w in held if w != source and kept[w] is None]
        if not targets:
            return None
        target = min(targets, key=lambda w: (wload[w], len(held[w]), w))
        s_load, t_load = wload[source], wload[target]
        gap = s_load - t_load
        best_clean: tuple[float, str] | None = None
        best_any: tuple[float, str] | None = None
        for shard in candidates(source):
            x = loads[shard]
            if t_load + x >= s_load - eps:
                continue  # the target would become the new max of the pair: no improvement
            key = (abs(gap - 2 * x), shard)  # the shard that best evens the pair
            if t_load + x <= high + eps and (s_load - x >= low - eps or kept[source] is not None):
                best_clean = min(best_clean or key, key)
            best_any = min(best_any or key, key)
        chosen = best_clean or best_any
        return (chosen[1], target) if chosen else None

    def take_into(target: str) -> tuple[str, str] | None:
        """An underloaded worker takes one shard: (shard, source). The one that closes its deficit, or the
        largest that fits, from any worker that stays in the band; else the most-loaded worker's best."""
        t_load = wload[target]
        need, room = low - t_load, high - t_load

        def spare(w: str) -> float:
            hot = kept[w]
            if hot is not None:
                return wload[w] - loads[hot]  # a hot shard's company may all go
            return wload[w] - low

        sources = sorted((w for w in held if w != target and wload[w] > t_load + eps), key=lambda w: (-spare(w), w))
        best: tuple[tuple[int, float, str], str, str] | None = None
        for source in sources:
            cap = min(spare(source), room)
            if cap <= eps or (best is not None and (best[0][0] == 0 or -best[0][1] >= cap)):
                break  # sorted by spare: no later source offers more
            xs, names = offer(source)
            cap = min(cap, wload[source] - t_load - 2 * eps)  # and the target stays below the source
            i = bisect.bisect_left(xs, need - eps)  # the smallest shard that closes the deficit
            if i < len(xs) and xs[i] <= cap + eps:
                key = (0, xs[i], names[i])
            else:
                j = bisect.bisect_right(xs, cap + eps) - 1  # else the largest that fits
                if j < 0:
                    continue
                key = (1, -xs[j], names[j])
            if best is None or key < best[0]:
                best = (key, key[2], source)
        if best is not None:
            return best[1], best[2]
        for source in sorted(held, key=lambda w: (-wload[w], w)):  # nothing clean: improve the pair
            if source == target or wload[source] <= t_load + eps:
                break
            picked: tuple[float, str] | None = None
            for shard in candidates(source):
                x = loads[shard]
                score = (abs(wload[source] - t_load - 2 * x), shard)
                if t_load + x < wload[source] - eps and (picked is None or score < picked):
                    picked = score
            if picked:
                return picked[1], source
        return None

    def hot_for_empty(target: str) -> tuple[str, str] | None:
        """A hot shard with company that should rather move to the empty `target`: (shard, source).

        Its company must leave it anyway, and `target` must be filled anyway. Moving the hot shard instead costs
        its own move plus the fill of the company it leaves behind, and saves the fill of `target` (each fill
        move is taken to bring at most the band's width): it moves when that is fewer moves. (Counting only
        the company's refill, as this once did, kept a hot shard with two to four companions in place.)
        """
        width = max(high - low, eps)

        def fill(deficit: float) -> int:
            return math.ceil(max(0.0, deficit) / width - 1e-9)

        best: tuple[int, str, str] | None = None
        for source in held:
            hot_shard = kept[source]
            if hot_shard is None or len(held[source]) < 2 or not movable(hot_shard):
                continue
            company = wload[source] - loads[hot_shard]
            saved = (len(held[source]) - 1) + fill(low - wload[target]) - (1 + fill(low - company))
            if saved > 0 and (best is None or (-saved, hot_shard) < (best[0], best[1])):
                best = (-saved, hot_shard, source)
        return (best[1], best[2]) if best else None

    def spare(w: str) -> float:
        """What `w` can give and stay in the band (a hot shard's company may all go)."""
        hot_shard = kept[w]
        return wload[w] - loads[hot_shard] if hot_shard is not None else wload[w] - low

    def plan_fills(targets: list[str]) -> dict[str, list[tuple[str, str]]]:
        """How the workers being filled (joined, or left with a hot shard's company) reach the band: target →
        [(shard, source)], in the fewest moves this finds. Each source offers the largest shard that keeps
        it in the band; the largest offers are dealt out first, each to the target that lacks the most, until
        their sum covers the targets' deficits; a target still short then trades one of its shards for a
        larger offer or for a larger shard of a target with room to spare, and only if neither exists takes
        one more (the smallest that closes it). Dealing the largest shard to whoever lacks most and topping
        up at the end (`take_into`'s way) leaves many targets a hair short, each one move more."""
        need = {t: low - wload[t] for t in targets}
        room = {t: high - wload[t] for t in targets}
        cap = {w: spare(w) for w in held if w not in need}
        taken: dict[str, tuple[float, str, str]] = {}  # shard → (load, source, target)
        got = dict.fromkeys(targets, 0.0)
        bins: dict[str, list[str]] = {t: [] for t in targets}

        too_big: set[str] = set()  # offers no target has room for (targets only fill up while dealing)

        def best(w: str) -> tuple[float, str] | None:
            xs, names = offer(w)
            i = bisect.bisect_right(xs, cap[w] + eps) - 1
            while i >= 0 and (names[i] in taken or names[i] in too_big):
                i -= 1
            return (xs[i], names[i]) if i >= 0 else None

        def assign(shard: str, source: str, target: str) -> None:
            taken[shard] = (loads[shard], source, target)
            cap[source] -= loads[shard]
            got[target] += loads[shard]
            bins[target].append(shard)

        def unassign(shard: str) -> None:
            x, source, target = taken.pop(shard)
            cap[source] += x
            got[target] -= x
            bins[target].remove(shard)

        def short(t: str) -> float:
            return need[t] - got[t]

        def smallest_closing(t: str) -> tuple[float, str, str] | None:
            """The smallest offer of any source that closes `t`'s deficit and fits it: (load, shard, source)."""
            found: tuple[float, str, str] | None = None
            for w in cap:
                xs, names = offer(w)
                i = bisect.bisect_left(xs, short(t) - eps)
                while i < len(xs) and names[i] in taken:
                    i += 1
                if i < len(xs) and xs[i] <= min(cap[w], room[t] - got[t]) + eps and w != t:
                    found = min(found or (xs[i], names[i], w), (xs[i], names[i], w))
            return found

        heap = [(-o[0], o[1], w) for w in cap if cap[w] > eps and (o := best(w))]
        heapq.heapify(heap)
        while heap and math.fsum(got.values()) < math.fsum(need.values()) - eps:
            _, shard, source = heapq.heappop(heap)
            if best(source) != (loads[shard], shard):
                if (o := best(source)) is not None:
                    heapq.heappush(heap, (-o[0], o[1], source))
                continue
            if math.fsum(got.values()) + loads[shard] > math.fsum(need.values()) + eps:
                break  # the rest is closed target by target below
            fits = [t for t in targets if got[t] + loads[shard] <= room[t] + eps]
            if fits:
                assign(shard, source, max(fits, key=lambda t: (short(t), t)))
            else:
                too_big.add(shard)
            if (o := best(source)) is not None:
                heapq.heappush(heap, (-o[0], o[1], source))

        too_big.clear()
        for t in sorted(targets, key=lambda t: (short(t), t)):
            lack = short(t)
            if lack <= eps:
                continue
            offers = [(o[0], o[1], w) for w in cap if w != t and (o := best(w))]
            # trade one of t's shards for a larger offer that closes it
            trade = min(
                (
                    (y - loads[a], a, name, w)
                    for a in bins[t]
                    for y, name, w in offers
                    if lack - eps <= y - loads[a] <= room[t] - got[t] + eps
                    and (w != taken[a][1] or y <= cap[w] + loads[a] + eps)
                ),
                default=None,
            )
            if trade is not None:
                _, a, name, w = trade
                unassign(a)
                assign(name, w, t)
                continue
            # trade with a target that has more than it needs
            swap = min(
                (
                    (loads[b] - loads[a], a, b, u)
                    for u in targets
                    if u != t and short(u) < -eps
                    for a in bins[t]
                    for b in bins[u]
                    if lack - eps <= loads[b] - loads[a] <= -short(u) + eps
                    and loads[b] - loads[a] <= room[t] - got[t] + eps
                    and taken[a][1] != u
                    and taken[b][1] != t
                ),
                default=None,
            )
            if swap is not None:
                _, a, b, u = swap
                a_source, b_source = taken[a][1], taken[b][1]
                unassign(a)
                unassign(b)
                assign(a, a_source, u)
                assign(b, b_source, t)
                continue
            closing = smallest_closing(t)
            if closing is not None:
                assign(closing[1], closing[2], t)
        return {t: sorted(((s, taken[s][1]) for s in bins[t]), key=lambda p: (-loads[p[0]], p[0])) for t in targets}

    fills = {w for w in held if not held[w] and wload[w] < low}  # joined: filled by plan_fills
    planned: dict[str, list[tuple[str, str]]] | None = None

    def planned_into(target: str) -> tuple[str, str] | None:
        """The next move of the fill plan into `target` that is still valid: (shard, source)."""
        nonlocal planned
        if target not in fills:
            return None
        if planned is None:
            planned = plan_fills(sorted(w for w in fills if wload[w] < low - eps))
        queue = planned.get(target, [])
        while queue:
            shard, source = queue.pop(0)
            x = loads[shard]
            if (
                owner.get(shard) == source
                and shard not in moved_now
                and movable(shard)
                and spare(source) >= x - eps
                and wload[target] + x <= high + eps
            ):
                return shard, source
        return None

    def relocate_hot(source: str) -> bool:
        """A hot shard with company moves instead to the worker whose shards are cheapest to move away
        (`_room_for_hot`), when that and the refill of the company it leaves are fewer moves than the
        company's own: a load shift can make a shard hot on a worker of twenty small shards."""
        hot_shard = kept[source]
        if hot_shard is None or not movable(hot_shard) or any(s in hot for s in held[source] - {hot_shard}):
            return False
        company = len(held[source]) - 1
        width = max(high - low, eps)
        refill = math.ceil(max(0.0, low - (wload[source] - loads[hot_shard])) / width - 1e-9)
        room = _room_for_hot(held, wload, loads, hot, high, movable, ranks)
        if room is None or 1 + room[2] + refill >= company:
            return False
        target, evictions, _ = room
        for name, to in [(hot_shard, target), *evictions]:
            origin = owner[name]
            place(name, origin, to, REBALANCE, f"hot shard {hot_shard} alone on {target}, not its company moved")
        kept[source] = None
        kept[target] = hot_shard
        offers.clear()
        if wload[source] < low:
            fills.add(source)  # the company it keeps is topped up like a joined worker
        return True

    relocated = False
    placed = len(moves)
    rebalanced = 0
    state = before
    stuck: set[str] = set()  # violations no move could fix in this plan; the next plan tries again
    while state.violations:
        if cfg.max_moves is not None and rebalanced >= cfg.max_moves:
            notes.append(f"stopped at max_moves={cfg.max_moves}")
            break
        move: tuple[str, str, str, str] | None = None
        for w in state.violations:
            if w in stuck or (only_targets is not None and w not in only_targets):
                continue
            if kept[w] is not None and relocate_hot(w):
                relocated = True
                break
            if kept[w] is not None or wload[w] > high + eps:  # too much: send one shard away
                found = send_from(w)
                if found:
                    why = f"with hot shard {kept[w]}" if kept[w] is not None else f"at {wload[w] / lvl:.2f}x"
                    move = (found[0], w, found[1], f"{w} {why} of the level")
            else:  # too little: take one shard in (an empty worker: perhaps a hot shard instead of its company)
                hot_move = hot_for_empty(w) if not held[w] and planned is None else None
                if hot_move:
                    move = (hot_move[0], hot_move[1], w, f"hot shard {hot_move[0]} alone, not its company moved")
                    fills.add(hot_move[1])
                    if only_targets is not None:
                        only_targets.add(hot_move[1])  # its old worker keeps only the company: fill it too
                else:
                    found = planned_into(w) or take_into(w)
                    if found:
                        move = (found[0], found[1], w, f"{w} at {wload[w] / lvl:.2f}x of the level")
            if move:
                break
            stuck.add(w)
        if relocated:
            relocated = False
            rebalanced = len(moves) - placed
            state = _judge(loads, held, wload, lvl, hot, cfg.threshold)
            continue
        if move is None:
            blocked = [
                s for w in state.violations for s in held[w] if s in last_moved and now - last_moved[s] < cfg.cooldown_s
            ]
            notes.append(
                f"no move improves the imbalance {_figure(state)}"
                + (f" ({len(blocked)} shard(s) in cooldown)" if blocked else "")
            )
            break
        shard, source, target, detail = move
        held[source].discard(shard)
        held[target].add(shard)
        wload[source] -= loads[shard]
        wload[target] += loads[shard]
        owner[shard] = target
        if shard in hot:
            kept[source] = _kept_hot(held[source], hot, loads)
            kept[target] = _kept_hot(held[target], hot, loads)
        moved_now.add(shard)
        offers.pop(source, None)
        offers.pop(target, None)
        record(shard, source, target, REBALANCE, detail)
        rebalanced += 1
        state = _judge(loads, held, wload, lvl, hot, cfg.threshold)
        if only_targets is not None:
            only_targets &= set(state.violations)
            if not only_targets:
                break
    return _done(moves, owner, wload, before, state, since if state.violations else None, unplaced, notes)


def _room_for_hot(
    held: Mapping[str, set[str]],
    wload: Mapping[str, float],
    loads: Mapping[str, float],
    hot: frozenset[str],
    high: float,
    movable: Callable[[str], bool],
    rank: Mapping[str, int],
) -> tuple[str, list[tuple[str, str]], int] | None:
    """Where a hot shard goes, and where that worker's company goes: (worker, [(shard, to)], estimated moves).

    A hot shard must be alone, so the worker it lands on loses all its other shards. The least-loaded worker
    (LPT's choice) may hold dozens of small shards; a worker with a few shards that fit into the others' room
    below the band's top costs a few moves and no ripple. Each candidate's company is tried largest first
    into the roomiest other sharing worker; a shard that fits nowhere pushes that worker over the band's top,
    and costs as many moves as that worker then needs to shed the excess (its fewest shards, largest first,
    that cover it; `_OVERFLOW_COST` if none do): a shard a hair too big costs one move more, a shard near the
    level on a worker of small shards costs dozens. None when every candidate holds a shard in cooldown (the caller then
    places the hot shard as any other and the rebalance moves its company later).
    """
    sharing = [w for w in sorted(held) if not held[w] & hot]
    empty = [w for w in sharing if not held[w]]
    if empty:
        return min(empty, key=lambda w: (wload[w], rank[w], w)), [], 0
    best: tuple[tuple[int, int, float, str], list[tuple[str, str]]] | None = None
    for w in sharing:
        company = sorted(held[w], key=lambda s: (-loads[s], s))
        if best is not None and len(company) > best[0][0]:
            continue  # each shard costs at least one move: it cannot beat the best so far
        if not all(movable(s) for s in company):
            continue
        rooms = [(-(high - wload[t]), t) for t in sharing if t != w]
        heapq.heapify(rooms)
        cost, plan = 0, []
        for s in company:
            if not rooms:
                cost = sys.maxsize
                break
            room, t = heapq.heappop(rooms)
            if loads[s] > -room:
                cost += _shed(sorted((loads[x] for x in held[t]), reverse=True), loads[s] + room)
            cost += 1
            plan.append((s, t))
            heapq.heappush(rooms, (room + loads[s], t))
        key = (cost, len(company), wload[w], w)
        if best is None or key < best[0]:
            best = (key, plan)
    if best is None or best[0][0] == sys.maxsize:
        return None
    return best[0][3], best[1], best[0][0]


_OVERFLOW_COST = 1000  # moves an overflow its target cannot shed is taken to cost (the rebalance it triggers)


def _shed(descending: list[float], excess: float) -> int:
    """The fewest of `descending` (loads, largest first) whose sum covers `excess`; `_OVERFLOW_COST` if all do not."""
    for i, x in enumerate(descending):
        excess -= x
        if excess <= 0:
            return i + 1
    return _OVERFLOW_COST


def _kept_hot(held: set[str], hot: frozenset[str], loads: Mapping[str, float]) -> str | None:
    """The hot shard a worker keeps (its heaviest); None for a sharing worker."""
    hots = held & hot
    return min(hots, key=lambda s: (-loads[s], s)) if hots else None


def _figure(b: Balance) -> str:
    text = f"{b.imbalance:.2f}x the level"
    if b.hot_not_alone:
        text += f", {b.hot_not_alone} hot shard(s) not alone"
    return text


def _done(
    moves: list[Move],
    owner: dict[str, str],
    wload: dict[str, float],
    before: Balance,
    after: Balance,
    since: float | None,
    unplaced: tuple[str, ...],
    notes: list[str],
) -> Plan:
    return Plan(
        moves=tuple(moves),
        assignment=dict(sorted(owner.items())),
        loads=dict(sorted(wload.items())),
        before=before,
        after=after,
        imbalanced_since=since,
        unplaced=unplaced,
        notes=tuple(notes),
    )


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def consistent_hash_assignment(workers: Iterable[str], shards: Iterable[str], vnodes: int = 100) -> dict[str, str]:
    """Baseline: shard → worker on a hash ring with `vnodes` virtual nodes per worker (blind to load)."""
    ring = sorted((_hash(f"{w}#{i}"), w) for w in set(workers) for i in range(vnodes))
    if not ring:
        return {}
    points = [p for p, _ in ring]
    out: dict[str, str] = {}
    for s in sorted(shards):
        i = bisect.bisect_right(points, _hash(s)) % len(ring)
        out[s] = ring[i][1]
    return out
