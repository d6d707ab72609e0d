//! LatestRoute: a FailoverRoute over at most `failover_count` (default 5) of its children,
//! chosen once per router host (mcrouter: "pseudo-randomly based on client host ID"), so each
//! router talks to few servers and different routers spread over all of them. The choice is
//! `crate::hash::latest_order` of this host's name: stable across restarts and reloads.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::RouteRef;
use super::failover::Failover;
use crate::build::{Builder, Handle, get_i64, required};

/// This machine's name (the host id the choice is made from).
pub fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

pub const LATEST_ROUTE: Handle = Handle {
    name: "LatestRoute",
    build,
    shorthand: Some("children"),
    fields: &[
        "children",
        "failover_count",
        "thresholds",
        "failover_errors",
        "failover_tag",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "LatestRoute")?)?;
    if children.is_empty() {
        return Ok(super::null::over_nothing(b, "LatestRoute"));
    }
    let count = get_i64(obj, "failover_count")?.unwrap_or(5);
    if count < 1 {
        return Err("LatestRoute: `failover_count` must be at least 1".into());
    }
    for field in ["thresholds", "failover_errors", "failover_tag"] {
        if obj.contains_key(field) {
            b.warnings
                .push(format!("LatestRoute: `{field}` ignored (not supported)"));
        }
    }
    let order = crate::hash::latest_order(host_id().as_bytes(), children.len(), count as usize);
    Ok(Arc::new(Failover {
        children: order.into_iter().map(|i| children[i].clone()).collect(),
        ctx: Some(b.ctx().clone()),
        lease_pairing: None,
    }))
}
