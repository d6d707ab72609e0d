//! TransparentLeaseRoute: memcached leases (meta `mg N` / `ms C`) for clients that send plain
//! `get`/`gets`/`set` (off unless a config puts this handle in front of a route).
//!
//! - A classic `get`/`gets` goes down as `mg KEY v f c N<lease_ttl>`. A hit is answered as the
//!   classic `VALUE` block. A miss that wins the lease (`W`) keeps the item's CAS as this key's
//!   token and answers a plain miss. A key whose lease another client holds (`Z`, or a stale `X`
//!   without `W`) is asked again after `lease_wait_ms`, at most `lease_retries` times, then
//!   answered as a miss: readers of a hot key wait for the winner's fill instead of all going to
//!   the database. The keys of a multi-key get are handled each as above, but each round's `mg`s
//!   go to each server as one pipelined batch, and the keys still held wait and are asked again
//!   together (a batch costs the router about what one `mg` does, see docs/benchmarks.md).
//! - A plain `set` of a key with a token goes down as `ms KEY <len> F<flags> T<exptime> C<token>`:
//!   stored only if nothing deleted or changed the item since the lease was won. A refused fill
//!   answers `NOT_STORED` (see docs/router.md). A `set` without a token passes through unchanged.
//! - Tokens are kept per key, not per connection (stock clients pool connections), in a map of at
//!   most `max_tokens` entries; the oldest are evicted (counted), and a token older than
//!   `lease_ttl` is dropped (the vivified item it belongs to has expired by then).
//! - With `stale_ttl` (stale-while-revalidate, the paper's "stale values"): a delete — squeal's
//!   `md KEY q` or a client's `delete` — goes down as `md KEY I T<stale_ttl>`: memcached keeps the
//!   value, marked stale, for at most `stale_ttl` seconds, and bumps its CAS so no fill from before
//!   the delete can store. The first reader after it wins the lease (`W`) and gets a miss, as
//!   after a plain delete; a reader while the winner refills gets the stale value at once instead of
//!   waiting (counted as `lease_stale_served`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};

use futures_util::future::join_all;

use super::destination::Destination;
use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_i64, required};
use crate::context::Context;
use crate::protocol::lease::{fill_reply, read_mg, write_value_block};
use crate::protocol::{Cmd, Reply, Request, Res};
use crate::server::MetaGetFrame;
use crate::stats::Stats;

/// Per-key lease tokens with insertion order for eviction.
#[derive(Default)]
struct Tokens {
    map: HashMap<Bytes, (u64, Instant, u64)>,
    order: VecDeque<(Bytes, u64)>,
    seq: u64,
}

pub struct TransparentLease {
    pub target: RouteRef,
    pub lease_ttl: i64,
    /// Seconds a deleted value stays readable, marked stale, while one reader refills it; 0: off.
    pub stale_ttl: i64,
    pub wait: Duration,
    pub retries: u32,
    pub max_tokens: usize,
    /// `N<lease_ttl>`, the flag that asks memcached for a lease on a miss (made once, sent per key).
    lease_flag: Bytes,
    /// The same `mg` encoded once: a multi-key get's batches are written around it.
    mg_frame: MetaGetFrame,
    tokens: Mutex<Tokens>,
    /// The router's counters (`Stats::lease_*`): every handle of the config counts into them.
    ctx: Arc<Context>,
}

/// What one `mg … N` answered (a value's classic block is written to the caller's buffer).
enum Got {
    Hit,
    Won(u64),
    Held,
    /// A stale value whose lease another reader holds (with `stale_ttl`: served).
    Stale,
    /// Not a value (an error, say): the reply is the answer, as the server sent it.
    AsSent,
    /// A `VA` reply that cannot be read: this error is the answer.
    Unreadable(Reply),
}

