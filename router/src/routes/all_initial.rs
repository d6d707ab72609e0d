//! AllInitialRoute: sends to every child, answers with the first child's reply; the others run
//! in the background.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::all_async::spawn_to;
use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle};
use crate::protocol::{Reply, Request};

pub struct AllInitial {
    pub children: Vec<RouteRef>,
}

impl Route for AllInitial {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        for c in self.children.iter().skip(1) {
            spawn_to(c, req);
        }
        self.children[0].route(req)
    }
}

pub const ALL_INITIAL_ROUTE: Handle = Handle {
    name: "AllInitialRoute",
    build,
    shorthand: Some("children"),
    fields: &["children"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    super::null::over_children(b, obj, "AllInitialRoute", |children| Arc::new(AllInitial { children }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Res;
    use crate::routes::testing::*;

    #[test]
    fn first_child_answers() {
        let a = Fake::new("a", Res::NotStored);
        let b = Fake::new("b", Res::Stored);
        let r = AllInitial {
            children: vec![a.clone(), b.clone()],
        };
        run(async {
            assert_eq!(r.route(&set_req("k", 0)).await.res, Res::NotStored);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(b.count(), 1);
    }
}
