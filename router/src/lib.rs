//! squeal-router: a memcached-protocol proxy that reads mcrouter's JSON config dialect.
//!
//! Layers, bottom up: `protocol` (wire format, no I/O), `server` (per-server connections, TKO),
//! `spool` (failed deletes to disk and back), `ack` (when a delete counts as acknowledged), `routes` (route handles, one per file) built by
//! `config` from JSON, `connection` (one client connection: buffered reads, replies in request
//! order; `connection::multiget` batches a multi-key get per server), `flush` (opt-in `flush_all` to every server of the config), `metrics_http` (Prometheus
//! `/metrics`), `accept` (accepting clients; refusing them at the connection limit as memcached
//! does), `admin` (`get __mcrouter__.*` admin requests, answered by the router itself).
//! `main` wires them together.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

pub mod accept;
pub mod ack;
pub mod admin;
pub mod auth;
pub mod config;
pub mod connection;
pub mod flush;
pub mod hash;
pub mod jsonc;
pub mod lease_tokens;
pub mod load;
pub mod md5;
pub mod metrics_http;
pub mod preprocess;
pub mod protocol;
pub mod recording;
pub mod routes;
pub mod server;
pub mod spool;
pub mod stats;
pub mod tls;

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
    /// `--max-item-size`: longer values are refused as memcached refuses items over its `-I`.
    pub max_value: usize,
    /// `--auth-file`: clients log in to the router (memcached `-Y` style); their login never
    /// reaches a server.
    pub client_auth: Option<std::sync::Arc<auth::AuthFile>>,
    /// `--upstream-auth-file`: the router logs in to every new server connection with this.
    pub upstream_login: Option<auth::UpstreamLogin>,
    /// `--pem-ca-path` (and `--pem-cert-path`/`--pem-key-path`): TLS to the servers of pools with
    /// `"security_mech": "tls"`.
    pub upstream_tls: Option<Arc<tls::Upstream>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            server_timeout: Duration::from_millis(1000),
            connect_timeout: Duration::from_millis(1000),
            probe_initial: Duration::from_secs(10),
            probe_max: Duration::from_secs(60),
            enable_flush: false,
            max_value: protocol::request::MAX_VALUE_LEN,
            client_auth: None,
            upstream_login: None,
            upstream_tls: None,
        }
    }
}

/// Process-wide state that outlives config reloads: servers (connections, TKO), spool, stats.
pub struct Context {
    pub stats: stats::Stats,
    pub opts: Options,
    pub spool: Option<spool::Spool>,
    /// Tokens the router gave `lease-get` clients in place of a server's (see `lease_tokens`).
    pub lease_tokens: lease_tokens::LeaseTokens,
    /// The servers of the config that serves, by address: the ones probed, replayed to, counted.
    servers: Mutex<HashMap<String, Arc<Server>>>,
}

impl Context {
    pub fn new(opts: Options, spool: Option<spool::Spool>) -> Arc<Context> {
        Arc::new(Context {
            stats: stats::Stats::default(),
            opts,
            spool,
            lease_tokens: lease_tokens::LeaseTokens::default(),
            servers: Mutex::new(HashMap::new()),
        })
    }

    /// The server at `addr` of the config that serves, if it has one (a new config reuses it, with
    /// its connection and TKO state).
    pub fn live_server(&self, addr: &str) -> Option<Arc<Server>> {
        self.servers.lock().expect("servers").get(addr).cloned()
    }

    /// Make `servers` (those of a config about to serve) the live ones. Servers no longer in the
    /// config are retired (their probes stop); new ones with spooled deletes waiting are held out of
    /// the read path until those are replayed to them.
    pub fn install(&self, servers: &[Arc<Server>]) {
        let added: Vec<Arc<Server>> = {
            let mut live = self.servers.lock().expect("servers");
            let next: HashMap<String, Arc<Server>> = servers.iter().map(|s| (s.addr.clone(), s.clone())).collect();
            for (addr, old) in live.iter() {
                if !next.get(addr).is_some_and(|s| Arc::ptr_eq(s, old)) {
                    old.retire();
                }
            }
            let added = next
                .values()
                .filter(|s| !live.get(&s.addr).is_some_and(|old| Arc::ptr_eq(old, s)))
                .cloned()
                .collect();
            *live = next;
            added
        };
        let Some(spool) = self.spool.as_ref() else {
            return;
        };
        for server in added {
            if spool.has_entries(&server.addr) {
                server.hold("deletes for it are waiting in the spool");
            }
        }
        let orphans: Vec<String> = spool
            .servers_with_entries()
            .into_iter()
            .filter(|addr| self.live_server(addr).is_none())
            .collect();
        if !orphans.is_empty() {
            eprintln!(
                "squeal-router: the spool holds deletes for servers not in the config (kept on disk, replayed if they come back): {}",
                orphans.join(", ")
            );
        }
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
    /// Serve `config` (its servers become the live ones, see `Context::install`).
    pub fn new(ctx: Arc<Context>, config: RouterConfig) -> Arc<Shared> {
        ctx.install(&config.servers);
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

    /// Serve `config` from now on (a reload): its servers become the live ones, the others retire.
    pub fn replace(&self, config: RouterConfig) {
        self.ctx.install(&config.servers);
        let mut guard = self.config.write().expect("config lock");
        *guard = Arc::new(config);
        self.generation.fetch_add(1, Ordering::Release);
    }
}
