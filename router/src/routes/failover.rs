//! FailoverRoute: tries children in order while they fail with a failover-type error
//! (TKO, connect errors, timeouts, busy, remote/local errors). A miss never fails over.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, required};
use crate::context::Context;
use crate::lease_tokens::{Issued, LeaseTokens};
use crate::protocol::{Cmd, Reply, Request, Res};
use crate::routes::destination::HOT_MISS_TOKEN;

pub struct Failover {
    pub children: Vec<RouteRef>,
    pub ctx: Option<Arc<Context>>,
    /// `enable_lease_pairing`: the route's name in the lease token map (see `lease_get`).
    pub lease_pairing: Option<String>,
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

impl Failover {
    /// A `lease-get` with lease pairing: failed over as any get, but a lease won from a child
    /// other than the first (or one whose token clients would misread) is answered with a router
    /// token that leads the `lease-set` back to that child.
    async fn lease_get(&self, ctx: &Context, name: &str, req: &Request) -> Reply {
        let mut chosen = (0, None);
        for (i, c) in self.children.iter().enumerate() {
            if i == 1 {
                ctx.stats.failovers.fetch_add(1, Relaxed);
            }
            let reply = c.route(req).await;
            let done = !reply.res.is_failover_error();
            chosen = (i, Some(reply));
            if done {
                break;
            }
        }
        let (child, Some(mut reply)) = chosen else {
            unreachable!("a FailoverRoute has children")
        };
        let token = reply.lease_token;
        if token > HOT_MISS_TOKEN && (child > 0 || LeaseTokens::conflicts(token)) {
            let issued = Issued { original: token, child };
            reply.lease_token = ctx.lease_tokens.insert(name, issued);
        }
        reply
    }

    /// A `lease-set` with lease pairing: to the child that issued its token, with that child's
    /// token; a token this route did not issue goes to the first child, never failed over.
    async fn lease_set(&self, ctx: &Context, name: &str, req: &Request) -> Reply {
        let Some(issued) = ctx.lease_tokens.take(name, req.cas) else {
            return self.children[0].route(req).await;
        };
        let Some(child) = self.children.get(issued.child) else {
            return Reply::error(Res::LocalError, "LeaseSet failover destination out-of-range");
        };
        if issued.child > 0 {
            // where pairing matters: without it this fill would reach the first child, which has no lease
            ctx.stats.lease_pairing_redirects.fetch_add(1, Relaxed);
        }
        let mut fill = req.clone();
        fill.cas = issued.original;
        child.route(&fill).await
    }
}

impl Route for Failover {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        if let (Some(name), Some(ctx)) = (&self.lease_pairing, &self.ctx) {
            match req.cmd {
                Cmd::LeaseGet => return Box::pin(self.lease_get(ctx, name, req)),
                Cmd::LeaseSet => return Box::pin(self.lease_set(ctx, name, req)),
                _ => {}
            }
        }
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

pub const FAILOVER_ROUTE: Handle = Handle {
    name: "FailoverRoute",
    build,
    shorthand: Some("children"),
    fields: &["children"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "FailoverRoute")?)?;
    if children.is_empty() {
        return Ok(super::null::over_nothing(b, "FailoverRoute"));
    }
    let pairing = match obj.get("enable_lease_pairing") {
        None => false,
        Some(Value::Bool(on)) => *on,
        Some(_) => return Err("FailoverRoute: `enable_lease_pairing` must be true or false".to_string()),
    };
    let lease_pairing = match (pairing, obj.get("name")) {
        (false, _) => None,
        (true, Some(Value::String(name))) if !name.is_empty() => {
            // as mcrouter names it: a changed number of children does not pair with old tokens
            Some(format!("failover:{name}:failover_targets={}", children.len()))
        }
        (true, _) => return Err("FailoverRoute: `name` is required when lease pairing is enabled".to_string()),
    };
    Ok(Arc::new(Failover {
        children,
        ctx: Some(b.ctx().clone()),
        lease_pairing,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::testing::*;

    #[test]
    fn fails_over_on_errors_not_misses() {
        let a = Fake::new("a", Res::Tko);
        let b = Fake::new("b", Res::Found);
        let r = Failover {
            children: vec![a.clone(), b.clone()],
            ctx: None,
            lease_pairing: None,
        };
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Found);
        a.set(Res::Miss);
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Miss);
        assert_eq!(b.count(), 1);
        a.set(Res::Timeout);
        b.set(Res::ConnectError);
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::ConnectError);
    }

    /// A child that wins every lease with `token` and records the tokens of the fills it gets.
    struct Leasing {
        token: u64,
        fills: std::sync::Mutex<Vec<u64>>,
    }

    impl Route for Leasing {
        fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
            Box::pin(async move {
                if req.cmd == Cmd::LeaseSet {
                    self.fills.lock().unwrap().push(req.cas);
                    return Reply::line(Res::Stored, "STORED");
                }
                let wire = format!("VA 0 f0 c{} W\r\n\r\n", self.token);
                let mut reply = Reply::new(Res::Miss, bytes::Bytes::from(wire));
                reply.lease_token = self.token;
                reply
            })
        }
    }

    #[test]
    fn lease_pairing_sends_the_fill_to_the_child_that_issued_the_lease() {
        let leasing = |token| {
            Arc::new(Leasing {
                token,
                fills: Default::default(),
            })
        };
        let (first, second) = (leasing(5), leasing(77));
        let ctx = crate::context::Context::new(crate::options::Options::default(), None);
        let r = Failover {
            children: vec![first.clone(), second.clone()],
            ctx: Some(ctx.clone()),
            lease_pairing: Some("failover:p:failover_targets=2".into()),
        };
        // from the first child: its own token, nothing remembered
        assert_eq!(run(r.route(&req(Cmd::LeaseGet, "k"))).lease_token, 5);
        assert!(ctx.lease_tokens.is_empty());
        // the first child down: the second's lease comes back as a router token
        let down = Fake::new("down", Res::Tko);
        let r = Failover {
            children: vec![down.clone(), second.clone()],
            ..r
        };
        let token = run(r.route(&req(Cmd::LeaseGet, "k"))).lease_token;
        assert!(LeaseTokens::is_router_token(token), "{token}");
        // the first child is back: the fill still goes to the second, with the second's token
        down.set(Res::Stored);
        let mut fill = req(Cmd::LeaseSet, "k");
        fill.cas = token;
        assert_eq!(run(r.route(&fill)).res, Res::Stored);
        assert_eq!(*second.fills.lock().unwrap(), [77]);
        assert_eq!(ctx.stats.lease_pairing_redirects.load(Relaxed), 1);
        assert_eq!(
            down.count(),
            1,
            "only the lease-get that failed over reached the first child"
        );
        // used once: the same token again goes to the first child, not failed over
        assert_eq!(run(r.route(&fill)).res, Res::Stored);
        assert_eq!(down.count(), 2);
        assert_eq!(second.fills.lock().unwrap().len(), 1);
        assert_eq!(ctx.stats.lease_pairing_redirects.load(Relaxed), 1);
    }
}
