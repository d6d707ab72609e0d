//! One client connection: buffered reads, many requests in flight, replies in request order.
//!
//! Requests are parsed from whatever a read brought in (pipelines welcome) and each one becomes a
//! future in an ordered queue, so a pipeline fanned out to many servers is answered in the order
//! it was sent; replies that are ready together go out in one write. `mn` is an ordinary entry in
//! that queue, so it is answered only after everything before it. Idle connections hold no
//! buffers (reads wait for readiness before allocating), which keeps 10,000 idle clients cheap.
//! A multi-key get is batched per server by `multiget`.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future::{FutureExt, join_all};
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::Login;
use crate::config::{RouterConfig, select_route};
use crate::context::Context;
use crate::protocol::binary::{BINARY_REQUEST_MAGIC, binary_refusal};
use crate::protocol::lease;
use crate::protocol::parse::parse_with;
use crate::protocol::reply::{END, first_line_end};
use crate::protocol::{Cmd, Command, ParseOutcome, Reply, Request};
use crate::routes::BoxFuture;
use crate::shared::Shared;

mod multiget;
use multiget::{append_value, multi_get_reply};

/// Requests in flight per connection before the router stops reading from it (backpressure).
const MAX_IN_FLIGHT: usize = 4096;
const READ_CHUNK: usize = 16 * 1024;

type ReplyFuture = BoxFuture<'static, Done>;
/// Writes the client's bytes for one routed request: (context, key as the client sent it,
/// request, reply, write buffer).
type AnswerFn = fn(&Context, &[u8], &Request, Reply, &mut BytesMut);

/// A request whose turn to be answered has come.
enum Done {
    /// Bytes to send as they are.
    Bytes(Bytes),
    /// A routed single-key request; `answer` writes its reply straight into the write buffer.
    Routed {
        answer: AnswerFn,
        /// The key as the client sent it, if routing stripped a prefix from it.
        asked: Option<Bytes>,
        req: Request,
        reply: Reply,
        start: Instant,
    },
    /// An answer the router made from several servers' replies (a multi-key get, `flush_all`).
    Merged { bytes: Bytes, start: Instant },
}

struct Conn {
    shared: Arc<Shared>,
    generation: u64,
    config: Arc<RouterConfig>,
    /// Bytes of a refused value still to discard.
    swallow: usize,
    closing: bool,
    /// Nothing of the connection has been processed yet (a binary-protocol client shows itself by
    /// its first byte).
    fresh: bool,
    /// False until the client has logged in, when the router runs with `--auth-file`.
    authenticated: bool,
    /// The client's address, for log lines.
    peer: String,
    wbuf: BytesMut,
    in_flight: FuturesOrdered<ReplyFuture>,
}

/// A client's byte stream, plaintext or TLS: the connection code is the same for both.
pub trait ClientStream: AsyncWrite + Unpin + Send + 'static {
    /// Wait until `read_now` may find something.
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send + '_;
    /// Read what is there into `buf` without waiting: `Ok(None)` if nothing was, `Ok(Some(0))` at
    /// the end of the stream.
    fn read_now(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<usize>>;
    /// The TCP connection underneath.
    fn tcp(&self) -> &TcpStream;
}

impl ClientStream for TcpStream {
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send + '_ {
        TcpStream::readable(self)
    }
    fn read_now(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<usize>> {
        crate::server::connection::read_ready(self, buf)
    }
    fn tcp(&self) -> &TcpStream {
        self
    }
}

/// A client over TLS. rustls may hold decrypted bytes that the socket no longer shows as
/// readable, so after a read that brought something the next read is tried before waiting.
pub struct TlsClient {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    more: bool,
}

impl TlsClient {
    pub fn new(stream: tokio_rustls::server::TlsStream<TcpStream>) -> TlsClient {
        // the client's first request may have come with its last handshake message
        TlsClient { stream, more: true }
    }
}

