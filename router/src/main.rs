//! `squeal-router`: command line, start-up, config reload, and shutdown.
//!
//! Wires the library together: loads the config (refusing to start on a bad one), listens for
//! clients, serves `/metrics`, polls the config file for changes (a bad new config is rejected
//! and the old one keeps serving), and exits cleanly on SIGTERM/SIGINT. (Spooled deletes are
//! replayed by each server's recovery, see `server` and `spool`.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use squeal_router::auth::AuthFile;
use squeal_router::{Context, Options, Shared, config, connection, metrics_http, spool};
use tokio::net::TcpListener;

const USAGE: &str = "\
squeal-router: a memcached-protocol router that reads mcrouter's JSON config dialect

usage: squeal-router --config-file PATH -p PORT [options]

  -f, --config-file PATH        mcrouter-format JSON config (reloaded when the file changes)
  -p, --port PORT               port to serve memcached clients on
      --listen ADDR             address to listen on (default 127.0.0.1)
      --metrics-port PORT       serve Prometheus /metrics and /healthz on this port
      --spool-dir DIR           spool failed deletes here and replay them (asynclog AS2.0 lines)
      --spool-max-mb N          bound of one server's spool file (default 64)
      --server-timeout-ms N     default per-request server timeout (default 1000)
      --connect-timeout-ms N    server connect timeout (default 1000)
      --probe-delay-initial-ms N  first TKO probe after N ms (default 10000)
      --probe-delay-max-ms N    TKO probe delay cap (default 60000)
  -R, --route-prefix PREFIX     default routing prefix of a `routes` config
      --threads N               worker threads (default 1: one thread runs everything)
      --enable-flush-cmd        forward flush_all to every server of every pool (default: refused)
      --max-item-size SIZE      largest value accepted, as memcached's -I: bytes, or with k/m
                                (default 1m; set it to the servers' -I)
      --auth-file PATH          clients must log in to the router as to memcached -Y (PATH in
                                -Y format, user:password lines); logins are never forwarded
      --upstream-auth-file PATH log in to each new server connection with the first user:password
                                of PATH (for servers started with memcached -Y)
  -h, --help                    this text
";

struct Args {
    config_file: PathBuf,
    port: u16,
    listen: String,
    metrics_port: Option<u16>,
    spool_dir: Option<PathBuf>,
    spool_max_mb: u64,
    route_prefix: Option<String>,
    threads: Option<usize>,
    opts: Options,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut it = args.into_iter();
    let mut config_file = None;
    let mut port = None;
    let mut a = Args {
        config_file: PathBuf::new(),
        port: 0,
        listen: "127.0.0.1".into(),
        metrics_port: None,
        spool_dir: None,
        spool_max_mb: 64,
        route_prefix: None,
        threads: None,
        opts: Options::default(),
    };
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag}: `{v}` is not a valid number"))
    }
    while let Some(flag) = it.next() {
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (flag, None),
        };
        let mut value = || inline.clone().or_else(|| it.next());
        match flag.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            "-f" | "--config-file" => config_file = Some(PathBuf::from(value().ok_or("--config-file needs a path")?)),
            "-p" | "--port" => port = Some(num::<u16>("--port", value())?),
            "--listen" => a.listen = value().ok_or("--listen needs an address")?,
            "--metrics-port" => a.metrics_port = Some(num("--metrics-port", value())?),
            "--spool-dir" => a.spool_dir = Some(PathBuf::from(value().ok_or("--spool-dir needs a path")?)),
            "--spool-max-mb" => a.spool_max_mb = num("--spool-max-mb", value())?,
            "--server-timeout-ms" => {
                a.opts.server_timeout = Duration::from_millis(num("--server-timeout-ms", value())?)
            }
            "--connect-timeout-ms" => {
                a.opts.connect_timeout = Duration::from_millis(num("--connect-timeout-ms", value())?)
            }
            "--probe-delay-initial-ms" => {
                a.opts.probe_initial = Duration::from_millis(num("--probe-delay-initial-ms", value())?)
            }
            "--probe-delay-max-ms" => a.opts.probe_max = Duration::from_millis(num("--probe-delay-max-ms", value())?),
            "-R" | "--route-prefix" => a.route_prefix = Some(value().ok_or("--route-prefix needs a value")?),
            "--threads" => a.threads = Some(num("--threads", value())?),
            "--max-item-size" => a.opts.max_value = item_size(value())?,
            "--auth-file" => {
                let path = PathBuf::from(value().ok_or("--auth-file needs a path")?);
                a.opts.client_auth = Some(Arc::new(AuthFile::read(&path, "--auth-file")?));
            }
            "--upstream-auth-file" => {
                let path = PathBuf::from(value().ok_or("--upstream-auth-file needs a path")?);
                a.opts.upstream_login = Some(AuthFile::read(&path, "--upstream-auth-file")?.login_request());
            }
            "--enable-flush-cmd" => {
                if inline.is_some() {
                    return Err("--enable-flush-cmd takes no value".into());
                }
                a.opts.enable_flush = true;
            }
            other => return Err(format!("unknown option `{other}` (see --help)")),
        }
    }
    a.config_file = config_file.ok_or("--config-file is required")?;
    a.port = port.ok_or("-p PORT is required")?;
    if a.opts.server_timeout.is_zero() || a.opts.probe_initial.is_zero() {
        return Err("timeouts and probe delays must be positive".into());
    }
    Ok(a)
}

