//! One destination's flow, natively: the queue logic of `squeal.delivery.flows.Flow` (stage 2 of the native data
//! plane, docs/squeal.md; not wired to Python yet). Plain data and logic, no I/O: what is queued, what the next
//! batch is, what an acknowledgement completes, when the flow sheds. The differential test that will hold it to the
//! Python flow comes with its binding; the unit tests below pin the same rules the Python flow's tests do.
//!
//! The rules, as in the Python flow:
//! * `offer` queues a committed transaction's lines unless the flow has it already (`enqueued` covers it). A huge
//!   transaction may come in pieces; a flow takes a piece only right after the one before it, else it sheds (the
//!   catch-up reader re-reads the transaction whole). Only the last piece completes the GTID.
//! * `take_batch` hands out up to `batch_size` lines (an entry may be split across batches), at most
//!   `max_in_flight` batches at once; `ack` completes them strictly in order; `fail` hands every batch in flight
//!   back. `acked` moves past a transaction only once all of its lines are acknowledged.
//! * Bounded memory (Wormhole's caravans): past `max_backlog` unacknowledged lines the flow sheds (drops its queue,
//!   moves to a new epoch). The oldest queued transaction bigger than the bound on its own is not counted, so a
//!   healthy flow takes a huge transaction without shedding.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// (domain, server_id, seq_no)
pub type Gtid = (u32, u32, u64);
/// domain -> (server_id, seq_no) of the last transaction done in that domain (`squeal.read.gtid.Position`).
pub type Position = BTreeMap<u32, (u32, u64)>;

pub fn covers(pos: &Position, gtid: Gtid) -> bool {
    pos.get(&gtid.0).is_some_and(|&(_, seq)| seq >= gtid.2)
}

pub fn covers_position(pos: &Position, other: &Position) -> bool {
    other.iter().all(|(&d, &(s, n))| covers(pos, (d, s, n)))
}

pub fn advance(pos: &mut Position, gtid: Gtid) {
    pos.insert(gtid.0, (gtid.1, gtid.2));
}

pub fn merge(pos: &mut Position, other: &Position) {
    for (&d, &(s, n)) in other {
        if pos.get(&d).is_none_or(|&(_, seq)| seq < n) {
            pos.insert(d, (s, n));
        }
    }
}

/// Sent ahead of a transaction's deletes when its changes carry no row images, or after binlog data loss.
pub const FLUSH_LINE: &[u8] = b"flush_all\r\n";
const END_OF_BATCH: &[u8] = b"mn\r\n";

/// Delete lines in one buffer with each line's end (shared by every flow that queues them).
#[derive(Debug, Default)]
pub struct Lines {
    data: Vec<u8>,
    ends: Vec<u32>,
}

impl Lines {
    pub fn push(&mut self, line: &[u8]) {
        self.data.extend_from_slice(line);
        // A run's lines are bounded far below 4 GiB (lib.rs, RUN_LINES).
        self.ends
            .push(u32::try_from(self.data.len()).expect("lines under 4 GiB"));
    }

    /// Lines end to end in `data`, line `i` ending at `ends[i]` (the native reader's joined lines); None unless
    /// the ends rise and the last is the end of `data`.
    pub fn from_parts(data: Vec<u8>, ends: Vec<u32>) -> Option<Lines> {
        let rising = ends.windows(2).all(|w| w[0] <= w[1]);
        let whole = ends
            .last()
            .map_or(data.is_empty(), |&e| e as usize == data.len());
        (rising && whole).then_some(Lines { data, ends })
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Lines [a, b) as one slice.
    fn span(&self, a: usize, b: usize) -> &[u8] {
        let start = if a == 0 { 0 } else { self.ends[a - 1] as usize };
        let end = if b == 0 { 0 } else { self.ends[b - 1] as usize };
        &self.data[start..end]
    }
}

impl<T: AsRef<[u8]>> FromIterator<T> for Lines {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut lines = Lines::default();
        for line in iter {
            lines.push(line.as_ref());
        }
        lines
    }
}

