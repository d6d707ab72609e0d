//! Reloading the config and the TLS files while the router serves: the config file polled for
//! changes (unless `--no-config-watch`), the TLS files polled likewise, both read again on SIGHUP;
//! one reload at a time, and a config or TLS file that does not load is rejected, the old one
//! kept serving.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use squeal_router::{Context, Shared, config, tls};

use crate::cli::Args;

/// What the config file looked like when it was read: (modified time, length).
pub type Stamp = Option<(SystemTime, u64)>;

fn mtime(path: &PathBuf) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Read and build the config; also the file's stamp from *before* it was read, so that the watch,
/// starting from that stamp, sees any edit made after this read (one made between the stat and
/// the read is loaded now and again by the watch, which is harmless).
pub fn load(ctx: &Arc<Context>, args: &Args) -> (Stamp, Result<config::RouterConfig, String>) {
    let stamp = mtime(&args.config_file);
    let cfg = std::fs::read_to_string(&args.config_file)
        .map_err(|e| format!("cannot read {}: {e}", args.config_file.display()))
        .and_then(|text| {
            config::load_from(
                ctx,
                &text,
                args.route_prefix.as_deref(),
                args.config_file.parent(),
                &args.config_params,
            )
        });
    (stamp, cfg)
}

pub fn log_loaded(verb: &str, path: &std::path::Path, cfg: &config::RouterConfig) {
    eprintln!(
        "squeal-router: config {} {verb} ({} pools; handles: {})",
        path.display(),
        cfg.pools,
        cfg.types_used.join(", ")
    );
    for w in &cfg.warnings {
        eprintln!("squeal-router: config {}: warning: {w}", path.display());
    }
}

/// Reloads of the config file after the first load, by the watch or on SIGHUP, one at a time.
pub struct Reloader {
    shared: Arc<Shared>,
    args: Arc<Args>,
    /// The TLS setups, whose files are read again on SIGHUP (and when they change).
    pub listener_tls: Option<Arc<tls::Listener>>,
    upstream_tls: Option<Arc<tls::Upstream>>,
    /// The file's stamp when it was last read (loaded or rejected): the watch reloads only when it
    /// changes, so a file SIGHUP has just loaded is not loaded again by the watch.
    seen: Mutex<Stamp>,
}

impl Reloader {
    pub fn new(shared: Arc<Shared>, args: Arc<Args>, seen: Stamp) -> Arc<Reloader> {
        Arc::new(Reloader {
            listener_tls: None,
            upstream_tls: shared.ctx.opts.upstream_tls.clone(),
            shared,
            args,
            seen: Mutex::new(seen),
        })
    }

    /// Read the file again and serve it; a config that does not load is rejected (logged with the
    /// file and the reason, e.g. a JSON error's line and column) and the old one keeps serving.
    /// `how` says what asked (`""` for the watch, `" on SIGHUP"`).
    fn reload(&self, how: &str) {
        // held while loading (no await in between): a reload never interleaves with another
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = &self.shared.ctx;
        let path = self.args.config_file.display();
        let (stamp, cfg) = load(ctx, &self.args);
        *seen = stamp;
        match cfg {
            Ok(cfg) => {
                log_loaded(&format!("reloaded{how}"), &self.args.config_file, &cfg);
                ctx.stats.config_loads.fetch_add(1, Relaxed);
                self.shared.replace(cfg);
            }
            Err(e) => {
                ctx.stats.config_rejects.fetch_add(1, Relaxed);
                eprintln!("squeal-router: config {path} rejected{how}, keeping the previous one: {e}");
            }
        }
    }

