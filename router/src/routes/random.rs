//! RandomRoute: each request goes to one child picked at random (mcrouter's RandomRoute).
//!
//! A delete reaches only the child it picked, so it is acknowledged when that child has it; use
//! the route for reads of replicated data, not as a replica set for deletes (AllSyncRoute).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle};
use crate::protocol::{Reply, Request};

pub struct RandomRoute {
    pub children: Vec<RouteRef>,
    rng: Rng,
}

impl RandomRoute {
    pub fn new(children: Vec<RouteRef>) -> RandomRoute {
        RandomRoute {
            children,
            rng: Rng::new(),
        }
    }
}

/// xorshift64* seeded from the clock: cheap, good enough to spread load or sample requests (not
/// for secrets). Shared by the routes that choose at random.
pub struct Rng(AtomicU64);

impl Rng {
    pub fn new() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1;
        Rng(AtomicU64::new(seed))
    }

    pub fn next(&self) -> u64 {
        let mut x = self.0.load(Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.store(x, Relaxed);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

impl Default for Rng {
    fn default() -> Rng {
        Rng::new()
    }
}

impl Route for RandomRoute {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        for c in &self.children {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        let i = (self.rng.next() % self.children.len() as u64) as usize;
        self.children[i].route(req)
    }
}

pub const RANDOM_ROUTE: Handle = Handle {
    name: "RandomRoute",
    build,
    shorthand: Some("children"),
    fields: &["children"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    super::null::over_children(b, obj, "RandomRoute", |children| Arc::new(RandomRoute::new(children)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn spreads_over_all_children() {
        let fakes: Vec<_> = (0..3).map(|_| Fake::new("x", Res::Found)).collect();
        let r = RandomRoute::new(fakes.iter().map(|f| f.clone() as RouteRef).collect());
        run(async {
            for _ in 0..3000 {
                r.route(&req(Cmd::Get, "same-key")).await;
            }
        });
        for f in &fakes {
            assert!((800..1200).contains(&f.count()), "{}", f.count());
        }
    }
}
