//! A model of squeal's invalidation protocol, checked by Stateright (docs/model.md).
//!
//! The protocol, not the code: one cached key, a master database and a replica in a second
//! region, a writer, a web-tier reader per region (miss -> DB read -> lease-guarded fill),
//! squeal delivering the binlog's deletes at least once (replay from a datamarker, two workers
//! taking turns at one shard, fenced by the shard's epoch), memcached with leases and stale
//! marks (`mg N` -> W/Z, `ms C<cas>`, `md`, `md I`), a router that fails over to a gutter pool
//! (short TTL, deletes spooled for the main pool), and remote markers for the writer in the
//! second region. Every part is a field of one state; every step one atomic action of one part.
//! Switches in [`Config`] turn mechanisms off so the checker can show what each one prevents.

use stateright::{Checker, Model, Property};

/// What squeal sends for each binlog event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invalidation {
    /// `md k`: the item is gone.
    Delete,
    /// `md k I`: the item is marked stale, its CAS bumped (a stale value may be served meanwhile).
    StaleMark,
}

/// The model's bounds and its switches (each `true` is squeal's design).
#[derive(Clone, Debug)]
pub struct Config {
    /// Commits the writer makes (each one is a GTID, the key's new value).
    pub writes: u8,
    /// Reads each reader makes (a miss fills; a lost lease retries).
    pub reads: u8,
    /// The master region's reader and squeal (with its worker hand-over).
    pub region1: bool,
    /// The second region: its replica, its squeal, its reader, remote markers.
    pub region2: bool,
    /// Ownership hand-overs in region 1 (a new epoch each, the old owner possibly still alive); at most 3.
    pub takeovers: u8,
    /// Times the region-1 main pool may go down (reads, fills and deletes fail over to gutter).
    pub failovers: u8,
    /// Leases: `mg N` hands out a CAS, fills are `ms C<cas>`; off: plain get/miss/set.
    pub leases: bool,
    /// Epoch fencing: a worker sends and writes markers only with the current epoch.
    pub fencing: bool,
    /// Remote markers: the second-region writer sets `rmk:k`, its reader reads the master while it lives.
    pub remote_markers: bool,
    /// The router spools deletes for a main pool that is down (else it answers an error and squeal retries).
    pub spool: bool,
    pub invalidation: Invalidation,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            writes: 2,
            reads: 2,
            region1: true,
            region2: false,
            takeovers: 1,
            failovers: 1,
            leases: true,
            fencing: true,
            remote_markers: true,
            spool: true,
            invalidation: Invalidation::Delete,
        }
    }
}

/// One memcached item of the key. `val: None` is a lease placeholder (0 bytes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub val: Option<u8>,
    pub cas: u8,
    /// `md I` marked it; it is no longer served as fresh.
    pub stale: bool,
    /// A W (the right to fill) was handed out for this item and not yet used.
    pub lease_out: bool,
}

/// One memcached pool holding the key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cache {
    pub item: Option<Entry>,
    /// The highest GTID whose squeal delete this pool has applied (a ghost: for the stale-set property).
    pub invalidated: u8,
}

/// The answer to `mg k v c N<ttl>` (or a plain `get` without leases).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lookup {
    Hit(u8),
    /// Won the lease (`W`), with the CAS to fill with; `None`: a plain miss, leases off.
    Win(Option<u8>),
    /// Lost (`Z`): somebody else fills; read again later.
    Lose,
}

