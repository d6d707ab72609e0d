//! The server pool: one pipelined connection per memcached server, timeouts and TKO.
//!
//! Requests to one server go through a queue to a writer that batches everything queued into one
//! write; a reader matches replies to requests by order (every forwarded request is answered, see
//! `protocol::request`). A caller waits at most its timeout. Failure handling follows mcrouter:
//! a connect error or connect timeout marks the server TKO ("technical knockout") at once; three
//! consecutive timeouts do too. While TKO, requests fail immediately so failover routes (gutter)
//! take over without waiting; a prober sends `version` on a fresh connection, first after the
//! initial delay, then with delays growing x1.5 (with jitter) to the maximum. After the first
//! success the server's spooled deletes are replayed, and only then is TKO cleared: a server that
//! missed deletes never serves reads before it has them. A server is also taken out ("held") when
//! a delete for it is spooled while it is up (a timeout), until that delete is replayed.
//!
//! The connection itself — opening it, the batching writer, the reader — is `server::connection`;
//! this module decides when one is opened and what its failures mean.
//!
//! Servers are shared by address across pools and across config reloads, so a reload keeps
//! connections and TKO state. A server dropped from the config is retired: its recovery stops, and
//! its connection task ends once nothing refers to it any more.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use std::pin::Pin;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::auth::NotReady;
use crate::options::Options;
use crate::protocol::reply::parse_reply;
use crate::protocol::{Cmd, Reply, ReplyKind, Request, Res};
use crate::stats::Stats;

pub mod connection;
use connection::{Job, open, serve};

/// What a server needs of the process it serves in: the options, the stats it counts TKO in, and
/// the replay of its spooled deletes before it serves again. `crate::context::Context` is it; the
/// server holds it weakly (the Context holds the live servers) and, being given it, does not name it.
pub trait Env: Send + Sync + 'static {
    fn opts(&self) -> &Options;
    fn stats(&self) -> &Stats;
    /// Replay `server`'s spooled deletes, then clear its TKO (`crate::spool::replay::catch_up`).
    fn catch_up<'a>(&'a self, server: &'a Arc<Server>) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>>;
}

/// Consecutive timeouts that make a server TKO.
pub const SOFT_TKO_THRESHOLD: u32 = 3;
/// Requests queued for one server before new ones are refused as `busy`.
const QUEUE_DEPTH: usize = 65_536;

/// One memcached server as seen by the router.
pub struct Server {
    pub addr: String,
    tx: mpsc::Sender<Job>,
    tko: AtomicBool,
    consecutive_timeouts: AtomicU32,
    /// Dropped from the config: probes and replays stop.
    retired: AtomicBool,
    /// The last connection opened (or probe) found that the server demands a login the router does
    /// not have: logged when this changes to true, not per request or probe.
    login_demanded: AtomicBool,
    /// Reached over TLS (its pool's `"security_mech": "tls"`), verified with `--pem-ca-path`.
    pub tls: bool,
    /// Requests outstanding and reply latency (`crate::load`), kept on every request for LoadBalancerRoute.
    pub load: crate::load::Load,
    ctx: Weak<dyn Env>,
}

pub fn reply_kind(cmd: Cmd) -> ReplyKind {
    match cmd {
        Cmd::Get | Cmd::Gets | Cmd::Gat | Cmd::Gats => ReplyKind::Values,
        Cmd::MetaGet | Cmd::MetaArith | Cmd::LeaseGet => ReplyKind::Meta,
        _ => ReplyKind::Line,
    }
}

fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    // 0.9x .. 1.1x
    d.mul_f64(0.9 + (nanos % 1000) as f64 / 5000.0)
}

/// A meta get `mg` encoded once around an empty key (`encode` puts the key after the command's
/// first space): each key of a batch then costs two copies, not a request of its own.
pub struct MetaGetFrame {
    before: Bytes,
    after: Bytes,
    /// Whether the pool counts its keys' hits and misses (`Request::counts_as_get`).
    pub counts_as_get: bool,
}