/// A committed transaction (or a run of them) as this flow sees it: the lines of its kind (cluster or regional).
#[derive(Debug, Clone)]
pub struct Committed {
    pub gtid: Gtid,
    pub commit_ts: f64,
    pub read_ts: f64,
    pub lines: Arc<Lines>,
    /// Flush every destination before these deletes (a `FLUSH_LINE` goes first).
    pub flush: bool,
    /// A run's (or after data loss, the resume point's) position, instead of one GTID.
    pub position: Option<Position>,
    /// A piece of a huge transaction, more to follow.
    pub partial: bool,
    pub rows_from: u64,
    pub rows_to: u64,
    pub transactions: u32,
}

impl Committed {
    fn continued(&self) -> bool {
        self.rows_from > 0
    }
}

#[derive(Debug)]
struct Entry {
    commit_ts: f64,
    read_ts: f64,
    lines: Arc<Lines>,
    flush: bool,
    gtid: Gtid,
    position: Option<Position>,
    partial: bool,
    transactions: u32,
}

impl Entry {
    /// Lines to send, the flush line included.
    fn len(&self) -> usize {
        self.lines.len() + usize::from(self.flush)
    }

    /// Append lines [a, b) (the flush line being line 0 when there is one) to `out`.
    fn write(&self, out: &mut Vec<u8>, a: usize, b: usize) {
        let shift = usize::from(self.flush);
        if self.flush && a == 0 && b > 0 {
            out.extend_from_slice(FLUSH_LINE);
        }
        let (a, b) = (a.max(shift) - shift, b - shift.min(b));
        if a < b {
            out.extend_from_slice(self.lines.span(a, b));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Live,
    Shed,
    CatchingUp,
}

impl State {
    /// As `squeal.delivery.flows` names it.
    pub fn name(self) -> &'static str {
        match self {
            State::Live => "live",
            State::Shed => "shed",
            State::CatchingUp => "catching_up",
        }
    }
}

/// A batch handed out: its payload (`md … q` lines then `mn`) and what acknowledging it completes. Batches are
/// told apart by (epoch, sequence number), not by their bytes.
#[derive(Debug, Clone)]
pub struct Batch {
    pub payload: Vec<u8>,
    pub nkeys: usize,
    /// `FLUSH_LINE`s in the payload: each must be answered `OK`.
    pub flushes: usize,
    entries: usize,
    end_offset: usize,
    epoch: u64,
    seq: u64,
}

impl PartialEq for Batch {
    fn eq(&self, other: &Batch) -> bool {
        (self.epoch, self.seq) == (other.epoch, other.seq)
    }
}

impl Batch {
    /// Queue entries this batch completes.
    pub fn entries(&self) -> usize {
        self.entries
    }
}

/// What `offer` did with a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// Not taken: the flow has it already, or is not in the state that takes this stream.
    Ignored,
    /// Nothing to send and nothing ahead of it: done at once (`acked` moved).
    Done,
    Queued,
    /// Queueing it passed the bound: the queue is dropped, a catch-up reader must start from `acked`.
    Shed,
}

/// One transaction (or run) completed by an acknowledgement: what the latency histograms observe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Completed {
    pub commit_ts: f64,
    pub read_ts: f64,
    pub transactions: u32,
}

#[derive(Debug)]
pub struct Flow {
    pub acked: Position,
    pub enqueued: Position,
    pub state: State,
    pub epoch: u64,
    /// Unacknowledged lines, the batches in flight included.
    pub backlog: usize,
    max_backlog: usize,
    queue: VecDeque<Entry>,
    sending: VecDeque<Batch>,
    head_offset: usize,
    sent_entries: usize,
    sent_offset: usize,
    sent_keys: usize,
    // The shed rule's exemption: lines queued since the last shed (the first `keys_queued - backlog` of them
    // acknowledged) and the span in that count of the oldest transaction bigger than the bound on its own.
    keys_queued: usize,
    oversize_span: (usize, usize),
    pieces: Option<(Gtid, u64)>,
    pieces_start: usize,
    batches: u64, // handed out so far: the next batch's sequence number
}

