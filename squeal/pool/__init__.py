"""The elastic squeal worker pool (issue 24): a region's shards divided among its workers through ZooKeeper.

A region with `[[regions.R.squeal_instances]]` runs them as the *workers* of its pool
(`squeal run --instance NAME`). Each (region, shard) has exactly one owner among them; one elected
controller decides who owns what with the load-aware policy (`squeal.pool.placement.plan`); a worker runs one
pipeline per shard it owns (a `RegionDaemon` whose shards come and go at run time). Znodes, under
`<root>/regions/<region>/pool/`:

    workers/<name>        ephemeral, JSON {"name", "pid", "region", "shards", "loads", "load", "since"}: the pool's
                          members (alive while their session is) and what each measures: per owned shard
                          {"rows_s", "bytes_s", "load"}, smoothed (`placement.smooth`, 60 s half-life)
    controller/           kazoo's `Election` recipe: the one worker that plans
    assignment            persistent, JSON {"assignment": {shard: worker}, "last_moved": {shard: t}, "moves", "by",
                          "at"}: the plan, written by the controller with compare-and-set (its znode version)
    drain/<name>          persistent: an operator's `squealctl drain NAME`: the controller moves its shards away
    move/<shard>          persistent, JSON {"to"}: an operator's `squealctl move SHARD --to NAME`
    shards/<shard>/owner  ephemeral, JSON {"worker", "epoch", "since"}: who owns the shard now
    shards/<shard>/epoch  persistent, JSON {"epoch", "owner"[, "released"]}: bumped (version + 1) in the multi-
                          operation that creates `owner`, so its version is the owner's fencing token; an owner that
                          hands the shard on marks it "released" in the multi-operation that deletes `owner`
    shards/<shard>/markers  every destination's GTID for the shard (`zkstore.ShardMarkerStore`)

**Ownership and fencing** (the region election's argument, per shard). A worker takes a shard only when the
assignment names it and nobody owns the shard: creating `owner` (ephemeral: it dies with the session) and
bumping `epoch` are one multi-operation. The worker acts for the shard only within its *lease* (`SessionLease`:
each round trip to ZooKeeper proves the session alive until its send time + T, the session timeout; the lease
runs to send time + 0.6 T): the shard's flows hand the batcher a batch only while `may_send(shard)` holds at
that instant, and every marker write checks the shard's epoch version. A shard changes hands only after its
`owner` znode is gone: released by its owner once it has stopped (a planned move), or expired with its
owner's session (a crash, a partition), which ZooKeeper does no earlier than T after it last heard from that
session, i.e. after the old owner's lease ran out. So the old owner has stopped sending before the new one
starts, and its late marker writes fail (the epoch moved).

**A planned move** (rebalance, drain, `squealctl move`): the controller writes the new assignment; the old
owner stops reading the shard, waits (bounded) for its in-flight deletes to be acknowledged, writes the
shard's markers and releases `owner`; the new owner, watching `owner`, takes it, reads the markers and starts
from them. Its pipeline's database checks were done ahead (`RegionDaemon.warm`, while the old owner handed on;
in a region of at most `WARM_ALL_UP_TO` shards, for every shard, for a takeover too): only what needs ownership
is in the shard's pause. At least once: whatever was not acknowledged is after the markers and is sent again.

**A crash**: the dead worker's `workers/<name>` and `owner` znodes expire with its session; the controller
sees the shards orphaned and places them at once; their new owners start from the markers.

Load: each owner measures rows/s (`squeal_rows_total`) and binlog bytes/s (`BinlogMeter`) per shard, smooths
both (`[regions.R.squeal_placement] half_life_s`) and publishes them with their combination (`placement.shard_load`,
`bytes_per_row`); the controller plans with the region's `squeal_placement` settings.

The session lease, start-up and the rejoin after a loss are squeal/pool/owner.py.
A shard that has no markers znode yet starts from the HA layout's markers of the same shard (an HA region turned
into a pool). Which copy of a shard a worker reads: `squeal.shard.copies.read_order` (the copy it names, else an
extra copy on its host, else the region's own copy; the region's copy is every reader's fallback); without [shards], its
instance's own copy (`own_copy_topology`), whose health it publishes (`healthy` in its member znode: a worker whose
copy does not answer is given nothing and its shard moves). Preference: the instance's rank in `squeal_instances`
breaks ties, and a shard alone on its worker is handed back to an empty better-ranked worker once that one has been
healthy for `handback_after_s` (`placement.HANDBACK`): HA mode's "two instances, one leader" as "one shard, two
workers" (the region-level election it replaces is gone: docs/squeal.md, "HA mode on the pool: inventory"). Not yet:
no shard is placed on a worker for the copy it would read.

The package, one idea per module (and the thread each runs on):

    worker.py        `PoolWorker`, a service the process shell runs: a member's life - join, the step that takes and
                     gives up shards, publish its loads, leave (its own "pool-worker" thread; start and stop on the
                     reactor)
    handover.py      starting a taken shard's pipeline and handing a moved one on (the reactor; blocking ZooKeeper
                     calls in its thread pool)
    ownership.py     `Ownership`: the per-shard owner/epoch multi-operations and the fencing token (the caller's)
    controller.py    `Controller`: the elected planner that writes the assignment (its own "pool-controller" thread)
    shard_loads.py   `ShardLoads`: each owned shard's smoothed rows/s and binlog bytes/s (the worker's thread)
    binlog_meter.py  `BinlogMeter`: each owned shard's binlog growth (its own "pool-binlog-meter" thread)
    copy_health.py   `watch_copy_health`: whether a worker's own copy answers (its own "pool-health" thread)
    metrics.py       `PoolMetrics`: the worker's and the controller's `squeal_pool_*` series
    znodes.py        reading the pool's JSON znode documents
    zookeeper.py     squeal's ZooKeeper: client options (TLS, ACL), `UNAVAILABLE`, the znode paths, `Watched`
    squealctl.py     what `squealctl workers/drain/move` read and ask (the caller's thread: a CLI)
    placement.py     the load-aware placement policy as pure data (`plan`, `shard_load`, `read_order`): no I/O
    owner.py         a fenced owner's session lease, its start-up and its rejoin after a loss (worker's thread)
"""
