//! SaltedFailoverRoute: a PoolRoute over `pool` (with its `hash`) that, on a failover-type error,
//! tries other servers of the same pool, as mcrouter's does. The failover order is ours: retry n
//! hashes the key with the salt `n` appended over the servers not yet tried, so the load of a
//! dead server spreads over the rest. At most `max_tries` (default: every server) are tried.
//! Deletes follow the failover rule of `crate::ack` (every server tried must have it or spool it).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::hash::pool_hash_settings;
use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_i64, required};
use crate::hash::HashFunc;
use crate::protocol::{Reply, Request};

pub struct SaltedFailover {
    pub servers: Vec<RouteRef>,
    pub func: HashFunc,
    pub salt: Vec<u8>,
    pub max_tries: usize,
    pub ctx: Option<Arc<crate::context::Context>>,
}

impl SaltedFailover {
    /// The server indices in the order this key tries them.
    pub fn order(&self, key: &[u8]) -> Vec<usize> {
        let n = self.servers.len();
        let mut left: Vec<usize> = (0..n).collect();
        let mut out = vec![left.remove(self.func.pick(key, &self.salt, n))];
        let mut attempt = 0u32;
        while !left.is_empty() && out.len() < self.max_tries {
            attempt += 1;
            let salt = [&self.salt[..], attempt.to_string().as_bytes()].concat();
            let i = crate::hash::furc_hash(&[key, &salt[..]].concat(), left.len() as u32) as usize;
            out.push(left.remove(i));
        }
        out
    }
}

impl Route for SaltedFailover {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for i in self.order(&req.routing_key()) {
            visit(&self.servers[i], req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let order = self.order(&req.routing_key());
            let first = self.servers[order[0]].route(req).await;
            if !first.res.is_failover_error() || order.len() == 1 {
                return first;
            }
            if let Some(ctx) = &self.ctx {
                ctx.stats.failovers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let rest: Vec<RouteRef> = order[1..].iter().map(|&i| self.servers[i].clone()).collect();
            let mut tried = vec![first];
            super::failover::try_in_order(&rest, req, &mut tried).await;
            crate::ack::after_failover(req, tried)
        })
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        let i = self.func.pick(&req.routing_key(), &self.salt, self.servers.len());
        self.servers[i].first_get_target(req)
    }
}

pub const SALTED_FAILOVER_ROUTE: Handle = Handle {
    name: "SaltedFailoverRoute",
    build,
    shorthand: Some("pool"),
    fields: &[
        "pool",
        "hash",
        "hash_func",
        "salt",
        "weights",
        "max_tries",
        "shadows",
        "shadow_policy",
        "failover_policy",
        "failover_errors",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let pool = required(obj, "pool", "SaltedFailoverRoute")?;
    let servers = b.pool(pool)?;
    if servers.is_empty() {
        return Err("SaltedFailoverRoute: pool has no servers".into());
    }
    let (func, salt) = pool_hash_settings(b, obj, "SaltedFailoverRoute", pool, servers.len())?;
    let max_tries = match get_i64(obj, "max_tries")? {
        None => servers.len(),
        Some(n) if n >= 1 => n as usize,
        Some(_) => return Err("SaltedFailoverRoute: `max_tries` must be at least 1".into()),
    };
    for field in ["shadows", "shadow_policy", "failover_policy", "failover_errors"] {
        if obj.contains_key(field) {
            b.warnings
                .push(format!("SaltedFailoverRoute: `{field}` ignored (not supported)"));
        }
    }
    Ok(Arc::new(SaltedFailover {
        servers,
        func,
        salt,
        max_tries,
        ctx: Some(b.ctx().clone()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn fails_over_within_the_pool_in_a_salted_order() {
        let fakes: Vec<_> = (0..4).map(|_| Fake::new("x", Res::Tko)).collect();
        let r = SaltedFailover {
            servers: fakes.iter().map(|f| f.clone() as RouteRef).collect(),
            func: HashFunc::Ch3,
            salt: vec![],
            max_tries: 4,
            ctx: None,
        };
        let order = r.order(b"k");
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 1, 2, 3]);
        assert_eq!(order[0], HashFunc::Ch3.pick(b"k", b"", 4));
        // the third server in the order answers
        fakes[order[2]].set(Res::Found);
        assert_eq!(run(r.route(&req(Cmd::Get, "k"))).res, Res::Found);
        assert_eq!(fakes[order[3]].count(), 0);
        // different keys fail over to different servers
        let seconds: std::collections::HashSet<usize> = (0..50)
            .map(|i| r.order(format!("key{i}").as_bytes()))
            .filter(|o| o[0] == 0)
            .map(|o| o[1])
            .collect();
        assert!(seconds.len() > 1, "{seconds:?}");
        // a delete spooled on the first and delivered on the next is acknowledged
        let s = Fake::spooling("s", Res::Tko);
        let ok = Fake::new("ok", Res::Deleted);
        let r = SaltedFailover {
            servers: vec![s.clone(), ok.clone()],
            func: HashFunc::Ch3,
            salt: vec![],
            max_tries: 2,
            ctx: None,
        };
        let key = (0..100)
            .map(|i| format!("d{i}"))
            .find(|k| r.order(k.as_bytes())[0] == 0)
            .unwrap();
        assert_eq!(run(r.route(&req(Cmd::Delete, &key))).res, Res::Deleted);
    }
}
