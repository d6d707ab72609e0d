//! AllMajorityRoute: sends to every child and answers as soon as a majority agree on a result;
//! without a majority, the most common result (the worst among equals).

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, required};
use crate::protocol::{Reply, Request, Res};

pub struct AllMajority {
    pub children: Vec<RouteRef>,
}

impl Route for AllMajority {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let n = self.children.len();
            // Spawned, so children still finish (and spool failed deletes) after the answer.
            let mut pending: FuturesUnordered<_> = self
                .children
                .iter()
                .map(|c| {
                    let (c, r) = (c.clone(), req.clone());
                    tokio::spawn(async move { c.route(&r).await })
                })
                .collect();
            // A delete waits for every child: one that was neither delivered nor spooled must be the
            // answer (`crate::ack`), whatever the majority says.
            let deletes = req.is_delete();
            let mut all: Vec<Reply> = Vec::new();
            let mut majority: Option<Reply> = None;
            let mut seen: HashMap<Res, (usize, Reply)> = HashMap::new();
            while let Some(joined) = pending.next().await {
                let reply = joined.unwrap_or_else(|_| Reply::error(Res::LocalError, "route task failed"));
                if deletes {
                    all.push(reply.clone());
                }
                let entry = seen.entry(reply.res).or_insert((0, reply));
                entry.0 += 1;
                if entry.0 * 2 > n && majority.is_none() {
                    if !deletes {
                        return entry.1.clone();
                    }
                    majority = Some(entry.1.clone());
                }
            }
            if let Some(lost) = crate::ack::any_lost(req, &all) {
                return lost.clone();
            }
            if let Some(m) = majority {
                return m;
            }
            seen.into_values()
                .max_by(|a, b| a.0.cmp(&b.0).then(a.1.res.severity().cmp(&b.1.res.severity())))
                .map(|(_, r)| r)
                .unwrap_or_else(|| super::default_reply(req))
        })
    }
}

pub const ALL_MAJORITY_ROUTE: Handle = Handle {
    name: "AllMajorityRoute",
    build,
    shorthand: Some("children"),
    fields: &["children"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "AllMajorityRoute")?)?;
    Ok(Arc::new(AllMajority { children }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::testing::*;

    #[test]
    fn majority_wins() {
        let a = Fake::new("a", Res::Stored);
        let b = Fake::new("b", Res::Tko);
        let c = Fake::new("c", Res::Stored);
        let r = AllMajority {
            children: vec![a, b, c],
        };
        assert_eq!(run(r.route(&set_req("k", 0))).res, Res::Stored);
    }

    #[test]
    fn a_lost_delete_outvotes_the_majority() {
        use crate::protocol::Cmd;
        let a = Fake::new("a", Res::Deleted);
        let b = Fake::new("b", Res::Deleted);
        let c = Fake::new("c", Res::Tko); // not spooled
        let r = AllMajority {
            children: vec![a, b, c.clone()],
        };
        assert_eq!(run(r.route(&req(Cmd::Delete, "k"))).res, Res::Tko);
        let spooled = Fake::spooling("s", Res::Tko);
        let r = AllMajority {
            children: vec![Fake::new("a", Res::Deleted), Fake::new("b", Res::Deleted), spooled],
        };
        assert_eq!(run(r.route(&req(Cmd::Delete, "k"))).res, Res::Deleted);
    }
}