impl MetaGetFrame {
    pub fn new(mg: &Request) -> MetaGetFrame {
        debug_assert_eq!(reply_kind(mg.cmd), ReplyKind::Meta);
        let mut around = BytesMut::new();
        Request {
            key: Bytes::new(),
            ..mg.clone()
        }
        .encode(&mut around);
        let at = around
            .iter()
            .position(|&b| b == b' ')
            .map_or(around.len(), |space| space + 1);
        let after = around.split_off(at).freeze();
        MetaGetFrame {
            before: around.freeze(),
            after,
            counts_as_get: mg.counts_as_get(),
        }
    }
}

/// The replies to a batch of meta gets (`Server::send_meta_batch`), back to back as the server sent
/// them; the reader framed the batch reply by reply already.
pub struct MetaReplies {
    wire: Bytes,
    n: usize,
}

/// What `MetaReplies::iter` gives for a reply that cannot be framed (only a bug makes one: the
/// reader framed the batch with the same parser).
const MALFORMED_MG: &[u8] = b"SERVER_ERROR malformed batched mg reply\r\n";

impl MetaReplies {
    /// Each key's reply, in order: its result and its bytes, read in place.
    pub fn iter(&self) -> impl Iterator<Item = (Res, &[u8])> + '_ {
        let mut rest = &self.wire[..];
        (0..self.n).map(move |_| match parse_reply(rest, ReplyKind::Meta) {
            Ok(Some((res, consumed, keep))) => {
                let one = &rest[..keep];
                rest = &rest[consumed..];
                (res, one)
            }
            _ => {
                rest = &[];
                (Res::RemoteError, MALFORMED_MG)
            }
        })
    }

    /// A reply per key (each a slice of the batch, no copy).
    pub fn into_replies(self) -> Vec<Reply> {
        self.iter()
            .map(|(res, one)| {
                // (the same bytes whether a server sent them or `iter` made them)
                let wire = if one == MALFORMED_MG {
                    Bytes::from_static(MALFORMED_MG)
                } else {
                    self.wire.slice_ref(one)
                };
                Reply::new(res, wire)
            })
            .collect()
    }
}

impl Server {
    pub fn new<E: Env>(addr: String, tls: bool, ctx: &Arc<E>) -> Arc<Server> {
        let ctx: Weak<E> = Arc::downgrade(ctx);
        let ctx: Weak<dyn Env> = ctx;
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let server = Arc::new(Server {
            addr,
            tx,
            tko: AtomicBool::new(false),
            consecutive_timeouts: AtomicU32::new(0),
            retired: AtomicBool::new(false),
            login_demanded: AtomicBool::new(false),
            tls,
            load: crate::load::Load::default(),
            ctx,
        });
        // The connection task holds the server weakly: it ends when the server is dropped.
        tokio::spawn(run(Arc::downgrade(&server), rx));
        server
    }

    pub fn is_tko(&self) -> bool {
        self.tko.load(Relaxed)
    }

    /// Send one request and wait for its reply, at most `timeout`.
    pub async fn send(self: &Arc<Self>, req: &Request, timeout: Duration) -> Reply {
        let mut data = BytesMut::new();
        req.encode(&mut data);
        self.send_raw(data.freeze(), reply_kind(req.cmd), timeout).await
    }

    /// One classic multi-key `get`/`gets` for keys that all live here: the VALUE blocks, no END.
    pub async fn send_multi_get(self: &Arc<Self>, gets: bool, keys: &[&Bytes], timeout: Duration) -> Reply {
        let mut data = BytesMut::with_capacity(8 + keys.iter().map(|k| k.len() + 1).sum::<usize>());
        data.extend_from_slice(if gets { Cmd::Gets } else { Cmd::Get }.name().as_bytes());
        for k in keys {
            data.extend_from_slice(b" ");
            data.extend_from_slice(k);
        }
        data.extend_from_slice(b"\r\n");
        self.send_raw(data.freeze(), ReplyKind::Values, timeout).await
    }

    /// The meta get `mg` for each of `keys` (which all live here), as one job: one write, one wait
    /// for all their replies (a multi-key get's keys through TransparentLeaseRoute), instead of one
    /// of each per key. Their replies, in order; a failure of the batch (timeout, lost connection)
    /// is every key's.
    pub async fn send_meta_gets(self: &Arc<Self>, mg: &Request, keys: &[&Bytes], timeout: Duration) -> Vec<Reply> {
        self.send_framed_meta_gets(&MetaGetFrame::new(mg), keys, timeout).await
    }

