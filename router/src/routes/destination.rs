//! A leaf of the route tree: one server of one pool.
//!
//! Fails fast while the server is TKO (or held out until its spooled deletes are replayed). A
//! delete that fails with a failover-type error is spooled for replay (see `crate::ack`). A
//! too-large `set`/`ms` (`Request::too_large`) reaches the server as an unlink of the key and is
//! answered `SERVER_ERROR object too large for cache`, as memcached answers it.

use std::sync::Arc;
use std::time::Duration;

use super::{BoxFuture, Route};
use crate::Context;
use crate::protocol::{Reply, Request, Res};
use crate::server::Server;

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
    fn record(&self, rec: &crate::admin::Recorder, req: &Request) -> Reply {
        if self.server.is_tko() {
            return Reply::error(Res::Tko, "tko: server is marked down");
        }
        rec.record(&self.server.addr);
        super::default_reply(req)
    }
}

impl Route for Destination {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            if let Some(rec) = &req.recording {
                return self.record(rec, req);
            }
            let reply = if self.server.is_tko() {
                Reply::error(Res::Tko, "tko: server is marked down")
            } else {
                self.server.send(req, self.timeout).await
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
        })
    }

    fn route_name(&self) -> String {
        format!(
            "host|pool={}|id={}|ap={}:ascii:plain:notcompressed|timeout={}ms|keep_routing_prefix=false",
            self.pool,
            self.index,
            self.server.addr,
            self.timeout.as_millis()
        )
    }

    fn first_get_target(&self, _req: &Request) -> Option<&Destination> {
        (!self.server.is_tko()).then_some(self)
    }

    fn first_server(&self, _req: &Request) -> Option<&Server> {
        Some(&self.server)
    }
}