impl AsyncWrite for TlsClient {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl ClientStream for TlsClient {
    async fn readable(&self) -> std::io::Result<()> {
        if self.more {
            Ok(())
        } else {
            self.stream.get_ref().0.readable().await
        }
    }
    fn read_now(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<usize>> {
        match self.stream.read_buf(buf).now_or_never() {
            None => {
                self.more = false;
                Ok(None)
            }
            Some(Ok(n)) => {
                self.more = n > 0;
                Ok(Some(n))
            }
            Some(Err(e)) => Err(e),
        }
    }
    fn tcp(&self) -> &TcpStream {
        self.stream.get_ref().0
    }
}

/// Serve one client until it leaves.
pub async fn serve<S: ClientStream>(shared: Arc<Shared>, mut stream: S) {
    // counted in `curr_connections`/`total_connections` by the acceptor (`crate::accept`)
    let _ = stream.tcp().set_nodelay(true);
    let (generation, config) = shared.config();
    let mut conn = Conn {
        shared: shared.clone(),
        generation,
        config,
        swallow: 0,
        closing: false,
        fresh: true,
        authenticated: shared.ctx.opts.client_auth.is_none(),
        peer: stream
            .tcp()
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string()),
        wbuf: BytesMut::new(),
        in_flight: FuturesOrdered::new(),
    };
    if conn.run(&mut stream).await.is_ok() {
        // a TLS client gets its close_notify
        let _ = stream.shutdown().await;
    }
    shared.ctx.stats.curr_connections.fetch_sub(1, Relaxed);
}

async fn write_all<S: ClientStream>(stream: &mut S, buf: &[u8]) -> std::io::Result<()> {
    stream.write_all(buf).await?;
    stream.flush().await
}

impl Conn {
    async fn run<S: ClientStream>(&mut self, stream: &mut S) -> std::io::Result<()> {
        let mut rbuf = BytesMut::new();
        loop {
            if self.in_flight.is_empty() {
                if !self.wbuf.is_empty() {
                    write_all(stream, &self.wbuf).await?;
                    self.wbuf.clear();
                }
                if self.closing {
                    return Ok(());
                }
            }
            let can_read = !self.closing && self.in_flight.len() < MAX_IN_FLIGHT;
            tokio::select! {
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    let mut now = None;
                    self.emit(done, &mut now);
                    self.drain_ready(&mut now);
                    if !self.in_flight.is_empty() {
                        // More replies are due: let the runtime read what the servers have sent
                        // meanwhile, so they leave in this write rather than in a write each.
                        tokio::task::yield_now().await;
                        self.drain_ready(&mut None);
                    }
                    if !self.wbuf.is_empty() {
                        write_all(stream, &self.wbuf).await?;
                        self.wbuf.clear();
                    }
                }
                ready = stream.readable(), if can_read => {
                    ready?;
                    // room for 16 KiB: a command line of up to 16 KiB written at once is read at once,
                    // as memcached reads it (a line cut short by a read is held to 2 KiB, as there)
                    rbuf.reserve(READ_CHUNK);
                    match stream.read_now(&mut rbuf)? {
                        Some(0) => {
                            self.closing = true;
                            continue;
                        }
                        Some(_) => {}
                        None => continue,
                    }
                    let data = rbuf.split().freeze();
                    let used = self.process(&data, Instant::now());
                    if used < data.len() {
                        rbuf.extend_from_slice(&data[used..]);
                    } else if rbuf.capacity() > 4 * READ_CHUNK {
                        rbuf = BytesMut::new();
                    }
                    if rbuf.is_empty() && self.in_flight.is_empty() {
                        // idle: drop the read buffer's memory
                        rbuf = BytesMut::new();
                    }
                }
            }
        }
    }

    /// Move the replies that are ready, in order, into the write buffer (`now` as in `emit`).
    fn drain_ready(&mut self, now: &mut Option<Instant>) {
        while let Some(Some(done)) = self.in_flight.next().now_or_never() {
            self.emit(done, now);
        }
    }

