//! The route tree: route handles that compose, one per file, and the registry of config names.
//!
//! A handle takes one single-key request and produces one reply; it knows its children only as
//! `RouteRef`s. Adding a handle means one new file and one line in `REGISTRY`. Leaves are
//! `Destination`s (one memcached server of one pool).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::config::Builder;
use crate::protocol::{Cmd, Reply, Request, Res};

pub mod all_async;
pub mod all_fastest;
pub mod all_initial;
pub mod all_majority;
pub mod all_sync;
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

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type RouteRef = Arc<dyn Route>;

/// A route handle.
pub trait Route: Send + Sync + 'static {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply>;

    /// For classic gets: the destination (server of a pool) this route would ask first, when a hit
    /// or a miss from it is the final answer (errors may still fail over). Lets a multi-get send one
    /// multi-key `get` per destination (counted in its pool's hits and misses); any key whose
    /// batched get fails goes through `route` as usual.
    fn first_get_target(&self, _req: &Request) -> Option<&crate::routes::destination::Destination> {
        None
    }

    /// The server this route would send `req` to first, when that is known without routing it
    /// (a destination; a hash over destinations; a failover's first child): LoadBalancerRoute
    /// compares its children by that server's measured load (`crate::load`). Others have none.
    fn first_server(&self, _req: &Request) -> Option<&crate::server::Server> {
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

/// Builds a handle from its config object (`"Type|rest"` shorthands arrive as objects, see below).
pub type Constructor = fn(&mut Builder, &Map<String, Value>) -> Result<RouteRef, String>;

/// A registry entry: config `type` name, constructor, known fields, and the field that the `rest` of a
/// `"Type|rest"` shorthand fills (e.g. `"PoolRoute|wildcard"` means `{"pool": "wildcard"}`).
pub struct Handle {
    pub name: &'static str,
    pub build: Constructor,
    pub shorthand: Option<&'static str>,
    /// Config fields the handle reads (besides `type` and `name`); others draw a load warning.
    pub fields: &'static [&'static str],
}

