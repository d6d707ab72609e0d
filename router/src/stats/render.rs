//! The counters written out: memcached's `stats` reply (counts since the last `stats reset`) and
//! Prometheus text for `/metrics` (counts since start), every family listed in docs/metrics.md.

use std::sync::atomic::Ordering::Relaxed;

use super::{LATENCY_BUCKETS, OPS, Stats, find};

impl Stats {
    /// `stats` command reply (memcached style): counters since the last [`Stats::reset`].
    pub fn memcached_text(&self, servers_tko: usize) -> String {
        let base = self.since_reset.lock().unwrap_or_else(|e| e.into_inner());
        let since = |now: u64, then: Option<&u64>| now.saturating_sub(then.copied().unwrap_or(0));
        let mut s = String::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        s += &format!("STAT pid {}\r\n", std::process::id());
        s += &format!("STAT uptime {}\r\n", self.uptime().as_secs());
        s += &format!("STAT time {now}\r\n");
        s += &format!("STAT version squeal-router-{}\r\n", env!("CARGO_PKG_VERSION"));
        s += &format!("STAT max_connections {}\r\n", self.max_connections.load(Relaxed));
        s += &format!("STAT curr_connections {}\r\n", self.curr_connections.load(Relaxed));
        s += &format!(
            "STAT total_connections {}\r\n",
            since(self.total_connections.load(Relaxed), Some(&base.total_connections))
        );
        let mut totals = vec![0; OPS.len()];
        let mut per_route = String::new();
        for r in self.route_snapshot() {
            let then = base.route(&r.label);
            for (i, (op, c)) in OPS.iter().zip(&r.requests).enumerate() {
                let n = since(c.load(Relaxed), then.and_then(|t| t.get(i)));
                totals[i] += n;
                if n > 0 {
                    per_route += &format!("STAT route:{}:cmd_{op} {n}\r\n", r.label);
                }
            }
        }
        for (op, n) in OPS.iter().zip(totals) {
            s += &format!("STAT cmd_{op} {n}\r\n");
        }
        // memcached's get_hits/get_misses, then per route and per pool (memcstat-style names)
        let mut gets = [0u64; 2];
        let mut per = String::new();
        for r in self.route_snapshot() {
            let (now, then) = (r.gets.load(), find(&base.route_gets, &r.label));
            let n = [now[0].saturating_sub(then[0]), now[1].saturating_sub(then[1])];
            gets = [gets[0] + n[0], gets[1] + n[1]];
            if n != [0, 0] {
                per += &format!(
                    "STAT route:{l}:get_hits {}\r\nSTAT route:{l}:get_misses {}\r\n",
                    n[0],
                    n[1],
                    l = r.label
                );
            }
        }
        for p in self.pool_snapshot() {
            let (now, then) = (p.gets.load(), find(&base.pool_gets, &p.label));
            let n = [now[0].saturating_sub(then[0]), now[1].saturating_sub(then[1])];
            if n != [0, 0] {
                per += &format!(
                    "STAT pool:{l}:get_hits {}\r\nSTAT pool:{l}:get_misses {}\r\n",
                    n[0],
                    n[1],
                    l = p.label
                );
            }
        }
        s += &format!("STAT get_hits {}\r\nSTAT get_misses {}\r\n", gets[0], gets[1]);
        s += &per_route;
        s += &per;
        for (i, (name, _, v)) in self.scalars().into_iter().enumerate() {
            s += &format!("STAT {name} {}\r\n", since(v, base.scalars.get(i)));
        }
        s += &format!("STAT servers_tko {servers_tko}\r\n");
        s += &format!("STAT lease_tokens {}\r\n", self.lease_tokens.load(Relaxed));
        s += "END\r\n";
        s
    }

    /// Prometheus text format, every name starting `squeal_router_`.
    pub fn prometheus_text(&self, servers_tko: usize) -> String {
        let mut s = String::new();
        s += "# HELP squeal_router_requests_total client requests by command and route (get/gets: keys)\n";
        s += "# TYPE squeal_router_requests_total counter\n";
        for r in self.route_snapshot() {
            for (op, c) in OPS.iter().zip(&r.requests) {
                s += &format!(
                    "squeal_router_requests_total{{op=\"{op}\",route=\"{}\"}} {}\n",
                    r.label,
                    c.load(Relaxed)
                );
            }
        }
        for (name, help, which) in [
            ("get_hits", "gets answered with a value (get/gets keys, mg VA/HD)", 0),
            ("get_misses", "gets answered without a value (get/gets keys, mg EN)", 1),
        ] {
            s += &format!(
                "# HELP squeal_router_{name}_total {help}, by route\n# TYPE squeal_router_{name}_total counter\n"
            );
            for r in self.route_snapshot() {
                s += &format!(
                    "squeal_router_{name}_total{{route=\"{}\"}} {}\n",
                    r.label,
                    r.gets.load()[which]
                );
            }
            s += &format!(
                "# HELP squeal_router_pool_{name}_total {help}, by pool\n# TYPE squeal_router_pool_{name}_total counter\n"
            );
            for p in self.pool_snapshot() {
                s += &format!(
                    "squeal_router_pool_{name}_total{{pool=\"{}\"}} {}\n",
                    p.label,
                    p.gets.load()[which]
                );
            }
        }
        for (name, help, v) in self.scalars() {
            s += &format!("# HELP squeal_router_{name}_total {help}\n# TYPE squeal_router_{name}_total counter\n");
            s += &format!("squeal_router_{name}_total {v}\n");
        }
        s += "# HELP squeal_router_connections open client connections\n# TYPE squeal_router_connections gauge\n";
        s += &format!("squeal_router_connections {}\n", self.curr_connections.load(Relaxed));
        s += "# HELP squeal_router_max_connections client connection limit\n# TYPE squeal_router_max_connections gauge\n";
        s += &format!("squeal_router_max_connections {}\n", self.max_connections.load(Relaxed));
        s += "# HELP squeal_router_servers_tko servers currently marked TKO\n# TYPE squeal_router_servers_tko gauge\n";
        s += &format!("squeal_router_servers_tko {servers_tko}\n");
        s += "# HELP squeal_router_lease_tokens lease tokens the lease route holds now\n";
        s += "# TYPE squeal_router_lease_tokens gauge\n";
        s += &format!("squeal_router_lease_tokens {}\n", self.lease_tokens.load(Relaxed));
        s += "# HELP squeal_router_request_duration_seconds client request latency\n";
        s += "# TYPE squeal_router_request_duration_seconds histogram\n";
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.latency[i].load(Relaxed);
            s += &format!("squeal_router_request_duration_seconds_bucket{{le=\"{b}\"}} {cumulative}\n");
        }
        cumulative += self.latency[LATENCY_BUCKETS.len()].load(Relaxed);
        s += &format!("squeal_router_request_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}\n");
        s += &format!(
            "squeal_router_request_duration_seconds_sum {}\n",
            self.latency_sum_ns.load(Relaxed) as f64 / 1e9
        );
        s += &format!(
            "squeal_router_request_duration_seconds_count {}\n",
            self.latency_count.load(Relaxed)
        );
        s
    }
}
