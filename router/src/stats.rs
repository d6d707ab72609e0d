//! Router counters, shared by every task, rendered as memcached `stats` lines and as Prometheus text.
//!
//! Plain atomics: no locks on the request path. This module is the counters — their labels, their
//! registration across config reloads, their values at the last `stats reset`; `render` writes them
//! out, as the `stats` reply and as Prometheus text.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::protocol::Cmd;
use crate::protocol::cmd::COMMANDS;

mod render;

/// Labels of the per-operation request counter (client commands as received): the keyed
/// commands first, named and ordered by [`COMMANDS`] (so a `Cmd` is its own index), then the
/// commands that no route handles. `flush` is `flush_all` (memcached's `cmd_flush`).
pub const OPS: &[&str] = &OP_LABELS;

/// Labels of the commands that are not keyed, after the keyed ones in [`OPS`].
const UNKEYED_OPS: [&str; 5] = ["mn", "version", "stats", "flush", "other"];

const OP_LABELS: [&str; Cmd::COUNT + UNKEYED_OPS.len()] = {
    let mut labels = [""; Cmd::COUNT + UNKEYED_OPS.len()];
    let mut i = 0;
    while i < Cmd::COUNT {
        labels[i] = COMMANDS[i].name;
        i += 1;
    }
    while i < labels.len() {
        labels[i] = UNKEYED_OPS[i - Cmd::COUNT];
        i += 1;
    }
    labels
};

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Route label of commands that no route handles (`version`, `stats`, `mn`, unroutable keys).
pub const NO_ROUTE: &str = "none";

/// Request counters of one route: a routing prefix such as `/east/a/`, `default` for a config
/// with a single `route`, or [`NO_ROUTE`].
pub struct RouteCounters {
    pub label: String,
    requests: Vec<AtomicU64>,
    /// Gets (`get`/`gets` keys, `mg`, `gat`/`gats` keys) answered with a value, and without one.
    pub gets: HitCounters,
}

/// Get hits and misses (memcached's `get_hits`/`get_misses`): a hit is a value (`VALUE`, or `VA`/`HD`
/// for `mg`), a miss none (`END` without the key, `EN`); errors are neither.
#[derive(Default)]
pub struct HitCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl HitCounters {
    /// Count one answer to a get-type request from its result.
    #[inline]
    pub fn count(&self, res: crate::protocol::Res) {
        match res {
            crate::protocol::Res::Found => self.hits.fetch_add(1, Relaxed),
            crate::protocol::Res::Miss => self.misses.fetch_add(1, Relaxed),
            _ => 0,
        };
    }

    /// `count` for many answers at once (a batch of `mg`s): two atomic adds, not one per key.
    pub fn count_all(&self, results: impl Iterator<Item = crate::protocol::Res>) {
        let (mut hits, mut misses) = (0, 0);
        for res in results {
            match res {
                crate::protocol::Res::Found => hits += 1,
                crate::protocol::Res::Miss => misses += 1,
                _ => {}
            }
        }
        if hits > 0 {
            self.hits.fetch_add(hits, Relaxed);
        }
        if misses > 0 {
            self.misses.fetch_add(misses, Relaxed);
        }
    }

    fn load(&self) -> [u64; 2] {
        [self.hits.load(Relaxed), self.misses.load(Relaxed)]
    }
}

/// Get hits and misses of one pool, as its servers answered them (a WarmUpRoute's miss on cold
/// and hit on warm count once in each pool).
pub struct PoolCounters {
    pub label: String,
    pub gets: HitCounters,
}

impl RouteCounters {
    fn new(label: &str) -> RouteCounters {
        RouteCounters {
            label: label.to_string(),
            requests: OPS.iter().map(|_| AtomicU64::new(0)).collect(),
            gets: HitCounters::default(),
        }
    }

    /// Count one request of a command that is not routed by key (`mn`, `version`, ...).
    pub fn count(&self, op: &str) {
        self.requests[op_index(op)].fetch_add(1, Relaxed);
    }

    /// Count one keyed request (the request path: no name lookup).
    pub fn count_cmd(&self, cmd: Cmd) {
        self.requests[cmd as usize].fetch_add(1, Relaxed);
    }
}

