//! AllAsyncRoute: fires the request at every child in the background and answers at once with
//! the default reply (as mcrouter does); nobody waits for slow children.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, default_reply};
use crate::build::{Builder, Handle, required};
use crate::protocol::{Reply, Request};

pub struct AllAsync {
    pub children: Vec<RouteRef>,
}

pub fn spawn_to(child: &RouteRef, req: &Request) {
    let child = child.clone();
    let req = req.clone();
    tokio::spawn(async move {
        child.route(&req).await;
    });
}

impl Route for AllAsync {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        for c in &self.children {
            spawn_to(c, req);
        }
        Box::pin(async move { default_reply(req) })
    }
}

pub const ALL_ASYNC_ROUTE: Handle = Handle {
    name: "AllAsyncRoute",
    build,
    shorthand: Some("children"),
    fields: &["children"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "AllAsyncRoute")?)?;
    Ok(Arc::new(AllAsync { children }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn answers_default_and_reaches_all() {
        let a = Fake::new("a", Res::Stored);
        let b = Fake::new("b", Res::Stored);
        let r = AllAsync {
            children: vec![a.clone(), b.clone()],
        };
        run(async {
            let reply = r.route(&set_req("k", 0)).await;
            assert_eq!(reply.res, Res::NotStored);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!((a.count(), b.count()), (1, 1));
        let _ = req(Cmd::Get, "x");
    }

    #[test]
    fn a_too_large_set_is_answered_as_memcached_answers_it() {
        let a = Fake::new("a", Res::Deleted);
        let r = AllAsync {
            children: vec![a.clone()],
        };
        let mut set = set_req("k", 0);
        set.too_large = true;
        let reply = run(async {
            let reply = r.route(&set).await;
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            reply
        });
        assert_eq!(&reply.wire[..], b"SERVER_ERROR object too large for cache\r\n");
        assert!(a.last().too_large, "the child still gets the unlink");
    }
}
