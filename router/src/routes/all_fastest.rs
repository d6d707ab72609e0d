//! AllFastestRoute: sends to every child at once and answers with the first non-error reply
//! (all errors: the last one); the other children finish in the background.
//!
//! Deletes keep the acknowledgement rule (`crate::ack`): a delete waits for every child, and a
//! child that neither has it nor spooled it is the answer — a fast child's `DELETED` must not
//! hide a replica that missed the delete.

use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::{BoxFuture, Route, RouteRef, required};
use crate::config::Builder;
use crate::protocol::{Reply, Request};

pub struct AllFastest {
    pub children: Vec<RouteRef>,
}

impl Route for AllFastest {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let (tx, mut rx) = mpsc::unbounded_channel();
            for c in &self.children {
                let (c, r, tx) = (c.clone(), req.clone(), tx.clone());
                // spawned: the slower children run on after the answer has gone
                tokio::spawn(async move {
                    let _ = tx.send(c.route(&r).await);
                });
            }
            drop(tx);
            let mut replies = Vec::with_capacity(self.children.len());
            while let Some(reply) = rx.recv().await {
                if !req.is_delete() && !reply.res.is_error() {
                    return reply;
                }
                replies.push(reply);
            }
            if req.is_delete() {
                if let Some(i) = replies.iter().position(|r| crate::ack::lost(req, r)) {
                    return replies.swap_remove(i);
                }
                if let Some(i) = replies.iter().position(|r| !r.res.is_error()) {
                    return replies.swap_remove(i);
                }
            }
            replies.pop().unwrap_or_else(|| super::default_reply(req))
        })
    }
}

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "AllFastestRoute")?)?;
    if children.is_empty() {
        return Err("AllFastestRoute: empty `children`".into());
    }
    Ok(Arc::new(AllFastest { children }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn first_success_wins_for_reads_but_deletes_wait_for_all() {
        let a = Fake::new("a", Res::Timeout);
        let b = Fake::new("b", Res::Found);
        let r = AllFastest {
            children: vec![a.clone(), b.clone()],
        };
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Found);
        b.set(Res::Tko);
        assert!(run(r.route(&req(Cmd::Get, "k"))).res.is_error());
        // a delete one replica lost (not spooled) is not acknowledged
        a.set(Res::Deleted);
        let reply = run(r.route(&req(Cmd::Delete, "k")));
        assert_eq!(reply.res, Res::Tko);
        // ... but a spooled one is
        let c = Fake::spooling("c", Res::Tko);
        let r = AllFastest {
            children: vec![a.clone(), c.clone()],
        };
        let reply = run(r.route(&req(Cmd::Delete, "k")));
        assert_eq!(reply.res, Res::Deleted);
    }
}
