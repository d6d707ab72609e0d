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
use crate::routes::{BoxFuture, RouteRef};
use crate::server::Server;
use crate::{Context, Shared};
use std::time::Duration;

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
                    match crate::server::read_ready(stream, &mut rbuf)? {
                        Some(0) => {
                            self.closing = true;
                            continue;
                        }
                        Some(_) => {}
                        None => continue,
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
        self.in_flight.push_back(
            async move {
                let n = keys.len();
                let mut reqs: Vec<Request> = Vec::with_capacity(n);
                let mut routes: Vec<Option<RouteRef>> = Vec::with_capacity(n);
                let mut replies: Vec<Option<Reply>> = vec![None; n];
                // Keys whose route asks one server first are batched into one multi-key get per
                // server; the others (and any batch that fails) take their full route.
                let mut groups: Vec<(Arc<Server>, Duration, Vec<usize>)> = Vec::new();
                for (i, k) in keys.iter().enumerate() {
                    let mut req = Request::simple(cmd, k.clone());
                    match config.select(&mut req) {
                        Ok(route) => {
                            if let Some((srv, timeout)) = route.first_get_target(&req) {
                                match groups.iter_mut().find(|g| Arc::ptr_eq(&g.0, &srv)) {
                                    Some(g) => g.2.push(i),
                                    None => groups.push((srv, timeout, vec![i])),
                                }
                            }
                            routes.push(Some(route));
                        }
                        Err(e) => {
                            replies[i] = Some(e);
                            routes.push(None);
                        }
                    }
                    reqs.push(req);
                }
                let batched = join_all(groups.iter().map(|(srv, timeout, idx)| {
                    let ks: Vec<&Bytes> = idx.iter().map(|&i| &reqs[i].key).collect();
                    async move { srv.send_multi_get(gets, &ks, *timeout).await }
                }))
                .await;
                for ((_, _, idx), reply) in groups.iter().zip(batched) {
                    if reply.res.is_failover_error() {
                        continue;
                    }
                    if reply.res.is_error() {
                        for &i in idx {
                            replies[i] = Some(reply.clone());
                        }
                        continue;
                    }
                    split_values(&reply.wire, idx, &reqs, &mut replies);
                }
                let slow: Vec<usize> = (0..n).filter(|&i| replies[i].is_none()).collect();
                if !slow.is_empty() {
                    let outs = join_all(slow.iter().map(|&i| {
                        let route = routes[i].clone();
                        let req = &reqs[i];
                        async move {
                            match route {
                                Some(r) => r.route(req).await,
                                None => Reply::error(Res::LocalError, "no route"),
                            }
                        }
                    }))
                    .await;
                    for (i, r) in slow.into_iter().zip(outs) {
                        replies[i] = Some(r);
                    }
                }
                ctx.stats.observe_latency(start.elapsed());
                let mut out = BytesMut::new();
                for (i, reply) in replies.iter().enumerate() {
                    let Some(reply) = reply else { continue };
                    if reply.res.is_hit() {
                        append_value(&mut out, &keys[i], &reqs[i], reply);
                    } else if reply.res.is_error() {
                        ctx.stats.errors.fetch_add(1, Relaxed);
                        if n == 1 {
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

/// Hand the VALUE blocks of one batched multi-get to the keys that asked (in order; absent = miss).
fn split_values(wire: &Bytes, idx: &[usize], reqs: &[Request], replies: &mut [Option<Reply>]) {
    let mut pos = 0;
    let mut j = 0;
    while pos < wire.len() {
        let Some(nl) = wire[pos..].iter().position(|&b| b == b'\n') else {
            break;
        };
        let line = &wire[pos..pos + nl];
        let mut toks = line.split(|&b| b == b' ' || b == b'\r').filter(|t| !t.is_empty());
        let (Some(b"VALUE"), Some(key), Some(_flags), Some(len)) = (toks.next(), toks.next(), toks.next(), toks.next())
        else {
            break;
        };
        let Some(len) = std::str::from_utf8(len).ok().and_then(|l| l.parse::<usize>().ok()) else {
            break;
        };
        let end = (pos + nl + 1 + len + 2).min(wire.len());
        while j < idx.len() && reqs[idx[j]].key[..] != key[..] {
            replies[idx[j]] = Some(Reply::new(Res::Miss, Bytes::new()));
            j += 1;
        }
        if j < idx.len() {
            replies[idx[j]] = Some(Reply::new(Res::Found, wire.slice(pos..end)));
            j += 1;
        }
        pos = end;
    }
    for &i in &idx[j.min(idx.len())..] {
        replies[i] = Some(Reply::new(Res::Miss, Bytes::new()));
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
