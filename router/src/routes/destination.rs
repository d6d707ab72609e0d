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
}

impl Route for Destination {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let reply = if self.server.is_tko() {
                Reply::error(Res::Tko, "tko: server is marked down")
            } else {
                self.server.send(req, self.timeout).await
            };
            if req.is_delete() && reply.res.is_failover_error() {
                return crate::ack::spool_failed(&self.ctx, &self.server, &self.pool, req, reply).await;
            }
            if req.too_large && !reply.res.is_error() {
                // the server dropped the old value; the new one was never sent
                return Reply::error(Res::RemoteError, "object too large for cache");
            }
            reply
        })
    }

    fn first_get_target(&self, _req: &Request) -> Option<(&Arc<Server>, Duration)> {
        (!self.server.is_tko()).then_some((&self.server, self.timeout))
    }
}