impl TransparentLease {
    pub fn new(
        target: RouteRef,
        lease_ttl: i64,
        wait: Duration,
        retries: u32,
        max_tokens: usize,
        stale_ttl: i64,
        ctx: Arc<Context>,
    ) -> Self {
        let lease_flag = Bytes::from(format!("N{lease_ttl}"));
        let mg_frame = MetaGetFrame::new(&meta_get(Bytes::new(), &lease_flag));
        TransparentLease {
            target,
            lease_ttl,
            stale_ttl,
            wait,
            retries,
            max_tokens,
            lease_flag,
            mg_frame,
            tokens: Mutex::new(Tokens::default()),
            ctx,
        }
    }

    fn stats(&self) -> &Stats {
        &self.ctx.stats
    }

    fn remember(&self, key: &Bytes, token: u64) {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        t.seq += 1;
        let seq = t.seq;
        if t.map.insert(key.clone(), (token, Instant::now(), seq)).is_none() {
            self.stats().lease_tokens.fetch_add(1, Ordering::Relaxed);
        }
        t.order.push_back((key.clone(), seq));
        while t.map.len() > self.max_tokens || t.order.len() > 2 * self.max_tokens.max(1) {
            let Some((old, s)) = t.order.pop_front() else { break };
            if t.map.get(&old).is_some_and(|e| e.2 == s) {
                t.map.remove(&old);
                self.stats().lease_tokens.fetch_sub(1, Ordering::Relaxed);
                self.stats().lease_tokens_evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn take(&self, key: &[u8]) -> Option<u64> {
        let mut t = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        let (token, at, _) = t.map.remove(key)?;
        self.stats().lease_tokens.fetch_sub(1, Ordering::Relaxed);
        let ttl = Duration::from_secs(self.lease_ttl.max(0) as u64);
        (at.elapsed() < ttl).then_some(token)
    }

    /// Tokens held now (for stats).
    pub fn tokens_held(&self) -> usize {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner()).map.len()
    }

    fn meta_get(&self, key: &Bytes) -> Request {
        meta_get(key.clone(), &self.lease_flag)
    }

    /// What the reply to `req`'s `mg` (its bytes) says; a value's classic block is appended to
    /// `blocks` (a multi-key get's hits share one buffer, often the client's answer itself).
    fn read(&self, req: &Request, wire: &[u8], blocks: &mut BytesMut) -> Got {
        let v = match read_mg(wire) {
            Ok(v) => v,
            Err(None) => return Got::AsSent,
            Err(Some(error)) => return Got::Unreadable(error),
        };
        if v.won {
            return Got::Won(v.cas);
        }
        // (a stale lease placeholder has no value to serve: its readers wait for the fill as before)
        let serve_stale = v.held && v.stale && self.stale_ttl > 0 && !v.data.is_empty();
        if v.held && !serve_stale {
            return Got::Held;
        }
        let cas = (req.cmd == Cmd::Gets).then_some(v.cas);
        write_value_block(blocks, b"VALUE", &req.key, None, &v, cas);
        if serve_stale {
            return Got::Stale;
        }
        Got::Hit
    }

    /// A delete as a stale mark (`stale_ttl`): `md KEY I T<stale_ttl>` with the client's own meta
    /// flags; a classic `delete` keeps its classic answer. A client's own `I` or `x` passes as sent.
    async fn mark_stale(&self, req: &Request) -> Reply {
        let mut md = req.clone();
        if req.cmd == Cmd::Delete {
            md = Request::simple(Cmd::MetaDelete, req.key.clone());
        }
        md.meta.push(Bytes::from_static(b"I"));
        md.meta.push(Bytes::from(format!("T{}", self.stale_ttl)));
        let reply = self.target.route(&md).await;
        self.stats().lease_stale_marks.fetch_add(1, Ordering::Relaxed);
        if req.cmd != Cmd::Delete {
            return reply;
        }
        let w = &reply.wire;
        if w.starts_with(b"HD") {
            Reply::line(Res::Deleted, "DELETED")
        } else if w.starts_with(b"NF") {
            Reply::line(Res::NotFound, "NOT_FOUND")
        } else {
            reply
        }
    }

    fn marks_stale(&self, req: &Request) -> bool {
        self.stale_ttl > 0
            && match req.cmd {
                Cmd::Delete => true,
                Cmd::MetaDelete => !req
                    .meta
                    .iter()
                    .any(|f| f.first().is_some_and(|c| *c == b'I' || *c == b'x')),
                _ => false,
            }
    }

    /// The classic answer for `req` once its `mg` said `got` for the last time (a key still held
    /// has used up its retries): counted, and a won lease's token kept for the key. `None` for a
    /// value: its block is the one `read` appended. `as_sent`: the reply, for `Got::AsSent`.
    fn settle(&self, req: &Request, got: Got, as_sent: impl FnOnce() -> Reply) -> Option<Reply> {
        match got {
            Got::Hit => None,
            Got::AsSent => Some(as_sent()),
            Got::Unreadable(error) => Some(error),
            Got::Stale => {
                self.stats().lease_stale_served.fetch_add(1, Ordering::Relaxed);
                None
            }
            Got::Won(token) => {
                self.stats().lease_won.fetch_add(1, Ordering::Relaxed);
                self.remember(&req.key, token);
                Some(Reply::new(Res::Miss, Bytes::new()))
            }
            Got::Held => {
                self.stats().lease_gave_up.fetch_add(1, Ordering::Relaxed);
                Some(Reply::new(Res::Miss, Bytes::new()))
            }
        }
    }

    /// `settle`, a value's reply split off `blocks` (where `read` appended it).
    fn settle_reply(&self, req: &Request, got: Got, blocks: &mut BytesMut, as_sent: impl FnOnce() -> Reply) -> Reply {
        self.settle(req, got, as_sent)
            .unwrap_or_else(|| hit(blocks.split().freeze()))
    }

    async fn get(&self, req: &Request) -> Reply {
        let mut tries = 0;
        loop {
            let reply = self.target.route(&self.meta_get(&req.key)).await;
            let mut block = BytesMut::new();
            match self.read(req, &reply.wire, &mut block) {
                Got::Held if tries < self.retries => {
                    tries += 1;
                    self.stats().lease_waits.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(self.wait).await;
                }
                got => return self.settle_reply(req, got, &mut block, || reply),
            }
        }
    }

    /// The keys of a multi-key get: each as `get` would answer it, in order. Each round sends the
    /// `mg`s of the keys left as one batch per server (`meta_gets`); the keys held by another
    /// client then wait `lease_wait_ms` together and are asked again. Every key of a round has
    /// been held as often as the others, so `tries` counts each key's retries, as in `get`.
    async fn get_many(&self, reqs: Vec<&Request>) -> Vec<Reply> {
        let answers: Vec<Option<Reply>> = vec![None; reqs.len()];
        let asking: Vec<usize> = (0..reqs.len()).collect();
        self.rounds(&reqs, answers, asking, 0).await
    }

    /// `get_many`'s rounds, from the one where `asking` are left unanswered after `tries` retries.
    async fn rounds(
        &self,
        reqs: &[&Request],
        mut answers: Vec<Option<Reply>>,
        mut asking: Vec<usize>,
        mut tries: u32,
    ) -> Vec<Reply> {
        while !asking.is_empty() {
            let keys: Vec<&Bytes> = asking.iter().map(|&i| &reqs[i].key).collect();
            let replies = self.meta_gets(&keys).await;
            // room for every key's VALUE block (its value, key and numbers): one allocation a round
            let room = replies
                .iter()
                .zip(&keys)
                .map(|(r, k)| r.wire.len() + k.len() + 64)
                .sum();
            let mut blocks = BytesMut::with_capacity(room);
            let mut held = Vec::new();
            for (&i, reply) in asking.iter().zip(replies) {
                match self.read(reqs[i], &reply.wire, &mut blocks) {
                    Got::Held if tries < self.retries => held.push(i),
                    got => answers[i] = Some(self.settle_reply(reqs[i], got, &mut blocks, || reply)),
                }
            }
            if !held.is_empty() {
                tries += 1;
                self.stats().lease_waits.fetch_add(held.len() as u64, Ordering::Relaxed);
                tokio::time::sleep(self.wait).await;
            }
            asking = held;
        }
        answers.into_iter().map(|a| a.expect("every key settled")).collect()
    }

    /// `get_many` for all the keys of a client's get, the hits' `VALUE` blocks written straight
    /// into the client's answer `out`, in order (no reply per key to make, copy and drop): each
    /// key's result. When every key asks one server first — the common case — its batch of
    /// replies is read where it lies, as the server sent it.
    async fn get_many_into(&self, reqs: &[Request], out: &mut BytesMut) -> Vec<Res> {
        let keys: Vec<&Bytes> = reqs.iter().map(|r| &r.key).collect();
        let batches = self.batches(&keys);
        let replies = match &batches[..] {
            [(dest, members)] if members.len() == keys.len() => {
                match dest.send_meta_batch(&self.mg_frame, &keys).await {
                    Ok(batch) => {
                        let views: Vec<(Res, &[u8])> = batch.iter().collect();
                        dest.count_gets(&self.mg_frame, views.iter().map(|v| v.0));
                        if !views.iter().any(|(res, _)| res.is_failover_error()) {
                            return self.answer_into(reqs, &views, out).await;
                        }
                        let kept = batch.into_replies().into_iter();
                        self.route_rest(&keys, kept.map(|r| (!r.res.is_failover_error()).then_some(r)).collect())
                            .await
                    }
                    Err(failed) if failed.res.is_failover_error() => {
                        self.route_rest(&keys, vec![None; keys.len()]).await
                    }
                    Err(failed) => vec![failed; keys.len()],
                }
            }
            _ => self.send_batches(&keys, batches).await,
        };
        let views: Vec<(Res, &[u8])> = replies.iter().map(|r| (r.res, &r.wire[..])).collect();
        self.answer_into(reqs, &views, out).await
    }

    /// `get_many_into` once each key's reply is in (`views`: its result and bytes, in order). When
    /// no key is held by another client, one pass does it; otherwise the blocks written so far
    /// become per-key replies, and the rounds go on as in `get_many` before the blocks are
    /// written in order.
    async fn answer_into(&self, reqs: &[Request], views: &[(Res, &[u8])], out: &mut BytesMut) -> Vec<Res> {
        // room for every key's VALUE block (its value, key and numbers)
        out.reserve(
            views
                .iter()
                .zip(reqs)
                .map(|((_, w), r)| w.len() + r.key.len() + 64)
                .sum(),
        );
        let start = out.len();
        let mut results = Vec::with_capacity(reqs.len());
        // where each key's block ends in `out` (needed only if some key waits)
        let mut ends = Vec::with_capacity(reqs.len());
        let mut held = Vec::new();
        let mut others = Vec::new();
        for (i, (req, &(res, wire))) in reqs.iter().zip(views).enumerate() {
            let as_sent = || Reply::new(res, Bytes::copy_from_slice(wire));
            let res = match self.read(req, wire, out) {
                Got::Held if self.retries > 0 => {
                    held.push(i);
                    Res::Miss
                }
                got => match self.settle(req, got, as_sent) {
                    None => Res::Found,
                    Some(r) if r.res.is_hit() => {
                        out.extend_from_slice(&r.wire);
                        Res::Found
                    }
                    Some(r) => {
                        let res = r.res;
                        others.push((i, r));
                        res
                    }
                },
            };
            results.push(res);
            ends.push(out.len());
        }
        if held.is_empty() {
            return results;
        }
        let written = out.split_off(start).freeze();
        let mut answers: Vec<Option<Reply>> = vec![None; reqs.len()];
        let mut from = 0;
        for (i, &end) in ends.iter().enumerate() {
            if results[i].is_hit() {
                answers[i] = Some(hit(written.slice(from..end)));
            }
            from = end;
        }
        for (i, r) in others {
            answers[i] = Some(r);
        }
        self.stats().lease_waits.fetch_add(held.len() as u64, Ordering::Relaxed);
        tokio::time::sleep(self.wait).await;
        let refs: Vec<&Request> = reqs.iter().collect();
        let replies = self.rounds(&refs, answers, held, 1).await;
        for reply in &replies {
            if reply.res.is_hit() {
                out.extend_from_slice(&reply.wire);
            }
        }
        replies.into_iter().map(|r| r.res).collect()
    }

    /// The replies to the `mg`s of `keys`, in order (`send_batches` of their `batches`).
    async fn meta_gets(&self, keys: &[&Bytes]) -> Vec<Reply> {
        self.send_batches(keys, self.batches(keys)).await
    }

    /// The keys whose route asks one server first, grouped by that server (each group goes to it
    /// as one batch: one write, one wait; the router's cost per key is what made a multi-key get
    /// dear). A key with no such server is in no group.
    fn batches(&self, keys: &[&Bytes]) -> Vec<(&Destination, Vec<usize>)> {
        // one request, its key changed per key: no per-key request to build for the batched ones
        let mut mg = self.meta_get(&Bytes::new());
        let mut batches: Vec<(&Destination, Vec<usize>)> = Vec::new();
        for (i, &key) in keys.iter().enumerate() {
            mg.key = key.clone();
            let Some(dest) = self.target.first_get_target(&mg) else {
                continue;
            };
            match batches.iter_mut().find(|(d, _)| std::ptr::eq(*d, dest)) {
                Some((_, members)) => members.push(i),
                None => {
                    // room for every key left: one server often has them all
                    let mut members = Vec::with_capacity(keys.len() - i);
                    members.push(i);
                    batches.push((dest, members));
                }
            }
        }
        batches
    }

    /// The replies to the `mg`s of `keys`, in order: each of `batches` sent to its server, all
    /// servers at once; the keys in no batch, and those whose batch failed with an error that
    /// fails over, take the full route, as `get` sends them (`route_rest`).
    async fn send_batches(&self, keys: &[&Bytes], batches: Vec<(&Destination, Vec<usize>)>) -> Vec<Reply> {
        let frame = &self.mg_frame;
        let sent: Vec<Vec<Reply>> = match &batches[..] {
            // one server first for every key: its replies are the answer, in order, with no join,
            // regrouping or second pass over the keys to allocate for
            [(dest, members)] if members.len() == keys.len() => {
                let replies = dest.send_meta_gets(frame, keys).await;
                if !replies.iter().any(|r| r.res.is_failover_error()) {
                    return replies;
                }
                vec![replies]
            }
            _ => {
                join_all(batches.iter().map(|(dest, members)| async move {
                    let batch: Vec<&Bytes> = members.iter().map(|&i| keys[i]).collect();
                    dest.send_meta_gets(frame, &batch).await
                }))
                .await
            }
        };
        let mut replies: Vec<Option<Reply>> = vec![None; keys.len()];
        for ((_, members), got) in batches.iter().zip(sent) {
            for (&i, reply) in members.iter().zip(got) {
                if !reply.res.is_failover_error() {
                    replies[i] = Some(reply);
                }
            }
        }
        self.route_rest(keys, replies).await
    }

    /// `replies`, the keys without one (`None`) sent each on the full route, all at once.
    async fn route_rest(&self, keys: &[&Bytes], mut replies: Vec<Option<Reply>>) -> Vec<Reply> {
        let rest: Vec<usize> = (0..keys.len()).filter(|&i| replies[i].is_none()).collect();
        let mgs: Vec<Request> = rest.iter().map(|&i| self.meta_get(keys[i])).collect();
        let routed = join_all(mgs.iter().map(|mg| self.target.route(mg))).await;
        for (i, reply) in rest.into_iter().zip(routed) {
            replies[i] = Some(reply);
        }
        replies.into_iter().map(|r| r.expect("every mg answered")).collect()
    }

    async fn set(&self, req: &Request, token: u64) -> Reply {
        let mut ms = Request::simple(Cmd::MetaSet, req.key.clone());
        ms.value = req.value.clone();
        ms.meta = vec![
            Bytes::from(format!("F{}", req.client_flags)),
            Bytes::from(format!("T{}", req.exptime)),
            Bytes::from(format!("C{token}")),
        ];
        let reply = fill_reply(self.target.route(&ms).await);
        match reply.res {
            Res::Stored => self.stats().lease_fills_stored.fetch_add(1, Ordering::Relaxed),
            Res::NotStored => self.stats().lease_fills_refused.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        reply
    }
}

impl Drop for TransparentLease {
    /// A reloaded config drops its handles: their tokens leave the `lease_tokens` gauge with them.
    fn drop(&mut self) {
        let held = self.tokens.lock().unwrap_or_else(|e| e.into_inner()).map.len() as u64;
        self.stats().lease_tokens.fetch_sub(held, Ordering::Relaxed);
    }
}

impl Route for TransparentLease {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.target, req);
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        let plain = plain(req);
        match req.cmd {
            Cmd::Get | Cmd::Gets if plain => Box::pin(self.get(req)),
            Cmd::Set if plain => match self.take(&req.key) {
                Some(token) => Box::pin(self.set(req, token)),
                None => self.target.route(req),
            },
            _ if plain && self.marks_stale(req) => Box::pin(self.mark_stale(req)),
            _ => self.target.route(req),
        }
    }

    fn route_multi_get<'a>(&'a self, reqs: Vec<&'a Request>) -> BoxFuture<'a, Vec<Reply>> {
        if reqs.iter().all(|r| matches!(r.cmd, Cmd::Get | Cmd::Gets) && plain(r)) {
            Box::pin(self.get_many(reqs))
        } else {
            super::route_each(self, reqs)
        }
    }

    fn route_multi_get_into<'a>(
        &'a self,
        reqs: &'a [Request],
        out: &'a mut BytesMut,
    ) -> Option<BoxFuture<'a, Vec<Res>>> {
        if !reqs.iter().all(|r| matches!(r.cmd, Cmd::Get | Cmd::Gets) && plain(r)) {
            return None;
        }
        Some(Box::pin(self.get_many_into(reqs, out)))
    }
}

