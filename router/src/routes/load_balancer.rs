//! LoadBalancerRoute: mcrouter weighs its children by the load each server reports in its
//! replies (WeightedCh3 over 1 - load). memcached reports no load, so every weight stays 1.0,
//! and WeightedCh3 with equal weights is Ch3: the route hashes the key (with `salt`) over its
//! children. Said at load; `load_ttl_ms` and `default_server_load_percent` have nothing to act on.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::hash::HashRoute;
use super::{RouteRef, get_i64, get_str, required};
use crate::config::Builder;
use crate::hash::HashFunc;

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "LoadBalancerRoute")?)?;
    if children.is_empty() {
        return Err("LoadBalancerRoute: empty `children`".into());
    }
    let salt = get_str(obj, "salt")?.unwrap_or("").as_bytes().to_vec();
    if let Some(p) = get_i64(obj, "default_server_load_percent")?
        && !(0..=100).contains(&p)
    {
        return Err("LoadBalancerRoute: `default_server_load_percent` must be from 0 to 100".into());
    }
    get_i64(obj, "load_ttl_ms")?;
    b.warnings.push(
        "LoadBalancerRoute: memcached reports no server load: children are chosen by Ch3 of the key \
         (equal weights); load_ttl_ms/default_server_load_percent have no effect"
            .into(),
    );
    Ok(Arc::new(HashRoute {
        children,
        func: HashFunc::Ch3,
        salt,
    }))
}
