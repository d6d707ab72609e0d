"""Placement model (issue 24): `squeal.pool.placement` driven by simulated workers and shards, no servers (not a test).

    .venv/bin/python bench/placement_model.py [--shards 4096] [--workers 64,256] [--seed 24]

4,096 shards with Zipf(1.0) loads (the shard of rank k weighs 1/k; ranks shuffled over the shard names with
a fixed seed) are placed over 64 and over 256 workers, then each scenario starts from the converged state
of the one before it (clock moved on an hour, so no cooldown is running):

* **initial**: every shard unassigned.
* **join 1**: one worker joins.
* **crash**: one worker dies — the worker holding the most shards (an ordinary one: it holds no hot shard).
* **crash (hot)**: the worker of the hottest shard dies (it held that shard alone).
* **join 10%**: a tenth of the pool joins at once.
* **load shift**: 5% of the shards get a new load (a Zipf weight of a random rank).

After the event the controller plans every 30 s of simulated time (settings: threshold 1.15, persist 60 s,
cooldown 300 s) until a plan moves nothing and no move is pending (at most 40 plans); every move of every
plan counts. Reported per scenario:

* **moves** against the **minimum**: initial, every shard; crash, the dead worker's shard count (crash
  (hot): plus the fewest shards any sharing worker holds, since one of them must make room for the hot
  shard to be alone); otherwise a lower bound computed on the state right after the event, in the policy's
  own terms (band [L/1.15, 1.15 L] around the level L, hot shards alone). Every worker ends at L/1.15 or
  more (a hot shard alone is above L), so the underloaded workers' total deficit must come from the others,
  each giving at most its load above L/1.15. Moving a hot shard that is alone never helps (its old worker
  then lacks what its new one no longer does); a hot shard with company may stay (the company leaves) or
  leave for another worker whose shards then all leave. The bound is the largest of
  (a) the sum over overloaded workers of the fewest of their shards, largest first, whose load covers the
  excess, plus for each hot shard with company the fewer of its company's count and one more than the
  fewest shards a sharing worker holds; (b) the number of underloaded workers; (c) the fewest givers
  whose room above L/1.15, largest first, covers the deficit; (d) the fewest shards, largest first, that
  cover it, counting only shards that fit both their giver's room and the emptiest underloaded worker's.
  For (c) and (d) the deficit is taken smaller by what a hot shard with company could save by moving to
  an underloaded worker (that worker's deficit, less the one its company is then left with), and the
  company counts as offered all the same: the bound takes the better of both cases at once.
  Each move has one source and one target, so no plan can do with fewer; a greedy bound, not the optimum.
  (d) assumes a worker that gives shards takes none back (true of the policy's plans but for a hot shard's
  old worker): a plan that sends a shard larger than its giver's room and refills the giver is outside it,
  and only (a)-(c) bound it (at 256 workers, ten percent joining: 84 moves where (d) says 105).
* **max/mean**: the plain figure over all workers, beside its **floor** (heaviest shard ÷ mean: no
  placement goes below it; with Zipf(1.0) the hottest shard alone is 7x the mean worker at 64 workers);
  **sharing max/L**: the largest load of a worker without a hot shard over the level L (the balance the
  threshold 1.15 is about), and **hot alone**: hot shards alone on their worker, of all hot shards.
* **plan time**: the CPU time (`time.thread_time`) of the slowest `plan()` call of the scenario: wall
  time on a shared box is whatever the neighbours leave; consistent hashing's (computing the ring's
  assignment) is in the text below the table.

The baseline is plain consistent hashing of the shard names (`consistent_hash_assignment`, 100 virtual
nodes per worker) over the same workers, judged with the same figures; its minimum for a crash is its own
dead worker's shard count.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from squeal.pool.placement import (
    Plan,
    Settings,
    Shard,
    Worker,
    balance,
    consistent_hash_assignment,
    plan,
)

SETTINGS = Settings(threshold=1.15, persist_s=60.0, cooldown_s=300.0)
TICK_S = 30.0
MAX_PLANS = 40


@dataclass
class Pool:
    workers: list[str]
    loads: dict[str, float]
    assignment: dict[str, str] = field(default_factory=dict)
    last_moved: dict[str, float] = field(default_factory=dict)
    since: float | None = None
    now: float = 0.0

    def step(self) -> tuple[Plan, float]:
        shards = [Shard(s, x) for s, x in self.loads.items()]
        started = time.thread_time()
        p = plan(
            [Worker(w) for w in self.workers], shards, self.assignment, self.last_moved, self.now, self.since, SETTINGS
        )
        took = time.thread_time() - started
        for m in p.moves:
            self.last_moved[m.shard] = self.now
        self.assignment = dict(p.assignment)
        self.since = p.imbalanced_since
        return p, took

    def converge(self) -> tuple[int, float, int]:
        """Plan every TICK_S until quiet: (moves, slowest plan, plans)."""
        moves, slowest, quiet = 0, 0.0, 0
        for i in range(MAX_PLANS):
            p, took = self.step()
            moves += len(p.moves)
            slowest = max(slowest, took)
            self.now += TICK_S
            quiet = 0 if p.moves else quiet + 1
            # done: nothing moved, and either balanced or past any hysteresis and cooldown that could unblock
            if not p.moves and (not p.after.violations or quiet * TICK_S > SETTINGS.cooldown_s):
                return moves, slowest, i + 1
        return moves, slowest, MAX_PLANS

    def rest(self) -> None:
        self.now += 3600.0


def zipf_loads(n: int, rng: random.Random, scale: float = 100_000.0) -> dict[str, float]:
    ranks = list(range(1, n + 1))
    rng.shuffle(ranks)
    return {f"shard-{i:04d}": scale / r for i, r in enumerate(ranks)}


def figures(loads: dict[str, float], assignment: dict[str, str], workers: list[str]) -> dict[str, float]:
    b = balance(loads, assignment, workers, SETTINGS.threshold)
    wl = {w: 0.0 for w in workers}
    for s, w in assignment.items():
        wl[w] += loads[s]
    mean = math.fsum(wl.values()) / len(workers)
    sharing = [wl[w] for w in workers if not any(assignment.get(s) == w for s in b.hot)]
    alone = sum(1 for s in b.hot if sum(1 for t, w in assignment.items() if w == assignment[s]) == 1)
    return {
        "max_mean": max(wl.values()) / mean,
        "floor": max(1.0, max(loads.values()) / mean),
        "sharing": (max(sharing) / b.level) if sharing and b.level > 0 else 1.0,
        "hot": len(b.hot),
        "alone": alone,
    }


def fewest(xs: list[float], amount: float) -> int | None:
    """How many of `xs`, largest first, it takes to cover `amount` (None: all of them do not)."""
    if amount <= 0:
        return 0
    for i, x in enumerate(sorted(xs, reverse=True)):
        amount -= x
        if amount <= 1e-9:
            return i + 1
    return None


def min_moves(loads: dict[str, float], assignment: dict[str, str], workers: list[str]) -> int:
    """The greedy lower bound of the module docstring, on the state right after an event."""
    b = balance(loads, assignment, workers, SETTINGS.threshold)
    held: dict[str, list[str]] = {w: [] for w in workers}
    for s, w in assignment.items():
        if w in held:
            held[w].append(s)
    wl = {w: math.fsum(loads[s] for s in held[w]) for w in workers}
    hot_workers = {w for w in workers if any(s in b.hot for s in held[w])}
    under = [w for w in workers if w not in hot_workers and wl[w] < b.low]
    under_room = max((b.high - wl[w] for w in under), default=0.0)  # the most an underloaded worker can take
    deficit = math.fsum(b.low - wl[w] for w in under)
    deepest = sorted((b.low - wl[w] for w in under), reverse=True)  # the deficits a hot shard could take away
    fewest_held = min((len(held[w]) for w in workers if w not in hot_workers), default=0)
    over = 0
    spare: list[float] = []  # per source: the most it can give and end in the band
    offered: list[float] = []  # single shards that fit their source's spare and an underloaded worker
    for w in workers:
        if w in hot_workers:
            # a crowded hot shard: either its company leaves, or it leaves itself for another worker whose
            # shards then all leave, and its company stays. The bound takes the cheaper count, and both the
            # company as an offer and (if an underloaded worker could take the hot shard) the deficit that
            # worker then no longer has, less the one its old worker gets
            company = [loads[s] for s in held[w] if s not in b.hot]
            if company:
                over += min(len(company), 1 + fewest_held)
                if deepest:
                    deficit -= max(0.0, deepest.pop(0) - max(0.0, b.low - math.fsum(company)))
                spare.append(math.fsum(company))
                offered += [x for x in company if x <= under_room]
            continue
        if wl[w] > b.high:
            over += fewest([loads[s] for s in held[w]], wl[w] - b.high) or 0
        if wl[w] >= b.low:
            spare.append(wl[w] - b.low)
            offered += [loads[s] for s in held[w] if loads[s] <= min(wl[w] - b.low, under_room)]
    sources = fewest(spare, deficit) or 0
    shards = fewest(offered, deficit) or 0
    return max(over, len(under), sources, shards)


def held_by(assignment: dict[str, str], worker: str) -> int:
    return sum(1 for w in assignment.values() if w == worker)


def run(n_shards: int, n_workers: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    loads = zipf_loads(n_shards, rng)
    workers = [f"w-{i:03d}" for i in range(n_workers)]
    pool = Pool(list(workers), dict(loads))
    rows: list[dict] = []
    joined = 0

    def row(
        name: str,
        minimum: int,
        moves: int,
        slowest: float,
        plans: int,
        ch_before: dict[str, str] | None,
        ch_minimum: int | None = None,
    ) -> None:
        started = time.thread_time()
        ch = consistent_hash_assignment(pool.workers, pool.loads)
        ch_time = time.thread_time() - started
        ch_moves = n_shards if ch_before is None else sum(1 for s in ch if ch_before.get(s) != ch[s])
        rows.append(
            {
                "workers": n_workers,
                "scenario": name,
                "pool": len(pool.workers),
                "minimum": minimum,
                "moves": moves,
                "plans": plans,
                "time": slowest,
                "fig": figures(pool.loads, pool.assignment, pool.workers),
                "ch_moves": ch_moves,
                "ch_minimum": minimum if ch_minimum is None else ch_minimum,
                "ch_time": ch_time,
                "ch_fig": figures(pool.loads, ch, pool.workers),
                "ch": ch,
            }
        )

    # initial
    moves, slowest, plans = pool.converge()
    row("initial", n_shards, moves, slowest, plans, None)

    def event(name: str, change, minimum_of=None) -> None:
        ch_before = rows[-1]["ch"]
        pool.rest()
        dead = change()
        if minimum_of is not None:
            minimum = minimum_of
        else:
            minimum = min_moves(pool.loads, pool.assignment, pool.workers)
        ch_min = None if dead is None else held_by(ch_before, dead)
        if dead is not None:
            minimum = held_by(pool.assignment, dead)
            if name == "crash (hot)":  # its hot shard must be alone: some worker's shards must all leave
                minimum += min(
                    held_by(pool.assignment, w)
                    for w in pool.workers
                    if not any(pool.assignment[s] == w for s in hot_shards())
                )
        moves, slowest, plans = pool.converge()
        row(name, minimum, moves, slowest, plans, ch_before, ch_min)

    def hot_shards() -> frozenset[str]:
        return balance(pool.loads, pool.assignment, pool.workers, SETTINGS.threshold).hot

    def join(k: int):
        def change() -> None:
            nonlocal joined
            for _ in range(k):
                pool.workers.append(f"new-{joined:03d}")
                joined += 1

        return change

    def crash(hot: bool):
        def change() -> str:
            b = balance(pool.loads, pool.assignment, pool.workers, SETTINGS.threshold)
            if hot:
                victim = pool.assignment[max(pool.loads, key=lambda s: (pool.loads[s], s))]
            else:
                counts = {w: held_by(pool.assignment, w) for w in pool.workers}
                hot_workers = {pool.assignment[s] for s in b.hot}
                victim = max((w for w in pool.workers if w not in hot_workers), key=lambda w: (counts[w], w))
            pool.workers.remove(victim)
            return victim

        return change

    def shift() -> None:
        for s in rng.sample(sorted(pool.loads), k=max(1, n_shards // 20)):
            pool.loads[s] = 100_000.0 / rng.randint(1, n_shards)

    event("join 1", join(1))
    event("crash", crash(hot=False))
    event("crash (hot)", crash(hot=True))
    event("join 10%", join(max(1, math.ceil(n_workers / 10))))
    event("load shift 5%", shift)
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| workers | scenario | minimum moves | **moves** (÷ min) | plans | max/mean (floor) | **sharing max/L** "
        "| hot alone | plan time | CH moves (÷ min) | CH max/mean | CH sharing max/L | CH hot alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, c = r["fig"], r["ch_fig"]
        ratio = r["moves"] / r["minimum"] if r["minimum"] else math.inf
        ch_ratio = r["ch_moves"] / r["ch_minimum"] if r["ch_minimum"] else math.inf
        out.append(
            f"| {r['workers']} → {r['pool']} | {r['scenario']} | {r['minimum']} | **{r['moves']}** ({ratio:.2f}x) "
            f"| {r['plans']} | {f['max_mean']:.2f} ({f['floor']:.2f}) | **{f['sharing']:.3f}** "
            f"| {f['alone']}/{f['hot']} | {r['time'] * 1000:.0f} ms "
            f"| {r['ch_moves']} ({ch_ratio:.2f}x) | {c['max_mean']:.2f} | {c['sharing']:.3f} "
            f"| {c['alone']}/{c['hot']} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=4096)
    ap.add_argument("--workers", default="64,256", help="pool sizes, comma-separated")
    ap.add_argument("--seed", type=int, default=24)
    args = ap.parse_args()
    started = time.perf_counter()
    rows: list[dict] = []
    for n in (int(x) for x in args.workers.split(",")):
        rows += run(args.shards, n, args.seed)
    print(table(rows))
    print(
        f"\nconsistent hashing: computing an assignment took at most "
        f"{max(r['ch_time'] for r in rows) * 1000:.0f} ms CPU"
    )
    print(
        f"\n{args.shards} shards, Zipf(1.0), seed {args.seed}; threshold {SETTINGS.threshold}, persist "
        f"{SETTINGS.persist_s:g} s, cooldown {SETTINGS.cooldown_s:g} s, a plan every {TICK_S:g} s; "
        f"whole run {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
