//! LoadBalancerRoute: one child per request, chosen by measured load — for reads of replicated
//! data (a replicated pool's replicas), where any child can answer.
//!
//! mcrouter weighs its children by the load each server reports in its replies. memcached reports
//! none, so the router uses what it measures itself (`crate::load`: requests outstanding and a
//! reply-latency average per server) and the power of two choices: of two candidate children, the
//! less loaded one (`load::prefer`). With `algorithm` `weighted-hashing` (mcrouter's default) the
//! two are the key's own — its Ch3 choice (with `salt`) and a second one from a CRC-32 of the key
//! over the rest — and a tie keeps the first: while loads are even a key reads from one child, as
//! under Ch3, so its cache stays warm, and it can only ever move between its two. With
//! `two-random-choices` (mcrouter's other algorithm) the two are random.
//!
//! A child's load is that of the server it would send the key to first (`Route::first_server`:
//! a destination, a PoolRoute/HashRoute, a FailoverRoute's first child); a child of another kind
//! reports none, and is chosen as if its load were even. `load_ttl_ms` (default 100, as mcrouter's)
//! is how old a latency may be and still be trusted: a server nobody read from for that long is
//! compared by its outstanding requests only, so a server that was slow is tried again — mcrouter
//! resets such a server's load to the median for the same reason. `failover_count` (default 1: no
//! failover) is how many children a request may try: on a failover-type error the other
//! candidate, then the rest in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde_json::{Map, Value};

use super::failover::try_in_order;
use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_i64, get_str, required};
use crate::context::Context;
use crate::hash::HashFunc;
use crate::load::{self, Reading};
use crate::protocol::{Reply, Request};
use crate::server::Server;

/// mcrouter's default `load_ttl_ms`.
const DEFAULT_LOAD_TTL_MS: u64 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// The key's two children (mcrouter's default name; see the module doc).
    WeightedHashing,
    /// Two random children.
    TwoRandomChoices,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Algorithm::WeightedHashing => "weighted-hashing",
            Algorithm::TwoRandomChoices => "two-random-choices",
        }
    }
}

pub struct LoadBalancer {
    pub children: Vec<RouteRef>,
    pub salt: Vec<u8>,
    /// `load_ttl_ms` in µs: latencies older than this are not trusted.
    pub load_ttl_us: u64,
    /// Children a request may try (at least 1, at most all).
    pub failover_count: usize,
    pub algorithm: Algorithm,
    rng: AtomicU64,
    pub ctx: Option<Arc<Context>>,
}

impl LoadBalancer {
    pub fn new(children: Vec<RouteRef>, salt: Vec<u8>, algorithm: Algorithm) -> LoadBalancer {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        LoadBalancer {
            children,
            salt,
            load_ttl_us: DEFAULT_LOAD_TTL_MS * 1000,
            failover_count: 1,
            algorithm,
            rng: AtomicU64::new(seed),
            ctx: None,
        }
    }

    /// xorshift64* (spreading, not secrets); concurrent callers may see the same number.
    fn random(&self) -> u64 {
        let mut x = self.rng.load(Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Relaxed);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The two candidates, the one kept on a tie first (`n` ≥ 2).
    fn candidates(&self, req: &Request) -> (usize, usize) {
        let n = self.children.len();
        let (first, other) = match self.algorithm {
            Algorithm::WeightedHashing => {
                let key = req.routing_key();
                let home = HashFunc::Ch3.pick(&key, &self.salt, n);
                (home, HashFunc::Crc32.pick(&key, &self.salt, n - 1))
            }
            Algorithm::TwoRandomChoices => {
                let r = self.random();
                ((r % n as u64) as usize, ((r >> 32) % (n as u64 - 1)) as usize)
            }
        };
        // `other` indexes the children without `first`
        (first, if other >= first { other + 1 } else { other })
    }

    fn reading(&self, child: usize, req: &Request, now: u64) -> Option<Reading> {
        let server: &Server = self.children[child].first_server(req)?;
        Some(server.load.read(now, self.load_ttl_us, server.is_tko()))
    }

    /// The child to send `req` to, and the other candidate.
    fn choose(&self, req: &Request) -> (usize, usize) {
        let (first, other) = self.candidates(req);
        let now = load::now_us();
        match (self.reading(first, req, now), self.reading(other, req, now)) {
            (Some(a), Some(b)) if load::prefer(a, b) => (other, first),
            _ => (first, other),
        }
    }

    /// After `chosen` failed: `other`, then the rest in order, up to `failover_count` in all.
    fn failover_order(&self, chosen: usize, other: usize) -> Vec<RouteRef> {
        let n = self.children.len();
        std::iter::once(other)
            .chain((1..n).map(|i| (chosen + i) % n).filter(|&i| i != other))
            .take(self.failover_count - 1)
            .map(|i| self.children[i].clone())
            .collect()
    }
}

impl Route for LoadBalancer {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        // any child may be chosen, as mcrouter's traverse lists them all
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route_name(&self) -> String {
        format!("loadbalancer|{}", self.algorithm.name())
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let (chosen, other) = self.choose(req);
            let first = self.children[chosen].route(req).await;
            if self.failover_count < 2 || !first.res.is_failover_error() {
                return first;
            }
            if let Some(ctx) = &self.ctx {
                ctx.stats.failovers.fetch_add(1, Relaxed);
            }
            let mut tried = vec![first];
            try_in_order(&self.failover_order(chosen, other), req, &mut tried).await;
            crate::ack::after_failover(req, tried)
        })
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.children[self.choose(req).0].first_get_target(req)
    }

    fn first_server(&self, req: &Request) -> Option<&Server> {
        self.children[self.choose(req).0].first_server(req)
    }
}