    /// `send_meta_gets` with the `mg` encoded already (a route that batches on every multi-key get
    /// encodes it once, not per batch).
    pub async fn send_framed_meta_gets(
        self: &Arc<Self>,
        frame: &MetaGetFrame,
        keys: &[&Bytes],
        timeout: Duration,
    ) -> Vec<Reply> {
        match self.send_meta_batch(frame, keys, timeout).await {
            Ok(batch) => batch.into_replies(),
            Err(failed) => vec![failed; keys.len()],
        }
    }

    /// The `mg`s of `keys` as one job, their replies kept as the server sent them, back to back
    /// (read in place with `MetaReplies::iter`: no reply object per key); `Err` when the batch
    /// failed as a whole (timeout, lost connection), which is every key's answer.
    pub async fn send_meta_batch(
        self: &Arc<Self>,
        frame: &MetaGetFrame,
        keys: &[&Bytes],
        timeout: Duration,
    ) -> Result<MetaReplies, Reply> {
        let (before, after) = (&frame.before[..], &frame.after[..]);
        let mut data = BytesMut::with_capacity(keys.iter().map(|k| k.len() + before.len() + after.len()).sum());
        for key in keys {
            data.extend_from_slice(before);
            data.extend_from_slice(key);
            data.extend_from_slice(after);
        }
        let n = keys.len();
        let batch = self.send_raw(data.freeze(), ReplyKind::Metas(n as u32), timeout).await;
        if batch.res.is_error() {
            return Err(batch);
        }
        Ok(MetaReplies { wire: batch.wire, n })
    }

    /// A command that is not routed by key (e.g. `flush_all`, one line ending in CRLF), answered
    /// with one line.
    pub async fn send_line(self: &Arc<Self>, line: Bytes, timeout: Duration) -> Reply {
        self.send_raw(line, ReplyKind::Line, timeout).await
    }

    /// Several requests, queued on the connection in the order given before any reply is awaited
    /// (so they reach the server in that order): their replies, in order, all within `timeout`.
    pub async fn send_all(self: &Arc<Self>, reqs: &[Request], timeout: Duration) -> Vec<Reply> {
        let started = tokio::time::Instant::now();
        let deadline = started + timeout;
        let queued: Vec<_> = reqs
            .iter()
            .map(|req| {
                let mut data = BytesMut::new();
                req.encode(&mut data);
                let flight = self.load.start(started.into_std());
                self.enqueue(data.freeze(), reply_kind(req.cmd)).map(|rx| (rx, flight))
            })
            .collect();
        let mut replies = Vec::with_capacity(queued.len());
        for q in queued {
            replies.push(match q {
                Ok((rx, flight)) => self.wait(rx, deadline, flight).await,
                Err(busy) => busy,
            });
        }
        replies
    }

    fn enqueue(&self, data: Bytes, kind: ReplyKind) -> Result<oneshot::Receiver<Reply>, Reply> {
        let (tx, rx) = oneshot::channel();
        match self.tx.try_send(Job { data, kind, reply: tx }) {
            Ok(()) => Ok(rx),
            Err(_) => Err(Reply::error(Res::Busy, "busy: server queue full")),
        }
    }

    async fn send_raw(self: &Arc<Self>, data: Bytes, kind: ReplyKind, timeout: Duration) -> Reply {
        let started = tokio::time::Instant::now();
        // outstanding from here (a refused one is dropped at once: not counted, not timed)
        let flight = self.load.start(started.into_std());
        match self.enqueue(data, kind) {
            Ok(rx) => self.wait(rx, started + timeout, flight).await,
            Err(busy) => busy,
        }
    }