    /// Write one finished request's answer and record its latency. Answers finished together
    /// share one clock reading (`now`, read on first use).
    fn emit(&mut self, done: Done, now: &mut Option<Instant>) {
        let ctx = &self.shared.ctx;
        let start = match done {
            Done::Bytes(b) => {
                self.wbuf.extend_from_slice(&b);
                return;
            }
            Done::Routed {
                answer,
                asked,
                req,
                reply,
                start,
            } => {
                answer(ctx, asked.as_deref().unwrap_or(&req.key), &req, reply, &mut self.wbuf);
                start
            }
            Done::Merged { bytes, start } => {
                self.wbuf.extend_from_slice(&bytes);
                start
            }
        };
        let now = *now.get_or_insert_with(Instant::now);
        ctx.stats.observe_latency(now.saturating_duration_since(start));
    }

    /// Queue a reply that is ready now, behind anything still in flight.
    fn push_ready(&mut self, bytes: Bytes) {
        if self.in_flight.is_empty() {
            self.wbuf.extend_from_slice(&bytes);
        } else {
            self.in_flight
                .push_back(futures_util::future::ready(Done::Bytes(bytes)).boxed());
        }
    }

    /// Handle every complete command in `data` (read at `start`); returns the bytes used.
    fn process(&mut self, data: &Bytes, start: Instant) -> usize {
        let current = self.shared.generation();
        if current != self.generation {
            let (g, c) = self.shared.config();
            self.generation = g;
            self.config = c;
        }
        if self.fresh && !data.is_empty() {
            if data[0] == BINARY_REQUEST_MAGIC {
                // A binary-protocol client: answer "Not supported" in its protocol and close, so it
                // fails at once instead of waiting for its own timeout (see docs/router.md).
                let Some(refusal) = binary_refusal(data) else {
                    return 0; // the rest of the 24-byte header is on its way
                };
                self.shared.ctx.stats.client_errors.fetch_add(1, Relaxed);
                self.push_ready(refusal);
                self.closing = true;
                return data.len();
            }
            if data.len() >= 2 && data[0] == 22 && data[1] == 3 {
                // A TLS ClientHello (record type 22, version 3.x) on a plaintext port: one line
                // naming the client (rate-limited), then close; its TLS library reports the failure.
                self.shared.ctx.stats.client_errors.fetch_add(1, Relaxed);
                crate::tls::PLAINTEXT_PORT.note(
                    &format!("client {}", self.peer),
                    "a TLS client on the plaintext port (it sent a TLS handshake; use an --ssl-port); closed",
                );
                self.closing = true;
                return data.len();
            }
            self.fresh = false;
        }
        let mut pos = 0;
        if self.swallow > 0 {
            let n = self.swallow.min(data.len());
            self.swallow -= n;
            pos += n;
        }
        while pos < data.len() && !self.closing {
            let rest = data.slice(pos..);
            match parse_with(&rest, self.shared.ctx.opts.max_value) {
                ParseOutcome::Incomplete => break,
                ParseOutcome::Error { reply, consume, close } => {
                    self.shared.ctx.stats.client_errors.fetch_add(1, Relaxed);
                    self.push_ready(Bytes::from_static(reply.as_bytes()));
                    if consume > rest.len() {
                        self.swallow = consume - rest.len();
                        pos = data.len();
                    } else {
                        pos += consume;
                    }
                    self.closing |= close;
                }
                ParseOutcome::Done(cmd, used) => {
                    if used > rest.len() {
                        // a too-large value: routed as an unlink, its bytes swallowed as they arrive
                        self.swallow = used - rest.len();
                        pos = data.len();
                    } else {
                        pos += used;
                    }
                    if self.authenticated {
                        self.command(cmd, start);
                    } else {
                        self.login(cmd);
                    }
                }
            }
        }
        pos
    }

