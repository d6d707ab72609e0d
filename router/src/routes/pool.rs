//! PoolRoute: a HashRoute over the servers of a named (or inline) pool — mcrouter's usual leaf.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::RouteRef;
use super::hash::{HashRoute, hash_settings};
use super::required;
use crate::config::Builder;

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let dests = b.pool(required(obj, "pool", "PoolRoute")?)?;
    if dests.is_empty() {
        return Err("PoolRoute: pool has no servers".into());
    }
    let (func, salt) = hash_settings(obj)?;
    Ok(Arc::new(HashRoute {
        children: dests,
        func,
        salt,
    }))
}