    /// The reply, or the error that stands for it; a server's reply (or a timeout: the server is at
    /// least that slow) is a latency sample for its load, a failed or lost connection is not.
    async fn wait(
        self: &Arc<Self>,
        rx: oneshot::Receiver<Reply>,
        deadline: tokio::time::Instant,
        flight: crate::load::InFlight<'_>,
    ) -> Reply {
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reply)) => {
                // a failed connect is answered by the router itself, at once: not the server's speed
                if !matches!(reply.res, Res::ConnectError | Res::ConnectTimeout) {
                    flight.answered();
                }
                if !reply.res.is_failover_error() || reply.res == Res::RemoteError {
                    self.consecutive_timeouts.store(0, Relaxed);
                }
                reply
            }
            Ok(Err(_)) => Reply::error(Res::ConnectError, "connection to server lost"),
            Err(_) => {
                flight.answered();
                let n = self.consecutive_timeouts.fetch_add(1, Relaxed) + 1;
                if n >= SOFT_TKO_THRESHOLD {
                    self.mark_tko(&format!("{n} consecutive timeouts"));
                }
                Reply::error(Res::Timeout, "timeout")
            }
        }
    }

    /// Out of rotation after a failure: requests fail fast until a probe succeeds and the server's
    /// spooled deletes are replayed.
    fn mark_tko(self: &Arc<Self>, why: &str) {
        self.take_out(why, false);
    }

    /// Out of rotation because a delete for it was spooled while it was up (see `crate::ack`): until
    /// the spool is replayed to it, which starts at once.
    pub fn hold(self: &Arc<Self>, why: &str) {
        self.take_out(why, true);
    }

    fn take_out(self: &Arc<Self>, why: &str, now: bool) {
        if self.tko.swap(true, Relaxed) {
            return;
        }
        let Some(ctx) = self.ctx.upgrade() else {
            return;
        };
        ctx.stats().tko_events.fetch_add(1, Relaxed);
        if now {
            eprintln!(
                "squeal-router: server {} held out of rotation ({why}) until its spooled deletes are replayed",
                self.addr
            );
        } else {
            eprintln!(
                "squeal-router: server {} marked TKO ({why}); failing fast until a probe succeeds",
                self.addr
            );
        }
        tokio::spawn(self.clone().recover(ctx, now));
    }

    /// Probe (at once if `now`, else after the initial delay, then x1.5 to the maximum) until the
    /// server answers and its spooled deletes are replayed (`spool::replay::catch_up` clears TKO then).
    async fn recover(self: Arc<Self>, ctx: Arc<dyn Env>, now: bool) {
        let mut delay = if now { Duration::ZERO } else { ctx.opts().probe_initial };
        loop {
            if !delay.is_zero() {
                tokio::time::sleep(jitter(delay)).await;
            }
            if self.retired.load(Relaxed) {
                return;
            }
            if self.probe(&*ctx).await && ctx.catch_up(&self).await {
                return;
            }
            delay = if delay.is_zero() {
                ctx.opts().probe_initial
            } else {
                delay.mul_f64(1.5).min(ctx.opts().probe_max)
            };
        }
    }

    /// Back in rotation: the probe answered and no spooled delete is left for it.
    pub fn clear_tko(&self) {
        self.consecutive_timeouts.store(0, Relaxed);
        if !self.tko.swap(false, Relaxed) {
            return;
        }
        if let Some(ctx) = self.ctx.upgrade() {
            ctx.stats().tko_recoveries.fetch_add(1, Relaxed);
        }
        eprintln!(
            "squeal-router: server {} is back (probe answered, spooled deletes replayed); TKO cleared",
            self.addr
        );
    }

    /// Dropped from the config: stop probing it (requests already routed to it still finish).
    pub fn retire(&self) {
        self.retired.store(true, Relaxed);
    }

    async fn probe(&self, ctx: &dyn Env) -> bool {
        let opened = open(
            &self.addr,
            self.tls_config(ctx),
            ctx.opts().upstream_login.as_ref(),
            ctx.opts().connect_timeout,
        )
        .await;
        self.note_opened(&opened);
        let Ok(mut s) = opened else {
            return false;
        };
        if ctx.opts().upstream_login.is_none() {
            return true; // `open` asked `version` already (auth::prepare) and got `VERSION`
        }
        let attempt = async {
            s.write_all(b"version\r\n").await.ok()?;
            let mut buf = [0u8; 128];
            let n = s.read(&mut buf).await.ok()?;
            buf[..n].starts_with(b"VERSION").then_some(())
        };
        matches!(
            tokio::time::timeout(ctx.opts().server_timeout, attempt).await,
            Ok(Some(()))
        )
    }

    /// The TLS setup to reach this server with, if it is reached over TLS.
    fn tls_config(&self, ctx: &dyn Env) -> Option<Arc<crate::tls::Upstream>> {
        if self.tls {
            ctx.opts().upstream_tls.clone()
        } else {
            None
        }
    }

    /// After a connection (or probe) was opened: say so once when the server starts demanding a
    /// login the router does not have (nothing is sent to it then; it is TKO until it stops).
    fn note_opened<T>(&self, opened: &Result<T, (Res, NotReady)>) {
        let demanded = match opened {
            Ok(_) => false,
            Err((_, NotReady::LoginDemanded)) => true,
            Err(_) => return, // not known
        };
        if self.login_demanded.swap(demanded, Relaxed) != demanded && demanded {
            eprintln!(
                "squeal-router: ERROR: server {} demands a login (it answers CLIENT_ERROR unauthenticated, \
                 as memcached -Y does): the router sends it no client request; start the router with \
                 --upstream-auth-file",
                self.addr
            );
        }
    }
}