    /// A command before the client has logged in (`--auth-file`), answered as memcached -Y
    /// answers it: a `set` is a login (`AuthFile::check`: `STORED` and logged in, `CLIENT_ERROR
    /// authentication failure` or `CLIENT_ERROR bad authentication token format`, also with
    /// `noreply`), anything else `CLIENT_ERROR unauthenticated` (`quit` closes). Nothing of it is
    /// sent to a server.
    fn login(&mut self, cmd: Command) {
        let auth = self.shared.ctx.opts.client_auth.clone();
        let reply: &'static [u8] = match &cmd {
            Command::Keyed(req) if req.cmd == Cmd::Set && !req.too_large => {
                let judged = auth.map_or(Login::Refused, |f| f.check(&req.value));
                self.authenticated = judged == Login::Accepted;
                judged.reply()
            }
            Command::Quit => {
                self.closing = true;
                return;
            }
            _ => b"CLIENT_ERROR unauthenticated\r\n",
        };
        if !self.authenticated {
            self.shared.ctx.stats.client_errors.fetch_add(1, Relaxed);
        }
        self.push_ready(Bytes::from_static(reply));
    }

    fn command(&mut self, cmd: Command, start: Instant) {
        let ctx = self.shared.ctx.clone();
        match cmd {
            Command::Keyed(req) => self.route_one(ctx, req, start, keyed_reply),
            Command::MultiGet { gets, keys } => self.multi_get(ctx, gets, keys, start),
            Command::GetAndTouch {
                cas,
                exptime,
                keys,
                refused,
            } => self.get_and_touch(ctx, cas, exptime, keys, refused, start),
            Command::LeaseGet { keys } => self.lease_get(ctx, keys, start),
            Command::MetaNoop => {
                ctx.stats.no_route.count("mn");
                self.push_ready(Bytes::from_static(b"MN\r\n"));
            }
            Command::Version => {
                ctx.stats.no_route.count("version");
                let v = format!("VERSION {}\r\n", crate::admin::version());
                self.push_ready(Bytes::from(v));
            }
            Command::Stats => {
                ctx.stats.no_route.count("stats");
                let text = ctx.stats.memcached_text(ctx.servers_tko());
                self.push_ready(Bytes::from(text));
            }
            Command::StatsReset => {
                ctx.stats.no_route.count("stats");
                self.stats_reset(ctx, start);
            }
            Command::Quit => self.closing = true,
            Command::Verbosity { noreply } => {
                ctx.stats.no_route.count("other");
                if !noreply {
                    self.push_ready(Bytes::from_static(b"OK\r\n"));
                }
            }
            Command::FlushAll { delay, noreply } => {
                ctx.stats.no_route.count("flush");
                if ctx.opts.enable_flush {
                    self.flush_all(ctx, delay, noreply, start);
                } else if noreply {
                    eprintln!("squeal-router: flush_all noreply refused (not started with --enable-flush-cmd)");
                } else {
                    self.push_ready(Bytes::from_static(FLUSH_DISABLED));
                }
            }
            Command::Unsupported(name) => {
                ctx.stats.no_route.count("other");
                self.push_ready(Bytes::from(format!(
                    "SERVER_ERROR {name} is not supported by squeal-router\r\n"
                )));
            }
        }
    }

    /// `flush_all` to every server of the connection's config, answered in its turn like any
    /// request (see `crate::flush`).
    fn flush_all(&mut self, ctx: Arc<Context>, delay: Option<i64>, noreply: bool, start: Instant) {
        let config = self.config.clone();
        self.in_flight.push_back(
            async move {
                let outcome = crate::flush::flush_all(&config.flush_targets, &config.flush_problems, delay).await;
                let what = match delay {
                    Some(d) => format!("flush_all {d}"),
                    None => "flush_all".to_string(),
                };
                let bytes = match outcome {
                    Ok(n) => {
                        eprintln!("squeal-router: {what}: OK from all {n} servers");
                        Bytes::from_static(b"OK\r\n")
                    }
                    Err(text) => {
                        ctx.stats.errors.fetch_add(1, Relaxed);
                        let tag = if noreply { " (noreply)" } else { "" };
                        eprintln!("squeal-router: {what}{tag} {text}");
                        Bytes::from(format!("SERVER_ERROR flush_all {text}\r\n"))
                    }
                };
                let bytes = if noreply { Bytes::new() } else { bytes };
                Done::Merged { bytes, start }
            }
            .boxed(),
        );
    }

    /// `stats reset`: the router's `stats` counters start again at once (in request order), and the
    /// servers of the connection's config are asked to reset theirs; `RESET` once all did (see
    /// `crate::flush`).
    fn stats_reset(&mut self, ctx: Arc<Context>, start: Instant) {
        ctx.stats.reset();
        let config = self.config.clone();
        self.in_flight.push_back(
            async move {
                let bytes = match crate::flush::stats_reset(&config.flush_targets, &config.flush_problems).await {
                    Ok(_) => Bytes::from_static(b"RESET\r\n"),
                    Err(text) => {
                        ctx.stats.errors.fetch_add(1, Relaxed);
                        eprintln!("squeal-router: stats reset {text}");
                        Bytes::from(format!("SERVER_ERROR stats reset {text}\r\n"))
                    }
                };
                Done::Merged { bytes, start }
            }
            .boxed(),
        );
    }

    /// Route one single-key request; `answer` turns its reply into the bytes for the client.
    fn route_one(&mut self, ctx: Arc<Context>, mut req: Request, start: Instant, answer: AnswerFn) {
        let (route, asked) = select_route(&self.config, &mut req);
        let (route, gets) = match route {
            // gets count their hits and misses on their route (memcached's get_hits/get_misses)
            Ok((r, counters)) => (r.clone(), req.counts_as_get().then(|| counters.clone())),
            Err(reply) => {
                ctx.stats.errors.fetch_add(1, Relaxed);
                if !req.suppress(&reply) {
                    self.push_ready(reply.wire);
                }
                return;
            }
        };
        self.in_flight.push_back(
            async move {
                let reply = route.route(&req).await;
                if let Some(gets) = gets {
                    gets.gets.count(reply.res);
                }
                Done::Routed {
                    answer,
                    asked,
                    req,
                    reply,
                    start,
                }
            }
            .boxed(),
        );
    }

    /// `gat`/`gats`: each key routed as the meta get that gets and touches (`mg <key> v f T<exptime>`,
    /// plus `c` for `gats`), which routes count as a `get`; the hits come back as classic `VALUE`
    /// blocks in the order the keys were asked, then `END`. As for a multi-key get, one key's error
    /// makes that key a miss, except for a single key, whose error is the answer.
    /// mcrouter's `lease-get <key>*`: each key routed as `Cmd::LeaseGet` (an `mg … N` at its
    /// server), answered in the order asked as mcrouter answers it: a hit as `VALUE`, a miss as
    /// `LVALUE <key> <token> <flags> <bytes>` with the lease token (1: someone else holds the
    /// lease) and the stale or empty value, an error as its line; then `END`.
    fn lease_get(&mut self, ctx: Arc<Context>, keys: Vec<Bytes>, start: Instant) {
        let mut reqs = Vec::with_capacity(keys.len());
        for key in keys {
            let mut req = Request::simple(Cmd::LeaseGet, key);
            let (route, asked) = select_route(&self.config, &mut req);
            let client_key = asked.unwrap_or_else(|| req.key.clone());
            // counted in its route's get hits and misses, as a get
            let route = route.map(|(r, counters)| (r.clone(), counters.clone()));
            reqs.push((req, route, client_key));
        }
        self.in_flight.push_back(
            async move {
                let replies = join_all(reqs.iter().map(|(req, route, _)| async move {
                    match route {
                        Ok((route, counters)) => {
                            let reply = route.route(req).await;
                            counters.gets.count(reply.res);
                            reply
                        }
                        Err(reply) => reply.clone(),
                    }
                }))
                .await;
                let mut out = BytesMut::new();
                for ((_, _, client_key), reply) in reqs.iter().zip(replies) {
                    if reply.res.is_error() {
                        ctx.stats.errors.fetch_add(1, Relaxed);
                        out.put_slice(&reply.wire);
                        continue;
                    }
                    match (lease::read_mg(&reply.wire), reply.lease_token) {
                        (Ok(v), 0) => out.put_slice(&lease::value_block(b"VALUE", client_key, None, &v, None)),
                        (Ok(v), token) => {
                            out.put_slice(&lease::value_block(b"LVALUE", client_key, Some(token), &v, None))
                        }
                        // a reply that is not a value (a route's own miss): nothing for this key
                        (Err(_), _) => {}
                    }
                }
                out.put_slice(END);
                Done::Merged {
                    bytes: out.freeze(),
                    start,
                }
            }
            .boxed(),
        );
    }

    fn get_and_touch(
        &mut self,
        ctx: Arc<Context>,
        cas: bool,
        exptime: i64,
        keys: Vec<Bytes>,
        refused: Option<&'static str>,
        start: Instant,
    ) {
        let mut reqs = Vec::with_capacity(keys.len());
        for key in keys {
            // each key as `gat <exptime> <key>`, never `mg <key> T…`: an mg of a stale item would take
            // its win token (stale-while-revalidate) away from the meta client that should recache it
            let mut req = Request::simple(if cas { Cmd::Gats } else { Cmd::Gat }, key);
            req.exptime = exptime;
            let (route, asked) = select_route(&self.config, &mut req);
            let client_key = asked.unwrap_or_else(|| req.key.clone());
            let route = route.map(|(r, _)| r.clone());
            reqs.push((req, route, client_key));
        }
        self.in_flight.push_back(
            async move {
                let single = reqs.len() == 1;
                let replies = join_all(reqs.iter().map(|(req, route, _)| async move {
                    match route {
                        // a touch as memcached counts it, not a get (see `Request::counts_as_get`)
                        Ok(route) => route.route(req).await,
                        Err(reply) => reply.clone(),
                    }
                }))
                .await;
                if let Some(error) = refused {
                    // the keys before the refused one are touched, their values never sent
                    return Done::Merged {
                        bytes: Bytes::from_static(error.as_bytes()),
                        start,
                    };
                }
                let mut out = BytesMut::new();
                for ((req, _, client_key), reply) in reqs.iter().zip(replies) {
                    if reply.res.is_error() {
                        ctx.stats.errors.fetch_add(1, Relaxed);
                        if single {
                            return Done::Merged {
                                bytes: reply.wire,
                                start,
                            };
                        }
                    } else if reply.res.is_hit() {
                        append_value(&mut out, client_key, req, &reply.wire);
                    }
                }
                out.put_slice(END);
                Done::Merged {
                    bytes: out.freeze(),
                    start,
                }
            }
            .boxed(),
        );
    }

    fn multi_get(&mut self, ctx: Arc<Context>, gets: bool, mut keys: Vec<Bytes>, start: Instant) {
        let cmd = if gets { Cmd::Gets } else { Cmd::Get };
        if keys.iter().any(|k| crate::admin::is_admin(k)) {
            self.admin_get(ctx, cmd, keys, start);
            return;
        }
        if keys.len() == 1 {
            // The common case gets no batching machinery: route the one key like any keyed request.
            let req = Request::simple(cmd, keys.pop().expect("one key"));
            self.route_one(ctx, req, start, single_get_reply);
            return;
        }
        let config = self.config.clone();
        self.in_flight.push_back(
            async move {
                let bytes = multi_get_reply(&ctx, &config, cmd, keys).await;
                Done::Merged { bytes, start }
            }
            .boxed(),
        );
    }
}