impl Flow {
    pub fn new(start: Position, max_backlog: usize) -> Flow {
        Flow {
            acked: start.clone(),
            enqueued: start,
            state: State::Live,
            epoch: 0,
            backlog: 0,
            max_backlog,
            queue: VecDeque::new(),
            sending: VecDeque::new(),
            head_offset: 0,
            sent_entries: 0,
            sent_offset: 0,
            sent_keys: 0,
            keys_queued: 0,
            oversize_span: (0, 0),
            pieces: None,
            pieces_start: 0,
            batches: 0,
        }
    }

    /// Lines queued and not yet in flight.
    pub fn pending_keys(&self) -> usize {
        self.backlog - self.sent_keys
    }

    /// Entries queued (transactions or runs, or pieces), in flight or not.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Some queued entry is not in a batch yet (it may hold no lines: it still needs a batch to complete).
    pub fn has_unsent(&self) -> bool {
        self.sent_entries < self.queue.len()
    }

    /// The commit time of the oldest entry not acknowledged.
    pub fn oldest_commit_ts(&self) -> Option<f64> {
        self.queue.front().map(|e| e.commit_ts)
    }

    pub fn in_flight(&self) -> usize {
        self.sending.len()
    }

    /// The live stream's transaction (taken while live; it may shed the flow).
    pub fn offer_live(&mut self, c: &Committed) -> Offered {
        if self.state != State::Live {
            return Offered::Ignored;
        }
        self.enqueue(c, true)
    }

    /// The catch-up reader's transaction (taken while catching up; never sheds: the reader is held back instead).
    pub fn offer_catchup(&mut self, c: &Committed) -> Offered {
        if self.state != State::CatchingUp {
            return Offered::Ignored;
        }
        self.enqueue(c, false)
    }

    fn enqueue(&mut self, c: &Committed, may_shed: bool) -> Offered {
        if let Some(position) = &c.position {
            if covers_position(&self.enqueued, position) {
                return Offered::Ignored;
            }
            merge(&mut self.enqueued, position);
        } else if covers(&self.enqueued, c.gtid) {
            return Offered::Ignored;
        } else if c.partial || c.continued() {
            if !c.continued() {
                // a first piece (also the start again of one read again after a reconnect)
                self.pieces = Some((c.gtid, 0));
                self.pieces_start = self.keys_queued;
            }
            if self.pieces != Some((c.gtid, c.rows_from)) {
                self.shed();
                return Offered::Shed;
            }
            self.pieces = if c.partial {
                Some((c.gtid, c.rows_to))
            } else {
                None
            };
            if !c.partial {
                advance(&mut self.enqueued, c.gtid);
            }
        } else {
            advance(&mut self.enqueued, c.gtid);
        }
        let entry = Entry {
            commit_ts: c.commit_ts,
            read_ts: c.read_ts,
            lines: Arc::clone(&c.lines),
            flush: c.flush,
            gtid: c.gtid,
            position: c.position.clone(),
            partial: c.partial,
            transactions: c.transactions,
        };
        let n = entry.len();
        if n == 0 && self.queue.is_empty() && self.sending.is_empty() {
            if c.partial {
                return Offered::Ignored; // nothing to send, nothing completed
            }
            self.complete(&entry);
            return Offered::Done;
        }
        self.queue.push_back(entry);
        self.backlog += n;
        let since = (c.partial || c.continued()).then_some(self.pieces_start);
        if self.over_bound(n, since) && may_shed {
            self.shed();
            return Offered::Shed;
        }
        Offered::Queued
    }

    /// Count the `n` lines just queued; true if the lines queued, less the oversize transaction's, pass the bound.
    fn over_bound(&mut self, n: usize, since: Option<usize>) -> bool {
        let first = since.unwrap_or(self.keys_queued);
        self.keys_queued += n;
        let acked = self.keys_queued - self.backlog;
        let (start, end) = self.oversize_span;
        if self.keys_queued - first > self.max_backlog && (end <= acked || start == first) {
            self.oversize_span = (first, self.keys_queued);
        }
        let (start, end) = self.oversize_span;
        let exempt = end.saturating_sub(start.max(acked));
        self.backlog - exempt > self.max_backlog
    }