pub const LOAD_BALANCER_ROUTE: Handle = Handle {
    name: "LoadBalancerRoute",
    build,
    shorthand: Some("children"),
    fields: &[
        "children",
        "salt",
        "load_ttl_ms",
        "failover_count",
        "algorithm",
        "default_server_load_percent",
        "enable_thrift_server_load",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let mut children = b.children(required(obj, "children", "LoadBalancerRoute")?)?;
    if children.is_empty() {
        return Err("LoadBalancerRoute: empty `children`".into());
    }
    let salt = get_str(obj, "salt")
        .map_err(|e| format!("LoadBalancerRoute: {e}"))?
        .unwrap_or("")
        .as_bytes()
        .to_vec();
    let algorithm = match get_str(obj, "algorithm").map_err(|e| format!("LoadBalancerRoute: {e}"))? {
        None | Some("weighted-hashing") => Algorithm::WeightedHashing,
        Some("two-random-choices") => Algorithm::TwoRandomChoices,
        Some(other) => {
            return Err(format!(
                "LoadBalancerRoute: unknown `algorithm` `{other}` (weighted-hashing, two-random-choices)"
            ));
        }
    };
    let non_negative = |field: &str| -> Result<Option<u64>, String> {
        match get_i64(obj, field).map_err(|e| format!("LoadBalancerRoute: {e}"))? {
            Some(v) if v < 0 => Err(format!("LoadBalancerRoute: `{field}` must not be negative")),
            v => Ok(v.map(|v| v as u64)),
        }
    };
    let load_ttl_ms = non_negative("load_ttl_ms")?.unwrap_or(DEFAULT_LOAD_TTL_MS);
    let failover_count = non_negative("failover_count")?.unwrap_or(1);
    if let Some(p) = get_i64(obj, "default_server_load_percent")? {
        if !(0..=100).contains(&p) {
            return Err("LoadBalancerRoute: `default_server_load_percent` must be from 0 to 100".into());
        }
        b.warnings.push(
            "LoadBalancerRoute: `default_server_load_percent` ignored (mcrouter no longer reads it either; \
             a server not yet measured is compared by its outstanding requests)"
                .into(),
        );
    }
    if obj.contains_key("enable_thrift_server_load") {
        b.warnings
            .push("LoadBalancerRoute: `enable_thrift_server_load` ignored (no Thrift servers here)".into());
    }
    if children.len() == 1 {
        return Ok(children.remove(0)); // as mcrouter: nothing to choose from
    }
    let n = children.len();
    let mut route = LoadBalancer::new(children, salt, algorithm);
    route.load_ttl_us = load_ttl_ms.saturating_mul(1000);
    route.failover_count = (failover_count as usize).clamp(1, n);
    route.ctx = Some(b.ctx().clone());
    Ok(Arc::new(route))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    fn balancer(children: &[Arc<Fake>], algorithm: Algorithm) -> LoadBalancer {
        LoadBalancer::new(
            children.iter().map(|f| f.clone() as RouteRef).collect(),
            vec![],
            algorithm,
        )
    }

    #[test]
    fn without_load_it_is_ch3_of_the_key() {
        // children that report no server: the key's own choice, always (Ch3, as before)
        let fakes: Vec<_> = (0..3).map(|_| Fake::new("x", Res::Found)).collect();
        let r = balancer(&fakes, Algorithm::WeightedHashing);
        for i in 0..300 {
            let q = req(Cmd::Get, &format!("key{i}"));
            assert_eq!(r.choose(&q).0, HashFunc::Ch3.pick(&q.key, b"", 3));
        }
    }

    #[test]
    fn candidates_are_two_different_children_spread_over_all() {
        let fakes: Vec<_> = (0..4).map(|_| Fake::new("x", Res::Found)).collect();
        for algorithm in [Algorithm::WeightedHashing, Algorithm::TwoRandomChoices] {
            let r = balancer(&fakes, algorithm);
            let mut pairs = std::collections::HashSet::new();
            for i in 0..2000 {
                let (a, b) = r.candidates(&req(Cmd::Get, &format!("key{i}")));
                assert!(a != b && a < 4 && b < 4);
                pairs.insert((a, b));
            }
            assert_eq!(pairs.len(), 12, "{algorithm:?}: every ordered pair occurs");
        }
        // the key's pair does not change between requests
        let r = balancer(&fakes, Algorithm::WeightedHashing);
        let q = req(Cmd::Get, "stable");
        assert_eq!(r.candidates(&q), r.candidates(&q));
    }

    #[test]
    fn fails_over_to_the_other_candidate_then_the_rest() {
        let fakes: Vec<_> = (0..3).map(|_| Fake::new("x", Res::Tko)).collect();
        let mut r = balancer(&fakes, Algorithm::WeightedHashing);
        let q = req(Cmd::Get, "k");
        // default failover_count 1: the error is the answer
        assert_eq!(run(r.route(&q)).res, Res::Tko);
        assert_eq!(fakes.iter().map(|f| f.count()).sum::<usize>(), 1);
        r.failover_count = 3;
        let (chosen, other) = r.choose(&q);
        fakes[other].set(Res::Miss);
        assert_eq!(run(r.route(&q)).res, Res::Miss);
        assert_eq!((fakes[chosen].count(), fakes[other].count()), (2, 1));
        fakes[other].set(Res::Timeout);
        let third = 3 - chosen - other;
        fakes[third].set(Res::Found);
        assert_eq!(run(r.route(&q)).res, Res::Found);
        assert_eq!(fakes[third].count(), 1);
    }
}
