//! What the router measures of each server's load, for LoadBalancerRoute to choose by.
//!
//! mcrouter's LoadBalancerRoute weighs its children by the load servers report in their replies;
//! memcached reports none. The router sees every request it sends a server and every reply's
//! round trip, so each server keeps two numbers: requests outstanding (sent or queued, not yet
//! answered) and a moving average of reply latency. They live in the server (`Server::load`),
//! shared by every route and pool that names it, so writes an AllSyncRoute sends count as much as
//! the reads being spread. Counting outstanding requests costs two atomic adds per request. Timing
//! a reply costs a clock read and two clock subtractions (~200 instructions under cachegrind, 2.5%
//! of a pipelined get), so only some replies are timed: every request that finds its server idle
//! (nothing outstanding: at a low rate that is every request, and a server being probed is always
//! timed) and one in eight of the others (at a high rate, plenty). `bench/router_cachegrind.py`
//! measures the cost.
//!
//! A server's cost is `latency × (outstanding + 1)` (the time a new request can expect to wait,
//! the cost Finagle's power-of-two-choices balancers weigh, without their peak-following average):
//! `prefer` compares two servers by it.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Of the requests that find their server busy, one in this many is timed.
const TIME_ONE_IN: u32 = 8;

thread_local! {
    /// Requests started on this thread to busy servers (which of them to time; no atomics needed).
    static BUSY_STARTS: Cell<u32> = const { Cell::new(0) };
}

/// The latency average forgets a sample in about this long (µs) or 8 samples, whichever is longer:
/// at a high request rate the average follows the last few replies, and a server asked only now
/// and then is judged by its recent replies, not by an old one.
const FORGET_US: u64 = 100_000;

/// One server's measured load.
#[derive(Default)]
pub struct Load {
    outstanding: AtomicU32,
    /// Moving average of reply latency, µs (0: no reply yet).
    latency_us: AtomicU32,
    /// When the last reply was measured, µs since `epoch` (0: never).
    sampled_at_us: AtomicU64,
}

/// What a route reads of a server's load at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub outstanding: u32,
    /// The latency average, if a reply was measured within the reader's trust horizon.
    pub latency_us: Option<u32>,
    /// TKO (or held out for a replay): requests fail at once.
    pub down: bool,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Microseconds on the clock loads are stamped with (never 0, so 0 can mean "never").
pub fn now_us() -> u64 {
    micros(Instant::now())
}

fn micros(t: Instant) -> u64 {
    whole_micros(t.saturating_duration_since(epoch())) + 1
}

fn whole_micros(d: std::time::Duration) -> u64 {
    d.as_secs() * 1_000_000 + u64::from(d.subsec_micros())
}

impl Load {
    /// A request to this server starts: outstanding until the returned guard is dropped; its reply
    /// is timed if the server was idle, or if it is the busy ones' turn.
    #[inline]
    pub fn start(&self, started: Instant) -> InFlight<'_> {
        let busy = self.outstanding.fetch_add(1, Relaxed) > 0;
        let timed = !busy
            || BUSY_STARTS.with(|n| {
                let next = n.get().wrapping_add(1);
                n.set(next);
                next % TIME_ONE_IN == 0
            });
        InFlight {
            load: self,
            started: timed.then_some(started),
        }
    }

    /// The reading as of `now` (from [`now_us`]); a latency measured more than `trust_us` ago is
    /// not given (the server may have changed since).
    pub fn read(&self, now: u64, trust_us: u64, down: bool) -> Reading {
        let at = self.sampled_at_us.load(Relaxed);
        let latency = self.latency_us.load(Relaxed);
        Reading {
            outstanding: self.outstanding.load(Relaxed),
            latency_us: (at != 0 && now.saturating_sub(at) <= trust_us).then_some(latency),
            down,
        }
    }

    /// Fold one reply's latency into the average. Concurrent updates may lose one another's
    /// sample (relaxed loads and stores, no compare-and-swap): an average can afford that, the
    /// request path cannot afford a retry loop.
    fn sample(&self, latency_us: u64, now: u64) {
        let prev = u64::from(self.latency_us.load(Relaxed));
        let since = now.saturating_sub(self.sampled_at_us.load(Relaxed));
        let next = if prev == 0 || since >= FORGET_US {
            latency_us
        } else {
            // weight of the new sample: since/FORGET_US, at least 1/8
            let w = since.max(FORGET_US / 8);
            (prev * (FORGET_US - w) + latency_us * w) / FORGET_US
        };
        self.latency_us
            .store(next.clamp(1, u64::from(u32::MAX)) as u32, Relaxed);
        self.sampled_at_us.store(now, Relaxed);
    }
}

/// A request in flight to a server: counted in its outstanding requests until dropped.
pub struct InFlight<'a> {
    load: &'a Load,
    /// When it started, if its reply is to be timed.
    started: Option<Instant>,
}

impl InFlight<'_> {
    /// The server answered (or timed out: as slow as that): its latency counts in the average, if
    /// this request is one of those timed.
    #[inline]
    pub fn answered(self) {
        if let Some(started) = self.started {
            time_reply(self.load, started);
        }
    }
}

