//! PoolRoute: a HashRoute over the servers of a named (or inline) pool — mcrouter's usual leaf.
//! As in mcrouter, `"bucketize": true` hashes buckets instead of keys (a McBucketRoute around a
//! bucket-hashed pool, `mc_bucket.rs`; `useBucketHashSelector` hashes the bucket of a McBucketRoute
//! above), `"distribution_enabled": true` puts a DistributionRoute in front, and `shadows` copy
//! the requests of some servers to other routes (`shadow.rs`).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::RouteRef;
use super::hash::{HashRoute, pool_hash_settings};
use super::mc_bucket::BucketHashRoute;
use crate::build::{Builder, Handle, required};

fn flag(obj: &Map<String, Value>, field: &str) -> Result<bool, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("PoolRoute: `{field}` must be true or false, not {other}")),
    }
}

pub const POOL_ROUTE: Handle = Handle {
    name: "PoolRoute",
    build,
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
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let pool = required(obj, "pool", "PoolRoute")?;
    let dests = b.pool(pool)?;
    if dests.is_empty() {
        let name = match pool {
            Value::String(name) => name.clone(),
            other => other
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("inline")
                .to_string(),
        };
        let error_on_empty = b
            .pool_field(pool, "error_on_empty")
            .and_then(|v| v.as_bool())
            .unwrap_or(true);
        return Ok(super::hash::over_nothing(b, "PoolRoute", &name, error_on_empty));
    }
    // as in mcrouter, the shadows wrap the pool's servers before anything chooses among them
    let dests = super::shadow::wrap_pool(b, obj, dests)?;
    if let Some(r) = super::hash::as_route(b, obj, &dests)? {
        return Ok(r);
    }
    let (func, salt) = pool_hash_settings(b, obj, "PoolRoute", pool, dests.len())?;
    let bucketize = flag(obj, "bucketize")?;
    let mut route: RouteRef = if bucketize || flag(obj, "useBucketHashSelector")? {
        Arc::new(BucketHashRoute {
            children: dests,
            func,
            salt,
        })
    } else {
        Arc::new(HashRoute {
            children: dests,
            func,
            salt,
        })
    };
    if flag(obj, "distribution_enabled")? {
        route = super::distribution::wrap(route, obj)?;
    }
    if bucketize {
        route = super::mc_bucket::wrap(route, obj)?;
    }
    Ok(route)
}
