//! FailoverWithExptimeRoute: the gutter pattern. Requests go to `normal`; when it fails with a
//! failover-type error (TKO included), they go to `failover` (a route or a list tried in order),
//! with the TTL of updates capped at `failover_exptime` (default 60 s) so gutter entries die
//! young. Deletes fail over too, uncapped: while a server is down its keys live in gutter, and a
//! delete must reach them there (the failed delete is also spooled for the normal server by its
//! destination; if it could not be spooled, the delete is not acknowledged whatever gutter
//! answered, see `crate::ack`). Misses never fail over.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use serde_json::{Map, Value};

use super::failover::try_in_order;
use super::{BoxFuture, Route, RouteRef, cap_exptime};
use crate::build::{Builder, Handle, get_i64, required};
use crate::context::Context;
use crate::protocol::{Reply, Request};

pub struct FailoverWithExptime {
    pub normal: RouteRef,
    pub failover: Vec<RouteRef>,
    pub failover_exptime: i64,
    pub ctx: Option<Arc<Context>>,
}

impl Route for FailoverWithExptime {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.normal, req);
        let capped = cap_exptime(req, self.failover_exptime);
        for c in &self.failover {
            visit(c, capped.as_ref().unwrap_or(req));
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let normal = self.normal.route(req).await;
            if !normal.res.is_failover_error() || self.failover.is_empty() {
                return normal;
            }
            if let Some(ctx) = &self.ctx {
                ctx.stats.gutter_failovers.fetch_add(1, Relaxed);
            }
            let capped = cap_exptime(req, self.failover_exptime);
            let freq = capped.as_ref().unwrap_or(req);
            let mut tried = vec![normal];
            try_in_order(&self.failover, freq, &mut tried).await;
            crate::ack::after_failover(req, tried)
        })
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.normal.first_get_target(req)
    }
}

pub const FAILOVER_WITH_EXPTIME_ROUTE: Handle = Handle {
    name: "FailoverWithExptimeRoute",
    build,
    shorthand: None,
    fields: &["normal", "failover", "failover_exptime"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let normal = b.route(required(obj, "normal", "FailoverWithExptimeRoute")?)?;
    let failover = match obj.get("failover") {
        None | Some(Value::Null) => Vec::new(),
        Some(v @ Value::Array(_)) => b.children(v)?,
        Some(Value::String(s)) if s.starts_with("Pool|") => b.children(&Value::String(s.clone()))?,
        Some(v) => vec![b.route(v)?],
    };
    let failover_exptime = get_i64(obj, "failover_exptime")?.unwrap_or(60);
    Ok(Arc::new(FailoverWithExptime {
        normal,
        failover,
        failover_exptime,
        ctx: Some(b.ctx().clone()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    fn route(normal: Res, gutter: Res) -> (FailoverWithExptime, std::sync::Arc<Fake>, std::sync::Arc<Fake>) {
        let n = Fake::new("normal", normal);
        let g = Fake::new("gutter", gutter);
        (
            FailoverWithExptime {
                normal: n.clone(),
                failover: vec![g.clone()],
                failover_exptime: 10,
                ctx: None,
            },
            n,
            g,
        )
    }

    #[test]
    fn healthy_normal_is_used() {
        let (r, _, g) = route(Res::Stored, Res::Stored);
        assert_eq!(run(r.route(&set_req("k", 0))).res, Res::Stored);
        assert_eq!(g.count(), 0);
    }

    #[test]
    fn sets_fail_over_with_capped_ttl() {
        let (r, _, g) = route(Res::Tko, Res::Stored);
        assert_eq!(run(r.route(&set_req("k", 0))).res, Res::Stored);
        assert_eq!(g.last().exptime, 10);
        run(r.route(&set_req("k", 5)));
        assert_eq!(g.last().exptime, 5);
        run(r.route(&set_req("k", 3600)));
        assert_eq!(g.last().exptime, 10);
    }

    #[test]
    fn deletes_fail_over_uncapped_and_misses_do_not() {
        let n = Fake::spooling("normal", Res::ConnectError);
        let g = Fake::new("gutter", Res::Deleted);
        let r = FailoverWithExptime {
            normal: n.clone(),
            failover: vec![g.clone()],
            failover_exptime: 10,
            ctx: None,
        };
        // spooled for normal, delivered to gutter: gutter's answer
        assert_eq!(run(r.route(&req(Cmd::Delete, "k"))).res, Res::Deleted);
        assert_eq!(g.last().cmd, Cmd::Delete);
        n.set(Res::Miss);
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Miss);
        assert_eq!(g.count(), 1);
    }

    #[test]
    fn a_delete_normal_could_not_spool_is_not_acknowledged_by_gutter() {
        let (r, _, g) = route(Res::ConnectError, Res::Deleted);
        let reply = run(r.route(&req(Cmd::Delete, "k")));
        assert_eq!(reply.res, Res::ConnectError);
        assert!(!crate::ack::delivered(&reply));
        assert_eq!(g.count(), 1, "gutter still gets the delete");
    }

    #[test]
    fn meta_set_ttl_capped() {
        let (r, _, g) = route(Res::Timeout, Res::Ok);
        let mut ms = req(Cmd::MetaSet, "k");
        ms.meta = vec![bytes::Bytes::from_static(b"T3600"), bytes::Bytes::from_static(b"F3")];
        run(r.route(&ms));
        assert_eq!(g.last().exptime(), 10);
        assert_eq!(g.last().meta_flag(b'F'), Some(&b"3"[..]));
    }
}
