//! What each client command does, once the connection loop (`crate::connection`) has parsed it:
//! a keyed request routed through the connection's config, a multi-key get, `gat`, `lease-get`,
//! `__mcrouter__.*` admin gets, `flush_all`, `stats` and the rest; and how a routed reply is
//! written for the client (the routing prefix given back, noreply and quiet mode). Each answer is
//! queued in the connection's ordered queue, so replies leave in request order.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future::{FutureExt, join_all};

use super::multiget::{append_value, multi_get_reply};
use super::{AnswerFn, Conn, Done};
use crate::config::select_route;
use crate::context::Context;
use crate::protocol::lease;
use crate::protocol::reply::{END, first_line_end};
use crate::protocol::{Cmd, Command, Reply, Request};

impl Conn {
    /// Do what one parsed command asks (the client has logged in, or needs not): answered at once,
    /// or queued behind the requests in flight.
    pub(super) fn command(&mut self, cmd: Command, start: Instant) {
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

    /// `gat`/`gats`: each key routed as the meta get that gets and touches (`mg <key> v f T<exptime>`,
    /// plus `c` for `gats`), which routes count as a `get`; the hits come back as classic `VALUE`
    /// blocks in the order the keys were asked, then `END`. As for a multi-key get, one key's error
    /// makes that key a miss, except for a single key, whose error is the answer.
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