/// memcached's `-I` syntax: bytes, or a number with `k` or `m` (KiB, MiB); 1 KiB to 1 GiB.
fn item_size(v: Option<String>) -> Result<usize, String> {
    let v = v.ok_or("--max-item-size needs a size")?;
    let bad = || format!("--max-item-size: `{v}` is not a size like 1048576, 512k or 2m (1k to 1024m)");
    let (digits, unit) = match v.to_ascii_lowercase().strip_suffix(['k', 'm']) {
        Some(d) => (d.to_string(), if v.ends_with(['k', 'K']) { 1024 } else { 1024 * 1024 }),
        None => (v.clone(), 1),
    };
    let n: usize = digits.parse().map_err(|_| bad())?;
    let bytes = n.checked_mul(unit).ok_or_else(bad)?;
    if !(1024..=1024 * 1024 * 1024).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes)
}

/// What the config file looked like when it was read: (modified time, length).
type Stamp = Option<(SystemTime, u64)>;

fn mtime(path: &PathBuf) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Read and build the config; also the file's stamp from *before* it was read, so that the watch,
/// starting from that stamp, sees any edit made after this read (one made between the stat and
/// the read is loaded now and again by the watch, which is harmless).
fn load(ctx: &Arc<Context>, args: &Args) -> Result<(config::RouterConfig, Stamp), String> {
    let stamp = mtime(&args.config_file);
    let text = std::fs::read_to_string(&args.config_file)
        .map_err(|e| format!("cannot read {}: {e}", args.config_file.display()))?;
    Ok((config::load(ctx, &text, args.route_prefix.as_deref())?, stamp))
}

