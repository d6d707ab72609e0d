//! Process-wide state that outlives config reloads: the live servers (connections, TKO), the
//! spool, stats, lease tokens, and the options. Routes, servers and connections hold it as `Arc<Context>`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::options::Options;
use crate::server::{Env, Server};
use crate::{lease_tokens, spool, stats};

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

impl Env for Context {
    fn opts(&self) -> &Options {
        &self.opts
    }

    fn stats(&self) -> &stats::Stats {
        &self.stats
    }

    fn catch_up<'a>(&'a self, server: &'a Arc<Server>) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(spool::replay::catch_up(
            self.spool.as_ref(),
            &self.stats,
            self.opts.server_timeout,
            server,
        ))
    }
}