/// A get with `__mcrouter__.` keys (see `crate::admin`): those are answered by the router, the
/// others routed as usual, each key on its own, VALUE blocks in the order asked.
impl Conn {
    fn admin_get(&mut self, ctx: Arc<Context>, cmd: Cmd, keys: Vec<Bytes>, start: Instant) {
        let config = self.config.clone();
        self.in_flight.push_back(
            async move {
                let parts = join_all(keys.into_iter().map(|key| {
                    let (ctx, config) = (ctx.clone(), config.clone());
                    async move {
                        if crate::admin::is_admin(&key) {
                            ctx.stats.no_route.count(cmd.name());
                            return crate::admin::value_block(config, key).await;
                        }
                        let one = multi_get_reply(&ctx, &config, cmd, vec![key]).await;
                        one.slice(..one.len() - END.len())
                    }
                }))
                .await;
                let mut out = BytesMut::new();
                for p in parts {
                    out.put_slice(&p);
                }
                out.put_slice(END);
                Done::Merged {
                    bytes: out.freeze(),
                    start,
                }
            }
            .boxed(),
        );
    }
}

/// The answer to `flush_all` without `--enable-flush-cmd`. A `SERVER_ERROR`, as real mcrouter's
/// refusal (`SERVER_ERROR Command disabled`), not memcached's `-F` `CLIENT_ERROR`: callers such as
/// squeal's sender retry server errors and give up on client errors, and a refused flush must be
/// retried, never taken for done.
const FLUSH_DISABLED: &[u8] = b"SERVER_ERROR flush_all disabled (start the router with --enable-flush-cmd)\r\n";