    /// Read the TLS certificates, keys and CAs again: new handshakes use them, connections
    /// already open keep theirs. Files that do not load are rejected and the old ones kept.
    fn reload_tls(&self, how: &str) {
        if let Some(l) = &self.listener_tls {
            match l.reload() {
                Ok(()) => eprintln!(
                    "squeal-router: TLS certificate for clients reloaded{how} ({})",
                    l.files.cert.display()
                ),
                Err(e) => {
                    eprintln!("squeal-router: TLS certificate for clients rejected{how}, keeping the previous one: {e}")
                }
            }
        }
        if let Some(u) = &self.upstream_tls {
            match u.reload() {
                Ok(()) => eprintln!("squeal-router: TLS setup for servers reloaded{how}"),
                Err(e) => {
                    eprintln!("squeal-router: TLS setup for servers rejected{how}, keeping the previous one: {e}")
                }
            }
        }
    }

    /// Every TLS file in use.
    pub fn tls_paths(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        if let Some(l) = &self.listener_tls {
            paths.extend([l.files.cert.clone(), l.files.key.clone()]);
            paths.extend(l.files.ca.clone());
        }
        if let Some(u) = &self.upstream_tls {
            paths.extend(u.files.ca.iter().chain(&u.files.cert).chain(&u.files.key).cloned());
        }
        paths
    }

    fn seen(&self) -> Stamp {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Poll the config file every 500 ms for a change since the last load; after a change, wait until
/// it has been still for ~1 s, then reload.
pub async fn watch_config(reloader: Arc<Reloader>) {
    let path = &reloader.args.config_file;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = mtime(path);
        if now == reloader.seen() || now.is_none() {
            continue;
        }
        // settle: the writer may not be done
        let mut settled = now;
        loop {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let again = mtime(path);
            if again == settled {
                break;
            }
            settled = again;
        }
        if settled != reloader.seen() {
            reloader.reload("");
        }
    }
}

/// Poll the TLS files every second; after a change, once they have been still for ~1 s (a
/// rotation writes several files), read them again.
pub async fn watch_tls(reloader: Arc<Reloader>) {
    let stamps = |r: &Reloader| r.tls_paths().iter().map(mtime).collect::<Vec<Stamp>>();
    let mut seen = stamps(&reloader);
    loop {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let now = stamps(&reloader);
        if now == seen {
            continue;
        }
        let mut settled = now;
        loop {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let again = stamps(&reloader);
            if again == settled {
                break;
            }
            settled = again;
        }
        seen = settled;
        reloader.reload_tls(" (files changed)");
    }
}

/// Reload on every SIGHUP (the handler is installed before the router listens, so a SIGHUP never
/// finds the default action, which would end the process).
pub async fn reload_on_sighup(reloader: Arc<Reloader>, mut hup: tokio::signal::unix::Signal) {
    while hup.recv().await.is_some() {
        eprintln!(
            "squeal-router: SIGHUP, reloading {}",
            reloader.args.config_file.display()
        );
        reloader.reload(" on SIGHUP");
        reloader.reload_tls(" on SIGHUP");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use squeal_router::Options;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        crate::cli::parse_args(std::iter::once("squeal-router").chain(args.iter().copied()))
    }

    #[test]
    fn an_edit_right_after_the_first_load_is_not_missed() {
        let dir = std::env::temp_dir().join(format!("squeal-router-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(&path, r#"{"route": "NullRoute"}"#).unwrap();
        let args = Arc::new(parse(&["-f", path.to_str().unwrap(), "-p", "1"]).unwrap());
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let ctx = Context::new(Options::default(), None);
                let (stamp, cfg) = load(&ctx, &args);
                let shared = Shared::new(ctx, cfg.unwrap());
                // edited before the watch starts (and within the same clock tick of a coarse mtime)
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&path)
                    .unwrap();
                std::io::Write::write_all(&mut &f, br#"{"route": "ErrorRoute|edited"}"#).unwrap();
                f.set_modified(stamp.unwrap().0).unwrap();
                let watch = tokio::spawn(watch_config(Reloader::new(shared.clone(), args.clone(), stamp)));
                for _ in 0..60 {
                    if shared.generation() > 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                watch.abort();
                assert_eq!(shared.generation(), 1, "the edit was missed");
                assert_eq!(shared.config().1.types_used, ["ErrorRoute"]);
            });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