/// Which pool a request went to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool {
    Main1,
    Gutter1,
    Cluster2,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReaderStep {
    Idle,
    /// Missed and won the right to fill (token: the lease's CAS, None without leases).
    Won {
        pool: Pool,
        token: Option<u8>,
    },
    /// Read the database; about to fill.
    Loaded {
        pool: Pool,
        token: Option<u8>,
        val: u8,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reader {
    pub step: ReaderStep,
    pub done: u8,
    /// Ghost: the writer's last completed write when this read began (read-your-writes).
    pub floor: u8,
}

/// The second-region writer: `ms rmk:k` -> commit on the master -> `md k` on its own cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriterStep {
    Idle,
    Marked,
    Committed,
}

/// A squeal worker of the region-1 shard. It believes it owns the shard under `token`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Worker {
    pub token: Option<u8>,
    /// Next GTID to send.
    pub next: u8,
    /// Every GTID up to this one is acknowledged (deletes go out in order on one connection).
    pub acked: u8,
    /// Deletes sent, not yet answered, in order.
    pub in_flight: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The master's value of the key = its last GTID (the binlog is 1..=db).
    pub db: u8,
    /// The second region's replica has applied GTIDs 1..=replica.
    pub replica: u8,
    pub writer: WriterStep,
    /// Ghost: the writer's last completed write (marker, commit, local delete).
    pub written: u8,
    pub main1: Cache,
    pub gutter1: Cache,
    pub cluster2: Cache,
    /// `rmk:k` in the second region's regional pool.
    pub rmk: bool,
    pub main1_up: bool,
    pub failovers: u8,
    /// The router holds a spooled delete for the main pool.
    pub spooled: bool,
    pub next_cas: u8,
    pub reader1: Reader,
    pub reader2: Reader,
    pub workers: [Worker; 2],
    /// The shard's epoch (its owner's fencing token) and the worker it was given to.
    pub epoch: u8,
    pub owner: usize,
    pub takeovers: u8,
    /// The shard's datamarker (GTID acknowledged for the region-1 destination).
    pub marker: u8,
    /// Ghost: a marker write that went backwards happened.
    pub marker_regressed: bool,
    /// Ghost: per epoch, a bit per worker that sent a delete while it was the current epoch.
    pub senders: [u8; 4],
    /// Ghost: a fill stored a value older than an invalidation its pool had already applied.
    pub stale_fill: Option<Pool>,
    /// Ghost: a second-region read returned a value older than the writer's completed write.
    pub ryw_violated: bool,
    /// Region 2's squeal (one worker): GTIDs delivered to its cluster.
    pub squeal2: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    WriterMark,
    WriterCommit,
    WriterLocalDelete,
    Replicate,
    ReaderGet(u8),
    ReaderLoad(u8),
    ReaderFill(u8),
    SquealSend(usize),
    SquealDeliver(usize),
    SquealCheckpoint(usize),
    Takeover(usize),
    MainDown,
    MainUp,
    SpoolReplay,
    GutterExpire,
    Squeal2Deliver,
}

/// The model: a [`Config`] checked by Stateright.
pub struct Protocol {
    pub cfg: Config,
}

impl Protocol {
    pub fn new(cfg: Config) -> Self {
        // `State::senders` has a slot per epoch: the first owner's and up to three takeovers'.
        assert!(
            cfg.takeovers <= 3,
            "Config.takeovers: at most 3, got {}",
            cfg.takeovers
        );
        Protocol { cfg }
    }

    fn mg(&self, s: &mut State, pool: Pool) -> Lookup {
        let leases = self.cfg.leases;
        let cas = s.next_cas;
        let cache = cache_mut(s, pool);
        let out = match &mut cache.item {
            None if leases => {
                cache.item = Some(Entry {
                    val: None,
                    cas,
                    stale: false,
                    lease_out: true,
                });
                Lookup::Win(Some(cas))
            }
            None => Lookup::Win(None),
            Some(e) if !e.stale && e.val.is_some() => Lookup::Hit(e.val.unwrap_or_default()),
            // Leases off: a stale mark is only a miss (nothing hands out a token).
            Some(_) if !leases => Lookup::Win(None),
            // `X W`: the first reader of a stale (or invalidated placeholder) item wins, with its CAS.
            Some(e) if e.stale && !e.lease_out => {
                e.lease_out = true;
                return Lookup::Win(Some(e.cas));
            }
            Some(_) => Lookup::Lose,
        };
        if matches!(out, Lookup::Win(Some(_))) {
            s.next_cas += 1;
        }
        out
    }

