//! AllSyncRoute: sends to every child at once, waits for all, answers the worst reply
//! (e.g. a replicated pool's delete: any replica failing shows). The ranking, with spooled
//! deletes, is `crate::ack::worst`.

use std::sync::Arc;

use futures_util::future::join_all;
use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, required};
use crate::protocol::{Reply, Request};

pub struct AllSync {
    pub children: Vec<RouteRef>,
}

impl Route for AllSync {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let replies = join_all(self.children.iter().map(|c| c.route(req))).await;
            crate::ack::worst(replies).unwrap_or_else(|| super::default_reply(req))
        })
    }
}

pub const ALL_SYNC_ROUTE: Handle = Handle {
    name: "AllSyncRoute",
    build,
    shorthand: Some("children"),
    fields: &["children"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "AllSyncRoute")?)?;
    Ok(Arc::new(AllSync { children }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn reaches_all_and_returns_worst() {
        let a = Fake::new("a", Res::Deleted);
        let b = Fake::new("b", Res::NotFound);
        let c = Fake::new("c", Res::Deleted);
        let r = AllSync {
            children: vec![a.clone(), b.clone(), c.clone()],
        };
        let reply = run(r.route(&req(Cmd::Delete, "k")));
        assert_eq!(reply.res, Res::NotFound);
        assert_eq!((a.count(), b.count(), c.count()), (1, 1, 1));
        c.set(Res::Tko);
        assert_eq!(run(r.route(&req(Cmd::Delete, "k"))).res, Res::Tko);
    }

    #[test]
    fn a_replica_delete_refused_by_the_spool_outranks_a_spooled_one() {
        let a = Fake::spooling("a", Res::Tko);
        let b = Fake::new("b", Res::Tko); // failed, not spooled
        let r = AllSync {
            children: vec![a.clone(), b.clone()],
        };
        let reply = run(r.route(&req(Cmd::Delete, "k")));
        assert!(!reply.spooled && reply.res == Res::Tko, "{reply:?}");
        // all spooled (or answered): acknowledged
        b.set(Res::Deleted);
        let reply = run(r.route(&req(Cmd::Delete, "k")));
        assert!(crate::ack::delivered(&reply));
    }
}