/// A one-key `get`: the VALUE block (with the client's key) and END, or END, or the error line.
fn single_get_reply(ctx: &Context, orig: &[u8], req: &Request, reply: Reply, out: &mut BytesMut) {
    if reply.res.is_hit() {
        append_value(out, orig, req, &reply.wire);
        out.put_slice(END);
    } else if reply.res.is_error() {
        ctx.stats.errors.fetch_add(1, Relaxed);
        out.put_slice(&reply.wire);
    } else {
        out.put_slice(END);
    }
}

/// A keyed request's answer: `finish`, with the client's key put back into meta `k` flags.
fn keyed_reply(ctx: &Context, asked: &[u8], req: &Request, reply: Reply, out: &mut BytesMut) {
    let Some(wire) = finish(ctx, req, reply) else {
        return;
    };
    if asked.len() != req.key.len() && req.cmd.is_meta() {
        restore_meta_key(&wire, &req.key, asked, out);
    } else {
        out.put_slice(&wire);
    }
}

/// A meta reply's `k` flag echoes the key the server saw; give the client back the key it sent
/// (with its routing prefix), as VALUE lines of classic gets do.
fn restore_meta_key(wire: &[u8], stripped: &[u8], asked: &[u8], out: &mut BytesMut) {
    let line_end = first_line_end(wire);
    for (i, token) in wire[..line_end].split(|&b| b == b' ').enumerate() {
        if i > 0 {
            out.put_u8(b' ');
        }
        if i > 0 && token.first() == Some(&b'k') && &token[1..] == stripped {
            out.put_u8(b'k');
            out.put_slice(asked);
        } else {
            out.put_slice(token);
        }
    }
    out.put_slice(&wire[line_end..]);
}