    /// `ms k C<cas>` (or a plain `set` without a token). Returns whether it stored.
    fn fill(&self, s: &mut State, pool: Pool, token: Option<u8>, val: u8) -> bool {
        let cas = s.next_cas;
        let cache = cache_mut(s, pool);
        let ok = match (token, &cache.item) {
            (None, _) => true,
            (Some(t), Some(e)) => e.cas == t,
            (Some(_), None) => false, // NF: deleted meanwhile
        };
        if ok {
            cache.item = Some(Entry {
                val: Some(val),
                cas,
                stale: false,
                lease_out: false,
            });
            let stale = val < cache.invalidated;
            s.next_cas += 1;
            if stale && s.stale_fill.is_none() {
                s.stale_fill = Some(pool);
            }
        }
        ok
    }

    /// squeal's delete for GTID `gtid` applied at `pool`.
    fn invalidate(&self, s: &mut State, pool: Pool, gtid: u8) {
        let stale_mark = self.cfg.leases && self.cfg.invalidation == Invalidation::StaleMark;
        let cas = s.next_cas;
        let cache = cache_mut(s, pool);
        cache.invalidated = cache.invalidated.max(gtid);
        if stale_mark {
            if let Some(e) = &mut cache.item {
                e.stale = true;
                e.cas = cas;
                e.lease_out = false;
                s.next_cas += 1;
            }
        } else {
            cache.item = None;
        }
    }

    fn reader(s: &State, r: u8) -> &Reader {
        if r == 1 {
            &s.reader1
        } else {
            &s.reader2
        }
    }

    fn reader_mut(s: &mut State, r: u8) -> &mut Reader {
        if r == 1 {
            &mut s.reader1
        } else {
            &mut s.reader2
        }
    }

    /// Where the region-1 router sends a read or a fill now.
    fn pool_for(s: &State, r: u8) -> Pool {
        match (r, s.main1_up) {
            (1, true) => Pool::Main1,
            (1, false) => Pool::Gutter1,
            _ => Pool::Cluster2,
        }
    }

    fn finish_read(s: &mut State, r: u8, val: u8) {
        let rd = Self::reader_mut(s, r);
        if r == 2 && val < rd.floor {
            s.ryw_violated = true;
        }
        let rd = Self::reader_mut(s, r);
        rd.done += 1;
        rd.step = ReaderStep::Idle;
    }

    /// Nothing in flight and nobody with work left (readers may still start new reads):
    /// the state the eventual-consistency property is checked in.
    pub fn quiescent(&self, s: &State) -> bool {
        let readers_idle = |r: &Reader| r.step == ReaderStep::Idle;
        let region1 = !self.cfg.region1
            || (readers_idle(&s.reader1)
                && s.workers.iter().all(|w| w.in_flight.is_empty())
                && s.workers[s.owner].acked == s.db
                && s.main1_up
                && !s.spooled
                && s.gutter1.item.is_none());
        let region2 = !self.cfg.region2
            || (readers_idle(&s.reader2) && s.replica == s.db && s.squeal2 == s.db);
        s.writer == WriterStep::Idle && region1 && region2
    }

    /// Every value a reader could be served equals the database.
    pub fn consistent(&self, s: &State) -> bool {
        let fresh_ok = |c: &Cache| match &c.item {
            Some(Entry {
                val: Some(v),
                stale: false,
                ..
            }) => *v == s.db,
            _ => true,
        };
        fresh_ok(&s.main1) && fresh_ok(&s.gutter1) && fresh_ok(&s.cluster2)
    }
}

