//! `squeal-router`: command line, start-up, config reload, and shutdown.
//!
//! Wires the library together: loads the config (refusing to start on a bad one), listens for
//! clients, serves `/metrics`, reloads the config when the file changes (unless
//! `--no-config-watch`) and on SIGHUP (a bad new config is rejected and the old one keeps
//! serving), and exits cleanly on SIGTERM/SIGINT. (Spooled deletes are
//! replayed by each server's recovery, see `server` and `spool`.)

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use clap::Parser;
use squeal_router::auth::AuthFile;
use squeal_router::{Context, Options, Shared, accept, config, metrics_http, spool, tls};
use tokio::net::TcpListener;

/// The command line (clap's derive API): one field per flag, its doc comment the `--help` line.
#[derive(Parser)]
#[command(
    name = "squeal-router",
    version,
    about = "squeal-router: a memcached-protocol router that reads mcrouter's JSON config dialect",
    long_about = None,
    after_help = "The config is reloaded when the file changes and on SIGHUP; SIGTERM/SIGINT exit cleanly. See docs/router.md.",
    max_term_width = 200
)]
struct Cli {
    /// mcrouter-format JSON config (reloaded when the file changes, and on SIGHUP)
    #[arg(short = 'f', long, value_name = "PATH")]
    config_file: PathBuf,
    /// Port to serve plaintext memcached clients on (optional with --ssl-port: a TLS-only router)
    #[arg(
        short = 'p',
        long,
        value_name = "PORT",
        allow_negative_numbers = true,
        required_unless_present = "ssl_port"
    )]
    port: Option<u16>,
    /// Address to listen on (clients and metrics)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    listen: String,
    /// Serve Prometheus /metrics and /healthz on this port
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    metrics_port: Option<u16>,
    /// Spool failed deletes here (asynclog AS2.0 lines) and replay them
    #[arg(long, value_name = "DIR")]
    spool_dir: Option<PathBuf>,
    /// Bound of one server's spool file, in MiB
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 64)]
    spool_max_mb: u64,
    /// Per-request timeout of servers whose pool has no server_timeout
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 1000, value_parser = positive_ms)]
    server_timeout_ms: u64,
    /// Server connect (and upstream login) timeout
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 1000)]
    connect_timeout_ms: u64,
    /// First TKO probe of a server after N ms (then x1.5 with jitter)
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 10000, value_parser = positive_ms)]
    probe_delay_initial_ms: u64,
    /// Cap of the TKO probe delay
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 60000)]
    probe_delay_max_ms: u64,
    /// Routing prefix of the default tree of a `routes` config (else the first alias)
    #[arg(short = 'R', long, value_name = "PREFIX")]
    route_prefix: Option<String>,
    /// Constants the config's macros read as %name%, as mcrouter's flag: name:value,name:value
    #[arg(long, value_name = "PARAMS", value_parser = config_params)]
    config_params: Option<ConfigParams>,
    /// Worker threads (1: one thread runs everything)
    #[arg(long, value_name = "N", allow_negative_numbers = true, default_value_t = 1)]
    threads: usize,
    /// Forward flush_all to every server of every pool (else it is refused)
    #[arg(long)]
    enable_flush_cmd: bool,
    /// Largest value taken, as memcached's -I: bytes, 512k, 2m (1k to 1024m); set it to the servers' -I
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, default_value = "1m", value_parser = item_size)]
    max_item_size: usize,
    /// Clients log in to the router as to memcached -Y (user:password lines); never forwarded
    #[arg(long, value_name = "PATH", value_parser = auth_file)]
    auth_file: Option<AuthFile>,
    /// Log in to every server connection with the first user:password of PATH (servers run with -Y)
    #[arg(long, value_name = "PATH", value_parser = auth_file)]
    upstream_auth_file: Option<AuthFile>,
    /// Do not poll the config file for changes: reload only on SIGHUP
    #[arg(long)]
    no_config_watch: bool,
    /// Max simultaneous clients, as memcached's -c (default: the fd limit less max(32, an eighth)); more are refused
    #[arg(short = 'c', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    conn_limit: Option<u64>,
    /// Serve TLS clients on these ports too (comma separated; mcrouter's --ssl-port)
    #[arg(long, value_name = "PORTS", value_delimiter = ',', allow_negative_numbers = true)]
    ssl_port: Vec<u16>,
    /// The router's certificate (PEM): for TLS clients unless --server-pem-cert-path, and shown to TLS servers
    #[arg(long, value_name = "PATH")]
    pem_cert_path: Option<PathBuf>,
    /// Key of --pem-cert-path (PEM)
    #[arg(long, value_name = "PATH")]
    pem_key_path: Option<PathBuf>,
    /// CA (PEM) that TLS servers' certificates must chain to (and clients' unless --server-pem-ca-path)
    #[arg(long, value_name = "PATH")]
    pem_ca_path: Option<PathBuf>,
    /// Certificate (PEM) served on --ssl-port (default: --pem-cert-path)
    #[arg(long, value_name = "PATH")]
    server_pem_cert_path: Option<PathBuf>,
    /// Key of --server-pem-cert-path (default: --pem-key-path)
    #[arg(long, value_name = "PATH")]
    server_pem_key_path: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to (default: --pem-ca-path)
    #[arg(long, value_name = "PATH")]
    server_pem_ca_path: Option<PathBuf>,
    /// TLS clients must present a certificate signed by the client CA (mutual TLS)
    #[arg(long)]
    ssl_require_peer_certs: bool,
    /// Name TLS servers' certificates must carry (default: the host of each server's address)
    #[arg(long, value_name = "NAME")]
    ssl_service_identity: Option<String>,
}

