//! RoutingGroupRoute: picks a child by the request's routing group (mcrouter's Carbon groups):
//! `get_like` (get, gets, gat, gats and meta gets), `update_like` (set, add, replace, append,
//! prepend, cas and meta sets), `delete_like` (delete, md), `arithmetic_like` (incr, decr, ma);
//! anything else (touch) and groups without a policy go to `default_policy`, or get the default
//! reply. OperationSelectorRoute does the same per operation.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, default_reply};
use crate::build::{Builder, Handle};
use crate::protocol::{Op, Reply, Request};

/// mcrouter's routing group names, in the order `RoutingGroupRoute::policies` keeps them.
const GROUPS: [&str; 4] = ["get_like", "update_like", "delete_like", "arithmetic_like"];

fn group(req: &Request) -> Option<usize> {
    match req.op() {
        Op::Get | Op::Gets | Op::LeaseGet => Some(0),
        Op::Set | Op::Add | Op::Replace | Op::Append | Op::Prepend | Op::Cas | Op::LeaseSet => Some(1),
        Op::Delete => Some(2),
        Op::Incr | Op::Decr => Some(3),
        _ => None,
    }
}

pub struct RoutingGroupRoute {
    pub policies: [Option<RouteRef>; 4],
    pub default: Option<RouteRef>,
}

impl RoutingGroupRoute {
    fn pick(&self, req: &Request) -> Option<&RouteRef> {
        group(req)
            .and_then(|g| self.policies[g].as_ref())
            .or(self.default.as_ref())
    }
}

impl Route for RoutingGroupRoute {
    fn route_name(&self) -> String {
        "routing-group".into()
    }

    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        if let Some(r) = self.pick(req) {
            visit(r, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        match self.pick(req) {
            Some(r) => r.route(req),
            None => Box::pin(async move { default_reply(req) }),
        }
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.pick(req)?.first_get_target(req)
    }
}

pub const ROUTING_GROUP_ROUTE: Handle = Handle {
    name: "RoutingGroupRoute",
    build,
    shorthand: None,
    fields: &["default_policy", "routing_group_policies"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let default = match obj.get("default_policy") {
        None | Some(Value::Null) => None,
        Some(v) => Some(b.route(v).map_err(|e| format!("default_policy: {e}"))?),
    };
    let mut policies: [Option<RouteRef>; 4] = Default::default();
    match obj.get("routing_group_policies") {
        None | Some(Value::Null) if default.is_none() => {
            return Err("RoutingGroupRoute needs either `default_policy` or `routing_group_policies`".into());
        }
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, v) in map {
                let g = GROUPS.iter().position(|g| g == name).ok_or_else(|| {
                    format!(
                        "RoutingGroupRoute: `{name}` is not a valid routing group ({})",
                        GROUPS.join(", ")
                    )
                })?;
                policies[g] = Some(b.route(v).map_err(|e| format!("routing_group_policies.{name}: {e}"))?);
            }
        }
        Some(other) => {
            return Err(format!(
                "RoutingGroupRoute: `routing_group_policies` must be an object, not {other}"
            ));
        }
    }
    Ok(Arc::new(RoutingGroupRoute { policies, default }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn each_group_to_its_policy_the_rest_to_the_default() {
        let fakes: Vec<_> = ["g", "u", "d", "a"].iter().map(|n| Fake::new(n, Res::Ok)).collect();
        let def = Fake::new("def", Res::Ok);
        let r = RoutingGroupRoute {
            policies: [0, 1, 2, 3].map(|i| Some(fakes[i].clone() as RouteRef)),
            default: Some(def.clone()),
        };
        let mut ms = req(Cmd::MetaSet, "k");
        ms.meta = vec![bytes::Bytes::from_static(b"MA")];
        run(async {
            for cmd in [
                Cmd::Get,
                Cmd::Gets,
                Cmd::MetaGet,
                Cmd::Set,
                Cmd::Cas,
                Cmd::Delete,
                Cmd::MetaDelete,
                Cmd::Incr,
                Cmd::MetaArith,
                Cmd::Touch,
            ] {
                r.route(&req(cmd, "k")).await;
            }
            r.route(&ms).await; // an append
        });
        let counts: Vec<usize> = fakes.iter().map(|f| f.count()).collect();
        assert_eq!(counts, [3, 3, 2, 2]);
        assert_eq!(def.count(), 1); // touch
        let only_default = RoutingGroupRoute {
            policies: Default::default(),
            default: None,
        };
        assert_eq!(run(only_default.route(&req(Cmd::Delete, "k"))).res, Res::NotFound);
    }
}
