//! DistributionRoute: mcrouter's hand-off of cross-region writes to Meta's distribution layer
//! (Axon). A set or delete that an upstream route marked for another region (or for all of them,
//! a `/*/*/` routing prefix) is written to that layer instead of, or besides, `child`; every
//! other request goes to `child` as it is.
//!
//! This router has no distribution layer and no route that marks a request for one (its routing
//! prefixes select only this config's own trees), so every request takes mcrouter's unmarked
//! path: straight to `child`. Cross-region invalidation in squeal travels as MariaDB replication
//! to each region's own squeal daemon, not through the router. The settings
//! (`distributed_delete_rpc_enabled`, `replay`, `distribution_source_region`,
//! `distribution_secure_writes_enabled`, `return_error_on_mc_delete_failure`) are checked as
//! mcrouter checks them and shown in `route_handles`; they change nothing else.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_str, required};
use crate::protocol::{Reply, Request};

pub struct DistributionRoute {
    pub child: RouteRef,
    /// mcrouter's route name, with the settings it was given.
    pub name: String,
}

impl Route for DistributionRoute {
    fn route_name(&self) -> String {
        self.name.clone()
    }

    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.child, req);
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        self.child.route(req)
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.child.first_get_target(req)
    }
}

fn flag(obj: &Map<String, Value>, field: &str, default: bool) -> Result<bool, String> {
    match obj.get(field) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "DistributionRoute: `{field}` must be true or false, not {other}"
        )),
    }
}

/// mcrouter's route name for these settings (also used when PoolRoute's `distribution_enabled`
/// wraps a pool).
pub fn wrap(child: RouteRef, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let rpc = flag(obj, "distributed_delete_rpc_enabled", true)?;
    let replay = flag(obj, "replay", false)?;
    let region = get_str(obj, "distribution_source_region")
        .map_err(|e| format!("DistributionRoute: {e}"))?
        .unwrap_or("");
    let secure = flag(obj, "distribution_secure_writes_enabled", false)?;
    let error_on_failure = flag(obj, "return_error_on_mc_delete_failure", false)?;
    let name = format!(
        "distribution|distributed_delete_rpc_enabled={rpc}|replay={replay}|distribution_source_region={region}\
         |secure_writes={secure}|return_error_on_mc_delete_failure={error_on_failure}"
    );
    Ok(Arc::new(DistributionRoute { child, name }))
}

pub const DISTRIBUTION_ROUTE: Handle = Handle {
    name: "DistributionRoute",
    build,
    shorthand: None,
    fields: &[
        "child",
        "distributed_delete_rpc_enabled",
        "replay",
        "distribution_source_region",
        "distribution_secure_writes_enabled",
        "return_error_on_mc_delete_failure",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let child = b.route(required(obj, "child", "DistributionRoute")?)?;
    wrap(child, obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn every_request_goes_to_the_child_unchanged() {
        let child = Fake::new("child", Res::Deleted);
        let obj = serde_json::json!({"replay": false, "distribution_source_region": "oregon"});
        let r = wrap(child.clone(), obj.as_object().unwrap()).unwrap();
        run(async {
            assert_eq!(r.route(&req(Cmd::Delete, "/*/*/k")).await.res, Res::Deleted);
            r.route(&set_req("k", 5)).await;
            r.route(&req(Cmd::Get, "g")).await;
        });
        assert_eq!(child.count(), 3);
        assert_eq!(child.last().cmd, Cmd::Get);
        assert!(
            r.route_name()
                .contains("|replay=false|distribution_source_region=oregon|"),
            "{}",
            r.route_name()
        );
        let bad = serde_json::json!({"replay": "yes"});
        let e = wrap(child, bad.as_object().unwrap()).err().unwrap();
        assert!(e.contains("`replay` must be true or false"), "{e}");
    }
}
