//! The command line of `squeal-router`: clap's `Cli` (one field per flag, its doc comment the
//! `--help` line) and `Args`, the command line as the router uses it (flags checked and combined:
//! TLS files as mcrouter reads its flags, `-I` sizes, the connection limit, `__mcrouter__.options`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use squeal_router::auth::AuthFile;
use squeal_router::{Options, tls};

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
pub struct Args {
    pub config_file: PathBuf,
    /// The plaintext port; None: only the `--ssl-port`s (as mcrouter, one of the two is required).
    pub port: Option<u16>,
    pub listen: String,
    pub metrics_port: Option<u16>,
    pub spool_dir: Option<PathBuf>,
    pub spool_max_mb: u64,
    pub route_prefix: Option<String>,
    /// `--config-params`: constants for the config's macros.
    pub config_params: Vec<(String, String)>,
    pub threads: usize,
    /// Client connection limit (`--conn-limit`, or from the fd limit).
    pub conn_limit: u64,
    /// Poll the config file for changes (SIGHUP reloads either way).
    pub watch: bool,
    pub opts: Options,
    /// `--ssl-port`s and what their TLS is built from.
    pub ssl_ports: Vec<u16>,
    pub listener_tls: Option<tls::ListenerFiles>,
    /// TLS to servers (with `--pem-ca-path`).
    pub upstream_tls: Option<tls::UpstreamFiles>,
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

pub fn parse_args<I, T>(args: I) -> Result<Args, clap::Error>
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
