//! MissFailoverRoute: for gets, tries children in order until one hits (misses and errors move
//! on); other operations go to the first child only.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle};
use crate::protocol::{Reply, Request};

pub struct MissFailover {
    pub children: Vec<RouteRef>,
}

impl Route for MissFailover {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        if !req.is_get() {
            return self.children[0].route(req);
        }
        Box::pin(async move {
            let mut first: Option<Reply> = None;
            for c in &self.children {
                let reply = c.route(req).await;
                if reply.res.is_hit() {
                    return reply;
                }
                first.get_or_insert(reply);
            }
            first.expect("at least one child")
        })
    }
}

pub const MISS_FAILOVER_ROUTE: Handle = Handle {
    name: "MissFailoverRoute",
    build,
    shorthand: Some("children"),
    fields: &["children"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    super::null::over_children(b, obj, "MissFailoverRoute", |children| {
        Arc::new(MissFailover { children })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn misses_move_on() {
        let a = Fake::new("a", Res::Miss);
        let b = Fake::new("b", Res::Found);
        let r = MissFailover {
            children: vec![a.clone(), b.clone()],
        };
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Found);
        run(r.route(&set_req("k", 0)));
        assert_eq!((a.count(), b.count()), (2, 1));
    }
}
