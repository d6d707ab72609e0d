//! A loaded config, and the choice of its route tree for each request (the per-request path:
//! a routing prefix matched and stripped, the request counted on its route).

use std::sync::Arc;

use bytes::Bytes;

use crate::flush::FlushTarget;
use crate::protocol::{Reply, Request, Res};
use crate::routes::RouteRef;
use crate::server::Server;
use crate::stats::RouteCounters;

/// A route tree with the request counters of its label.
pub(super) type Labeled = (RouteRef, Arc<RouteCounters>);

pub(super) enum Root {
    Single(Labeled),
    Aliased {
        aliases: Vec<(Vec<u8>, Labeled)>,
        default: Labeled,
    },
}

/// A loaded config: the route tree plus routing-prefix selection.
pub struct RouterConfig {
    pub(super) root: Root,
    /// Where requests that match no route are counted (the stats' `none` route).
    pub(super) unroutable: Arc<RouteCounters>,
    pub types_used: Vec<&'static str>,
    /// Config fields that were ignored, one line each, for the load log.
    pub warnings: Vec<String>,
    pub pools: usize,
    /// Every server of every pool, for `flush_all` (see `crate::flush`).
    pub flush_targets: Vec<FlushTarget>,
    /// Pools that could not be built (used by no route): each fails every `flush_all`.
    pub flush_problems: Vec<String>,
    /// Every server the config uses, once (installed in the `Context` when the config serves).
    pub servers: Vec<Arc<Server>>,
    /// MD5 of the config text, hex (`__mcrouter__.config_md5_digest`).
    pub md5: String,
    /// When it was built (`__mcrouter__.config_age`).
    pub loaded_at: std::time::Instant,
}

/// The routing prefix of a key (`/region/cluster/`), if it has one.
pub(super) fn routing_prefix(key: &[u8]) -> Option<usize> {
    if key.first() != Some(&b'/') {
        return None;
    }
    let second = key[1..].iter().position(|&b| b == b'/')? + 1;
    let third = key[second + 1..].iter().position(|&b| b == b'/')? + second + 1;
    (second > 1 && third > second + 1).then_some(third + 1)
}

impl RouterConfig {
    /// Choose the tree for `req`, stripping a matched routing prefix from its key, and count the
    /// request on the chosen route (or as unroutable).
    pub fn select(&self, req: &mut Request) -> Result<(&RouteRef, &Arc<RouteCounters>), Reply> {
        match self.choose(req) {
            Ok((route, counters)) => {
                counters.count_cmd(req.cmd);
                Ok((route, counters))
            }
            Err(reply) => {
                self.unroutable.count_cmd(req.cmd);
                Err(reply)
            }
        }
    }

    /// The tree for `req` (its routing prefix stripped), counting nothing: admin requests.
    pub fn route_for(&self, req: &mut Request) -> Result<&RouteRef, Reply> {
        self.choose(req).map(|(route, _)| route)
    }

    fn choose(&self, req: &mut Request) -> Result<&Labeled, Reply> {
        match &self.root {
            Root::Single(r) => Ok(r),
            Root::Aliased { aliases, default } => {
                if req.base64_key {
                    return Ok(default);
                }
                let Some(len) = routing_prefix(&req.key) else {
                    return Ok(default);
                };
                let prefix = &req.key[..len];
                match aliases.iter().find(|(a, _)| a.as_slice() == prefix) {
                    Some((_, r)) => {
                        req.key = req.key.slice(len..);
                        if req.key.is_empty() {
                            return Err(Reply::error(Res::ClientError, "bad command line format"));
                        }
                        Ok(r)
                    }
                    None => Err(Reply::error(Res::ClientError, "no route for this routing prefix")),
                }
            }
        }
    }
}

/// A request's route and the counters of its label, or the error that answers it.
pub type Selected<'c> = Result<(&'c RouteRef, &'c Arc<RouteCounters>), Reply>;

/// Choose `req`'s route; also returns the key as the client sent it if routing stripped a
/// prefix from it. Routing prefixes start with '/', so only such keys are kept aside.
pub fn select_route<'c>(config: &'c RouterConfig, req: &mut Request) -> (Selected<'c>, Option<Bytes>) {
    let asked = req.key.starts_with(b"/").then(|| req.key.clone());
    let route = config.select(req);
    (route, asked.filter(|a| a.len() != req.key.len()))
}