/// The bytes to send for one keyed request's reply (None: suppressed by noreply / quiet mode).
fn finish(ctx: &Context, req: &Request, reply: Reply) -> Option<Bytes> {
    let reply = crate::ack::for_client(req, reply);
    if reply.res.is_error() {
        ctx.stats.errors.fetch_add(1, Relaxed);
    }
    if req.suppress(&reply) { None } else { Some(reply.wire) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_k_flag_gets_the_routing_prefix_back() {
        let restored = |wire: &[u8], stripped: &[u8], asked: &[u8]| {
            let mut out = BytesMut::new();
            restore_meta_key(wire, stripped, asked, &mut out);
            out
        };
        let got = restored(b"VA 2 kuser:1 O7 f0\r\nhi\r\n", b"user:1", b"/east/a/user:1");
        assert_eq!(&got[..], b"VA 2 k/east/a/user:1 O7 f0\r\nhi\r\n");
        // a k token for another key, or no k token, is left alone
        let other = b"HD kuser:10\r\n";
        assert_eq!(&restored(other, b"user:1", b"/e/a/user:1")[..], &other[..]);
        let none = b"EN\r\n";
        assert_eq!(&restored(none, b"user:1", b"/e/a/user:1")[..], &none[..]);
    }

    #[test]
    fn meta_k_flag_with_a_cr_in_the_key_gets_its_prefix_back() {
        let mut out = BytesMut::new();
        restore_meta_key(b"VA 1 ka\rb O7\r\nx\r\n", b"a\rb", b"/e/a/a\rb", &mut out);
        assert_eq!(&out[..], b"VA 1 k/e/a/a\rb O7\r\nx\r\n");
    }
}
