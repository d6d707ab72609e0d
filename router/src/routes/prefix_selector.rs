//! PrefixSelectorRoute: picks a child by the longest matching key prefix in `policies` (the
//! prefix stays on the key), else `wildcard`. The root of a config is implicitly one of these.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, default_reply};
use crate::build::{Builder, Handle};
use crate::protocol::{Reply, Request};

pub struct PrefixSelector {
    /// Longest prefix first.
    pub policies: Vec<(Vec<u8>, RouteRef)>,
    pub wildcard: Option<RouteRef>,
}

impl PrefixSelector {
    pub fn select(&self, key: &[u8]) -> Option<&RouteRef> {
        self.policies
            .iter()
            .find(|(p, _)| key.starts_with(p))
            .map(|(_, r)| r)
            .or(self.wildcard.as_ref())
    }
}

impl Route for PrefixSelector {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        if let Some(r) = self.select(&req.routing_key()) {
            visit(r, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        let chosen = self.select(&req.routing_key()).cloned();
        match chosen {
            Some(r) => Box::pin(async move { r.route(req).await }),
            None => Box::pin(async move { default_reply(req) }),
        }
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.select(&req.routing_key())?.first_get_target(req)
    }
}

pub const PREFIX_SELECTOR_ROUTE: Handle = Handle {
    name: "PrefixSelectorRoute",
    build,
    shorthand: None,
    fields: &["policies", "wildcard"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let mut policies = Vec::new();
    match obj.get("policies") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (prefix, v) in map {
                policies.push((prefix.as_bytes().to_vec(), b.route(v)?));
            }
        }
        Some(_) => return Err("PrefixSelectorRoute: `policies` must be an object".into()),
    }
    policies.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
    let wildcard = match obj.get("wildcard") {
        None | Some(Value::Null) => None,
        Some(v) => Some(b.route(v)?),
    };
    Ok(Arc::new(PrefixSelector { policies, wildcard }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn longest_prefix_wins_and_key_is_kept() {
        let short = Fake::new("short", Res::Found);
        let long = Fake::new("long", Res::Found);
        let wild = Fake::new("wild", Res::Found);
        let r = PrefixSelector {
            policies: vec![
                (b"user:email:".to_vec(), long.clone() as RouteRef),
                (b"user:".to_vec(), short.clone() as RouteRef),
            ],
            wildcard: Some(wild.clone()),
        };
        run(r.route(&req(Cmd::Get, "user:email:x")));
        run(r.route(&req(Cmd::Get, "user:1")));
        run(r.route(&req(Cmd::Get, "post:1")));
        assert_eq!((long.count(), short.count(), wild.count()), (1, 1, 1));
        assert_eq!(&long.last().key[..], b"user:email:x");
    }
}
