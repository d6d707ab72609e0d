//! The route tree: the `Route` trait and route handles that compose, one per file.
//!
//! A handle takes one single-key request and produces one reply; it knows its children only as
//! `RouteRef`s. Each handle's file has its `build` from a config object (`crate::build::Builder`)
//! and, beside it, its registry entry (`Handle`: config name, fields read), listed in
//! `crate::registry`. Leaves are `Destination`s (one memcached server of one pool).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::protocol::{Reply, Request};
use crate::server::Server;

pub mod all_async;
pub mod all_fastest;
pub mod all_initial;
pub mod all_majority;
pub mod all_sync;
pub mod default_reply;
pub mod destination;
pub mod dev_null;
pub mod distribution;
pub mod eager_shard_selection;
pub mod eager_shard_selection_shadow;
pub mod error;
pub mod failover;
pub mod failover_with_exptime;
pub mod hash;
pub mod hash_stop_allow_list;
pub mod host_id;
pub mod l1l2_cache;
pub mod l1l2_size_split;
pub mod latency_injection;
pub mod latest;
pub mod load_balancer;
pub mod mc_bucket;
pub mod migrate;
pub mod miss_failover;
pub mod modify_exptime;
pub mod modify_key;
pub mod null;
pub mod operation_selector;
pub mod pool;
pub mod prefix_selector;
pub mod random;
pub mod routing_group;
pub mod salted_failover;
pub mod shadow;
pub mod shard_selection;
pub mod transparent_lease;
pub mod warm_up;

pub use default_reply::default_reply;
use destination::Destination;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type RouteRef = Arc<dyn Route>;

/// A route handle.
pub trait Route: Send + Sync + 'static {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply>;

    /// For classic gets: the destination (server of a pool) this route would ask first, when a hit
    /// or a miss from it is the final answer (errors may still fail over). Lets a multi-get send one
    /// multi-key `get` per destination (counted in its pool's hits and misses); any key whose
    /// batched get fails goes through `route` as usual.
    fn first_get_target(&self, _req: &Request) -> Option<&Destination> {
        None
    }

    /// The keys of one multi-key get that take this route (and have no `first_get_target`): their
    /// replies in order, each as `route` would answer it. By default each key is routed on its own,
    /// all at once; TransparentLeaseRoute sends its keys' `mg`s to each server as one batch.
    fn route_multi_get<'a>(&'a self, reqs: Vec<&'a Request>) -> BoxFuture<'a, Vec<Reply>> {
        route_each(self, reqs)
    }

    /// `route_multi_get` for every key of a client's get, when they all take this route: the hits'
    /// `VALUE` blocks appended to the client's answer `out` in order, and each key's result (a hit,
    /// a miss, or an error that makes the key a miss). `None`: the route does not do this (the
    /// default); `route_multi_get` then answers the keys.
    fn route_multi_get_into<'a>(
        &'a self,
        _reqs: &'a [Request],
        _out: &'a mut bytes::BytesMut,
    ) -> Option<BoxFuture<'a, Vec<crate::protocol::Res>>> {
        None
    }

    /// The server this route would send `req` to first, when that is known without routing it
    /// (a destination; a hash over destinations; a failover's first child): LoadBalancerRoute
    /// compares its children by that server's measured load (`crate::load`). Others have none.
    fn first_server(&self, _req: &Request) -> Option<&Server> {
        None
    }

    /// The handle's line in `__mcrouter__.route_handles` (mcrouter's `routeName()`): by default
    /// its type in mcrouter's lower-case style (`Failover` → `failover`, `AllSync` → `all-sync`).
    fn route_name(&self) -> String {
        kebab_name(std::any::type_name::<Self>())
    }

    /// For `__mcrouter__.route_handles` (mcrouter's `traverse`): call `visit` with each child `req`
    /// may reach, and the request that child would get, without routing anything. Leaves have none.
    fn traverse(&self, _req: &Request, _visit: &mut dyn FnMut(&RouteRef, &Request)) {}
}

