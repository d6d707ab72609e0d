//! One client connection: buffered reads, many requests in flight, replies in request order.
//!
//! Requests are parsed from whatever a read brought in (pipelines welcome) and each one becomes a
//! future in an ordered queue, so a pipeline fanned out to many servers is answered in the order
//! it was sent; replies that are ready together go out in one write. `mn` is an ordinary entry in
//! that queue, so it is answered only after everything before it. Idle connections hold no
//! buffers (reads wait for readiness before allocating), which keeps 10,000 idle clients cheap.
//! This module is the loop: reading, framing (`protocol::parse`), the login of `--auth-file`, the
//! ordered queue and its writes. What each command does is `commands`; a multi-key get is batched
//! per server by `multiget`; the client's stream, plaintext or TLS, is `stream`.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::future::FutureExt;
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::io::AsyncWriteExt;

use crate::auth::Login;
use crate::config::RouterConfig;
use crate::context::Context;
use crate::protocol::binary::{BINARY_REQUEST_MAGIC, binary_refusal};
use crate::protocol::parse::parse_with;
use crate::protocol::{Cmd, Command, ParseOutcome, Reply, Request};
use crate::routes::BoxFuture;
use crate::shared::Shared;

mod commands;
mod multiget;
mod stream;
pub use stream::{ClientStream, TlsClient};

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
}
