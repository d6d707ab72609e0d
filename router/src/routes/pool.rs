//! PoolRoute: a HashRoute over the servers of a named (or inline) pool — mcrouter's usual leaf.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::RouteRef;
use super::hash::{HashRoute, hash_settings};
use super::required;
use crate::config::Builder;

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let pool = required(obj, "pool", "PoolRoute")?;
    let dests = b.pool(pool)?;
    if dests.is_empty() {
        return Err("PoolRoute: pool has no servers".into());
    }
    let pool_weights = b.pool_field(pool, "weights");
    let (func, salt) = hash_settings(b, obj, "PoolRoute", pool_weights.as_ref(), dests.len())?;
    if pool_weights.is_some() && matches!(func, crate::hash::HashFunc::WeightedCh3(_)) {
        b.weights_used(pool);
    }
    Ok(Arc::new(HashRoute {
        children: dests,
        func,
        salt,
    }))
}