fn log_loaded(verb: &str, path: &std::path::Path, cfg: &config::RouterConfig) {
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

/// Poll the config file every 500 ms for a change since `seen` (the stamp of the last load); after
/// a change, wait until it has been still for ~1 s.
async fn watch_config(shared: Arc<Shared>, args: Arc<Args>, mut seen: Stamp) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = mtime(&args.config_file);
        if now == seen || now.is_none() {
            continue;
        }
        // settle: the writer may not be done
        let mut settled = now;
        loop {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let again = mtime(&args.config_file);
            if again == settled {
                break;
            }
            settled = again;
        }
        seen = settled;
        let ctx = shared.ctx.clone();
        match load(&ctx, &args) {
            Ok((cfg, _)) => {
                log_loaded("reloaded", &args.config_file, &cfg);
                ctx.stats
                    .config_loads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                shared.replace(cfg);
            }
            Err(e) => {
                ctx.stats
                    .config_rejects
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                eprintln!(
                    "squeal-router: config {} rejected, keeping the previous one: {e}",
                    args.config_file.display()
                );
            }
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let args = Arc::new(args);
    let spool = match &args.spool_dir {
        Some(dir) => Some(
            spool::Spool::open(dir, args.spool_max_mb * 1024 * 1024)
                .map_err(|e| format!("cannot open spool dir {}: {e}", dir.display()))?,
        ),
        None => None,
    };
    let ctx = Context::new(args.opts.clone(), spool);
    let (cfg, stamp) = load(&ctx, &args).map_err(|e| format!("config {} rejected: {e}", args.config_file.display()))?;
    log_loaded("loaded", &args.config_file, &cfg);
    ctx.stats
        .config_loads
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let shared = Shared::new(ctx.clone(), cfg);
    let addr = format!("{}:{}", args.listen, args.port);
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    eprintln!("squeal-router: listening on {addr}");
    if args.opts.enable_flush {
        eprintln!("squeal-router: flush_all enabled (--enable-flush-cmd): it flushes every server of every pool");
    }
    if let Some(p) = args.metrics_port {
        let maddr = format!("{}:{p}", args.listen);
        let ml = TcpListener::bind(&maddr)
            .await
            .map_err(|e| format!("cannot listen on {maddr}: {e}"))?;
        eprintln!("squeal-router: metrics on http://{maddr}/metrics");
        tokio::spawn(metrics_http::serve(ml, shared.clone()));
    }
    tokio::spawn(watch_config(shared.clone(), args.clone(), stamp));
    let accept = {
        let shared = shared.clone();
        async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(connection::serve(shared.clone(), stream));
                    }
                    Err(e) => {
                        // e.g. out of file descriptors: back off instead of spinning
                        eprintln!("squeal-router: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    tokio::select! {
        _ = accept => {}
        _ = term.recv() => eprintln!("squeal-router: SIGTERM, shutting down"),
        _ = tokio::signal::ctrl_c() => eprintln!("squeal-router: SIGINT, shutting down"),
    }
    Ok(())
}

fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("squeal-router: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    // One thread by default: it runs everything, so a client connection and the server connection
    // it waits on never wake each other across threads (measured here at depth 1: 27-30 us of CPU
    // per get against 34-43 us with 2 workers, where park/unpark dominated); `--threads N` for
    // tokio's work-stealing pool.
    let mut rt = if args.threads.unwrap_or(1) <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    rt.enable_all();
    if let Some(n) = args.threads.filter(|&n| n > 1) {
        rt.worker_threads(n);
    }
    let rt = match rt.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("squeal-router: cannot start runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = rt.block_on(run(args));
    // Spooled deletes were fsync'd before they were acknowledged; nothing else needs draining.
    rt.shutdown_timeout(Duration::from_millis(200));
    if let Err(e) = result {
        eprintln!("squeal-router: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn flush_is_opt_in() {
        let a = parse(&["--config-file", "c.json", "-p", "5000"]).unwrap();
        assert!(!a.opts.enable_flush);
        let a = parse(&["-f", "c.json", "-p", "5000", "--enable-flush-cmd", "--threads", "2"]).unwrap();
        assert!(a.opts.enable_flush);
        assert_eq!(a.threads, Some(2));
        let e = parse(&["-f", "c.json", "-p", "5000", "--enable-flush-cmd=no"])
            .err()
            .unwrap();
        assert!(e.contains("takes no value"), "{e}");
        let e = parse(&["-f", "c.json", "-p", "5000", "--enable-flush"]).err().unwrap();
        assert!(e.contains("unknown option `--enable-flush`"), "{e}");
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
                let (cfg, stamp) = load(&ctx, &args).unwrap();
                let shared = Shared::new(ctx, cfg);
                // edited before the watch starts (and within the same clock tick of a coarse mtime)
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&path)
                    .unwrap();
                std::io::Write::write_all(&mut &f, br#"{"route": "ErrorRoute|edited"}"#).unwrap();
                f.set_modified(stamp.unwrap().0).unwrap();
                let watch = tokio::spawn(watch_config(shared.clone(), args.clone(), stamp));
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

    #[test]
    fn auth_files_are_read_at_start() {
        let dir = std::env::temp_dir().join(format!("squeal-router-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, "alice:secret\n").unwrap();
        let bad = dir.join("bad");
        std::fs::write(&bad, "alice secret\n").unwrap();
        let (g, b) = (good.to_str().unwrap(), bad.to_str().unwrap());
        let a = parse(&["-f", "c.json", "-p", "1", "--auth-file", g, "--upstream-auth-file", g]).unwrap();
        assert!(a.opts.client_auth.unwrap().check(b"alice secret"));
        assert!(a.opts.upstream_login.is_some());
        let a = parse(&["-f", "c.json", "-p", "1"]).unwrap();
        assert!(a.opts.client_auth.is_none() && a.opts.upstream_login.is_none());
        for flag in ["--auth-file", "--upstream-auth-file"] {
            let e = parse(&["-f", "c.json", "-p", "1", flag, b]).err().unwrap();
            assert!(e.starts_with(flag) && e.contains("user:password"), "{e}");
            let e = parse(&["-f", "c.json", "-p", "1", flag, "/nonexistent/x"])
                .err()
                .unwrap();
            assert!(e.contains("cannot read"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn max_item_size_reads_like_memcacheds_dash_i() {
        let size = |v: &str| parse(&["-f", "c.json", "-p", "1", "--max-item-size", v]).map(|a| a.opts.max_value);
        assert_eq!(parse(&["-f", "c.json", "-p", "1"]).unwrap().opts.max_value, 1024 * 1024);
        assert_eq!(size("2m"), Ok(2 * 1024 * 1024));
        assert_eq!(size("512K"), Ok(512 * 1024));
        assert_eq!(size("5000"), Ok(5000));
        assert_eq!(size("1024m"), Ok(1024 * 1024 * 1024));
        for bad in ["", "1x", "m", "0", "1023", "1025m", "-1m", "99999999999999999999k"] {
            let e = size(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.contains("--max-item-size"), "{e}");
        }
    }
}
