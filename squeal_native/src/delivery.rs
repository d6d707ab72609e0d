//! The delivery thread (issue 33, stage 2): every destination's flows and its connection driven by one Rust
//! thread, so the reactor pays no per-batch write, read, timer or acknowledgement, and the GIL is never taken.
//!
//! It does what `squeal.delivery.batcher.Sender` does on the reactor, with the same rules:
//! * A destination (a cluster's routers, or the regional pool's) has one connection, shared by the flows of
//!   every shard of the process (`add_flow`): their batches share writes, each flow's acknowledged in its order.
//! * When to send: at once when `batch_size` lines wait, else `flush_interval` after the first. While batches
//!   are in flight only full ones join them, up to `max_in_flight` per flow.
//! * Replies: `MN` closes the oldest batch in flight; `NF` / `HD` are fine; `OK` counts a flush done;
//!   `SERVER_ERROR …` fails the connection (the batch is sent again); other lines are logged, not retried.
//!   A batch with a flush not answered `OK` is never acknowledged.
//! * Failures (connect, TLS, no `MN` within `reply_timeout`, lost): every batch in flight goes back to its flow,
//!   the next router of the set is tried after a capped exponential back-off.
//! * A shard's gate (`set_window`): a pool worker sends only while its lease says so. The window is an
//!   `Instant`, so a process resumed from SIGSTOP after its lease ended finds the window shut before it sends.
//!
//! Python (`squeal.delivery.native`) keeps the control plane: it offers transactions, reads the acknowledged
//! positions for the datamarkers, starts catch-up readers, and takes the counters, histograms, log lines and
//! sampled deletes gathered here.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, ErrorKind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::{Events, Poll, Registry, Token, Waker};

use crate::conn::Tls;
use crate::flow::{Batch, Committed, Flow, Gtid, Offered, Position};
use crate::link::{Link, Reply};

const WAKER: Token = Token(usize::MAX);
// Log lines and samples held between two takes by Python (every 0.2 s): a bound on what a failing loop can pile up.
// Samples past it are lost (they are a sample); log lines past it are counted and reported.
const LOG_LINES: usize = 10_000;
const SAMPLES: usize = 10_000;

#[derive(Debug, Clone)]
pub struct Settings {
    pub batch_size: usize,
    pub flush_interval: Duration,
    pub reply_timeout: Duration,
    pub max_in_flight: usize,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub latency_buckets: Vec<f64>,
    pub batch_buckets: Vec<f64>,
    /// Sample one acknowledged plain key in this many (`squeal.delivery.sampler`); 0: none.
    pub sample_every: u64,
}

/// Counts per bucket (not cumulative; the last is +Inf) and the sum, since they were last taken.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub sum: f64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], value: f64, times: u64) {
        if self.counts.len() != bounds.len() + 1 {
            self.counts = vec![0; bounds.len() + 1];
        }
        let i = bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(bounds.len());
        self.counts[i] += times;
        self.sum += value * times as f64;
    }
}

/// A flow's counters since they were last taken (`take_stats`).
#[derive(Debug, Clone, Default)]
pub struct FlowStats {
    pub deletes: u64,
    pub flushes: u64,
    pub reply_errors: BTreeMap<String, u64>,
    pub latency: Histogram,
    pub delivery: Histogram,
}

impl FlowStats {
    /// Nothing counted (an idle flow's: not handed to Python at all).
    pub fn is_empty(&self) -> bool {
        self.deletes == 0
            && self.flushes == 0
            && self.reply_errors.is_empty()
            && self.latency.counts.is_empty()
            && self.delivery.counts.is_empty()
    }
}

/// A destination's counters since they were last taken.
#[derive(Debug, Clone, Default)]
pub struct DestStats {
    pub writes: u64,
    pub per_write: Histogram,
    pub retries: u64,
}

/// Every flow's counters (by id) and every destination's (by name), taken together.
pub type Stats = (Vec<(usize, FlowStats)>, Vec<(String, DestStats)>);

/// A sampled acknowledged delete: (destination, key, acknowledged at, unix seconds).
pub type Sample = (String, String, f64);

struct FlowSlot {
    flow: Flow,
    dest: usize,
    regional: bool,
    shard: String,
    dirty: bool,
    last_acked_commit_ts: Option<f64>,
    stats: FlowStats,
}