    /// Drop everything queued; the flow is re-read from `acked` by a catch-up reader.
    pub fn shed(&mut self) {
        self.queue.clear();
        self.head_offset = 0;
        self.backlog = 0;
        self.keys_queued = 0;
        self.oversize_span = (0, 0);
        self.pieces = None;
        self.drop_in_flight();
        self.epoch += 1; // an ack for a batch in flight now belongs to the past
        self.enqueued = self.acked.clone();
        self.state = State::Shed;
    }

    /// Enter catch-up; the position the catch-up reader starts from.
    pub fn start_catchup(&mut self) -> Position {
        self.enqueued = self.acked.clone();
        self.state = State::CatchingUp;
        self.acked.clone()
    }

    /// This catching-up flow has queued everything the live stream dispatched, and the live stream is between
    /// transactions (`live_pieces`: one it is handing on in pieces).
    pub fn caught_up(&self, live: &Position, live_pieces: Option<Gtid>) -> bool {
        self.state == State::CatchingUp
            && live_pieces.is_none()
            && covers_position(&self.enqueued, live)
    }

    pub fn rejoin(&mut self) {
        self.state = State::Live;
    }

    /// The next batch (up to `batch_size` lines), now in flight behind any others; None when `max_in_flight` are in
    /// flight or nothing is left. A batch of line-less entries only goes when nothing else is in flight.
    pub fn take_batch(&mut self, batch_size: usize, max_in_flight: usize) -> Option<Batch> {
        if self.sending.len() >= max_in_flight || self.sent_entries >= self.queue.len() {
            return None;
        }
        let mut payload = Vec::new();
        let (mut n, mut done, mut flushes) = (0, 0, 0);
        let mut offset = self.sent_offset;
        for e in self.queue.iter().skip(self.sent_entries) {
            if offset == 0 && e.flush {
                flushes += 1;
            }
            let room = batch_size - n;
            let total = e.len();
            let avail = total - offset;
            if avail <= room {
                e.write(&mut payload, offset, total);
                n += avail;
                done += 1;
                offset = 0;
                if n >= batch_size {
                    break;
                }
            } else {
                e.write(&mut payload, offset, offset + room);
                n += room;
                offset += room;
                break;
            }
        }
        if n == 0 && !self.sending.is_empty() {
            return None;
        }
        payload.extend_from_slice(END_OF_BATCH);
        let batch = Batch {
            payload,
            nkeys: n,
            flushes,
            entries: done,
            end_offset: offset,
            epoch: self.epoch,
            seq: self.batches,
        };
        self.batches += 1;
        self.sending.push_back(batch.clone());
        self.sent_entries += done;
        self.sent_offset = offset;
        self.sent_keys += n;
        Some(batch)
    }

    /// The destination answered `MN` for `batch` (the oldest in flight): its transactions are done. Returns what
    /// completed, for the latency histograms (empty for a batch of an earlier epoch, or not the oldest).
    pub fn ack(&mut self, batch: &Batch) -> Vec<Completed> {
        let mut completed = Vec::new();
        if batch.epoch != self.epoch || self.sending.front() != Some(batch) {
            return completed;
        }
        self.sending.pop_front();
        self.sent_entries -= batch.entries;
        self.sent_keys -= batch.nkeys;
        for _ in 0..batch.entries {
            let e = self
                .queue
                .pop_front()
                .expect("a batch's entries are queued");
            if e.partial {
                continue; // its transaction completes with its last piece
            }
            self.complete(&e);
            if e.len() > 0 {
                completed.push(Completed {
                    commit_ts: e.commit_ts,
                    read_ts: e.read_ts,
                    transactions: e.transactions,
                });
            }
        }
        self.head_offset = batch.end_offset;
        self.backlog -= batch.nkeys;
        completed
    }

    fn complete(&mut self, e: &Entry) {
        match &e.position {
            Some(position) => merge(&mut self.acked, position),
            None => advance(&mut self.acked, e.gtid),
        }
    }

    /// `batch` was not acknowledged: it and every batch after it stay queued and are sent again.
    pub fn fail(&mut self, batch: &Batch) {
        if self.sending.iter().any(|b| b == batch) {
            self.drop_in_flight();
        }
    }