pub struct Stats {
    started: Instant,
    /// Every route's counters, kept across reloads (a label keeps its counters).
    routes: Mutex<Vec<Arc<RouteCounters>>>,
    /// Every pool's get counters, by pool name, kept across reloads.
    pools: Mutex<Vec<Arc<PoolCounters>>>,
    pub no_route: Arc<RouteCounters>,
    pub errors: AtomicU64,
    pub client_errors: AtomicU64,
    pub tko_events: AtomicU64,
    pub tko_recoveries: AtomicU64,
    pub gutter_failovers: AtomicU64,
    pub failovers: AtomicU64,
    pub warmup_fills: AtomicU64,
    pub spooled_deletes: AtomicU64,
    pub spool_dropped: AtomicU64,
    pub replayed_deletes: AtomicU64,
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    /// Clients refused at the connection limit (memcached's `rejected_connections`).
    pub rejected_connections: AtomicU64,
    /// Clients of a TLS port whose handshake succeeded.
    pub tls_handshakes: AtomicU64,
    /// Clients of a TLS port refused at the handshake (each logged, see `crate::tls::FailureLog`).
    pub tls_handshake_failures: AtomicU64,
    /// The client connection limit (memcached's `max_connections`), set by `crate::accept`.
    pub max_connections: AtomicU64,
    pub config_loads: AtomicU64,
    pub config_rejects: AtomicU64,
    /// TransparentLeaseRoute (every handle of the config together): leases won by a plain get miss,
    /// waits on a lease another client held, gets that gave up waiting (answered a miss), fills
    /// stored and refused, tokens evicted at the map's bound; `lease_tokens` is a gauge.
    pub lease_won: AtomicU64,
    pub lease_waits: AtomicU64,
    pub lease_gave_up: AtomicU64,
    pub lease_fills_stored: AtomicU64,
    pub lease_fills_refused: AtomicU64,
    pub lease_tokens_evicted: AtomicU64,
    pub lease_stale_marks: AtomicU64,
    pub lease_stale_served: AtomicU64,
    /// FailoverRoute with `enable_lease_pairing`: lease-sets sent to the child that issued their
    /// token when that was not the first (without pairing they would reach a server with no lease).
    pub lease_pairing_redirects: AtomicU64,
    pub lease_tokens: AtomicU64,
    latency: Vec<AtomicU64>,
    latency_sum_ns: AtomicU64,
    latency_count: AtomicU64,
    /// The counters as they were at the last `stats reset`: `stats` shows counts since then, while
    /// `/metrics` keeps counting from the start (a Prometheus counter only goes back at a restart).
    since_reset: Mutex<Baseline>,
}

/// Counter values at a `stats reset` (see [`Stats::reset`]).
#[derive(Default)]
struct Baseline {
    total_connections: u64,
    scalars: Vec<u64>,
    /// requests per op, by route label
    routes: Vec<(String, Vec<u64>)>,
    /// get hits and misses, by route label, then by pool
    route_gets: Vec<(String, [u64; 2])>,
    pool_gets: Vec<(String, [u64; 2])>,
}

fn find(list: &[(String, [u64; 2])], label: &str) -> [u64; 2] {
    list.iter().find(|(l, _)| l == label).map_or([0, 0], |(_, v)| *v)
}

impl Baseline {
    fn route(&self, label: &str) -> Option<&[u64]> {
        self.routes.iter().find(|(l, _)| l == label).map(|(_, v)| &v[..])
    }
}

impl Default for Stats {
    fn default() -> Self {
        let no_route = Arc::new(RouteCounters::new(NO_ROUTE));
        Stats {
            started: Instant::now(),
            routes: Mutex::new(vec![no_route.clone()]),
            pools: Mutex::new(Vec::new()),
            no_route,
            errors: AtomicU64::new(0),
            client_errors: AtomicU64::new(0),
            tko_events: AtomicU64::new(0),
            tko_recoveries: AtomicU64::new(0),
            gutter_failovers: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            warmup_fills: AtomicU64::new(0),
            spooled_deletes: AtomicU64::new(0),
            spool_dropped: AtomicU64::new(0),
            replayed_deletes: AtomicU64::new(0),
            curr_connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            tls_handshakes: AtomicU64::new(0),
            tls_handshake_failures: AtomicU64::new(0),
            max_connections: AtomicU64::new(0),
            config_loads: AtomicU64::new(0),
            config_rejects: AtomicU64::new(0),
            lease_won: AtomicU64::new(0),
            lease_waits: AtomicU64::new(0),
            lease_gave_up: AtomicU64::new(0),
            lease_fills_stored: AtomicU64::new(0),
            lease_fills_refused: AtomicU64::new(0),
            lease_tokens_evicted: AtomicU64::new(0),
            lease_stale_marks: AtomicU64::new(0),
            lease_stale_served: AtomicU64::new(0),
            lease_pairing_redirects: AtomicU64::new(0),
            lease_tokens: AtomicU64::new(0),
            latency: (0..=LATENCY_BUCKETS.len()).map(|_| AtomicU64::new(0)).collect(),
            latency_sum_ns: AtomicU64::new(0),
            latency_count: AtomicU64::new(0),
            since_reset: Mutex::new(Baseline::default()),
        }
    }
}

pub fn op_index(name: &str) -> usize {
    OPS.iter().position(|o| *o == name).unwrap_or(OPS.len() - 1)
}

