//! A leaf of the route tree: one server of one pool.
//!
//! Fails fast while the server is TKO (or held out until its spooled deletes are replayed). A
//! delete that fails with a failover-type error is spooled for replay (see `crate::ack`). A
//! too-large `set`/`ms` (`Request::too_large`) reaches the server as an unlink of the key and is
//! answered `SERVER_ERROR object too large for cache`, as memcached answers it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::default_reply::default_reply;
use crate::context::Context;
use crate::lease_tokens::{Issued, LeaseTokens};
use crate::protocol::lease;
use crate::protocol::{Cmd, Reply, Request, Res};
use crate::server::{MetaGetFrame, MetaReplies, Server};

pub struct Destination {
    pub server: Arc<Server>,
    pub pool: Arc<str>,
    pub timeout: Duration,
    pub ctx: Arc<Context>,
    /// Its place in the pool's `servers` (mcrouter's `id`).
    pub index: usize,
    /// The pool's get hits and misses.
    pub gets: Arc<crate::stats::PoolCounters>,
}

impl Destination {
    /// `__mcrouter__.route`: a server that is down answers as it would (TKO, so failover routes
    /// go on to their next child, as mcrouter's recording does); one that is up is recorded and
    /// answers the route's default reply. Nothing is sent and nothing is spooled.
    fn record(&self, rec: &crate::recording::Recorder, req: &Request) -> Reply {
        if self.server.is_tko() {
            return Reply::error(Res::Tko, "tko: server is marked down");
        }
        rec.record(&self.server.addr);
        default_reply(req)
    }
}

impl Destination {
    /// A `lease-get`'s `mg` reply with its lease token: the item's CAS for a won lease (a router
    /// token in its place when clients would misread it, see `crate::lease_tokens`), 1 for a
    /// lease someone else holds (mcrouter's hot miss), none for a hit.
    fn lease_get(&self, mut reply: Reply) -> Reply {
        let v = match lease::read_mg(&reply.wire) {
            Ok(v) => v,
            Err(Some(error)) => return error,
            Err(None) => return reply,
        };
        if v.won {
            let token = if LeaseTokens::conflicts(v.cas) {
                let issued = Issued {
                    original: v.cas,
                    child: 0,
                };
                self.ctx.lease_tokens.insert(&self.name(), issued)
            } else {
                v.cas
            };
            reply.lease_token = token;
            reply.res = Res::Miss;
        } else if v.held {
            reply.lease_token = HOT_MISS_TOKEN;
            reply.res = Res::Miss;
        }
        reply
    }
}

/// The lease token of a miss whose lease another client holds (mcrouter's "hot miss").
pub const HOT_MISS_TOKEN: u64 = 1;

/// What the trait's `route` runs (`impl Route for Destination` sits beside the trait in `routes/mod.rs`,
/// which names `Destination`, so that this file need not name the trait back).
impl Destination {
    /// Send `req` to the server (or record it, see `crate::admin`), spooling a delete that failed.
    pub async fn send(&self, req: &Request) -> Reply {
        if let Some(rec) = &req.recording {
            return self.record(rec, req);
        }
        let reply = if self.server.is_tko() {
            Reply::error(Res::Tko, "tko: server is marked down")
        } else if req.cmd == Cmd::LeaseSet && req.cas <= HOT_MISS_TOKEN {
            // never a lease: 1 is the hot-miss answer, and `C0` would store unconditionally
            Reply::line(Res::NotStored, "NOT_STORED")
        } else if req.cmd == Cmd::LeaseSet && LeaseTokens::is_router_token(req.cas) {
            // a token this destination gave in place of its server's (see `lease_get`)
            let mut fill = req.clone();
            if let Some(issued) = self.ctx.lease_tokens.take(&self.name(), req.cas) {
                fill.cas = issued.original;
            }
            self.server.send(&fill, self.timeout).await
        } else {
            self.server.send(req, self.timeout).await
        };
        let reply = match req.cmd {
            Cmd::LeaseGet => self.lease_get(reply),
            Cmd::LeaseSet => lease::fill_reply(reply),
            _ => reply,
        };
        if req.is_delete() && reply.res.is_failover_error() {
            return crate::ack::spool_failed(&self.ctx, &self.server, &self.pool, req, reply).await;
        }
        if req.counts_as_get() {
            self.gets.gets.count(reply.res);
        }
        if req.too_large && !reply.res.is_error() {
            // the server dropped the old value; the new one was never sent
            return Reply::error(Res::RemoteError, "object too large for cache");
        }
        reply
    }

    /// The meta get `mg` for each of `keys` (which all live here), sent as one batch
    /// (`Server::send_meta_gets`): what `send` does for each, but in one write. Only a plain `mg`
    /// (no recording, never too large): none of `send`'s lease, spool or too-large handling applies
    /// to it. The pool counts each key's hit or miss, as `send` does.
    pub async fn send_meta_gets(&self, mg: &MetaGetFrame, keys: &[&Bytes]) -> Vec<Reply> {
        match self.send_meta_batch(mg, keys).await {
            Ok(batch) => {
                let replies = batch.into_replies();
                self.count_gets(mg, replies.iter().map(|r| r.res));
                replies
            }
            Err(failed) => vec![failed; keys.len()],
        }
    }

    /// `send_meta_gets`' replies as the server sent them, to be read in place (no reply object
    /// per key); the caller counts them with `count_gets` as it reads them.
    pub async fn send_meta_batch(&self, mg: &MetaGetFrame, keys: &[&Bytes]) -> Result<MetaReplies, Reply> {
        if self.server.is_tko() {
            return Err(Reply::error(Res::Tko, "tko: server is marked down"));
        }
        self.server.send_meta_batch(mg, keys, self.timeout).await
    }

    /// The pool's hits and misses for the replies to a batch of `mg`s.
    pub fn count_gets(&self, mg: &MetaGetFrame, results: impl Iterator<Item = Res>) {
        if mg.counts_as_get {
            self.gets.gets.count_all(results);
        }
    }

    /// Its line in `__mcrouter__.route_handles` (mcrouter's name for a destination).
    pub fn name(&self) -> String {
        format!(
            "host|pool={}|id={}|ap={}:ascii:plain:notcompressed|timeout={}ms|keep_routing_prefix=false",
            self.pool,
            self.index,
            self.server.addr,
            self.timeout.as_millis()
        )
    }
}
