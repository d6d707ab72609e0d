//! The config that serves, swapped atomically on reload (`main` replaces it; connections pick up
//! a new one between reads).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::config::RouterConfig;
use crate::context::Context;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;
    use crate::options::Options;
    use crate::testing::run;

    #[test]
    fn a_rejected_config_leaves_no_server_behind_and_a_reload_retires_removed_ones() {
        run(async {
            let c = Context::new(Options::default(), None);
            let first = load(
                &c,
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]}}, "route": "PoolRoute|p"}"#,
                None,
            )
            .unwrap();
            let shared = Shared::new(c.clone(), first);
            let before: Vec<String> = {
                let mut a: Vec<String> = c.all_servers().iter().map(|s| s.addr.clone()).collect();
                a.sort();
                a
            };
            assert_eq!(before, ["127.0.0.1:1", "127.0.0.1:2"]);
            // fails after building pool `p` with a third server: none of it stays
            let bad = r#"{"pools": {"p": {"servers": ["127.0.0.1:3"]}},
                         "route": {"type": "FailoverRoute", "children": ["PoolRoute|p", "PoolRoute|nope"]}}"#;
            assert!(load(&c, bad, None).is_err());
            let mut now: Vec<String> = c.all_servers().iter().map(|s| s.addr.clone()).collect();
            now.sort();
            assert_eq!(now, before);
            // a reload keeps the server it still uses (same object: connection, TKO state) and drops the other
            let kept = c.live_server("127.0.0.1:1").unwrap();
            let next = load(
                &c,
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1"]}}, "route": "PoolRoute|p"}"#,
                None,
            )
            .unwrap();
            shared.replace(next);
            let live = c.all_servers();
            assert_eq!(live.len(), 1);
            assert!(Arc::ptr_eq(&live[0], &kept));
        });
    }
}
