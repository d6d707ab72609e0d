//! LatencyInjectionRoute: delays requests to `child` (`before_latency_ms`, `after_latency_ms`,
//! and `total_latency_ms`, a floor on the whole time spent), for testing timeouts.
//!
//! It only delays: the reply is `child`'s, so a delete is acknowledged exactly when the child's
//! would be. `request_payload_latency`/`max_request_latency_us` read latencies carried in
//! Carbon requests, which the text protocol has none of: warned about and ignored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, get_i64, required};
use crate::config::Builder;
use crate::protocol::{Reply, Request};

pub struct LatencyInjection {
    pub child: RouteRef,
    pub before: Duration,
    pub after: Duration,
    pub total: Duration,
}

impl Route for LatencyInjection {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.child, req);
    }

    fn route_name(&self) -> String {
        format!(
            "latency-injection|before:{}ms|after:{}ms|total:{}ms",
            self.before.as_millis(),
            self.after.as_millis(),
            self.total.as_millis()
        )
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            if req.recording.is_some() {
                // `__mcrouter__.route`: nothing is sent, so there is nothing to delay
                return self.child.route(req).await;
            }
            let start = Instant::now();
            if !self.before.is_zero() {
                tokio::time::sleep(self.before).await;
            }
            let reply = self.child.route(req).await;
            if !self.after.is_zero() {
                tokio::time::sleep(self.after).await;
            }
            if let Some(rest) = self.total.checked_sub(start.elapsed()) {
                tokio::time::sleep(rest).await;
            }
            reply
        })
    }
}

fn millis(obj: &Map<String, Value>, field: &str) -> Result<Duration, String> {
    match get_i64(obj, field).map_err(|e| format!("LatencyInjectionRoute: {e}"))? {
        None => Ok(Duration::ZERO),
        Some(ms) if ms >= 0 => Ok(Duration::from_millis(ms as u64)),
        Some(_) => Err(format!("LatencyInjectionRoute: `{field}` must not be negative")),
    }
}

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let child = b.route(required(obj, "child", "LatencyInjectionRoute")?)?;
    let given = [
        "before_latency_ms",
        "after_latency_ms",
        "total_latency_ms",
        "request_payload_latency",
    ];
    if !given.iter().any(|f| obj.contains_key(*f)) {
        return Err(format!("LatencyInjectionRoute: give one of {}", given.join(", ")));
    }
    for field in ["request_payload_latency", "max_request_latency_us"] {
        if obj.contains_key(field) {
            b.warnings.push(format!(
                "LatencyInjectionRoute: `{field}` ignored (text-protocol requests carry no latency)"
            ));
        }
    }
    Ok(Arc::new(LatencyInjection {
        child,
        before: millis(obj, "before_latency_ms")?,
        after: millis(obj, "after_latency_ms")?,
        total: millis(obj, "total_latency_ms")?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn delays_and_passes_the_reply_through() {
        let a = Fake::spooling("a", Res::Tko);
        let r = LatencyInjection {
            child: a.clone(),
            before: Duration::from_millis(20),
            after: Duration::from_millis(10),
            total: Duration::from_millis(50),
        };
        let start = Instant::now();
        let reply = run(r.route(&req(Cmd::Delete, "k")));
        assert!(start.elapsed() >= Duration::from_millis(50), "{:?}", start.elapsed());
        // the child's reply, spooled mark and all
        assert!(reply.spooled && reply.res == Res::Tko);
        let r = LatencyInjection {
            child: a.clone(),
            before: Duration::ZERO,
            after: Duration::from_millis(30),
            total: Duration::ZERO,
        };
        let start = Instant::now();
        run(r.route(&req(Cmd::Get, "k")));
        assert!(start.elapsed() >= Duration::from_millis(30));
    }
}