    fn drop_in_flight(&mut self) {
        self.sending.clear();
        self.sent_entries = 0;
        self.sent_offset = self.head_offset;
        self.sent_keys = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(d: u32, s: u32, n: u64) -> Position {
        BTreeMap::from([(d, (s, n))])
    }

    fn txn(seq: u64, keys: &[&str]) -> Committed {
        Committed {
            gtid: (0, 1, seq),
            commit_ts: seq as f64,
            read_ts: seq as f64 + 0.5,
            lines: Arc::new(keys.iter().map(|k| format!("md {k} q\r\n")).collect()),
            flush: false,
            position: None,
            partial: false,
            rows_from: 0,
            rows_to: 0,
            transactions: 1,
        }
    }

    fn piece(seq: u64, keys: &[&str], rows: (u64, u64), partial: bool) -> Committed {
        Committed {
            partial,
            rows_from: rows.0,
            rows_to: rows.1,
            ..txn(seq, keys)
        }
    }

    fn text(b: &Batch) -> String {
        String::from_utf8(b.payload.clone()).unwrap()
    }

    #[test]
    fn batches_split_entries_and_acks_move_the_position_only_past_whole_transactions() {
        let mut f = Flow::new(pos(0, 1, 0), 100);
        assert_eq!(f.offer_live(&txn(1, &["a", "b", "c"])), Offered::Queued);
        assert_eq!(f.offer_live(&txn(2, &["d"])), Offered::Queued);
        let b1 = f.take_batch(2, 2).unwrap();
        assert_eq!(text(&b1), "md a q\r\nmd b q\r\nmn\r\n");
        let b2 = f.take_batch(2, 2).unwrap();
        assert_eq!(text(&b2), "md c q\r\nmd d q\r\nmn\r\n");
        assert_eq!(f.take_batch(2, 2), None, "two in flight at most");
        assert!(
            f.ack(&b1).is_empty(),
            "transaction 1 is only partly acknowledged"
        );
        assert_eq!(f.acked, pos(0, 1, 0));
        let done = f.ack(&b2);
        assert_eq!(done.len(), 2);
        assert_eq!((done[0].commit_ts, done[1].read_ts), (1.0, 2.5));
        assert_eq!(f.acked, pos(0, 1, 2));
        assert_eq!(f.backlog, 0);
    }

    #[test]
    fn acks_go_in_order_and_a_failure_sends_everything_in_flight_again() {
        let mut f = Flow::new(Position::new(), 100);
        f.offer_live(&txn(1, &["a"]));
        f.offer_live(&txn(2, &["b"]));
        let b1 = f.take_batch(1, 4).unwrap();
        let b2 = f.take_batch(1, 4).unwrap();
        assert!(f.ack(&b2).is_empty(), "not the oldest in flight: ignored");
        f.fail(&b1);
        let again = f.take_batch(10, 4).unwrap();
        assert_eq!(text(&again), "md a q\r\nmd b q\r\nmn\r\n");
        assert!(
            f.ack(&b1).is_empty(),
            "the batch handed back is no longer in flight"
        );
        assert_eq!(f.ack(&again).len(), 2);
        assert_eq!(f.acked, pos(0, 1, 2));
    }

    #[test]
    fn a_transaction_the_flow_has_is_ignored_and_one_without_lines_is_done_at_once() {
        let mut f = Flow::new(pos(0, 1, 5), 100);
        assert_eq!(f.offer_live(&txn(5, &["a"])), Offered::Ignored);
        assert_eq!(f.offer_live(&txn(6, &[])), Offered::Done);
        assert_eq!(f.acked, pos(0, 1, 6));
        let mut run = txn(9, &["x"]);
        run.position = Some(BTreeMap::from([(0, (1, 9)), (1, (2, 3))]));
        run.transactions = 3;
        assert_eq!(f.offer_live(&run), Offered::Queued);
        assert_eq!(
            f.offer_live(&run),
            Offered::Ignored,
            "a run the flow has queued"
        );
        let b = f.take_batch(10, 1).unwrap();
        assert_eq!(f.ack(&b)[0].transactions, 3);
        assert_eq!(f.acked, BTreeMap::from([(0, (1, 9)), (1, (2, 3))]));
    }

    #[test]
    fn a_flush_line_goes_first_and_is_counted() {
        let mut f = Flow::new(Position::new(), 100);
        let mut c = txn(1, &["a", "b"]);
        c.flush = true;
        f.offer_live(&c);
        assert_eq!(f.pending_keys(), 3);
        let b1 = f.take_batch(2, 4).unwrap();
        assert_eq!(
            (text(&b1).as_str(), b1.flushes),
            ("flush_all\r\nmd a q\r\nmn\r\n", 1)
        );
        let b2 = f.take_batch(2, 4).unwrap();
        assert_eq!((text(&b2).as_str(), b2.flushes), ("md b q\r\nmn\r\n", 0));
    }

    #[test]
    fn past_the_bound_the_flow_sheds_and_a_catch_up_rejoins() {
        let mut f = Flow::new(Position::new(), 3);
        f.offer_live(&txn(1, &["a", "b"]));
        let b = f.take_batch(10, 1).unwrap();
        f.ack(&b);
        assert_eq!(
            f.offer_live(&txn(2, &["c", "d", "e"])),
            Offered::Queued,
            "at the bound, not past it"
        );
        assert_eq!(f.offer_live(&txn(3, &["f"])), Offered::Shed);
        assert_eq!((f.state, f.backlog, f.epoch), (State::Shed, 0, 1));
        assert_eq!(
            f.offer_live(&txn(4, &["g"])),
            Offered::Ignored,
            "a shed flow ignores the live stream"
        );
        assert_eq!(f.start_catchup(), pos(0, 1, 1));
        assert_eq!(f.offer_catchup(&txn(2, &["c", "d", "e"])), Offered::Queued);
        assert_eq!(
            f.offer_catchup(&txn(3, &["f"])),
            Offered::Queued,
            "catch-up never sheds"
        );
        assert!(!f.caught_up(&pos(0, 1, 4), None));
        f.offer_catchup(&txn(4, &["g"]));
        assert!(f.caught_up(&pos(0, 1, 4), None));
        assert!(!f.caught_up(&pos(0, 1, 4), Some((0, 1, 5))));
        f.rejoin();
        assert_eq!(f.state, State::Live);
    }

    #[test]
    fn one_transaction_bigger_than_the_bound_does_not_shed_a_healthy_flow() {
        let mut f = Flow::new(Position::new(), 3);
        let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        assert_eq!(f.offer_live(&txn(1, &refs)), Offered::Queued);
        assert_eq!(f.offer_live(&txn(2, &["a", "b"])), Offered::Queued);
        assert_eq!(
            f.offer_live(&txn(3, &["c", "d"])),
            Offered::Shed,
            "the others still count: 4 > 3"
        );
    }

    #[test]
    fn pieces_are_taken_in_order_and_a_missed_one_sheds() {
        let mut f = Flow::new(Position::new(), 100);
        assert_eq!(
            f.offer_live(&piece(1, &["a"], (0, 2), true)),
            Offered::Queued
        );
        assert_eq!(
            f.offer_live(&piece(1, &["b"], (2, 4), true)),
            Offered::Queued
        );
        assert_eq!(f.enqueued, Position::new(), "only the last piece moves it");
        assert_eq!(
            f.offer_live(&piece(1, &["c"], (4, 5), false)),
            Offered::Queued
        );
        assert_eq!(f.enqueued, pos(0, 1, 1));
        let b = f.take_batch(2, 4).unwrap();
        assert!(
            f.ack(&b).is_empty(),
            "two pieces acknowledged, not the last"
        );
        assert_eq!(f.acked, Position::new());
        let b = f.take_batch(2, 4).unwrap();
        assert_eq!(f.ack(&b).len(), 1);
        assert_eq!(f.acked, pos(0, 1, 1));

        let mut g = Flow::new(Position::new(), 100);
        g.offer_live(&piece(2, &["a"], (0, 2), true));
        assert_eq!(
            g.offer_live(&piece(2, &["c"], (4, 5), false)),
            Offered::Shed,
            "rows 2..4 never came"
        );
    }
}
