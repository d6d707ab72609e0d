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
//! Servers are shared by address across pools and across config reloads, so a reload keeps
//! connections and TKO state. A server dropped from the config is retired: its recovery stops, and
//! its connection task ends once nothing refers to it any more.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use std::pin::Pin;
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot};

use crate::auth::{self, NotReady, UpstreamLogin};
use crate::options::Options;
use crate::protocol::reply::{parse_reply, parse_reply_counted};
use crate::protocol::{Cmd, Reply, ReplyKind, Request, Res};
use crate::stats::Stats;

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
/// A batch write is cut at this size.
const MAX_BATCH: usize = 256 * 1024;

struct Job {
    data: Bytes,
    kind: ReplyKind,
    reply: oneshot::Sender<Reply>,
}

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

/// A connection to a server: plaintext, or TLS for a pool with `"security_mech": "tls"`.
pub enum ServerStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for ServerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection to `addr` (over TLS with `tls`), made ready for requests (`auth::prepare`: logged
/// in with `login`, or found not to demand a login) within `connect_timeout`: the one way server
/// connections and probe connections are opened. The error carries the reply code for the
/// requests waiting on it.
async fn open(
    addr: &str,
    tls: Option<Arc<crate::tls::Upstream>>,
    login: Option<&UpstreamLogin>,
    connect_timeout: Duration,
) -> Result<ServerStream, (Res, NotReady)> {
    let attempt = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| NotReady::Failed(format!("connect error: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let mut stream = match tls {
            None => ServerStream::Plain(tcp),
            Some(tls) => ServerStream::Tls(Box::new(tls.connect(addr, tcp).await.map_err(NotReady::Failed)?)),
        };
        let tls = matches!(stream, ServerStream::Tls(_));
        auth::prepare(&mut stream, login).await.map_err(|e| match e {
            // TLS 1.3: a server that refuses the router's certificate (or its lack of one) says so
            // only after the handshake, in an alert read with the first answer
            NotReady::Failed(m) if tls && m.contains("alert") => NotReady::Failed(format!(
                "TLS: the server refused the router after the handshake ({m}): does it demand a client certificate (--pem-cert-path) from another CA?"
            )),
            // memcached -Z resets a connection whose first bytes are not a TLS handshake
            NotReady::Failed(m) if !tls && plaintext_refused(&m) => NotReady::Failed(format!(
                "{m}: the server may require TLS (memcached -Z): set \"security_mech\": \"tls\" on its pool (with --pem-ca-path)"
            )),
            e => e,
        })?;
        Ok(stream)
    };
    match tokio::time::timeout(connect_timeout, attempt).await {
        Ok(opened) => opened.map_err(|e| (Res::ConnectError, e)),
        Err(_) => Err((Res::ConnectTimeout, NotReady::Failed("connect timeout".to_string()))),
    }
}

/// A plaintext first exchange that a TLS-only server answers by closing the connection (or with a
/// TLS alert record, 0x15 0x03).
fn plaintext_refused(message: &str) -> bool {
    [
        "reset by peer",
        "connection closed",
        "unexpected answer to version: \u{15}\u{3}",
    ]
    .iter()
    .any(|m| message.contains(m))
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
            Ok(ServerStream::Plain(stream)) => {
                let (rd, wr) = stream.into_split();
                serve(rd, wr, first, &mut rx).await;
                continue;
            }
            Ok(ServerStream::Tls(stream)) => {
                let (rd, wr) = tokio::io::split(*stream);
                serve(rd, wr, first, &mut rx).await;
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

/// The reading half of a server connection.
trait ReadHalf: Send + 'static {
    /// Read what arrives into `buf` (waiting for it): the count, 0 at the end of the stream.
    fn read_some(&mut self, buf: &mut BytesMut) -> impl Future<Output = std::io::Result<usize>> + Send;
}

impl ReadHalf for OwnedReadHalf {
    async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        loop {
            self.readable().await?;
            if let Some(n) = read_ready(self.as_ref(), buf)? {
                return Ok(n);
            }
        }
    }
}

impl ReadHalf for tokio::io::ReadHalf<tokio_rustls::client::TlsStream<TcpStream>> {
    async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        self.read_buf(buf).await
    }
}

async fn serve<R: ReadHalf, W: AsyncWrite + Unpin>(rd: R, mut wr: W, first: Job, rx: &mut mpsc::Receiver<Job>) {
    let (ptx, prx) = mpsc::unbounded_channel();
    let (dead_tx, mut dead_rx) = oneshot::channel::<()>();
    let reader = tokio::spawn(read_loop(rd, prx, dead_tx));
    let mut next = Some(first);
    let mut wbuf = BytesMut::new();
    loop {
        let job = match next.take() {
            Some(j) => j,
            None => tokio::select! {
                j = rx.recv() => match j { Some(j) => j, None => break },
                _ = &mut dead_rx => break,
            },
        };
        let mut job = Some(job);
        while let Some(j) = job.take() {
            wbuf.extend_from_slice(&j.data);
            if let Err(mpsc::error::SendError((_, reply))) = ptx.send((j.kind, j.reply)) {
                let _ = reply.send(Reply::error(Res::ConnectError, "connection to server lost"));
            }
            if wbuf.len() < MAX_BATCH {
                job = rx.try_recv().ok();
            }
        }
        if wr.write_all(&wbuf).await.is_err() || wr.flush().await.is_err() {
            break;
        }
        wbuf.clear();
    }
    // Pending requests' senders drop with the reader: their callers see a connection error.
    reader.abort();
}

type Pending = (ReplyKind, oneshot::Sender<Reply>);

/// Read what the socket has into `buf` after it reported readable: `Ok(None)` if nothing was there.
///
/// A read that came back short means the socket is drained, so readiness is cleared right away
/// (tokio only clears it if no new event arrived meanwhile); this saves the extra would-block
/// `read` per wake-up that a plain read loop pays, which matters at one request per round trip.
pub fn read_ready(stream: &TcpStream, buf: &mut BytesMut) -> std::io::Result<Option<usize>> {
    let spare = buf.capacity() - buf.len();
    let mut got = None;
    let r = stream.try_io(tokio::io::Interest::READABLE, || {
        let n = stream.try_read_buf(buf)?;
        got = Some(n);
        if n > 0 && n < spare {
            Err(std::io::ErrorKind::WouldBlock.into())
        } else {
            Ok(())
        }
    });
    match (r, got) {
        (_, Some(n)) => Ok(Some(n)),
        (Err(e), None) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        (Err(e), None) => Err(e),
        (Ok(()), None) => Ok(None),
    }
}

async fn read_loop<R: ReadHalf>(mut rd: R, mut prx: mpsc::UnboundedReceiver<Pending>, _dead: oneshot::Sender<()>) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut pending: VecDeque<Pending> = VecDeque::new();
    loop {
        while !buf.is_empty() {
            if pending.is_empty() {
                while let Ok(p) = prx.try_recv() {
                    pending.push_back(p);
                }
            }
            let Some((kind, _)) = pending.front() else {
                return; // a reply nobody asked for: out of sync
            };
            match parse_reply_counted(&buf, *kind) {
                Ok(Some((res, consumed, keep, values))) => {
                    let chunk = buf.split_to(consumed).freeze();
                    let (_, tx) = pending.pop_front().expect("front exists");
                    let mut reply = Reply::new(res, chunk.slice(..keep));
                    reply.values = values;
                    let _ = tx.send(reply);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match rd.read_some(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
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
