//! HostIdRoute: every request of this router goes to one child, chosen once by the router's
//! host (mcrouter's: `hostid` mod the number of children, with `salt` mixed in), so a fleet of
//! routers spreads over the children while each router talks to one. The host is this machine's
//! name, hashed as LatestRoute's choice is (`crate::hash::latest_order`), so not necessarily the
//! child a real mcrouter on this host would pick. Over no children it is a NullRoute, as in mcrouter.

use serde_json::{Map, Value};

use super::{RouteRef, get_str, required};
use crate::config::Builder;

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let mut children = b.children(required(obj, "children", "HostIdRoute")?)?;
    if children.is_empty() {
        return Ok(super::null::over_nothing(b, "HostIdRoute"));
    }
    let host = format!("{}{}", super::latest::host_id(), get_str(obj, "salt")?.unwrap_or(""));
    let i = crate::hash::latest_order(host.as_bytes(), children.len(), 1)[0];
    Ok(children.swap_remove(i))
}

#[cfg(test)]
mod tests {
    use crate::protocol::Cmd;
    use crate::routes::testing::{req, run};

    #[test]
    fn one_child_per_router_host_and_none_is_a_null_route() {
        run(async {
            let c = crate::context::Context::new(crate::options::Options::default(), None);
            let text = r#"{"pools": {"p": {"servers": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]}, "e": {"servers": []}},
                "route": {"type": "PrefixSelectorRoute", "policies": {"e:": "HostIdRoute|Pool|e"},
                          "wildcard": {"type": "HostIdRoute", "children": "Pool|p", "salt": "x"}}}"#;
            let cfg = crate::config::load(&c, text, None).unwrap();
            let host = format!("{}x", crate::routes::latest::host_id());
            let want = crate::hash::latest_order(host.as_bytes(), 3, 1)[0];
            for key in ["a", "b", "c", "d"] {
                let r = req(Cmd::Get, key);
                let route = cfg.select(&mut r.clone()).ok().unwrap().0.clone();
                let target = route.first_get_target(&r).unwrap();
                assert_eq!(target.index, want, "{key}");
            }
            let mut r = req(Cmd::Get, "e:k");
            let route = cfg.select(&mut r).ok().unwrap().0.clone();
            assert_eq!(route.route(&r).await.res, crate::protocol::Res::Miss);
            assert!(
                cfg.warnings.iter().any(|w| w.starts_with("HostIdRoute: no children")),
                "{:?}",
                cfg.warnings
            );
        });
    }
}