struct Dest {
    name: String,
    routers: Vec<(String, u16)>,
    router: usize,
    flows: Vec<usize>,
    next: usize, // the flow asked first at the next send (round robin across shards)
    conn: Option<Link>,
    // (flow, batch) in flight on `conn`, oldest first; the flow is None once it left (`remove_flow`): its
    // batches still take their `MN` so the later ones line up.
    in_flight: VecDeque<(Option<usize>, Batch)>,
    linger: Option<Instant>,
    deadline: Option<Instant>, // connect or reply timeout
    waiting: Option<Instant>,  // backing off until then
    backoff: Duration,
    stats: DestStats,
    connections: u64, // tokens: (index << 20) | connection count, so a stale event finds no connection
}

struct Inner {
    settings: Settings,
    tls: Option<Tls>,
    flows: Vec<Option<FlowSlot>>,
    dests: Vec<Dest>,
    windows: BTreeMap<String, Option<Instant>>, // shard -> may send until (None: shut); absent: no gate
    log: Vec<(u8, String)>, // (level: 30 warning, 40 error, 20 info, logging's), message
    log_dropped: u64, // lines past LOG_LINES since the last take (counted, said in a line of their own)
    samples: Vec<Sample>,
    until_sample: u64,
    stopping: bool,
    // The thread was woken and has not looked yet: offers meanwhile need no wake-up of their own (it looks at
    // every destination once it has the lock). Set and cleared under the lock, so no offer is missed.
    wake_pending: bool,
    registry: Registry,
}

struct Shared {
    inner: Mutex<Inner>,
    room: Condvar, // notified at every acknowledgement: a catch-up reader's brake (`wait_room`)
    waker: Waker,
}