#[inline(never)]
fn time_reply(load: &Load, started: Instant) {
    let now = Instant::now();
    load.sample(whole_micros(now.saturating_duration_since(started)), micros(now));
}

impl Drop for InFlight<'_> {
    #[inline]
    fn drop(&mut self) {
        self.load.outstanding.fetch_sub(1, Relaxed);
    }
}

/// The expected wait of a new request: latency × (outstanding + 1).
fn cost(latency_us: u32, outstanding: u32) -> u64 {
    u64::from(latency_us) * (u64::from(outstanding) + 1)
}

/// Whether `other` is measurably less loaded than `home` (the key's own choice, kept on a tie so
/// a key keeps reading from one server and its cache stays warm). A server that is down loses to
/// one that is up. With both latencies trusted, `other` must cost less than 3/4 of `home`: the
/// average of equally fast servers wobbles by more than a few percent between replies, and a key
/// should not move for that. A server whose latency is no longer trusted gets one request at a
/// time to measure it again (while that one is outstanding, a measured server is preferred), so a
/// server that was slow is tried again without a burst of requests waiting on it. Otherwise only
/// what is certain now counts: fewer requests outstanding.
pub fn prefer(home: Reading, other: Reading) -> bool {
    if home.down != other.down {
        return home.down;
    }
    match (home.latency_us, other.latency_us) {
        (Some(h), Some(o)) => 4 * cost(o, other.outstanding) < 3 * cost(h, home.outstanding),
        (None, Some(_)) if home.outstanding > 0 => true,
        (Some(_), None) if other.outstanding > 0 => false,
        _ => other.outstanding < home.outstanding,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reading(outstanding: u32, latency_us: Option<u32>) -> Reading {
        Reading {
            outstanding,
            latency_us,
            down: false,
        }
    }

    #[test]
    fn outstanding_requests_count_until_answered_or_dropped() {
        let load = Load::default();
        let t = Instant::now();
        let a = load.start(t);
        let b = load.start(t);
        assert_eq!(load.read(now_us(), 1_000_000, false).outstanding, 2);
        a.answered();
        drop(b); // e.g. the caller gave up: not a latency sample
        let r = load.read(now_us(), 1_000_000, false);
        assert_eq!(r.outstanding, 0);
        assert!(r.latency_us.is_some());
    }

    #[test]
    fn the_average_follows_replies_and_forgets_old_ones() {
        let load = Load::default();
        assert_eq!(load.read(now_us(), u64::MAX, false).latency_us, None);
        let now = 1_000_000;
        load.sample(100, now);
        assert_eq!(load.latency_us.load(Relaxed), 100);
        // a burst of slow replies moves it up within a few samples, one outlier only by 1/8
        load.sample(900, now + 1);
        assert_eq!(load.latency_us.load(Relaxed), 200);
        for i in 0..20 {
            load.sample(900, now + 2 + i);
        }
        assert!(load.latency_us.load(Relaxed) > 800);
        // after a long quiet spell the next reply replaces the average
        load.sample(50, now + 10 * FORGET_US);
        assert_eq!(load.latency_us.load(Relaxed), 50);
        // trust horizon: the reading gives no latency once it is older than the reader trusts
        let at = now + 10 * FORGET_US;
        assert_eq!(load.read(at + 99, 100, false).latency_us, Some(50));
        assert_eq!(load.read(at + 101, 100, false).latency_us, None);
    }

    #[test]
    fn a_slow_server_costs_more_and_ties_stay_home() {
        let fast = reading(0, Some(100));
        let slow = reading(0, Some(5000));
        assert!(prefer(slow, fast));
        assert!(!prefer(fast, slow));
        // equal, or within the wobble: the key stays on its own server
        assert!(!prefer(fast, fast));
        assert!(!prefer(reading(0, Some(110)), reading(0, Some(100))));
        // queued requests make a fast server expensive
        assert!(prefer(reading(9, Some(100)), reading(0, Some(200))));
        // a server not measured lately gets one request to measure it, then waits for its answer
        assert!(!prefer(reading(0, None), reading(0, Some(100))));
        assert!(prefer(reading(1, None), reading(3, Some(100))));
        assert!(!prefer(reading(3, Some(100)), reading(1, None)));
        // with no trusted latency at all only the outstanding requests count
        assert!(prefer(reading(2, None), reading(1, None)));
        assert!(!prefer(reading(1, None), reading(1, None)));
        // a server that is down always loses
        let down = Reading { down: true, ..fast };
        assert!(prefer(down, slow));
        assert!(!prefer(slow, down));
    }

    #[test]
    fn idle_servers_are_timed_busy_ones_one_in_eight() {
        let load = Load::default();
        let t = Instant::now();
        assert!(load.start(t).started.is_some()); // idle (each guard drops at once)
        let held = load.start(t);
        let timed = (0..80).filter(|_| load.start(t).started.is_some()).count();
        assert_eq!(timed, 10);
        drop(held);
    }

    #[test]
    fn answered_measures_the_time_since_start() {
        let load = Load::default();
        let f = load.start(Instant::now() - Duration::from_millis(20));
        f.answered();
        let r = load.read(now_us(), u64::MAX, false);
        assert!(r.latency_us.unwrap() >= 20_000, "{r:?}");
    }
}
