//! A leaf of the route tree: one server of one pool.
//!
//! Fails fast while the server is TKO. A delete that fails with a failover-type error is spooled
//! for replay (when a spool is configured); the reply stays an error, marked `spooled`, so a
//! failover route above still sends the delete to gutter, and the client is answered NOT_FOUND
//! if nothing better comes back (mcrouter's behaviour).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
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
}

impl Route for Destination {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let mut reply = if self.server.is_tko() {
                Reply::error(Res::Tko, "tko: server is marked down")
            } else {
                self.server.send(req, self.timeout).await
            };
            if req.is_delete()
                && reply.res.is_failover_error()
                && let Some(spool) = self.ctx.spool.as_ref()
            {
                if spool.append(&self.server.addr, &self.pool, req).await {
                    self.ctx.stats.spooled_deletes.fetch_add(1, Relaxed);
                    reply.spooled = true;
                } else {
                    self.ctx.stats.spool_dropped.fetch_add(1, Relaxed);
                }
            }
            reply
        })
    }

    fn first_get_target(&self, _req: &Request) -> Option<(&Arc<Server>, Duration)> {
        (!self.server.is_tko()).then_some((&self.server, self.timeout))
    }
}
