//! FailoverRoute: tries children in order while they fail with a failover-type error
//! (TKO, connect errors, timeouts, busy, remote/local errors). A miss never fails over.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, required};
use crate::Context;
use crate::config::Builder;
use crate::protocol::{Reply, Request};

pub struct Failover {
    pub children: Vec<RouteRef>,
    pub ctx: Option<Arc<Context>>,
}

/// Try `children` in order until one answers with something other than a failover-type error:
/// every reply, in order (the answer is `ack::after_failover`'s choice among them).
pub async fn try_in_order(children: &[RouteRef], req: &Request, tried: &mut Vec<Reply>) {
    for c in children {
        let reply = c.route(req).await;
        let done = !reply.res.is_failover_error();
        tried.push(reply);
        if done {
            return;
        }
    }
}

impl Route for Failover {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let first = self.children[0].route(req).await;
            if !first.res.is_failover_error() || self.children.len() == 1 {
                return first;
            }
            if let Some(ctx) = &self.ctx {
                ctx.stats.failovers.fetch_add(1, Relaxed);
            }
            let mut tried = vec![first];
            try_in_order(&self.children[1..], req, &mut tried).await;
            crate::ack::after_failover(req, tried)
        })
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.children[0].first_get_target(req)
    }

    fn first_server(&self, req: &Request) -> Option<&crate::server::Server> {
        self.children[0].first_server(req)
    }
}

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "FailoverRoute")?)?;
    if children.is_empty() {
        return Ok(super::null::over_nothing(b, "FailoverRoute"));
    }
    Ok(Arc::new(Failover {
        children,
        ctx: Some(b.ctx().clone()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn fails_over_on_errors_not_misses() {
        let a = Fake::new("a", Res::Tko);
        let b = Fake::new("b", Res::Found);
        let r = Failover {
            children: vec![a.clone(), b.clone()],
            ctx: None,
        };
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Found);
        a.set(Res::Miss);
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Miss);
        assert_eq!(b.count(), 1);
        a.set(Res::Timeout);
        b.set(Res::ConnectError);
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::ConnectError);
    }
}
