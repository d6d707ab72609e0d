//! One client connection: buffered reads, many requests in flight, replies in request order.
//!
//! Requests are parsed from whatever a read brought in (pipelines welcome) and each one becomes a
//! future in an ordered queue, so a pipeline fanned out to many servers is answered in the order
//! it was sent; replies that are ready together go out in one write. `mn` is an ordinary entry in
//! that queue, so it is answered only after everything before it. Idle connections hold no
//! buffers (reads wait for readiness before allocating), which keeps 10,000 idle clients cheap.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future::{FutureExt, join_all};
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::net::TcpStream;

use crate::config::RouterConfig;
use crate::protocol::request::parse;
use crate::protocol::{Cmd, Command, ParseOutcome, Reply, Request, Res};
use crate::routes::BoxFuture;
use crate::{Context, Shared};

/// Requests in flight per connection before the router stops reading from it (backpressure).
const MAX_IN_FLIGHT: usize = 4096;
const READ_CHUNK: usize = 16 * 1024;

type ReplyFuture = BoxFuture<'static, Option<Bytes>>;

struct Conn {
    shared: Arc<Shared>,
    generation: u64,
    config: Arc<RouterConfig>,
    /// Bytes of a refused value still to discard.
    swallow: usize,
    closing: bool,
    wbuf: BytesMut,
    in_flight: FuturesOrdered<ReplyFuture>,
}

pub async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let stats = &shared.ctx.stats;
    stats.curr_connections.fetch_add(1, Relaxed);
    stats.total_connections.fetch_add(1, Relaxed);
    let _ = stream.set_nodelay(true);
    let (generation, config) = shared.config();
    let mut conn = Conn {
        shared: shared.clone(),
        generation,
        config,
        swallow: 0,
        closing: false,
        wbuf: BytesMut::new(),
        in_flight: FuturesOrdered::new(),
    };
    let _ = conn.run(&stream).await;
    shared.ctx.stats.curr_connections.fetch_sub(1, Relaxed);
}