fn cache_mut(s: &mut State, pool: Pool) -> &mut Cache {
    match pool {
        Pool::Main1 => &mut s.main1,
        Pool::Gutter1 => &mut s.gutter1,
        Pool::Cluster2 => &mut s.cluster2,
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let reader = Reader {
            step: ReaderStep::Idle,
            done: 0,
            floor: 0,
        };
        let worker = |token| Worker {
            token,
            next: 1,
            acked: 0,
            in_flight: Vec::new(),
        };
        vec![State {
            db: 0,
            replica: 0,
            writer: WriterStep::Idle,
            written: 0,
            main1: Cache::default(),
            gutter1: Cache::default(),
            cluster2: Cache::default(),
            rmk: false,
            main1_up: true,
            failovers: 0,
            spooled: false,
            next_cas: 1,
            reader1: reader.clone(),
            reader2: reader,
            workers: [worker(Some(0)), worker(None)],
            epoch: 0,
            owner: 0,
            takeovers: 0,
            marker: 0,
            marker_regressed: false,
            senders: [0; 4],
            stale_fill: None,
            ryw_violated: false,
            squeal2: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let c = &self.cfg;
        match s.writer {
            WriterStep::Idle if s.db < c.writes => actions.push(if c.region2 && c.remote_markers {
                Action::WriterMark
            } else {
                Action::WriterCommit
            }),
            WriterStep::Marked => actions.push(Action::WriterCommit),
            WriterStep::Committed => actions.push(Action::WriterLocalDelete),
            _ => {}
        }
        let mut readers = Vec::new();
        if c.region1 {
            readers.push(1);
        }
        if c.region2 {
            readers.push(2);
        }
        for r in readers {
            let rd = Self::reader(s, r);
            match rd.step {
                ReaderStep::Idle if rd.done < c.reads => actions.push(Action::ReaderGet(r)),
                ReaderStep::Won { .. } => actions.push(Action::ReaderLoad(r)),
                ReaderStep::Loaded { .. } => actions.push(Action::ReaderFill(r)),
                _ => {}
            }
        }
        if c.region1 {
            for (i, w) in s.workers.iter().enumerate() {
                if let Some(t) = w.token {
                    let current = t == s.epoch;
                    // One delete in flight per worker keeps the state space small; order is what matters.
                    if w.next <= s.db && w.in_flight.is_empty() && (current || !c.fencing) {
                        actions.push(Action::SquealSend(i));
                    }
                    if w.acked != s.marker && (current || !c.fencing) {
                        actions.push(Action::SquealCheckpoint(i));
                    }
                }
                if !w.in_flight.is_empty() {
                    actions.push(Action::SquealDeliver(i));
                }
                if i != s.owner && s.takeovers < c.takeovers {
                    actions.push(Action::Takeover(i));
                }
            }
            if s.main1_up && s.failovers < c.failovers {
                actions.push(Action::MainDown);
            }
            if !s.main1_up {
                actions.push(Action::MainUp);
            }
            if s.main1_up && s.spooled {
                actions.push(Action::SpoolReplay);
            }
            if s.gutter1.item.is_some() {
                actions.push(Action::GutterExpire);
            }
        }
        if c.region2 {
            if s.replica < s.db {
                actions.push(Action::Replicate);
            }
            if s.squeal2 < s.replica {
                actions.push(Action::Squeal2Deliver);
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::WriterMark => {
                s.rmk = true;
                s.writer = WriterStep::Marked;
            }
            Action::WriterCommit => {
                s.db += 1;
                s.writer = if self.cfg.region2 {
                    WriterStep::Committed
                } else {
                    WriterStep::Idle
                };
                if !self.cfg.region2 {
                    s.written = s.db;
                }
            }
            Action::WriterLocalDelete => {
                // The writer's own `md k` on its cluster: not squeal's, so no ghost GTID.
                s.cluster2.item = None;
                s.writer = WriterStep::Idle;
                s.written = s.db;
            }
            Action::Replicate => s.replica += 1,
            Action::ReaderGet(r) => {
                let pool = Self::pool_for(&s, r);
                let written = s.written;
                Self::reader_mut(&mut s, r).floor = written;
                match self.mg(&mut s, pool) {
                    Lookup::Hit(v) => Self::finish_read(&mut s, r, v),
                    Lookup::Win(token) => {
                        Self::reader_mut(&mut s, r).step = ReaderStep::Won { pool, token }
                    }
                    Lookup::Lose => {} // read again later (a self-loop)
                }
            }
            Action::ReaderLoad(r) => {
                let ReaderStep::Won { pool, token } = Self::reader(&s, r).step.clone() else {
                    return None;
                };
                // Region 2 reads its replica unless the writer's remote marker says the master.
                let val = if r == 2 && !(self.cfg.remote_markers && s.rmk) {
                    s.replica
                } else {
                    s.db
                };
                Self::reader_mut(&mut s, r).step = ReaderStep::Loaded { pool, token, val };
            }
            Action::ReaderFill(r) => {
                let ReaderStep::Loaded { token, val, .. } = Self::reader(&s, r).step.clone() else {
                    return None;
                };
                // The router decides now where the fill goes (the main pool may have failed meanwhile).
                let pool = Self::pool_for(&s, r);
                self.fill(&mut s, pool, token, val);
                Self::finish_read(&mut s, r, val);
            }
            Action::SquealSend(i) => {
                let w = &mut s.workers[i];
                w.in_flight.push(w.next);
                w.next += 1;
                s.senders[usize::from(s.epoch)] |= 1 << i;
            }
            Action::SquealDeliver(i) => {
                let gtid = s.workers[i].in_flight[0];
                if s.main1_up {
                    self.invalidate(&mut s, Pool::Main1, gtid);
                } else {
                    // FailoverWithExptimeRoute: the delete also goes to gutter; acknowledged only if spooled.
                    self.invalidate(&mut s, Pool::Gutter1, gtid);
                    if self.cfg.spool {
                        s.spooled = true;
                    } else {
                        // An error: squeal sends it again (from the first unacknowledged GTID).
                        let w = &mut s.workers[i];
                        w.in_flight.clear();
                        w.next = w.acked + 1;
                        return Some(s);
                    }
                }
                let w = &mut s.workers[i];
                w.in_flight.remove(0);
                w.acked = gtid;
            }
            Action::SquealCheckpoint(i) => {
                let acked = s.workers[i].acked;
                if acked < s.marker {
                    s.marker_regressed = true;
                }
                s.marker = acked;
            }
            Action::Takeover(i) => {
                // The new owner bumps the epoch and starts from the shard's marker (replaying what
                // the old owner sent after it: at least once). The old owner may not know yet.
                s.epoch += 1;
                s.takeovers += 1;
                s.owner = i;
                let marker = s.marker;
                let w = &mut s.workers[i];
                w.token = Some(s.epoch);
                w.next = marker + 1;
                w.acked = marker;
            }
            Action::MainDown => {
                s.main1_up = false;
                s.failovers += 1;
            }
            Action::MainUp => s.main1_up = true,
            Action::SpoolReplay => {
                // The spool holds the latest GTID delivered to gutter; replaying it deletes the main copy.
                let gtid = s.gutter1.invalidated;
                self.invalidate(&mut s, Pool::Main1, gtid);
                s.spooled = false;
            }
            Action::GutterExpire => s.gutter1.item = None,
            Action::Squeal2Deliver => {
                s.squeal2 += 1;
                let gtid = s.squeal2;
                self.invalidate(&mut s, Pool::Cluster2, gtid);
                // The commit's `/* mcd:k,rmk:k */`: the marker goes once the replica has the write.
                s.rmk = false;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "quiescent states are consistent",
                |m: &Protocol, s: &State| !m.quiescent(s) || m.consistent(s),
            ),
            Property::always("no stale fill after an invalidation", |_, s: &State| {
                s.stale_fill.is_none()
            }),
            Property::always("markers never move backwards", |_, s: &State| {
                !s.marker_regressed
            }),
            Property::always("one sender per epoch", |_, s: &State| {
                s.senders.iter().all(|b| b.count_ones() <= 1)
            }),
            Property::always("read your writes in region 2", |_, s: &State| {
                !s.ryw_violated
            }),
            Property::sometimes("quiescent after every write", |m: &Protocol, s: &State| {
                s.db == m.cfg.writes && m.quiescent(s)
            }),
        ]
    }
}

/// Checks `cfg` exhaustively (breadth first, one thread: fast enough at these bounds).
pub fn check(cfg: Config) -> impl Checker<Protocol> {
    Protocol::new(cfg).checker().spawn_bfs().join()
}
