//! AllFastestRoute: sends to every child at once and answers with the first non-error reply
//! (all errors: the last one); the other children finish in the background.
//!
//! Deletes keep the acknowledgement rule (`crate::ack::delete_answer`): a delete waits for every
//! child, and a child that neither has it nor spooled it is the answer — a fast child's `DELETED`
//! must not hide a replica that missed the delete.

use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle};
use crate::protocol::{Reply, Request};

pub struct AllFastest {
    pub children: Vec<RouteRef>,
}

impl Route for AllFastest {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

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
            if replies.is_empty() {
                return super::default_reply(req);
            }
            if req.is_delete() {
                return crate::ack::delete_answer(replies);
            }
            replies.pop().expect("not empty")
        })
    }
}

pub const ALL_FASTEST_ROUTE: Handle = Handle {
    name: "AllFastestRoute",
    build,
    shorthand: Some("children"),
    fields: &["children"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    super::null::over_children(b, obj, "AllFastestRoute", |children| Arc::new(AllFastest { children }))
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

    #[test]
    fn delete_acknowledgement_is_acks_rule() {
        use crate::ack::{delivered, for_client};
        let del = req(Cmd::Delete, "k");
        // every child spooled: acknowledged, answered NOT_FOUND
        let r = AllFastest {
            children: vec![Fake::spooling("a", Res::Tko), Fake::spooling("b", Res::Timeout)],
        };
        let reply = run(r.route(&del));
        assert!(reply.spooled && delivered(&reply));
        assert_eq!(&for_client(&del, reply).wire[..], b"NOT_FOUND\r\n");
        // one lost among spooled and delivered ones: the lost one, whatever arrived first
        let r = AllFastest {
            children: vec![
                Fake::new("a", Res::Deleted),
                Fake::spooling("b", Res::Tko),
                Fake::new("c", Res::Timeout),
            ],
        };
        let reply = run(r.route(&del));
        assert!(crate::ack::lost(&del, &reply) && reply.res == Res::Timeout, "{reply:?}");
        // a miss on one and a delete on the other: an answered one (not an error)
        let r = AllFastest {
            children: vec![Fake::spooling("a", Res::Tko), Fake::new("b", Res::NotFound)],
        };
        assert_eq!(run(r.route(&del)).res, Res::NotFound);
    }
}
