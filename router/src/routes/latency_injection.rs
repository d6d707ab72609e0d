//! LatencyInjectionRoute: delays requests to `child` (`before_latency_ms`, `after_latency_ms`,
//! and `total_latency_ms`, a floor on the whole time spent), for testing timeouts. Without
//! `total_latency_ms`, `total_latency_percentile_ms` ([[percentile, ms], ...], percentiles
//! strictly increasing in (0, 100]) draws each request's floor as mcrouter does: a uniform r in
//! [0, 100) takes the first step whose percentile is above it (the last step past them all).
//!
//! It only delays: the reply is `child`'s, so a delete is acknowledged exactly when the child's
//! would be. `request_payload_latency`/`max_request_latency_us` read latencies carried in
//! Carbon requests, which the text protocol has none of: warned about and ignored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_i64, required};
use crate::protocol::{Reply, Request};

pub struct LatencyInjection {
    pub child: RouteRef,
    pub before: Duration,
    pub after: Duration,
    pub total: Duration,
    /// (percentile, floor) steps, used when `total` is zero
    pub total_percentiles: Vec<(f64, Duration)>,
    pub rng: super::random::Rng,
}

impl LatencyInjection {
    /// The floor on the request's whole time: `total`, else the percentile step `r` (0 to 100) falls in.
    fn total_for(&self, r: f64) -> Duration {
        if !self.total.is_zero() {
            return self.total;
        }
        match self.total_percentiles.iter().find(|(p, _)| r < *p) {
            Some((_, d)) => *d,
            None => self.total_percentiles.last().map_or(Duration::ZERO, |(_, d)| *d),
        }
    }
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
            // 53 random bits as a fraction of 1, times 100: a percentile in [0, 100)
            let r = (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 100.0;
            let total = self.total_for(r);
            if !self.before.is_zero() {
                tokio::time::sleep(self.before).await;
            }
            let reply = self.child.route(req).await;
            if !self.after.is_zero() {
                tokio::time::sleep(self.after).await;
            }
            if let Some(rest) = total.checked_sub(start.elapsed()) {
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

/// `total_latency_percentile_ms`, checked as mcrouter checks it.
fn percentiles(obj: &Map<String, Value>) -> Result<Vec<(f64, Duration)>, String> {
    const FIELD: &str = "LatencyInjectionRoute: `total_latency_percentile_ms`";
    let Some(v) = obj.get("total_latency_percentile_ms") else {
        return Ok(Vec::new());
    };
    let list = v.as_array().ok_or_else(|| format!("{FIELD} must be a list"))?;
    let mut steps: Vec<(f64, Duration)> = Vec::with_capacity(list.len());
    for (i, step) in list.iter().enumerate() {
        let bad = || format!("{FIELD}[{i}] must be a [percentile, latency_ms] pair of numbers, not {step}");
        let [p, ms] = step.as_array().map(Vec::as_slice).ok_or_else(bad)? else {
            return Err(bad());
        };
        let (p, ms) = (p.as_f64().ok_or_else(bad)?, ms.as_i64().ok_or_else(bad)?);
        if !(p > 0.0 && p <= 100.0) {
            return Err(format!("{FIELD}[{i}]: percentile must be in (0, 100], not {p}"));
        }
        if ms < 0 {
            return Err(format!("{FIELD}[{i}]: latency_ms must not be negative"));
        }
        if steps.last().is_some_and(|(last, _)| p <= *last) {
            return Err(format!(
                "{FIELD}: percentiles must be strictly increasing ({p} at [{i}])"
            ));
        }
        steps.push((p, Duration::from_millis(ms as u64)));
    }
    Ok(steps)
}

pub const LATENCY_INJECTION_ROUTE: Handle = Handle {
    name: "LatencyInjectionRoute",
    build,
    shorthand: None,
    fields: &[
        "child",
        "before_latency_ms",
        "after_latency_ms",
        "total_latency_ms",
        "total_latency_percentile_ms",
        "request_payload_latency",
        "max_request_latency_us",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let child = b.route(required(obj, "child", "LatencyInjectionRoute")?)?;
    let given = [
        "before_latency_ms",
        "after_latency_ms",
        "total_latency_ms",
        "total_latency_percentile_ms",
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
        total_percentiles: percentiles(obj)?,
        rng: super::random::Rng::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn a_percentile_takes_the_first_step_above_it() {
        let ms = Duration::from_millis;
        let mut r = LatencyInjection {
            child: Fake::new("a", Res::Found),
            before: Duration::ZERO,
            after: Duration::ZERO,
            total: Duration::ZERO,
            total_percentiles: vec![(50.0, ms(5)), (90.0, ms(10)), (99.0, ms(20))],
            rng: crate::routes::random::Rng::new(),
        };
        let drawn: Vec<Duration> = [0.0, 49.9, 50.0, 89.0, 90.0, 98.9, 99.0, 99.99]
            .iter()
            .map(|p| r.total_for(*p))
            .collect();
        assert_eq!(drawn, [ms(5), ms(5), ms(10), ms(10), ms(20), ms(20), ms(20), ms(20)]);
        // a fixed total wins, as in mcrouter
        r.total = ms(7);
        assert_eq!(r.total_for(10.0), ms(7));
    }

    #[test]
    fn delays_and_passes_the_reply_through() {
        let a = Fake::spooling("a", Res::Tko);
        let r = LatencyInjection {
            child: a.clone(),
            before: Duration::from_millis(20),
            after: Duration::from_millis(10),
            total: Duration::from_millis(50),
            total_percentiles: Vec::new(),
            rng: crate::routes::random::Rng::new(),
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
            total_percentiles: Vec::new(),
            rng: crate::routes::random::Rng::new(),
        };
        let start = Instant::now();
        run(r.route(&req(Cmd::Get, "k")));
        assert!(start.elapsed() >= Duration::from_millis(30));
        // every percentile draws the one step: its floor holds
        let r = LatencyInjection {
            child: a.clone(),
            before: Duration::ZERO,
            after: Duration::ZERO,
            total: Duration::ZERO,
            total_percentiles: vec![(100.0, Duration::from_millis(30))],
            rng: crate::routes::random::Rng::new(),
        };
        let start = Instant::now();
        run(r.route(&req(Cmd::Get, "k")));
        assert!(start.elapsed() >= Duration::from_millis(30));
    }
}