pub const REGISTRY: &[Handle] = &[
    Handle {
        name: "PoolRoute",
        build: pool::build,
        shorthand: Some("pool"),
        fields: &[
            "pool",
            "hash",
            "hash_func",
            "salt",
            "weights",
            // bucketized pools (mc_bucket.rs) and the DistributionRoute in front (distribution.rs)
            "bucketize",
            "useBucketHashSelector",
            "total_buckets",
            "total_buckets_by_prefix",
            "bucketization_keyspace",
            "distribution_enabled",
            "distributed_delete_rpc_enabled",
            "replay",
            "distribution_source_region",
            "distribution_secure_writes_enabled",
            "return_error_on_mc_delete_failure",
            // copies of some servers' requests (shadow.rs)
            "shadows",
            "shadow_policy",
        ],
    },
    Handle {
        name: "HashRoute",
        build: hash::build,
        shorthand: Some("children"),
        fields: &["children", "hash", "hash_func", "salt", "weights"],
    },
    Handle {
        name: "AllSyncRoute",
        build: all_sync::build,
        shorthand: Some("children"),
        fields: &["children"],
    },
    Handle {
        name: "AllAsyncRoute",
        build: all_async::build,
        shorthand: Some("children"),
        fields: &["children"],
    },
    Handle {
        name: "AllInitialRoute",
        build: all_initial::build,
        shorthand: Some("children"),
        fields: &["children"],
    },
    Handle {
        name: "AllMajorityRoute",
        build: all_majority::build,
        shorthand: Some("children"),
        fields: &["children"],
    },
    Handle {
        name: "FailoverRoute",
        build: failover::build,
        shorthand: Some("children"),
        fields: &["children"],
    },
    Handle {
        name: "FailoverWithExptimeRoute",
        build: failover_with_exptime::build,
        shorthand: None,
        fields: &["normal", "failover", "failover_exptime"],
    },
    Handle {
        name: "MissFailoverRoute",
        build: miss_failover::build,
        shorthand: Some("children"),
        fields: &["children"],
    },
    Handle {
        name: "WarmUpRoute",
        build: warm_up::build,
        shorthand: None,
        fields: &["cold", "warm", "exptime"],
    },
    Handle {
        name: "OperationSelectorRoute",
        build: operation_selector::build,
        shorthand: None,
        fields: &["default_policy", "operation_policies"],
    },
    // mcrouter's older name for OperationSelectorRoute
    Handle {
        name: "PrefixPolicyRoute",
        build: operation_selector::build,
        shorthand: None,
        fields: &["default_policy", "operation_policies"],
    },
    Handle {
        name: "PrefixSelectorRoute",
        build: prefix_selector::build,
        shorthand: None,
        fields: &["policies", "wildcard"],
    },
    Handle {
        name: "TransparentLeaseRoute",
        build: transparent_lease::build,
        shorthand: None,
        fields: &["target", "lease_ttl", "lease_wait_ms", "lease_retries", "max_tokens"],
    },
    Handle {
        name: "ModifyExptimeRoute",
        build: modify_exptime::build,
        shorthand: None,
        fields: &["action", "exptime", "target"],
    },
    Handle {
        name: "NullRoute",
        build: null::build,
        shorthand: None,
        fields: &[],
    },
    Handle {
        name: "ErrorRoute",
        build: error::build,
        shorthand: Some("response"),
        fields: &["response"],
    },
    Handle {
        name: "AllFastestRoute",
        build: all_fastest::build,
        shorthand: Some("children"),
        fields: &["children"],
    },
    Handle {
        name: "RandomRoute",
        build: random::build,
        shorthand: Some("children"),
        fields: &["children"],
    },
    Handle {
        name: "LatestRoute",
        build: latest::build,
        shorthand: Some("children"),
        fields: &[
            "children",
            "failover_count",
            "thresholds",
            "failover_errors",
            "failover_tag",
        ],
    },
    Handle {
        name: "LoadBalancerRoute",
        build: load_balancer::build,
        shorthand: Some("children"),
        fields: &[
            "children",
            "salt",
            "load_ttl_ms",
            "failover_count",
            "algorithm",
            "default_server_load_percent",
            "enable_thrift_server_load",
        ],
    },
    Handle {
        name: "SaltedFailoverRoute",
        build: salted_failover::build,
        shorthand: Some("pool"),
        fields: &[
            "pool",
            "hash",
            "hash_func",
            "salt",
            "weights",
            "max_tries",
            "shadows",
            "shadow_policy",
            "failover_policy",
            "failover_errors",
        ],
    },
    Handle {
        name: "ShadowRoute",
        build: shadow::build,
        shorthand: None,
        fields: &["children", "shadows", "shadow_policy"],
    },
    Handle {
        name: "MigrateRoute",
        build: migrate::build,
        shorthand: None,
        fields: &["from", "to", "start_time", "interval"],
    },
    Handle {
        name: "L1L2CacheRoute",
        build: l1l2_cache::build,
        shorthand: None,
        fields: &["l1", "l2", "upgradingL1Exptime", "ncacheExptime", "ncacheUpdatePeriod"],
    },
    Handle {
        name: "LatencyInjectionRoute",
        build: latency_injection::build,
        shorthand: None,
        fields: &[
            "child",
            "before_latency_ms",
            "after_latency_ms",
            "total_latency_ms",
            "total_latency_percentile_ms",
            "request_payload_latency",
            "max_request_latency_us",
        ],
    },
    Handle {
        name: "ModifyKeyRoute",
        build: modify_key::build,
        shorthand: None,
        fields: &[
            "target",
            "set_routing_prefix",
            "ensure_key_prefix",
            "replace_key_prefix",
            "modify_inplace",
        ],
    },
    Handle {
        name: "DevNullRoute",
        build: dev_null::build_dev_null,
        shorthand: None,
        fields: &[],
    },
    Handle {
        name: "BlackholeRoute",
        build: dev_null::build_blackhole,
        shorthand: None,
        fields: &["default", "blackhole_child", "policies"],
    },
    Handle {
        name: "ShardSelectionRoute",
        build: shard_selection::build,
        shorthand: None,
        fields: &["pool", "shards", "out_of_range"],
    },
    Handle {
        name: "EagerShardSelectionRoute",
        build: eager_shard_selection::build,
        shorthand: None,
        fields: &["pools", "children_type", "children_settings", "out_of_range"],
    },
    Handle {
        name: "EagerShardSelectionShadowRoute",
        build: eager_shard_selection_shadow::build,
        shorthand: None,
        fields: &[
            "pools",
            "children_type",
            "children_settings",
            "out_of_range",
            "shadow_children_type",
            "shadow_children_settings",
            "shadow_weights",
        ],
    },
    Handle {
        name: "DistributionRoute",
        build: distribution::build,
        shorthand: None,
        fields: &[
            "child",
            "distributed_delete_rpc_enabled",
            "replay",
            "distribution_source_region",
            "distribution_secure_writes_enabled",
            "return_error_on_mc_delete_failure",
        ],
    },
    Handle {
        name: "L1L2SizeSplitRoute",
        build: l1l2_size_split::build,
        shorthand: None,
        fields: &[
            "l1",
            "l2",
            "threshold",
            "ttl_threshold",
            "failure_ttl",
            "both_full_set",
            "retries",
        ],
    },
    Handle {
        name: "HashStopAllowListRoute",
        build: hash_stop_allow_list::build,
        shorthand: None,
        fields: &["target", "prefixes"],
    },
    Handle {
        name: "McBucketRoute",
        build: mc_bucket::build,
        shorthand: None,
        fields: &[
            "target",
            "bucketize",
            "total_buckets",
            "total_buckets_by_prefix",
            "bucketization_keyspace",
            "salt",
        ],
    },
    Handle {
        name: "HostIdRoute",
        build: host_id::build,
        shorthand: Some("children"),
        fields: &["children", "salt"],
    },
    Handle {
        name: "RoutingGroupRoute",
        build: routing_group::build,
        shorthand: None,
        fields: &["default_policy", "routing_group_policies"],
    },
];

