//! HostIdRoute: every request of this router goes to one child, chosen once by the router's
//! host (mcrouter's: `hostid` mod the number of children, with `salt` mixed in), so a fleet of
//! routers spreads over the children while each router talks to one. The host is this machine's
//! name, hashed as LatestRoute's choice is (`crate::hash::latest_order`), so not necessarily the
//! child a real mcrouter on this host would pick. Over no children it is a NullRoute, as in mcrouter.

use serde_json::{Map, Value};

use super::RouteRef;
use crate::build::{Builder, Handle, get_str, required};

pub const HOST_ID_ROUTE: Handle = Handle {
    name: "HostIdRoute",
    build,
    shorthand: Some("children"),
    fields: &["children", "salt"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let mut children = b.children(required(obj, "children", "HostIdRoute")?)?;
    if children.is_empty() {
        return Ok(super::null::over_nothing(b, "HostIdRoute"));
    }
    let host = format!("{}{}", super::latest::host_id(), get_str(obj, "salt")?.unwrap_or(""));
    let i = crate::hash::latest_order(host.as_bytes(), children.len(), 1)[0];
    Ok(children.swap_remove(i))
}