impl Stats {
    /// The counters of route `label` (config loads call this, not requests): those of an earlier
    /// config if one used the label, else new ones that stay out of `stats` and `/metrics` until
    /// [`Stats::register`] (so a config that fails to load leaves no routes behind).
    pub fn route_counters(&self, label: &str) -> Arc<RouteCounters> {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        match routes.iter().find(|r| r.label == label) {
            Some(r) => r.clone(),
            None => Arc::new(RouteCounters::new(label)),
        }
    }

    /// Show the counters of a config that has loaded (those already shown stay as they are).
    pub fn register<'a>(&self, counters: impl IntoIterator<Item = &'a Arc<RouteCounters>>) {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        for c in counters {
            if !routes.iter().any(|r| r.label == c.label) {
                routes.push(c.clone());
            }
        }
    }

    /// The get counters of pool `name` (config loads call this): those of an earlier config if
    /// one had the pool, else new ones, shown once a config using them loads (`register_pools`).
    pub fn pool_counters(&self, name: &str) -> Arc<PoolCounters> {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        match pools.iter().find(|p| p.label == name) {
            Some(p) => p.clone(),
            None => Arc::new(PoolCounters {
                label: name.to_string(),
                gets: HitCounters::default(),
            }),
        }
    }

    pub fn register_pools<'a>(&self, counters: impl IntoIterator<Item = &'a Arc<PoolCounters>>) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        for c in counters {
            if !pools.iter().any(|p| p.label == c.label) {
                pools.push(c.clone());
            }
        }
    }

    fn pool_snapshot(&self) -> Vec<Arc<PoolCounters>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn route_snapshot(&self) -> Vec<Arc<RouteCounters>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn observe_latency(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.latency[i].fetch_add(1, Relaxed);
        self.latency_sum_ns.fetch_add(d.as_nanos() as u64, Relaxed);
        self.latency_count.fetch_add(1, Relaxed);
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    fn scalars(&self) -> Vec<(&'static str, &'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Relaxed);
        vec![
            ("errors", "replies that were errors", g(&self.errors)),
            ("client_errors", "malformed client commands", g(&self.client_errors)),
            ("tko_events", "servers marked TKO", g(&self.tko_events)),
            (
                "tko_recoveries",
                "TKO servers brought back by a probe",
                g(&self.tko_recoveries),
            ),
            ("failovers", "requests answered by a failover child", g(&self.failovers)),
            (
                "gutter_failovers",
                "requests sent to a FailoverWithExptimeRoute failover (gutter)",
                g(&self.gutter_failovers),
            ),
            (
                "warmup_fills",
                "values copied from warm to cold by WarmUpRoute",
                g(&self.warmup_fills),
            ),
            (
                "spooled_deletes",
                "failed deletes written to the spool",
                g(&self.spooled_deletes),
            ),
            (
                "spool_dropped_deletes",
                "failed deletes the full spool refused",
                g(&self.spool_dropped),
            ),
            (
                "replayed_deletes",
                "spooled deletes replayed to their server",
                g(&self.replayed_deletes),
            ),
            ("config_loads", "configs loaded", g(&self.config_loads)),
            ("config_rejects", "configs rejected", g(&self.config_rejects)),
            (
                "rejected_connections",
                "clients refused at the connection limit",
                g(&self.rejected_connections),
            ),
            (
                "tls_handshakes",
                "clients of a TLS port whose handshake succeeded",
                g(&self.tls_handshakes),
            ),
            (
                "tls_handshake_failures",
                "clients of a TLS port refused at the handshake",
                g(&self.tls_handshake_failures),
            ),
            (
                "lease_won",
                "lease route: plain get misses that won a lease",
                g(&self.lease_won),
            ),
            (
                "lease_waits",
                "lease route: waits on a lease another client held",
                g(&self.lease_waits),
            ),
            (
                "lease_gave_up",
                "lease route: gets that waited out their retries (a miss)",
                g(&self.lease_gave_up),
            ),
            (
                "lease_fills_stored",
                "lease route: sets with a lease token, stored",
                g(&self.lease_fills_stored),
            ),
            (
                "lease_fills_refused",
                "lease route: sets with a lease token refused as stale",
                g(&self.lease_fills_refused),
            ),
            (
                "lease_tokens_evicted",
                "lease route: tokens dropped at max_tokens, oldest first",
                g(&self.lease_tokens_evicted),
            ),
            (
                "lease_stale_marks",
                "lease route: deletes sent as stale marks (md I T<stale_ttl>)",
                g(&self.lease_stale_marks),
            ),
            (
                "lease_stale_served",
                "lease route: gets answered with a stale value while another reader refills it",
                g(&self.lease_stale_served),
            ),
            (
                "lease_pairing_redirects",
                "lease pairing: lease-sets sent to the failover child that issued their token, not the first",
                g(&self.lease_pairing_redirects),
            ),
        ]
    }

    /// `stats reset`: the counters `stats` shows start again from zero (memcached resets its
    /// counters, not its gauges: `curr_connections`, `servers_tko` and `uptime` stay).
    pub fn reset(&self) {
        let base = Baseline {
            total_connections: self.total_connections.load(Relaxed),
            scalars: self.scalars().iter().map(|s| s.2).collect(),
            routes: self
                .route_snapshot()
                .iter()
                .map(|r| (r.label.clone(), r.requests.iter().map(|c| c.load(Relaxed)).collect()))
                .collect(),
            route_gets: self
                .route_snapshot()
                .iter()
                .map(|r| (r.label.clone(), r.gets.load()))
                .collect(),
            pool_gets: self
                .pool_snapshot()
                .iter()
                .map(|p| (p.label.clone(), p.gets.load()))
                .collect(),
        };
        *self.since_reset.lock().unwrap_or_else(|e| e.into_inner()) = base;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyed_command_indexes_its_own_op_label() {
        use Cmd::*;
        let all = [
            Get, Gets, Set, Add, Replace, Append, Prepend, Cas, Delete, Incr, Decr, Touch, MetaGet, MetaSet,
            MetaDelete, MetaArith, MetaDebug,
        ];
        for cmd in all {
            assert_eq!(OPS[cmd as usize], cmd.name());
        }
        let c = RouteCounters::new("r");
        c.count_cmd(Delete);
        c.count("delete");
        assert_eq!(c.requests[op_index("delete")].load(Relaxed), 2);
    }

    fn stat(text: &str, name: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")).map(|v| v.parse().unwrap()))
    }

    #[test]
    fn reset_restarts_what_stats_shows_but_not_the_prometheus_counters() {
        let s = Stats::default();
        let r = s.route_counters("/a/");
        s.register([&r]);
        r.count_cmd(Cmd::Get);
        s.errors.fetch_add(3, Relaxed);
        s.total_connections.fetch_add(2, Relaxed);
        s.curr_connections.fetch_add(1, Relaxed);
        s.reset();
        let text = s.memcached_text(0);
        assert_eq!(stat(&text, "cmd_get"), Some(0));
        assert_eq!(stat(&text, "route:/a/:cmd_get"), None);
        assert_eq!(stat(&text, "errors"), Some(0));
        assert_eq!(stat(&text, "total_connections"), Some(0));
        assert_eq!(stat(&text, "curr_connections"), Some(1), "a gauge");
        r.count_cmd(Cmd::Get);
        s.errors.fetch_add(1, Relaxed);
        let late = s.route_counters("/b/"); // a route first seen after the reset counts from zero
        s.register([&late]);
        late.count_cmd(Cmd::Set);
        let text = s.memcached_text(0);
        assert_eq!(stat(&text, "cmd_get"), Some(1));
        assert_eq!(stat(&text, "route:/a/:cmd_get"), Some(1));
        assert_eq!(stat(&text, "route:/b/:cmd_set"), Some(1));
        assert_eq!(stat(&text, "errors"), Some(1));
        let prom = s.prometheus_text(0);
        assert!(
            prom.contains("squeal_router_requests_total{op=\"get\",route=\"/a/\"} 2\n"),
            "{prom}"
        );
        assert!(prom.contains("squeal_router_errors_total 4\n"), "{prom}");
    }

    /// The metric families `prometheus_text` renders (from its `# TYPE` lines), with the
    /// `_total` suffix that docs/metrics.md leaves off counters.
    fn rendered_families(text: &str) -> std::collections::BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(|n| n.strip_suffix("_total").unwrap_or(n).to_string())
            .collect()
    }

    #[test]
    fn docs_metrics_md_lists_exactly_the_families_the_router_renders() {
        // Both ways: a new series must be documented, and a documented one that no longer
        // exists is a stale row an operator would alert on in vain.
        let doc = include_str!("../../docs/metrics.md");
        let documented: std::collections::BTreeSet<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `squeal_router_"))
            .filter_map(|l| l.split('`').next())
            .map(|n| format!("squeal_router_{n}"))
            .collect();
        let rendered = rendered_families(&Stats::default().prometheus_text(0));
        assert!(rendered.len() > 20, "{rendered:?}");
        let undocumented: Vec<_> = rendered.difference(&documented).collect();
        let stale: Vec<_> = documented.difference(&rendered).collect();
        assert!(
            undocumented.is_empty(),
            "rendered but not in docs/metrics.md: {undocumented:?}"
        );
        assert!(stale.is_empty(), "in docs/metrics.md but never rendered: {stale:?}");
    }
}
