//! HashStopAllowListRoute: only keys with an allowed prefix may carry a hash stop (`|#|`, which
//! makes the key placed by its part before the stop: see `Request::routing_key`). Other keys with
//! one are refused with `SERVER_ERROR Hash stop not permitted` (mcrouter's local error) before
//! they reach `target`, so a client cannot pile unrelated keys onto one server. Keys without a
//! hash stop always pass. Config: `target`, `prefixes` (strings; none means no key may have one).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, required};
use crate::protocol::{Reply, Request, Res};

pub struct HashStopAllowListRoute {
    pub target: RouteRef,
    pub prefixes: Vec<Vec<u8>>,
}

impl HashStopAllowListRoute {
    fn allowed(&self, req: &Request) -> bool {
        !req.has_hash_stop() || self.prefixes.iter().any(|p| req.key.starts_with(p))
    }
}

impl Route for HashStopAllowListRoute {
    fn route_name(&self) -> String {
        format!("HashStopAllowListRoute|num_prefixes={}", self.prefixes.len())
    }

    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        if self.allowed(req) {
            visit(&self.target, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        if self.allowed(req) {
            return self.target.route(req);
        }
        Box::pin(async move { Reply::error(Res::LocalError, "Hash stop not permitted") })
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        if self.allowed(req) {
            self.target.first_get_target(req)
        } else {
            None
        }
    }
}

pub const HASH_STOP_ALLOW_LIST_ROUTE: Handle = Handle {
    name: "HashStopAllowListRoute",
    build,
    shorthand: None,
    fields: &["target", "prefixes"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let target = b.route(required(obj, "target", "HashStopAllowListRoute")?)?;
    let prefixes = match obj.get("prefixes") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|p| {
                p.as_str()
                    .map(|s| s.as_bytes().to_vec())
                    .ok_or_else(|| format!("HashStopAllowListRoute: `prefixes` must be strings, not {p}"))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "HashStopAllowListRoute: `prefixes` must be a list, not {other}"
            ));
        }
    };
    Ok(Arc::new(HashStopAllowListRoute { target, prefixes }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Cmd;
    use crate::routes::testing::*;

    #[test]
    fn hash_stops_only_for_allowed_prefixes() {
        // mcrouter's HashStopAllowListRouteTest cases
        let target = Fake::new("t", Res::Stored);
        let r = HashStopAllowListRoute {
            target: target.clone(),
            prefixes: vec![b"foo".to_vec(), b"baz".to_vec(), b"abc".to_vec()],
        };
        run(async {
            assert_eq!(r.route(&set_req("zoo", 0)).await.res, Res::Stored);
            assert_eq!(r.route(&set_req("abc|#|1", 0)).await.res, Res::Stored);
            let refused = r.route(&set_req("zoo|#|a", 0)).await;
            assert_eq!(refused.res, Res::LocalError);
            assert_eq!(&refused.wire[..], b"SERVER_ERROR Hash stop not permitted\r\n");
        });
        assert_eq!(target.count(), 2);
        let none = HashStopAllowListRoute {
            target: target.clone(),
            prefixes: vec![],
        };
        assert!(run(none.route(&req(Cmd::Get, "abc|#|1"))).res == Res::LocalError);
        assert!(run(none.route(&req(Cmd::Get, "abc|1"))).res != Res::LocalError);
    }
}