/// A value's classic block as a key's reply.
fn hit(block: Bytes) -> Reply {
    let mut r = Reply::new(Res::Found, block);
    r.values = 1;
    r
}

/// `mg KEY v f c N<lease_ttl>`: value, flags, CAS, and a lease on a miss.
fn meta_get(key: Bytes, lease_flag: &Bytes) -> Request {
    let mut r = Request::simple(Cmd::MetaGet, key);
    r.meta = vec![
        Bytes::from_static(b"v"),
        Bytes::from_static(b"f"),
        Bytes::from_static(b"c"),
        lease_flag.clone(),
    ];
    r
}

/// A request the handle may change: not one recorded by `__mcrouter__.route`, nor a too-large set.
fn plain(req: &Request) -> bool {
    req.recording.is_none() && !req.too_large
}

pub const TRANSPARENT_LEASE_ROUTE: Handle = Handle {
    name: "TransparentLeaseRoute",
    build,
    shorthand: None,
    fields: &[
        "target",
        "lease_ttl",
        "lease_wait_ms",
        "lease_retries",
        "max_tokens",
        "stale_ttl",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let target = b.route(required(obj, "target", "TransparentLeaseRoute")?)?;
    let field = |name: &str, default: i64, min: i64| -> Result<i64, String> {
        let v = get_i64(obj, name)?.unwrap_or(default);
        if v < min {
            return Err(format!(
                "TransparentLeaseRoute: `{name}` must be at least {min}, not {v}"
            ));
        }
        Ok(v)
    };
    let lease_ttl = field("lease_ttl", 10, 1)?;
    let wait_ms = field("lease_wait_ms", 20, 0)?;
    let retries = field("lease_retries", 10, 0)?;
    let max_tokens = field("max_tokens", 100_000, 1)?;
    let stale_ttl = field("stale_ttl", 0, 0)?;
    Ok(Arc::new(TransparentLease::new(
        target,
        lease_ttl,
        Duration::from_millis(wait_ms as u64),
        retries.min(u32::MAX as i64) as u32,
        max_tokens as usize,
        stale_ttl,
        b.ctx().clone(),
    )))
}