async fn write_all(stream: &TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match stream.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Conn {
    async fn run(&mut self, stream: &TcpStream) -> std::io::Result<()> {
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
                Some(out) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    if let Some(b) = out {
                        self.wbuf.extend_from_slice(&b);
                    }
                    while let Some(Some(out)) = self.in_flight.next().now_or_never() {
                        if let Some(b) = out {
                            self.wbuf.extend_from_slice(&b);
                        }
                    }
                    if !self.wbuf.is_empty() {
                        write_all(stream, &self.wbuf).await?;
                        self.wbuf.clear();
                    }
                }
                ready = stream.readable(), if can_read => {
                    ready?;
                    if rbuf.capacity() - rbuf.len() < READ_CHUNK / 2 {
                        rbuf.reserve(READ_CHUNK);
                    }
                    match stream.try_read_buf(&mut rbuf) {
                        Ok(0) => {
                            self.closing = true;
                            continue;
                        }
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e),
                    }
                    let data = rbuf.split().freeze();
                    let used = self.process(&data);
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

    /// Queue a reply that is ready now, behind anything still in flight.
    fn push_ready(&mut self, bytes: Bytes) {
        if self.in_flight.is_empty() {
            self.wbuf.extend_from_slice(&bytes);
        } else {
            self.in_flight
                .push_back(futures_util::future::ready(Some(bytes)).boxed());
        }
    }

    /// Handle every complete command in `data`; returns the bytes used.
    fn process(&mut self, data: &Bytes) -> usize {
        let current = self.shared.generation();
        if current != self.generation {
            let (g, c) = self.shared.config();
            self.generation = g;
            self.config = c;
        }
        let mut pos = 0;
        if self.swallow > 0 {
            let n = self.swallow.min(data.len());
            self.swallow -= n;
            pos += n;
        }
        while pos < data.len() && !self.closing {
            let rest = data.slice(pos..);
            match parse(&rest) {
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
                    pos += used;
                    self.command(cmd);
                }
            }
        }
        pos
    }

    fn command(&mut self, cmd: Command) {
        let ctx = self.shared.ctx.clone();
        match cmd {
            Command::Keyed(req) => {
                ctx.stats.count_request(req.cmd.name());
                self.keyed(ctx, req);
            }
            Command::MultiGet { gets, keys } => {
                ctx.stats.count_request(if gets { "gets" } else { "get" });
                self.multi_get(ctx, gets, keys);
            }
            Command::MetaNoop => {
                ctx.stats.count_request("mn");
                self.push_ready(Bytes::from_static(b"MN\r\n"));
            }
            Command::Version => {
                ctx.stats.count_request("version");
                let v = format!("VERSION 1.6.18-squeal-router-{}\r\n", env!("CARGO_PKG_VERSION"));
                self.push_ready(Bytes::from(v));
            }
            Command::Stats => {
                ctx.stats.count_request("stats");
                let text = ctx.stats.memcached_text(ctx.servers_tko());
                self.push_ready(Bytes::from(text));
            }
            Command::Quit => self.closing = true,
            Command::Verbosity { noreply } => {
                ctx.stats.count_request("other");
                if !noreply {
                    self.push_ready(Bytes::from_static(b"OK\r\n"));
                }
            }
            Command::Unsupported(name) => {
                ctx.stats.count_request("other");
                self.push_ready(Bytes::from(format!(
                    "SERVER_ERROR {name} is not supported by squeal-router\r\n"
                )));
            }
        }
    }

    fn keyed(&mut self, ctx: Arc<Context>, mut req: Request) {
        let start = Instant::now();
        let route = match self.config.select(&mut req) {
            Ok(r) => r,
            Err(reply) => {
                ctx.stats.errors.fetch_add(1, Relaxed);
                self.push_ready(reply.wire);
                return;
            }
        };
        self.in_flight.push_back(
            async move {
                let reply = route.route(&req).await;
                ctx.stats.observe_latency(start.elapsed());
                finish(&ctx, &req, reply)
            }
            .boxed(),
        );
    }

    fn multi_get(&mut self, ctx: Arc<Context>, gets: bool, keys: Vec<Bytes>) {
        let start = Instant::now();
        let cmd = if gets { Cmd::Gets } else { Cmd::Get };
        let config = self.config.clone();
        let single = keys.len() == 1;
        self.in_flight.push_back(
            async move {
                let items: Vec<(Bytes, Request)> =
                    keys.into_iter().map(|k| (k.clone(), Request::simple(cmd, k))).collect();
                let lookups = items.into_iter().map(|(orig, mut req)| {
                    let config = &config;
                    async move {
                        let reply = match config.select(&mut req) {
                            Ok(route) => route.route(&req).await,
                            Err(e) => e,
                        };
                        (orig, req, reply)
                    }
                });
                let results = if single {
                    let mut it = lookups;
                    vec![it.next().expect("one key").await]
                } else {
                    join_all(lookups).await
                };
                ctx.stats.observe_latency(start.elapsed());
                let mut out = BytesMut::new();
                for (orig, req, reply) in &results {
                    if reply.res.is_hit() {
                        append_value(&mut out, orig, req, reply);
                    } else if reply.res.is_error() {
                        ctx.stats.errors.fetch_add(1, Relaxed);
                        if single {
                            return Some(reply.wire.clone());
                        }
                    }
                }
                out.put_slice(b"END\r\n");
                Some(out.freeze())
            }
            .boxed(),
        );
    }
}

/// Append a server's VALUE block, with the client's key if a routing prefix was stripped.
fn append_value(out: &mut BytesMut, orig: &Bytes, req: &Request, reply: &Reply) {
    if orig.len() == req.key.len() || !reply.wire.starts_with(b"VALUE ") {
        out.put_slice(&reply.wire);
        return;
    }
    let after = 6 + req.key.len();
    if reply.wire.len() < after || reply.wire[6..after] != req.key[..] {
        out.put_slice(&reply.wire);
        return;
    }
    out.put_slice(b"VALUE ");
    out.put_slice(orig);
    out.put_slice(&reply.wire[after..]);
}

/// The bytes to send for one keyed request's reply (None: suppressed by noreply / quiet mode).
fn finish(ctx: &Context, req: &Request, mut reply: Reply) -> Option<Bytes> {
    if reply.res.is_error() {
        if reply.spooled {
            // mcrouter answers a spooled delete NOT_FOUND: the delete will be delivered later.
            reply = if req.cmd.is_meta() {
                Reply::new(Res::NotFound, req.meta_line("NF"))
            } else {
                Reply::line(Res::NotFound, "NOT_FOUND")
            };
        } else {
            ctx.stats.errors.fetch_add(1, Relaxed);
        }
    }
    if req.suppress(&reply) { None } else { Some(reply.wire) }
}
