//! OperationSelectorRoute: picks a child by operation (`operation_policies` keyed by mcrouter
//! operation names), else `default_policy`. Meta commands count as their classic operation:
//! mg→get, ms→set/add/replace/append/prepend by its mode flag, md→delete, ma→incr/decr.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, default_reply};
use crate::build::{Builder, Handle};
use crate::protocol::{Op, Reply, Request};

pub struct OperationSelector {
    pub policies: HashMap<Op, RouteRef>,
    pub default: Option<RouteRef>,
}

impl Route for OperationSelector {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        if let Some(r) = self.policies.get(&req.op()).or(self.default.as_ref()) {
            visit(r, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        match self.policies.get(&req.op()).or(self.default.as_ref()) {
            Some(r) => r.route(req),
            None => Box::pin(async move { default_reply(req) }),
        }
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.policies
            .get(&req.op())
            .or(self.default.as_ref())?
            .first_get_target(req)
    }
}

pub const OPERATION_SELECTOR_ROUTE: Handle = Handle {
    name: "OperationSelectorRoute",
    build,
    shorthand: None,
    fields: &["default_policy", "operation_policies"],
};

// mcrouter's older name for OperationSelectorRoute
pub const PREFIX_POLICY_ROUTE: Handle = Handle {
    name: "PrefixPolicyRoute",
    build,
    shorthand: None,
    fields: &["default_policy", "operation_policies"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let mut policies = HashMap::new();
    match obj.get("operation_policies") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, v) in map {
                let op =
                    Op::from_name(name).ok_or_else(|| format!("OperationSelectorRoute: unknown operation `{name}`"))?;
                policies.insert(op, b.route(v)?);
            }
        }
        Some(_) => {
            return Err("OperationSelectorRoute: `operation_policies` must be an object".into());
        }
    }
    let default = match obj.get("default_policy") {
        None | Some(Value::Null) => None,
        Some(v) => Some(b.route(v)?),
    };
    Ok(Arc::new(OperationSelector { policies, default }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn selects_by_op_including_meta() {
        let del = Fake::new("del", Res::Deleted);
        let def = Fake::new("def", Res::Found);
        let add = Fake::new("add", Res::Stored);
        let mut policies: HashMap<Op, RouteRef> = HashMap::new();
        policies.insert(Op::Delete, del.clone());
        policies.insert(Op::Add, add.clone());
        let r = OperationSelector {
            policies,
            default: Some(def.clone()),
        };
        run(r.route(&req(Cmd::Delete, "k")));
        run(r.route(&req(Cmd::MetaDelete, "k")));
        run(r.route(&req(Cmd::Get, "k")));
        let mut ms = req(Cmd::MetaSet, "k");
        ms.meta = vec![bytes::Bytes::from_static(b"ME")];
        run(r.route(&ms));
        assert_eq!((del.count(), def.count(), add.count()), (2, 1, 1));
    }

    #[test]
    fn lease_commands_are_operations_of_their_own() {
        let get = Fake::new("get", Res::Found);
        let lease = Fake::new("lease", Res::Miss);
        let def = Fake::new("def", Res::Stored);
        let policies: HashMap<Op, RouteRef> =
            [(Op::Get, get.clone() as RouteRef), (Op::LeaseGet, lease.clone())].into();
        let r = OperationSelector {
            policies,
            default: Some(def.clone()),
        };
        run(r.route(&req(Cmd::LeaseGet, "k")));
        run(r.route(&req(Cmd::Get, "k")));
        run(r.route(&req(Cmd::LeaseSet, "k"))); // no `lease-set` policy: the default, not `set`'s
        assert_eq!((get.count(), lease.count(), def.count()), (1, 1, 1));
    }
}
