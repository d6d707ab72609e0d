//! L1L2CacheRoute: two-level caching (mcrouter's fields `l1`, `l2`, `upgradingL1Exptime`).
//!
//! A classic `get` tries `l1`; on a miss it asks `l2` and, on a hit, adds the value to `l1` in
//! the background with `upgradingL1Exptime`. `gets` and meta gets also fall through to `l2` on a
//! miss but fill nothing (mcrouter's route leaves them out too: a cas or lease from l2 means
//! nothing in l1). Updates go to `l1` only, as in mcrouter, which leaves l2 to the application.
//!
//! Deletes go to both levels and are acknowledged only when both have them or spooled them
//! (`crate::ack::worst`). mcrouter sends deletes to `l1` only; squeal's invalidations must reach `l2`
//! too, or the next `l1` miss would copy l2's stale value back into l1.
//!
//! Negative caching (`ncacheExptime`, `ncacheUpdatePeriod`) stores a marker value with a flag
//! mcrouter's clients know and ours do not: warned about and not done.

use std::sync::Arc;

use futures_util::future::join;
use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_i64, required};
use crate::protocol::{Cmd, Reply, Request};

pub struct L1L2Cache {
    pub l1: RouteRef,
    pub l2: RouteRef,
    pub upgrade_exptime: i64,
}

impl Route for L1L2Cache {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.l1, req);
        if req.is_get() || req.is_delete() {
            visit(&self.l2, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        if req.is_delete() {
            return Box::pin(async move {
                let (a, b) = join(self.l1.route(req), self.l2.route(req)).await;
                crate::ack::worst(vec![a, b]).expect("two replies")
            });
        }
        if !req.is_get() {
            return self.l1.route(req);
        }
        Box::pin(async move {
            let first = self.l1.route(req).await;
            if first.res.is_hit() {
                return first;
            }
            let second = self.l2.route(req).await;
            if req.cmd == Cmd::Get
                && second.res.is_hit()
                && let Some((flags, value)) = second.value_parts()
            {
                let mut add = Request::simple(Cmd::Add, req.key.clone());
                add.client_flags = flags;
                add.value = value;
                add.exptime = self.upgrade_exptime;
                super::all_async::spawn_to(&self.l1, &add);
            }
            second
        })
    }
}

pub const L1L2_CACHE_ROUTE: Handle = Handle {
    name: "L1L2CacheRoute",
    build,
    shorthand: None,
    fields: &["l1", "l2", "upgradingL1Exptime", "ncacheExptime", "ncacheUpdatePeriod"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let l1 = b.route(required(obj, "l1", "L1L2CacheRoute")?)?;
    let l2 = b.route(required(obj, "l2", "L1L2CacheRoute")?)?;
    let upgrade_exptime = get_i64(obj, "upgradingL1Exptime")
        .map_err(|e| format!("L1L2CacheRoute: {e}"))?
        .ok_or("L1L2CacheRoute: missing `upgradingL1Exptime`")?;
    for field in ["ncacheExptime", "ncacheUpdatePeriod"] {
        if get_i64(obj, field)
            .map_err(|e| format!("L1L2CacheRoute: {e}"))?
            .unwrap_or(0)
            != 0
        {
            b.warnings.push(format!(
                "L1L2CacheRoute: `{field}` ignored: no negative caching (l2 misses are not remembered in l1)"
            ));
        }
    }
    Ok(Arc::new(L1L2Cache {
        l1,
        l2,
        upgrade_exptime,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Res;
    use crate::routes::testing::*;

    #[test]
    fn reads_fall_through_and_fill_l1_deletes_reach_both() {
        let l1 = Fake::new("l1", Res::Miss);
        let l2 = Fake::new("l2", Res::Found);
        let r = L1L2Cache {
            l1: l1.clone(),
            l2: l2.clone(),
            upgrade_exptime: 7,
        };
        let reply = run(async {
            let reply = r.route(&req(Cmd::Get, "k")).await;
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            reply
        });
        assert!(reply.wire.starts_with(b"VALUE k 7 2\r\nl2"));
        let add = l1.last();
        assert_eq!(
            (add.cmd, add.exptime, add.client_flags, &add.value[..]),
            (Cmd::Add, 7, 7, &b"l2"[..])
        );
        // updates: l1 only
        run(r.route(&set_req("k", 0)));
        assert_eq!((l1.count(), l2.count()), (3, 1));
        // a delete l2 lost is not acknowledged even though l1 has it
        l1.set(Res::Deleted);
        l2.set(Res::Timeout);
        let reply = run(r.route(&req(Cmd::Delete, "k")));
        assert_eq!(reply.res, Res::Timeout);
        assert_eq!((l1.count(), l2.count()), (4, 2));
    }

    #[test]
    fn a_delete_spooled_for_one_level_is_acknowledged_as_not_found() {
        let del = req(Cmd::Delete, "k");
        let r = L1L2Cache {
            l1: Fake::new("l1", Res::Deleted),
            l2: Fake::spooling("l2", Res::Tko),
            upgrade_exptime: 7,
        };
        let reply = run(r.route(&del));
        assert!(crate::ack::delivered(&reply));
        assert_eq!(&crate::ack::for_client(&del, reply).wire[..], b"NOT_FOUND\r\n");
        // lost on l1, spooled on l2: the lost one
        let r = L1L2Cache {
            l1: Fake::new("l1", Res::ConnectError),
            l2: Fake::spooling("l2", Res::Tko),
            upgrade_exptime: 7,
        };
        let reply = run(r.route(&del));
        assert!(crate::ack::lost(&del, &reply) && reply.res == Res::ConnectError);
    }
}
