//! DevNullRoute and BlackholeRoute: places where requests are dropped on purpose.
//!
//! DevNullRoute answers like NullRoute (mcrouter's is a NullRoute that is counted): a miss for
//! gets, `NOT_STORED` for updates, `NOT_FOUND` for deletes. A delete sent there goes to no
//! destination at all, so "every destination has it" holds trivially: the route is a decision
//! to discard (a pool being retired), and mcrouter answers the same `NOT_FOUND`.
//!
//! BlackholeRoute (`default`, `policies`, optional `blackhole_child`) matches its `policies`
//! against fields of mcrouter's Carbon (thrift) requests, which memcached's text protocol does
//! not carry: no request can match, so every request goes to `default` (said at load).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::RouteRef;
use super::null::Null;
use crate::build::{Builder, Handle, required};

pub const DEV_NULL_ROUTE: Handle = Handle {
    name: "DevNullRoute",
    build: build_dev_null,
    shorthand: None,
    fields: &[],
};

pub fn build_dev_null(_b: &mut Builder, _obj: &Map<String, Value>) -> Result<RouteRef, String> {
    Ok(Arc::new(Null))
}

pub const BLACKHOLE_ROUTE: Handle = Handle {
    name: "BlackholeRoute",
    build: build_blackhole,
    shorthand: None,
    fields: &["default", "blackhole_child", "policies"],
};

pub fn build_blackhole(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let default = b.route(required(obj, "default", "BlackholeRoute")?)?;
    match obj.get("policies") {
        Some(Value::Object(_)) => {}
        Some(_) => return Err("BlackholeRoute: `policies` must be an object".into()),
        None => return Err("BlackholeRoute: missing `policies`".into()),
    }
    if let Some(child) = obj.get("blackhole_child") {
        b.route(child)?; // still checked, so a broken child does not wait for a later edit
    }
    b.warnings.push(
        "BlackholeRoute: `policies` match Carbon request fields that text-protocol requests do not carry: \
         nothing is blackholed, every request goes to `default`"
            .into(),
    );
    Ok(default)
}

#[cfg(test)]
mod tests {
    use crate::protocol::{Cmd, Res};
    use crate::routes::Route;
    use crate::routes::null::Null;
    use crate::routes::testing::*;

    #[test]
    fn dev_null_answers_like_mcrouter() {
        let r = Null;
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Miss);
        assert_eq!(&run(r.route(&req(Cmd::Delete, "k"))).wire[..], b"NOT_FOUND\r\n");
        assert_eq!(run(r.route(&set_req("k", 0))).res, Res::NotStored);
    }
}
