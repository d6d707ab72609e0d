//! `squeal-router`: start-up, serving, and shutdown.
//!
//! Wires the library together: reads the command line (`cli`), loads the config (refusing to
//! start on a bad one), listens for clients, serves `/metrics`, reloads the config when the file
//! changes (unless `--no-config-watch`) and on SIGHUP (`reload`: a bad new config is rejected and
//! the old one keeps serving), and exits cleanly on SIGTERM/SIGINT. (Spooled deletes are
//! replayed by each server's recovery, see `server` and `spool`.)

mod cli;
mod reload;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use squeal_router::{Context, Shared, accept, metrics_http, spool, tls};
use tokio::net::TcpListener;

use cli::{Args, parse_args};
use reload::{Reloader, load, log_loaded, reload_on_sighup, watch_config, watch_tls};

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