// Destination's impl sits beside the trait: the trait names Destination (`first_get_target`), so
// destination.rs does not name the trait back.
impl Route for Destination {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(self.send(req))
    }

    fn route_name(&self) -> String {
        self.name()
    }

    fn first_get_target(&self, _req: &Request) -> Option<&Destination> {
        (!self.server.is_tko()).then_some(self)
    }

    fn first_server(&self, _req: &Request) -> Option<&Server> {
        Some(&self.server)
    }
}

/// Route each request on its own, all at once: the replies in order (`Route::route_multi_get`'s default).
pub fn route_each<'a, R: Route + ?Sized>(route: &'a R, reqs: Vec<&'a Request>) -> BoxFuture<'a, Vec<Reply>> {
    Box::pin(futures_util::future::join_all(
        reqs.into_iter().map(|req| route.route(req)),
    ))
}

/// `squeal_router::routes::all_sync::AllSync` → `all-sync` (a trailing `Route` dropped).
pub fn kebab_name(type_name: &str) -> String {
    let short = type_name.rsplit("::").next().unwrap_or(type_name);
    let short = short.strip_suffix("Route").filter(|s| !s.is_empty()).unwrap_or(short);
    let mut out = String::with_capacity(short.len() + 4);
    for (i, c) in short.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// memcached treats an exptime above 30 days as an absolute unix time.
const RELATIVE_LIMIT: i64 = 60 * 60 * 24 * 30;

/// The exptime in seconds from now (0 = never expires, negative = already expired).
pub fn relative_exptime(exptime: i64) -> i64 {
    if exptime > RELATIVE_LIMIT {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        (exptime - now as i64).max(-1)
    } else {
        exptime
    }
}

/// `req` with its TTL capped at `cap` seconds (a TTL of 0, "forever", is capped too).
pub fn cap_exptime(req: &Request, cap: i64) -> Option<Request> {
    if !req.has_exptime() || cap <= 0 {
        return None;
    }
    let e = relative_exptime(req.exptime());
    if e == 0 || e > cap {
        let mut r = req.clone();
        r.set_exptime(cap);
        return Some(r);
    }
    None
}

#[cfg(test)]
pub mod testing {
    //! Fake destinations for route tests.
    use super::*;
    use crate::protocol::{Cmd, Res};
    pub use crate::testing::{req, run, set_req};
    use std::sync::Mutex;

    /// Answers every request with a fixed result (or a scripted one per key) and records what it saw.
    pub struct Fake {
        pub name: &'static str,
        pub res: Mutex<Res>,
        pub seen: Mutex<Vec<Request>>,
        /// Error replies to deletes come back spooled (as a destination with room in its spool).
        pub spools: bool,
    }

    impl Fake {
        pub fn new(name: &'static str, res: Res) -> Arc<Fake> {
            Arc::new(Fake {
                name,
                res: Mutex::new(res),
                seen: Mutex::new(Vec::new()),
                spools: false,
            })
        }
        pub fn spooling(name: &'static str, res: Res) -> Arc<Fake> {
            Arc::new(Fake {
                name,
                res: Mutex::new(res),
                seen: Mutex::new(Vec::new()),
                spools: true,
            })
        }
        pub fn count(&self) -> usize {
            self.seen.lock().unwrap().len()
        }
        pub fn last(&self) -> Request {
            self.seen.lock().unwrap().last().cloned().expect("a request")
        }
        pub fn set(&self, res: Res) {
            *self.res.lock().unwrap() = res;
        }
    }

    impl Route for Fake {
        fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
            Box::pin(async move {
                self.seen.lock().unwrap().push(req.clone());
                let res = *self.res.lock().unwrap();
                match res {
                    Res::Found if req.cmd == Cmd::Get => Reply::new(
                        res,
                        bytes::Bytes::from(format!(
                            "VALUE {} 7 2\r\n{}\r\n",
                            String::from_utf8_lossy(&req.key),
                            self.name.get(..2).unwrap_or(self.name)
                        )),
                    ),
                    r if r.is_error() => {
                        let mut reply = Reply::error(r, self.name);
                        reply.spooled = self.spools && req.is_delete() && r.is_failover_error();
                        reply
                    }
                    r => Reply::line(r, self.name),
                }
            })
        }
    }
}