/// `--config-params` as parsed (a pair without `:` is a bad value).
#[derive(Clone, Debug)]
struct ConfigParams(Vec<(String, String)>);

fn config_params(text: &str) -> Result<ConfigParams, String> {
    squeal_router::preprocess::parse_params(text).map(ConfigParams)
}

/// A `-Y` file, read when the command line is (a file that cannot be read or parsed is a bad value).
fn auth_file(path: &str) -> Result<AuthFile, String> {
    AuthFile::read(path.as_ref())
}

fn positive_ms(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(0) => Err("must be at least 1 (milliseconds)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The command line as the router uses it.
struct Args {
    config_file: PathBuf,
    /// The plaintext port; None: only the `--ssl-port`s (as mcrouter, one of the two is required).
    port: Option<u16>,
    listen: String,
    metrics_port: Option<u16>,
    spool_dir: Option<PathBuf>,
    spool_max_mb: u64,
    route_prefix: Option<String>,
    /// `--config-params`: constants for the config's macros.
    config_params: Vec<(String, String)>,
    threads: usize,
    /// Client connection limit (`--conn-limit`, or from the fd limit).
    conn_limit: u64,
    /// Poll the config file for changes (SIGHUP reloads either way).
    watch: bool,
    opts: Options,
    /// `--ssl-port`s and what their TLS is built from.
    ssl_ports: Vec<u16>,
    listener_tls: Option<tls::ListenerFiles>,
    /// TLS to servers (with `--pem-ca-path`).
    upstream_tls: Option<tls::UpstreamFiles>,
}

/// The TLS setups of the command line, as mcrouter reads its flags: `--server-pem-*` for the
/// listeners, each defaulting to its `--pem-*` counterpart (mcrouter's finalizeOptions does
/// the same), `--pem-*` for connections to servers.
fn tls_files(c: &Cli) -> Result<(Option<tls::ListenerFiles>, Option<tls::UpstreamFiles>), String> {
    let listener = if c.ssl_port.is_empty() {
        None
    } else {
        let cert = c.server_pem_cert_path.clone().or_else(|| c.pem_cert_path.clone());
        let key = c.server_pem_key_path.clone().or_else(|| c.pem_key_path.clone());
        let (Some(cert), Some(key)) = (cert, key) else {
            return Err("--ssl-port needs a certificate and key: --server-pem-cert-path and --server-pem-key-path (or --pem-cert-path and --pem-key-path)".into());
        };
        Some(tls::ListenerFiles {
            cert,
            key,
            ca: c.server_pem_ca_path.clone().or_else(|| c.pem_ca_path.clone()),
            require_client_cert: c.ssl_require_peer_certs,
        })
    };
    let upstream = c.pem_ca_path.clone().map(|ca| tls::UpstreamFiles {
        ca: Some(ca),
        cert: c.pem_cert_path.clone(),
        key: c.pem_key_path.clone(),
        service_identity: c.ssl_service_identity.clone(),
    });
    Ok((listener, upstream))
}

/// `--conn-limit`, or by default the fd limit less a reserve (`accept::default_conn_limit`).
fn conn_limit(given: Option<u64>) -> u64 {
    given
        .unwrap_or_else(|| squeal_router::accept::default_conn_limit(squeal_router::accept::fd_limit().unwrap_or(1024)))
}

/// `__mcrouter__.options`: every option by its long name (`_` for `-`) and the value in effect.
/// The auth files are shown as given or not (`yes`/`no`), never their path or content.
fn startup_options(c: &Cli) -> Vec<(String, String)> {
    let opt = |v: Option<String>| v.unwrap_or_default();
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    vec![
        ("config_file".into(), c.config_file.display().to_string()),
        ("port".into(), opt(c.port.map(|p| p.to_string()))),
        ("listen".into(), c.listen.clone()),
        ("metrics_port".into(), opt(c.metrics_port.map(|p| p.to_string()))),
        (
            "spool_dir".into(),
            opt(c.spool_dir.as_ref().map(|d| d.display().to_string())),
        ),
        ("spool_max_mb".into(), c.spool_max_mb.to_string()),
        ("server_timeout_ms".into(), c.server_timeout_ms.to_string()),
        ("connect_timeout_ms".into(), c.connect_timeout_ms.to_string()),
        ("probe_delay_initial_ms".into(), c.probe_delay_initial_ms.to_string()),
        ("probe_delay_max_ms".into(), c.probe_delay_max_ms.to_string()),
        ("route_prefix".into(), opt(c.route_prefix.clone())),
        (
            "config_params".into(),
            opt(c.config_params.as_ref().map(|p| {
                p.0.iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })),
        ),
        ("threads".into(), c.threads.to_string()),
        ("enable_flush_cmd".into(), yes_no(c.enable_flush_cmd)),
        ("max_item_size".into(), c.max_item_size.to_string()),
        ("auth_file".into(), yes_no(c.auth_file.is_some())),
        ("upstream_auth_file".into(), yes_no(c.upstream_auth_file.is_some())),
        ("no_config_watch".into(), yes_no(c.no_config_watch)),
        ("conn_limit".into(), conn_limit(c.conn_limit).to_string()),
        (
            "ssl_port".into(),
            c.ssl_port.iter().map(u16::to_string).collect::<Vec<_>>().join(","),
        ),
        ("pem_cert_path".into(), opt(path(&c.pem_cert_path))),
        ("pem_key_path".into(), opt(path(&c.pem_key_path))),
        ("pem_ca_path".into(), opt(path(&c.pem_ca_path))),
        ("server_pem_cert_path".into(), opt(path(&c.server_pem_cert_path))),
        ("server_pem_key_path".into(), opt(path(&c.server_pem_key_path))),
        ("server_pem_ca_path".into(), opt(path(&c.server_pem_ca_path))),
        ("ssl_require_peer_certs".into(), yes_no(c.ssl_require_peer_certs)),
        ("ssl_service_identity".into(), opt(c.ssl_service_identity.clone())),
    ]
}

impl TryFrom<Cli> for Args {
    type Error = String;
    fn try_from(c: Cli) -> Result<Args, String> {
        let (listener_tls, upstream_tls) = tls_files(&c)?;
        squeal_router::admin::set_startup(squeal_router::admin::Startup {
            config_file: std::fs::canonicalize(&c.config_file)
                .unwrap_or_else(|_| c.config_file.clone())
                .display()
                .to_string(),
            options: startup_options(&c),
        });
        let opts = Options {
            server_timeout: Duration::from_millis(c.server_timeout_ms),
            connect_timeout: Duration::from_millis(c.connect_timeout_ms),
            probe_initial: Duration::from_millis(c.probe_delay_initial_ms),
            probe_max: Duration::from_millis(c.probe_delay_max_ms),
            enable_flush: c.enable_flush_cmd,
            max_value: c.max_item_size,
            client_auth: c.auth_file.map(Arc::new),
            upstream_login: c.upstream_auth_file.map(|a| a.login_request()),
            upstream_tls: None, // built from `upstream_tls` when the router starts
        };
        Ok(Args {
            config_file: c.config_file,
            port: c.port,
            listen: c.listen,
            metrics_port: c.metrics_port,
            spool_dir: c.spool_dir,
            spool_max_mb: c.spool_max_mb,
            route_prefix: c.route_prefix,
            config_params: c.config_params.map(|p| p.0).unwrap_or_default(),
            threads: c.threads,
            conn_limit: conn_limit(c.conn_limit),
            watch: !c.no_config_watch,
            opts,
            ssl_ports: c.ssl_port,
            listener_tls,
            upstream_tls,
        })
    }
}

fn parse_args<I, T>(args: I) -> Result<Args, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    Args::try_from(cli).map_err(|e| {
        use clap::CommandFactory;
        Cli::command().error(clap::error::ErrorKind::ArgumentConflict, e)
    })
}

/// memcached's `-I` syntax: bytes, or a number with `k` or `m` (KiB, MiB); 1 KiB to 1 GiB.
fn item_size(v: &str) -> Result<usize, String> {
    let bad = || format!("`{v}` is not a size like 1048576, 512k or 2m (1k to 1024m)");
    let (digits, unit) = match v.to_ascii_lowercase().strip_suffix(['k', 'm']) {
        Some(d) => (d.to_string(), if v.ends_with(['k', 'K']) { 1024 } else { 1024 * 1024 }),
        None => (v.to_string(), 1),
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
fn load(ctx: &Arc<Context>, args: &Args) -> (Stamp, Result<config::RouterConfig, String>) {
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

/// Reloads of the config file after the first load, by the watch or on SIGHUP, one at a time.
struct Reloader {
    shared: Arc<Shared>,
    args: Arc<Args>,
    /// The TLS setups, whose files are read again on SIGHUP (and when they change).
    listener_tls: Option<Arc<tls::Listener>>,
    upstream_tls: Option<Arc<tls::Upstream>>,
    /// The file's stamp when it was last read (loaded or rejected): the watch reloads only when it
    /// changes, so a file SIGHUP has just loaded is not loaded again by the watch.
    seen: Mutex<Stamp>,
}

impl Reloader {
    fn new(shared: Arc<Shared>, args: Arc<Args>, seen: Stamp) -> Arc<Reloader> {
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
    fn tls_paths(&self) -> Vec<PathBuf> {
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
async fn watch_config(reloader: Arc<Reloader>) {
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
async fn watch_tls(reloader: Arc<Reloader>) {
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
async fn reload_on_sighup(reloader: Arc<Reloader>, mut hup: tokio::signal::unix::Signal) {
    while hup.recv().await.is_some() {
        eprintln!(
            "squeal-router: SIGHUP, reloading {}",
            reloader.args.config_file.display()
        );
        reloader.reload(" on SIGHUP");
        reloader.reload_tls(" on SIGHUP");
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
    let mut opts = args.opts.clone();
    if let Some(files) = &args.upstream_tls {
        opts.upstream_tls = Some(tls::Upstream::new(files.clone())?);
    }
    let listener_tls = match &args.listener_tls {
        Some(files) => Some(tls::Listener::new(files.clone())?),
        None => None,
    };
    let ctx = Context::new(opts, spool);
    let (stamp, cfg) = load(&ctx, &args);
    let cfg = cfg.map_err(|e| format!("config {} rejected: {e}", args.config_file.display()))?;
    log_loaded("loaded", &args.config_file, &cfg);
    ctx.stats.config_loads.fetch_add(1, Relaxed);
    let shared = Shared::new(ctx.clone(), cfg);
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    let reloader = {
        let mut r = Reloader::new(shared.clone(), args.clone(), stamp);
        Arc::get_mut(&mut r).expect("not shared yet").listener_tls = listener_tls.clone();
        r
    };
    tokio::spawn(reload_on_sighup(reloader.clone(), hup));
    let mut tls_accepts = Vec::new();
    if let Some(tls) = &listener_tls {
        for port in &args.ssl_ports {
            let addr = format!("{}:{port}", args.listen);
            let l = TcpListener::bind(&addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            let mtls = if tls.files.require_client_cert {
                ", client certificates required"
            } else {
                ""
            };
            eprintln!("squeal-router: listening on {addr} (TLS{mtls})");
            tls_accepts.push(tokio::spawn(accept::serve(
                l,
                shared.clone(),
                args.conn_limit,
                Some(tls.clone()),
            )));
        }
    }
    let listener = match args.port {
        Some(port) => {
            let addr = format!("{}:{port}", args.listen);
            let l = TcpListener::bind(&addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            eprintln!("squeal-router: listening on {addr}");
            Some(l)
        }
        None => {
            eprintln!("squeal-router: no plaintext port (no -p): TLS clients only");
            None
        }
    };
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
    if args.watch {
        if !reloader.tls_paths().is_empty() {
            tokio::spawn(watch_tls(reloader.clone()));
        }
        tokio::spawn(watch_config(reloader));
    } else {
        eprintln!("squeal-router: config file not watched (--no-config-watch): reload with SIGHUP");
    }
    eprintln!("squeal-router: at most {} clients at a time", args.conn_limit);
    let (plain, limit) = (shared.clone(), args.conn_limit);
    let accept = async move {
        match listener {
            Some(l) => accept::serve(l, plain, limit, None).await,
            // A TLS-only router: the --ssl-port tasks serve; this waits for a signal like the others.
            None => std::future::pending::<()>().await,
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
    // clap prints the error (naming the flag and value) or the help, and exits 2 or 0
    let args = parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    // One thread by default: it runs everything, so a client connection and the server connection
    // it waits on never wake each other across threads (measured here at depth 1: 27-30 us of CPU
    // per get against 34-43 us with 2 workers, where park/unpark dominated); `--threads N` for
    // tokio's work-stealing pool.
    let mut rt = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    rt.enable_all();
    if args.threads > 1 {
        rt.worker_threads(args.threads);
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
        parse_args(std::iter::once("squeal-router").chain(args.iter().copied())).map_err(|e| {
            assert_eq!(e.exit_code(), 2, "{e}");
            e.to_string()
        })
    }

    #[test]
    fn flush_is_opt_in() {
        let a = parse(&["--config-file", "c.json", "-p", "5000"]).unwrap();
        assert!(!a.opts.enable_flush);
        let a = parse(&["-f", "c.json", "-p", "5000", "--enable-flush-cmd", "--threads", "2"]).unwrap();
        assert!(a.opts.enable_flush);
        assert_eq!(a.threads, 2);
        let e = parse(&["-f", "c.json", "-p", "5000", "--enable-flush-cmd=no"])
            .err()
            .unwrap();
        assert!(e.contains("unexpected value 'no' for '--enable-flush-cmd'"), "{e}");
        let e = parse(&["-f", "c.json", "-p", "5000", "--enable-flush"]).err().unwrap();
        assert!(e.contains("unexpected argument '--enable-flush'"), "{e}");
        assert!(e.contains("similar argument exists: '--enable-flush-cmd'"), "{e}");
    }

    #[test]
    fn every_flag_keeps_its_name_and_meaning() {
        let a = parse(&[
            "--config-file=c.json",
            "--port",
            "5000",
            "--listen",
            "0.0.0.0",
            "--metrics-port",
            "9100",
            "--spool-dir",
            "/s",
            "--spool-max-mb",
            "8",
            "--server-timeout-ms",
            "300",
            "--connect-timeout-ms",
            "200",
            "--probe-delay-initial-ms",
            "400",
            "--probe-delay-max-ms",
            "900",
            "--route-prefix",
            "/a/b/",
            "--threads",
            "3",
        ])
        .unwrap();
        assert_eq!(
            (a.config_file.to_str(), a.port, &a.listen[..]),
            (Some("c.json"), Some(5000), "0.0.0.0")
        );
        assert_eq!(
            (a.metrics_port, a.spool_dir.as_deref()),
            (Some(9100), Some("/s".as_ref()))
        );
        assert_eq!(
            (a.spool_max_mb, a.route_prefix.as_deref(), a.threads),
            (8, Some("/a/b/"), 3)
        );
        let o = &a.opts;
        assert_eq!(
            (o.server_timeout, o.connect_timeout, o.probe_initial, o.probe_max),
            (
                Duration::from_millis(300),
                Duration::from_millis(200),
                Duration::from_millis(400),
                Duration::from_millis(900)
            )
        );
        let a = parse(&["-f", "c.json", "-p", "1", "-R", "/x/y/"]).unwrap();
        assert_eq!((a.listen.as_str(), a.spool_max_mb, a.threads), ("127.0.0.1", 64, 1));
        assert_eq!(a.route_prefix.as_deref(), Some("/x/y/"));
        assert_eq!(a.opts.server_timeout, Options::default().server_timeout);
        assert_eq!(a.opts.probe_initial, Options::default().probe_initial);
        assert!(a.metrics_port.is_none() && a.spool_dir.is_none());
        for (args, flag) in [
            (&["-p", "1"][..], "--config-file"),
            (&["-f", "c.json"], "--port"),
            (&["-f", "c.json", "-p", "x"], "--port"),
            (
                &["-f", "c.json", "-p", "1", "--server-timeout-ms", "0"],
                "--server-timeout-ms",
            ),
            (
                &["-f", "c.json", "-p", "1", "--probe-delay-initial-ms", "0"],
                "--probe-delay-initial-ms",
            ),
            (&["-f", "c.json", "-p", "1", "--threads", "-1"], "--threads"),
        ] {
            let e = parse(args).err().unwrap_or_else(|| panic!("{args:?} accepted"));
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }

    #[test]
    fn help_explains_each_flag_in_one_line() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        for arg in cmd.get_arguments() {
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(!help.is_empty() && !help.contains('\n'), "{:?}: {help:?}", arg.get_id());
        }
        cmd.debug_assert();
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
        assert_eq!(
            a.opts.client_auth.unwrap().check(b"alice secret"),
            squeal_router::auth::Login::Accepted
        );
        assert!(a.opts.upstream_login.is_some());
        let a = parse(&["-f", "c.json", "-p", "1"]).unwrap();
        assert!(a.opts.client_auth.is_none() && a.opts.upstream_login.is_none());
        for flag in ["--auth-file", "--upstream-auth-file"] {
            let e = parse(&["-f", "c.json", "-p", "1", flag, b]).err().unwrap();
            assert!(e.contains(flag) && e.contains("user:password"), "{e}");
            let e = parse(&["-f", "c.json", "-p", "1", flag, "/nonexistent/x"])
                .err()
                .unwrap();
            assert!(e.contains("cannot read"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tls_flags_map_as_mcrouters() {
        // --server-pem-* default to --pem-* (mcrouter's finalizeOptions); --pem-* are for servers
        let a = parse(&[
            "-f",
            "c.json",
            "-p",
            "1",
            "--ssl-port",
            "5001,5002",
            "--pem-cert-path",
            "r.crt",
            "--pem-key-path",
            "r.key",
            "--pem-ca-path",
            "ca.crt",
            "--ssl-require-peer-certs",
        ])
        .unwrap();
        assert_eq!(a.ssl_ports, [5001, 5002]);
        let l = a.listener_tls.unwrap();
        assert_eq!(
            (l.cert.to_str(), l.key.to_str(), l.ca.as_deref()),
            (Some("r.crt"), Some("r.key"), Some("ca.crt".as_ref()))
        );
        assert!(l.require_client_cert);
        let u = a.upstream_tls.unwrap();
        assert_eq!(
            (u.ca.as_deref(), u.cert.as_deref()),
            (Some("ca.crt".as_ref()), Some("r.crt".as_ref()))
        );
        let a = parse(&[
            "-f",
            "c.json",
            "-p",
            "1",
            "--ssl-port",
            "5001",
            "--server-pem-cert-path",
            "s.crt",
            "--server-pem-key-path",
            "s.key",
            "--server-pem-ca-path",
            "clients.crt",
            "--pem-ca-path",
            "ca.crt",
            "--ssl-service-identity",
            "cache.example",
        ])
        .unwrap();
        let l = a.listener_tls.unwrap();
        assert_eq!(
            (l.cert.to_str(), l.ca.as_deref()),
            (Some("s.crt"), Some("clients.crt".as_ref()))
        );
        assert!(!l.require_client_cert);
        assert_eq!(
            a.upstream_tls.unwrap().service_identity.as_deref(),
            Some("cache.example")
        );
        let a = parse(&["-f", "c.json", "-p", "1"]).unwrap();
        assert!(a.listener_tls.is_none() && a.upstream_tls.is_none() && a.ssl_ports.is_empty());
        let e = parse(&["-f", "c.json", "-p", "1", "--ssl-port", "5001"]).err().unwrap();
        assert!(e.contains("--ssl-port needs a certificate and key"), "{e}");
    }

    #[test]
    fn a_tls_only_router_needs_no_plaintext_port() {
        // as mcrouter: -p or --ssl-port, either is enough (`squealctl up --tls` serves TLS only)
        let tls = [
            "--ssl-port",
            "5001",
            "--pem-cert-path",
            "r.crt",
            "--pem-key-path",
            "r.key",
        ];
        let a = parse(&[&["-f", "c.json"][..], &tls].concat()).unwrap();
        assert_eq!((a.port, &a.ssl_ports[..]), (None, &[5001][..]));
        let a = parse(&[&["-f", "c.json", "-p", "5000"][..], &tls].concat()).unwrap();
        assert_eq!((a.port, &a.ssl_ports[..]), (Some(5000), &[5001][..]));
        let e = parse(&["-f", "c.json"]).err().unwrap();
        assert!(e.contains("--port"), "{e}");
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
