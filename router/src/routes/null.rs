//! NullRoute: answers every request with the default reply (miss / not stored / not found)
//! without touching a server.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, default_reply};
use crate::build::{Builder, Handle, required};
use crate::protocol::{Reply, Request};

pub struct Null;

impl Route for Null {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move { default_reply(req) })
    }
}

pub const NULL_ROUTE: Handle = Handle {
    name: "NullRoute",
    build,
    shorthand: None,
    fields: &[],
};

pub fn build(_b: &mut Builder, _obj: &Map<String, Value>) -> Result<RouteRef, String> {
    Ok(Arc::new(Null))
}

/// What mcrouter builds for a handle over no children (an empty pool in `children`): a NullRoute.
/// Said at load, since every request then gets a miss or `NOT_STORED`/`NOT_FOUND`.
pub fn over_nothing(b: &mut Builder, handle: &str) -> RouteRef {
    b.warnings.push(format!(
        "{handle}: no children (an empty pool?): a NullRoute, as in mcrouter: gets miss, updates are not stored"
    ));
    Arc::new(Null)
}

/// The route `make` builds over the handle's `children`; over none (an empty pool?), mcrouter's
/// NullRoute ([`over_nothing`]).
pub fn over_children(
    b: &mut Builder,
    obj: &Map<String, Value>,
    handle: &str,
    make: impl FnOnce(Vec<RouteRef>) -> RouteRef,
) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", handle)?)?;
    if children.is_empty() {
        return Ok(over_nothing(b, handle));
    }
    Ok(make(children))
}
