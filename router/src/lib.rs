//! squeal-router: a memcached-protocol proxy that reads mcrouter's JSON config dialect.
//!
//! Layers, bottom up: `protocol` (wire format, no I/O), `server` (per-server connections, TKO),
//! `spool` (failed deletes to disk and back), `routes` (route handles, one per file) built by
//! `config` from JSON, `connection` (one client connection: buffered reads, replies in request
//! order), `flush` (opt-in `flush_all` to every server of the config), `metrics_http` (Prometheus
//! `/metrics`). `main` wires them together.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

pub mod config;
pub mod connection;
pub mod flush;
pub mod hash;
pub mod metrics_http;
pub mod protocol;
pub mod routes;
pub mod server;
pub mod spool;
pub mod stats;

use config::RouterConfig;
use server::Server;

/// Tunables from the command line.
#[derive(Clone, Debug)]
pub struct Options {
    /// Per-request timeout for servers of pools without `server_timeout`.
    pub server_timeout: Duration,
    pub connect_timeout: Duration,
    /// First TKO probe after this long; then x1.5 up to `probe_max`.
    pub probe_initial: Duration,
    pub probe_max: Duration,
    /// `--enable-flush-cmd`: forward `flush_all` to every server of every pool (else refused).
    pub enable_flush: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            server_timeout: Duration::from_millis(1000),
            connect_timeout: Duration::from_millis(1000),
            probe_initial: Duration::from_secs(10),
            probe_max: Duration::from_secs(60),
            enable_flush: false,
        }
    }
}

/// Process-wide state that outlives config reloads: servers (connections, TKO), spool, stats.
pub struct Context {
    pub stats: stats::Stats,
    pub opts: Options,
    pub spool: Option<spool::Spool>,
    servers: Mutex<HashMap<String, Arc<Server>>>,
}

impl Context {
    pub fn new(opts: Options, spool: Option<spool::Spool>) -> Arc<Context> {
        Arc::new(Context {
            stats: stats::Stats::default(),
            opts,
            spool,
            servers: Mutex::new(HashMap::new()),
        })
    }

    /// The server at `addr`, created (with its connection task) on first use.
    pub fn server(self: &Arc<Self>, addr: &str) -> Arc<Server> {
        let mut servers = self.servers.lock().expect("servers");
        servers
            .entry(addr.to_string())
            .or_insert_with(|| Server::new(addr.to_string(), self))
            .clone()
    }

    pub fn all_servers(&self) -> Vec<Arc<Server>> {
        self.servers.lock().expect("servers").values().cloned().collect()
    }

    pub fn servers_tko(&self) -> usize {
        self.servers
            .lock()
            .expect("servers")
            .values()
            .filter(|s| s.is_tko())
            .count()
    }
}

/// The current config, swapped atomically on reload; connections pick up a new one between reads.
pub struct Shared {
    pub ctx: Arc<Context>,
    config: RwLock<Arc<RouterConfig>>,
    generation: AtomicU64,
}

impl Shared {
    pub fn new(ctx: Arc<Context>, config: RouterConfig) -> Arc<Shared> {
        Arc::new(Shared {
            ctx,
            config: RwLock::new(Arc::new(config)),
            generation: AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> (u64, Arc<RouterConfig>) {
        let guard = self.config.read().expect("config lock");
        (self.generation.load(Ordering::Acquire), guard.clone())
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn replace(&self, config: RouterConfig) {
        let mut guard = self.config.write().expect("config lock");
        *guard = Arc::new(config);
        self.generation.fetch_add(1, Ordering::Release);
    }
}