pub fn lookup(name: &str) -> Option<&'static Handle> {
    REGISTRY.iter().find(|h| h.name == name)
}

/// mcrouter's route handles this router does not have (its registry and the routes its tests
/// build): a config naming one is refused saying so, not as a typo.
pub const NOT_SUPPORTED: &[(&str, &str)] = &[
    ("BigValueRoute", "values are not split into chunks"),
    ("CarbonLookasideRoute", "it caches Carbon (Thrift) replies"),
    (
        "KeyParseRoute",
        "it chooses the part of the key a McBucketRoute below hashes; not implemented",
    ),
    (
        "KeySplitRoute",
        "it spreads a hot key over replicas by a key suffix; not implemented",
    ),
    (
        "LoggingRoute",
        "it logs requests to mcrouter's own logger; not implemented",
    ),
    (
        "OriginalClientHashRoute",
        "it hashes the client's address, which mcrouter takes from Thrift",
    ),
    (
        "RateLimitRoute",
        "token-bucket rate limits per operation; not implemented",
    ),
    (
        "SetDistributionTargetRoute",
        "there is no distribution layer (see DistributionRoute)",
    ),
    ("StagingRoute", "not implemented"),
    ("SRRoute", "it is Meta's service-router lookup"),
    ("AxonLogRoute", "it writes to Meta's Axon"),
    ("McRefillRoute", "it is Meta's refill service"),
    ("DistributionLoadTestRoute", "it writes to Meta's distribution layer"),
    ("ShardFilterRoute", "its shard filter is the embedding router's own"),
    ("ShardSplitRoute", "not implemented (PoolRoute `shard_splits`)"),
    ("ClientCompatibilityCheckerRoute", "it reads Carbon client versions"),
    ("OutstandingLimitRoute", "not implemented"),
    ("SlowWarmUpRoute", "not implemented"),
];

/// The load error for a handle type the registry does not have.
pub fn unknown_type(ty: &str) -> String {
    match NOT_SUPPORTED.iter().find(|(name, _)| *name == ty) {
        Some((_, why)) => {
            format!("mcrouter's route handle `{ty}` is not supported by squeal-router ({why}; docs/router.md)")
        }
        None => format!(
            "unknown route handle type `{ty}`: not supported by squeal-router (docs/router.md lists the handles it supports)"
        ),
    }
}

/// What a route answers when it has nothing better (NullRoute, AllAsyncRoute): a miss for gets,
/// not-stored for updates, not-found for the rest; a value the router refused as too large is that
/// error whatever the route.
pub fn default_reply(req: &Request) -> Reply {
    if req.too_large {
        return Reply::error(Res::RemoteError, "object too large for cache");
    }
    match req.cmd {
        Cmd::Get | Cmd::Gets | Cmd::Gat | Cmd::Gats => Reply::new(Res::Miss, bytes::Bytes::new()),
        Cmd::MetaGet | Cmd::MetaDebug | Cmd::LeaseGet => Reply::new(Res::Miss, req.meta_line("EN")),
        Cmd::Set | Cmd::Add | Cmd::Replace | Cmd::Append | Cmd::Prepend | Cmd::Cas | Cmd::LeaseSet => {
            Reply::line(Res::NotStored, "NOT_STORED")
        }
        Cmd::MetaSet => Reply::new(Res::NotStored, req.meta_line("NS")),
        Cmd::Delete | Cmd::Incr | Cmd::Decr | Cmd::Touch => Reply::line(Res::NotFound, "NOT_FOUND"),
        Cmd::MetaDelete | Cmd::MetaArith => Reply::new(Res::NotFound, req.meta_line("NF")),
    }
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

// ---- config field helpers shared by constructors ----

pub fn get_i64(obj: &Map<String, Value>, field: &str) -> Result<Option<i64>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| format!("`{field}` must be an integer")),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|_| format!("`{field}` must be an integer")),
        Some(_) => Err(format!("`{field}` must be an integer")),
    }
}

pub fn get_str<'a>(obj: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("`{field}` must be a string")),
    }
}

pub fn required<'a>(obj: &'a Map<String, Value>, field: &str, handle: &str) -> Result<&'a Value, String> {
    obj.get(field).ok_or_else(|| format!("{handle}: missing `{field}`"))
}

#[cfg(test)]
pub mod testing {
    //! Fake destinations for route tests.
    use super::*;
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