/// The delivery thread and what it shares with the callers.
pub struct Delivery {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What Python offers: one committed transaction (or run), the lines for clusters and for the regional pool.
pub struct Offer {
    pub cluster: Committed,
    pub regional: Committed,
}

fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn token(dest: usize, count: u64) -> Token {
    Token((dest << 20) | (count as usize & 0xF_FFFF))
}

impl Delivery {
    pub fn new(settings: Settings, tls: Option<Tls>) -> io::Result<Delivery> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let registry = poll.registry().try_clone()?;
        let until_sample = settings.sample_every;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                settings,
                tls,
                flows: Vec::new(),
                dests: Vec::new(),
                windows: BTreeMap::new(),
                log: Vec::new(),
                log_dropped: 0,
                samples: Vec::new(),
                until_sample,
                stopping: false,
                wake_pending: false,
                registry,
            }),
            room: Condvar::new(),
            waker,
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("squeal-delivery".into())
            .spawn(move || run(&for_thread, poll))?;
        Ok(Delivery {
            shared,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wake the thread unless a wake-up is pending already (`inner` is the locked state).
    fn wake(&self, inner: &mut Inner) {
        if !inner.wake_pending {
            inner.wake_pending = true;
            // (a failed wake-up only delays the send to the next timer or event)
            let _ = self.shared.waker.wake();
        }
    }

    /// A shard's flow to a destination (created with its first flow); its id.
    pub fn add_flow(
        &self,
        dest: &str,
        routers: Vec<(String, u16)>,
        regional: bool,
        shard: &str,
        start: Position,
        max_backlog: usize,
    ) -> Result<usize, String> {
        let mut inner = self.lock();
        let d = match inner.dests.iter().position(|d| d.name == dest) {
            Some(i) if inner.dests[i].routers != routers => {
                return Err(format!(
                    "flow {dest} ({routers:?}) is not for destination {dest} ({:?})",
                    inner.dests[i].routers
                ))
            }
            Some(i) => i,
            None => {
                let backoff = inner.settings.backoff_initial;
                inner.dests.push(Dest {
                    name: dest.to_string(),
                    routers,
                    router: 0,
                    flows: Vec::new(),
                    next: 0,
                    conn: None,
                    in_flight: VecDeque::new(),
                    linger: None,
                    deadline: None,
                    waiting: None,
                    backoff,
                    stats: DestStats::default(),
                    connections: 0,
                });
                inner.dests.len() - 1
            }
        };
        let id = inner.flows.len();
        inner.flows.push(Some(FlowSlot {
            flow: Flow::new(start, max_backlog),
            dest: d,
            regional,
            shard: shard.to_string(),
            dirty: false,
            last_acked_commit_ts: None,
            stats: FlowStats::default(),
        }));
        inner.dests[d].flows.push(id);
        Ok(id)
    }

    /// A shard's pipeline stopped: its flow leaves its destination (its batches in flight still take their `MN`).
    pub fn remove_flow(&self, id: usize) {
        let mut inner = self.lock();
        let Some(slot) = inner.flows.get_mut(id).and_then(Option::take) else {
            return;
        };
        let dest = &mut inner.dests[slot.dest];
        dest.flows.retain(|&f| f != id);
        for (flow, _) in dest.in_flight.iter_mut() {
            if *flow == Some(id) {
                *flow = None;
            }
        }
    }

    /// Offer a transaction to flows `ids` (live: the live stream's, else a catch-up reader's). Returns the ids
    /// of the flows it shed (Python starts their catch-up readers).
    pub fn offer(&self, ids: &[usize], offer: &Offer, live: bool) -> Vec<usize> {
        let mut shed = Vec::new();
        let mut queued = false;
        let mut inner = self.lock();
        {
            for &id in ids {
                let Some(slot) = inner.flows.get_mut(id).and_then(Option::as_mut) else {
                    continue;
                };
                let c = if slot.regional {
                    &offer.regional
                } else {
                    &offer.cluster
                };
                let outcome = if live {
                    slot.flow.offer_live(c)
                } else {
                    slot.flow.offer_catchup(c)
                };
                match outcome {
                    Offered::Shed => shed.push(id),
                    Offered::Done => slot.dirty = true,
                    Offered::Queued => queued = true,
                    Offered::Ignored => {}
                }
            }
        }
        if queued {
            self.wake(&mut inner);
        }
        shed
    }

    /// Run `f` on flow `id` (None if it left).
    pub fn with_flow<T>(&self, id: usize, f: impl FnOnce(&mut FlowView) -> T) -> Option<T> {
        let mut inner = self.lock();
        let slot = inner.flows.get_mut(id).and_then(Option::as_mut)?;
        let mut view = FlowView { slot };
        Some(f(&mut view))
    }

    /// Flow `id` was shed or rewound by Python: drop it, like an offer that passed the bound.
    pub fn shed(&self, id: usize, rewind: Option<Position>) {
        let mut inner = self.lock();
        if let Some(slot) = inner.flows.get_mut(id).and_then(Option::as_mut) {
            if let Some(position) = rewind {
                slot.flow.acked = position;
                slot.dirty = true;
            }
            slot.flow.shed();
        }
    }

    /// Block (without the GIL: the caller releases it) until flow `id` holds at most `bound` unacknowledged
    /// lines or `timeout` passed; whether there is room.
    pub fn wait_room(&self, id: usize, bound: usize, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            let backlog = match inner.flows.get(id).and_then(Option::as_ref) {
                Some(slot) => slot.flow.backlog,
                None => return true,
            };
            if backlog <= bound {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            inner = self
                .shared
                .room
                .wait_timeout(inner, end - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A shard's gate: it may send for `seconds` from now (0: not at all; None: no gate).
    pub fn set_window(&self, shard: &str, seconds: Option<f64>) {
        let mut inner = self.lock();
        let until = seconds.map(|s| {
            (s > 0.0 && s.is_finite()).then(|| Instant::now() + Duration::from_secs_f64(s))
        });
        match until {
            None => {
                inner.windows.remove(shard);
            }
            Some(until) => {
                inner.windows.insert(shard.to_string(), until);
            }
        }
        self.wake(&mut inner);
    }

    /// Nothing queued or in flight for destination `dest` (every flow of it).
    pub fn drained(&self, dest: &str) -> bool {
        let inner = self.lock();
        inner
            .dests
            .iter()
            .filter(|d| d.name == dest)
            .all(|d| d.in_flight.is_empty() && d.flows.iter().all(|&f| inner.queued(f) == 0))
    }

    /// The counters gathered since the last call: (flow id, its stats), (destination, its stats); those with
    /// nothing counted are left out.
    pub fn take_stats(&self) -> Stats {
        let mut inner = self.lock();
        let flows = inner
            .flows
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|s| (i, std::mem::take(&mut s.stats))))
            .filter(|(_, s)| !s.is_empty())
            .collect();
        let dests = inner
            .dests
            .iter_mut()
            .map(|d| (d.name.clone(), std::mem::take(&mut d.stats)))
            .filter(|(_, s)| s.writes > 0 || s.retries > 0)
            .collect();
        (flows, dests)
    }

    /// Log lines since the last call, and a warning of their own for any that did not fit.
    pub fn take_log(&self) -> Vec<(u8, String)> {
        let mut inner = self.lock();
        let mut lines = std::mem::take(&mut inner.log);
        let dropped = std::mem::take(&mut inner.log_dropped);
        if dropped > 0 {
            lines.push((30, format!("delivery thread: {dropped} more log lines were dropped (over {LOG_LINES} between two looks)")));
        }
        lines
    }

    pub fn take_samples(&self) -> Vec<Sample> {
        std::mem::take(&mut self.lock().samples)
    }

    /// Stop the thread; connections are closed, nothing queued is sent.
    pub fn stop(&mut self) {
        {
            let mut inner = self.lock();
            inner.stopping = true;
            inner.wake_pending = false; // (this wake-up must go out)
            self.wake(&mut inner);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One flow, for Python's questions (under the lock).
pub struct FlowView<'a> {
    slot: &'a mut FlowSlot,
}

impl FlowView<'_> {
    pub fn flow(&mut self) -> &mut Flow {
        &mut self.slot.flow
    }

    /// Whether `acked` moved since the last call (the checkpoint's question); clears it.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.slot.dirty)
    }

    pub fn set_dirty(&mut self) {
        self.slot.dirty = true;
    }

    pub fn dirty(&self) -> bool {
        self.slot.dirty
    }

    pub fn last_acked_commit_ts(&self) -> Option<f64> {
        self.slot.last_acked_commit_ts
    }
}

impl Inner {
    fn queued(&self, id: usize) -> usize {
        self.flows[id].as_ref().map_or(0, |s| s.flow.queued())
    }

    fn log(&mut self, level: u8, message: String) {
        if self.log.len() < LOG_LINES {
            self.log.push((level, message));
        } else {
            self.log_dropped += 1;
        }
    }

    fn may_send(&self, shard: &str, now: Instant) -> bool {
        match self.windows.get(shard) {
            None => true,
            Some(until) => until.is_some_and(|u| now < u),
        }
    }

    /// The earliest instant something is due (a linger, a time-out, the end of a back-off).
    fn next_due(&self) -> Option<Instant> {
        self.dests
            .iter()
            .flat_map(|d| [d.linger, d.deadline, d.waiting])
            .flatten()
            .min()
    }

    fn limit(&self, d: usize) -> usize {
        self.settings.max_in_flight.max(1) * self.dests[d].flows.len().max(1)
    }

    fn pending(&self, d: usize) -> (usize, bool) {
        let mut keys = 0;
        let mut unsent = false;
        for &f in &self.dests[d].flows {
            if let Some(s) = self.flows[f].as_ref() {
                keys += s.flow.pending_keys();
                unsent |= s.flow.has_unsent();
            }
        }
        (keys, unsent)
    }

    /// Look at destination `d`: time-outs, the end of a back-off, a connect, what to send.
    fn drive(&mut self, d: usize, now: Instant) {
        if self.dests[d].waiting.is_some_and(|t| now < t) {
            return;
        }
        self.dests[d].waiting = None;
        if self.dests[d].deadline.is_some_and(|t| now >= t) {
            let within = self.settings.reply_timeout.as_secs_f64();
            let why = match &self.dests[d].conn {
                Some(link) if link.connecting() => {
                    format!("connect to {}: no answer within {within:.1}s", link.addr)
                }
                _ => format!("no reply within {within:.1}s"),
            };
            self.failure(d, now, &why);
            return;
        }
        let (keys, unsent) = self.pending(d);
        if !unsent {
            self.dests[d].linger = None;
            return;
        }
        match &self.dests[d].conn {
            None => {
                self.connect(d, now);
                return;
            }
            Some(link) if link.ready() => {}
            Some(_) => return, // connecting
        }
        let limit = self.limit(d);
        let dest = &mut self.dests[d];
        if dest.in_flight.len() >= limit {
            return;
        }
        let batch_size = self.settings.batch_size;
        if !dest.in_flight.is_empty() {
            let full = dest.flows.iter().any(|&f| {
                self.flows[f]
                    .as_ref()
                    .is_some_and(|s| s.flow.pending_keys() >= batch_size)
            });
            if full {
                self.send(d, now);
            }
            return;
        }
        if keys >= batch_size || self.settings.flush_interval.is_zero() {
            self.send(d, now);
            return;
        }
        match dest.linger {
            None => dest.linger = Some(now + self.settings.flush_interval),
            Some(t) if now >= t => self.send(d, now),
            Some(_) => {}
        }
    }

    /// `Sender._send`: one batch from every flow with something queued when nothing is in flight, then (and while
    /// batches are in flight) full batches only; every round's batches share one write.
    fn send(&mut self, d: usize, now: Instant) {
        self.dests[d].linger = None;
        let batch_size = self.settings.batch_size;
        let max_in_flight = self.settings.max_in_flight.max(1);
        let limit = self.limit(d);
        let flows = self.dests[d].flows.clone();
        let n = flows.len();
        let first = self.dests[d].next;
        let mut full_only = !self.dests[d].in_flight.is_empty();
        let mut progress = true;
        while progress && self.dests[d].in_flight.len() < limit {
            progress = false;
            let mut joined = Vec::new();
            let mut joined_keys = 0;
            for i in 0..n {
                if self.dests[d].in_flight.len() >= limit {
                    break;
                }
                let id = flows[(first + i) % n];
                let Some(slot) = self.flows[id].as_ref() else {
                    continue;
                };
                if full_only && slot.flow.pending_keys() < batch_size {
                    continue;
                }
                if !self.may_send(&slot.shard, now) {
                    continue;
                }
                while let Some(batch) = self.flows[id]
                    .as_mut()
                    .and_then(|s| s.flow.take_batch(batch_size, max_in_flight))
                {
                    if batch.nkeys > 0 {
                        joined.extend_from_slice(&batch.payload);
                        joined_keys += batch.nkeys;
                        self.dests[d].in_flight.push_back((Some(id), batch));
                        progress = true;
                        break;
                    }
                    // key-less transactions only, nothing ahead: done without a round trip
                    self.acknowledge(id, &batch);
                }
            }
            if !joined.is_empty() {
                self.write(d, &joined, joined_keys, now);
            }
            full_only = true;
        }
        self.dests[d].next = (first + 1) % n.max(1);
    }

    fn write(&mut self, d: usize, payload: &[u8], nkeys: usize, now: Instant) {
        let reply_timeout = self.settings.reply_timeout;
        let bounds = self.settings.batch_buckets.clone();
        let dest = &mut self.dests[d];
        if dest.deadline.is_none() {
            dest.deadline = Some(now + reply_timeout);
        }
        dest.stats.writes += 1;
        dest.stats.per_write.observe(&bounds, nkeys as f64, 1);
        let Some(link) = dest.conn.as_mut() else {
            return;
        };
        if let Err(why) = link.send(payload, &self.registry) {
            self.failure(d, now, &why);
        }
    }

    /// Flow `id`'s `batch` is acknowledged: move its position, observe its latencies, sample it.
    fn acknowledge(&mut self, id: usize, batch: &Batch) {
        let Some(slot) = self.flows[id].as_mut() else {
            return;
        };
        let completed = slot.flow.ack(batch);
        if !completed.is_empty() || batch.entries() > 0 {
            slot.dirty = true;
        }
        let wall = wall_now();
        let bounds = &self.settings.latency_buckets;
        for c in &completed {
            slot.last_acked_commit_ts = Some(c.commit_ts);
            let times = u64::from(c.transactions);
            slot.stats
                .latency
                .observe(bounds, (wall - c.commit_ts).max(0.0), times);
            slot.stats
                .delivery
                .observe(bounds, (wall - c.read_ts).max(0.0), times);
        }
    }

    /// `MN`: the replies of destination `d`'s oldest batch in flight are in (`reply`).
    fn batch_done(&mut self, d: usize, reply: Reply, now: Instant) -> Result<(), String> {
        let reply_timeout = self.settings.reply_timeout;
        let dest = &mut self.dests[d];
        let Some((id, batch)) = dest.in_flight.pop_front() else {
            return Ok(());
        };
        dest.deadline = (!dest.in_flight.is_empty()).then(|| now + reply_timeout);
        let Reply {
            errors,
            server_errors,
            oks,
        } = reply;
        let name = dest.name.clone();
        if let Some(slot) = id.and_then(|i| self.flows[i].as_mut()) {
            for line in &errors {
                let word = line.split(|&b| b == b' ').next().unwrap_or_default();
                *slot
                    .stats
                    .reply_errors
                    .entry(String::from_utf8_lossy(word).into_owned())
                    .or_default() += 1;
            }
        }
        if oks < batch.flushes {
            self.dests[d].in_flight.push_front((id, batch));
            let said = errors.first().map_or("no OK".to_string(), |e| {
                format!("{:?}", String::from_utf8_lossy(e))
            });
            self.log(
                40,
                format!(
                    "flow {name}: flush_all refused ({said}); squeal-router flushes only with --enable-flush-cmd"
                ),
            );
            return Err("flush_all not acknowledged".into());
        }
        if server_errors > 0 {
            self.dests[d].in_flight.push_front((id, batch));
            return Err(format!(
                "{server_errors} SERVER_ERROR replies, e.g. {:?}",
                String::from_utf8_lossy(&errors[0])
            ));
        }
        if !errors.is_empty() {
            self.log(
                30,
                format!(
                    "flow {name}: {} error replies in a batch (not retried), e.g. {:?}",
                    errors.len(),
                    String::from_utf8_lossy(&errors[0])
                ),
            );
        }
        self.dests[d].backoff = self.settings.backoff_initial;
        let Some(id) = id else {
            return Ok(()); // the batch of a flow that left: its `MN` is taken, nothing moves
        };
        if let Some(slot) = self.flows[id].as_mut() {
            slot.stats.deletes += batch.nkeys as u64;
            slot.stats.flushes += batch.flushes as u64;
        }
        self.acknowledge(id, &batch);
        self.sample(&name, &batch);
        Ok(())
    }

    /// `squeal.delivery.sampler.DeleteSampler.offer`: every `sample_every`-th plain key acknowledged.
    fn sample(&mut self, dest: &str, batch: &Batch) {
        let every = self.settings.sample_every;
        if every == 0 {
            return;
        }
        let nkeys = batch.nkeys as u64;
        if nkeys < self.until_sample {
            self.until_sample -= nkeys;
            return;
        }
        let lines: Vec<&[u8]> = batch.payload.split(|&b| b == b'\n').collect();
        let mut index = self.until_sample - 1;
        let at = wall_now();
        while index < nkeys {
            let line = lines
                .get(index as usize)
                .map_or(&b""[..], |l| l.strip_suffix(b"\r").unwrap_or(l));
            let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            if parts.len() == 3 && parts[0] == b"md" && parts[2] == b"q" {
                if let Ok(key) = std::str::from_utf8(parts[1]) {
                    if self.samples.len() < SAMPLES {
                        self.samples.push((dest.to_string(), key.to_string(), at));
                    }
                }
            }
            index += every;
        }
        self.until_sample = index - nkeys + 1;
    }

    fn connect(&mut self, d: usize, now: Instant) {
        let dest = &mut self.dests[d];
        let (host, port) = dest.routers[dest.router % dest.routers.len()].clone();
        dest.connections += 1;
        let tok = token(d, dest.connections);
        match Link::open(&host, port, self.tls.as_ref(), &self.registry, tok) {
            Ok(link) => {
                let dest = &mut self.dests[d];
                dest.conn = Some(link);
                dest.deadline = Some(now + self.settings.reply_timeout);
            }
            Err(why) => self.failure(d, now, &why),
        }
    }

    /// A socket event for destination `d`: the replies that came, then the end of the connection if it ended.
    fn on_event(&mut self, d: usize, tok: Token, now: Instant) {
        let dest = &mut self.dests[d];
        if token(d, dest.connections) != tok {
            return; // an event of a connection since closed
        }
        let Some(link) = dest.conn.as_mut() else {
            return;
        };
        let (replies, ended) = link.pump(&self.registry);
        if link.ready() && dest.in_flight.is_empty() {
            dest.deadline = None; // (the connect's)
        }
        for reply in replies {
            if let Err(why) = self.batch_done(d, reply, now) {
                self.failure(d, now, &why);
                return;
            }
        }
        if let Some(why) = ended {
            self.failure(d, now, &why);
        }
    }

    fn failure(&mut self, d: usize, now: Instant, why: &str) {
        let dest = &mut self.dests[d];
        let addr = {
            let (h, p) = &dest.routers[dest.router % dest.routers.len()];
            format!("{h}:{p}")
        };
        for (id, batch) in std::mem::take(&mut dest.in_flight) {
            if let Some(slot) = id.and_then(|i| self.flows[i].as_mut()) {
                slot.flow.fail(&batch);
            }
        }
        let dest = &mut self.dests[d];
        dest.deadline = None;
        dest.linger = None;
        if let Some(link) = dest.conn.take() {
            link.close(&self.registry);
        }
        if self.stopping {
            return;
        }
        let dest = &mut self.dests[d];
        dest.router += 1;
        dest.stats.retries += 1;
        let wait = dest.backoff;
        dest.waiting = Some(now + wait);
        dest.backoff = (dest.backoff * 2).min(self.settings.backoff_max);
        let (h, p) = &dest.routers[dest.router % dest.routers.len()];
        let message = format!(
            "flow {}: {addr} {why}; retrying in {:.2}s via {h}:{p}",
            dest.name,
            wait.as_secs_f64()
        );
        self.log(30, message);
    }
}

/// The delivery thread: wait for a socket, a wake-up or the next due time; then look at every destination.
fn run(shared: &Shared, mut poll: Poll) {
    let mut events = Events::with_capacity(256);
    loop {
        let timeout = {
            let inner = shared.inner.lock().unwrap_or_else(|e| e.into_inner());
            if inner.stopping {
                break;
            }
            inner
                .next_due()
                .map(|t| t.saturating_duration_since(Instant::now()))
        };
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != ErrorKind::Interrupted {
                let mut inner = shared.inner.lock().unwrap_or_else(|e| e.into_inner());
                inner.log(40, format!("delivery thread: poll failed: {e}"));
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        let mut inner = shared.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.stopping {
            break;
        }
        inner.wake_pending = false; // from here on an offer wakes the thread again
        let now = Instant::now();
        for ev in events.iter() {
            let tok = ev.token();
            if tok == WAKER {
                continue;
            }
            let d = tok.0 >> 20;
            if d < inner.dests.len() {
                inner.on_event(d, tok, now);
            }
        }
        for d in 0..inner.dests.len() {
            inner.drive(d, now);
        }
        drop(inner);
        shared.room.notify_all();
    }
    let mut inner = shared.inner.lock().unwrap_or_else(|e| e.into_inner());
    for d in 0..inner.dests.len() {
        if let Some(link) = inner.dests[d].conn.take() {
            link.close(&inner.registry);
        }
    }
}

/// (gtid, position) of an offer as Python gives them.
pub fn committed(
    gtid: Gtid,
    times: (f64, f64),
    lines: Arc<crate::flow::Lines>,
    flush: bool,
    position: Option<Position>,
    piece: (bool, u64, u64),
    transactions: u32,
) -> Committed {
    Committed {
        gtid,
        commit_ts: times.0,
        read_ts: times.1,
        lines,
        flush,
        position,
        partial: piece.0,
        rows_from: piece.1,
        rows_to: piece.2,
        transactions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            batch_size: 8,
            flush_interval: Duration::from_micros(500),
            reply_timeout: Duration::from_secs(1),
            max_in_flight: 2,
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            latency_buckets: vec![0.001, 1.0],
            batch_buckets: vec![1.0, 256.0],
            sample_every: 0,
        }
    }

    #[test]
    fn log_lines_past_the_bound_are_counted_and_said_not_lost_silently() {
        let delivery = Delivery::new(settings(), None).unwrap();
        {
            let mut inner = delivery.lock();
            for i in 0..LOG_LINES + 5 {
                inner.log(30, format!("line {i}"));
            }
        }
        let lines = delivery.take_log();
        assert_eq!(lines.len(), LOG_LINES + 1);
        assert_eq!(lines[LOG_LINES - 1].1, format!("line {}", LOG_LINES - 1));
        let (level, said) = &lines[LOG_LINES];
        assert_eq!(*level, 30);
        assert!(said.contains("5 more log lines were dropped"), "{said}");
        assert!(delivery.take_log().is_empty(), "the count starts again");
    }
}