/// Connection manager: connects on demand, serves until the connection breaks, repeats; ends when
/// the server is dropped (its queue closes).
async fn run(server: Weak<Server>, mut rx: mpsc::Receiver<Job>) {
    while let Some(first) = rx.recv().await {
        let Some((addr, tls, connect_timeout, login)) = server.upgrade().and_then(|s| {
            let ctx = s.ctx.upgrade()?;
            Some((
                s.addr.clone(),
                s.tls_config(&*ctx),
                ctx.opts().connect_timeout,
                ctx.opts().upstream_login.clone(),
            ))
        }) else {
            return;
        };
        // Connect and log in (`--upstream-auth-file`), or find that the server demands no login,
        // before any client request is sent: a server connection is shared by every client, so it
        // is never left to a client's login.
        let opened = open(&addr, tls, login.as_ref(), connect_timeout).await;
        if let Some(s) = server.upgrade() {
            s.note_opened(&opened);
        }
        let failure = match opened {
            Ok(stream) => {
                serve(stream, first, &mut rx).await;
                continue;
            }
            Err((res, why)) => (res, why.to_string()),
        };
        if let Some(s) = server.upgrade() {
            s.mark_tko(&failure.1);
        }
        let _ = first.reply.send(Reply::error(failure.0, &failure.1));
        while let Ok(job) = rx.try_recv() {
            let _ = job.reply.send(Reply::error(failure.0, &failure.1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fake_memcached, run};

    /// What a server needs of its process, for a server alone (the router's is `crate::context`).
    #[derive(Default)]
    struct Alone {
        opts: Options,
        stats: Stats,
    }

    impl Env for Alone {
        fn opts(&self) -> &Options {
            &self.opts
        }
        fn stats(&self) -> &Stats {
            &self.stats
        }
        fn catch_up<'a>(&'a self, _: &'a Arc<Server>) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
            Box::pin(async { true })
        }
    }

    /// A hit for keys starting `hit`, a miss for others.
    fn hit_or_miss(line: &str) -> &'static str {
        match line.split(' ').nth(1) {
            Some(key) if key.starts_with("hit") => "VA 2 f3 c9\r\nEN\r\n",
            _ => "EN\r\n",
        }
    }

    #[test]
    fn meta_gets_go_as_one_batch_and_come_back_one_reply_per_key() {
        run(async {
            let ctx = Arc::new(Alone::default());
            let (addr, seen) = fake_memcached(hit_or_miss).await;
            let server = Server::new(addr, false, &ctx);
            let mut mg = Request::simple(Cmd::MetaGet, Bytes::new());
            mg.meta = vec![Bytes::from_static(b"v"), Bytes::from_static(b"N10")];
            let keys = [
                Bytes::from_static(b"hit1"),
                Bytes::from_static(b"nope"),
                Bytes::from_static(b"hit2"),
            ];
            let keys: Vec<&Bytes> = keys.iter().collect();
            let replies = server.send_meta_gets(&mg, &keys, Duration::from_secs(5)).await;
            let got: Vec<_> = replies.iter().map(|r| (r.res, &r.wire[..])).collect();
            // (a hit's data that looks like a reply, "EN", is data: the batch is framed reply by reply)
            let hit = &b"VA 2 f3 c9\r\nEN\r\n"[..];
            assert_eq!(got, [(Res::Found, hit), (Res::Miss, &b"EN\r\n"[..]), (Res::Found, hit)]);
            let lines = seen.lock().unwrap().clone();
            assert_eq!(
                lines[lines.len() - 3..],
                ["mg hit1 v N10", "mg nope v N10", "mg hit2 v N10"]
            );
        });
    }
}
