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
