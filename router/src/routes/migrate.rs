//! MigrateRoute: moves traffic from `from` to `to` around `start_time` (unix seconds), in
//! `interval` steps (default 3600): before the start everything goes to `from`; for one
//! interval other requests still go to `from` and deletes go to both; for the next interval
//! other requests go to `to` and deletes to both; then everything goes to `to`. A delete sent to
//! both is answered with the worse reply (`crate::ack::worst`), so it is acknowledged only when
//! both have it or spooled it.

use std::sync::Arc;

use futures_util::future::join;
use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_i64, required};
use crate::protocol::{Reply, Request};

pub struct Migrate {
    pub from: RouteRef,
    pub to: RouteRef,
    pub start: i64,
    pub interval: i64,
    /// The clock (unix seconds), replaceable in tests.
    pub now: fn() -> i64,
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Route for Migrate {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        let now = (self.now)();
        let from = now < self.start + 2 * self.interval && (req.is_delete() || now < self.start + self.interval);
        let to = now >= self.start && (req.is_delete() || now >= self.start + self.interval);
        if from {
            visit(&self.from, req);
        }
        if to {
            visit(&self.to, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        let now = (self.now)();
        if now < self.start {
            return self.from.route(req);
        }
        if now >= self.start + 2 * self.interval {
            return self.to.route(req);
        }
        if !req.is_delete() {
            return if now < self.start + self.interval {
                self.from.route(req)
            } else {
                self.to.route(req)
            };
        }
        Box::pin(async move {
            let (a, b) = join(self.from.route(req), self.to.route(req)).await;
            crate::ack::worst(vec![a, b]).expect("two replies")
        })
    }
}

pub const MIGRATE_ROUTE: Handle = Handle {
    name: "MigrateRoute",
    build,
    shorthand: None,
    fields: &["from", "to", "start_time", "interval"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let from = b.route(required(obj, "from", "MigrateRoute")?)?;
    let to = b.route(required(obj, "to", "MigrateRoute")?)?;
    let start = get_i64(obj, "start_time")?.ok_or("MigrateRoute: missing `start_time` (unix seconds)")?;
    let interval = get_i64(obj, "interval")?.unwrap_or(3600);
    if interval <= 0 {
        return Err("MigrateRoute: `interval` must be positive".into());
    }
    Ok(Arc::new(Migrate {
        from,
        to,
        start,
        interval,
        now: unix_now,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    fn at(now: fn() -> i64, from: &Arc<Fake>, to: &Arc<Fake>) -> Migrate {
        Migrate {
            from: from.clone(),
            to: to.clone(),
            start: 1000,
            interval: 100,
            now,
        }
    }

    #[test]
    fn phases() {
        let from = Fake::new("from", Res::Deleted);
        let to = Fake::new("to", Res::Tko);
        let counts = || (from.count(), to.count());
        run(at(|| 999, &from, &to).route(&req(Cmd::Delete, "k")));
        assert_eq!(counts(), (1, 0));
        run(at(|| 1050, &from, &to).route(&req(Cmd::Get, "k")));
        assert_eq!(counts(), (2, 0));
        // a delete during the migration goes to both; the lost one is the answer
        let reply = run(at(|| 1050, &from, &to).route(&req(Cmd::Delete, "k")));
        assert_eq!(counts(), (3, 1));
        assert_eq!(reply.res, Res::Tko);
        run(at(|| 1150, &from, &to).route(&req(Cmd::Get, "k")));
        assert_eq!(counts(), (3, 2));
        run(at(|| 1150, &from, &to).route(&req(Cmd::Delete, "k")));
        assert_eq!(counts(), (4, 3));
        run(at(|| 1200, &from, &to).route(&req(Cmd::Delete, "k")));
        assert_eq!(counts(), (4, 4));
    }

    #[test]
    fn a_delete_during_the_migration_follows_the_ack_rule() {
        let del = req(Cmd::Delete, "k");
        let (from, to) = (Fake::new("from", Res::Deleted), Fake::spooling("to", Res::Tko));
        let reply = run(at(|| 1050, &from, &to).route(&del));
        assert!(crate::ack::delivered(&reply));
        assert_eq!(&crate::ack::for_client(&del, reply).wire[..], b"NOT_FOUND\r\n");
        let (from, to) = (Fake::spooling("from", Res::Tko), Fake::new("to", Res::Timeout));
        let reply = run(at(|| 1150, &from, &to).route(&del));
        assert!(crate::ack::lost(&del, &reply) && reply.res == Res::Timeout);
    }
}
