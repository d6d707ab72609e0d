//! Load generator for bench/router_bench.py: the same client for direct memcached, squeal-router
//! and nutcracker, cheap enough (Rust, one thread by default) that the process under test gets
//! most of a 2-core machine.
//!
//! Every connection sends a batch of `--depth` classic `get` requests (`--keys` keys each), waits
//! for all `depth` END lines, and repeats until `--seconds` are up. Prints one JSON object:
//! requests, seconds, and p50/p99 of the batch round trip in milliseconds.
//!
//! With `--tls-ca PATH` every connection is TLS (rustls, the server's certificate checked against
//! that CA for the name 127.0.0.1). `--handshakes N` measures new connections instead: N in turn,
//! each connect (+ handshake), one `version`, close; prints {"handshakes": N, "seconds": ...}.
//!
//!     cargo build --release --example loadgen
//!     target/release/examples/loadgen --port 11211 --conns 32 --depth 1 --keys 1 --seconds 3

use std::time::{Duration, Instant};

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

struct Args {
    port: u16,
    conns: usize,
    threads: usize,
    depth: usize,
    keys: usize,
    seconds: f64,
    key_count: usize,
    prefix: String,
    tls_ca: Option<String>,
    handshakes: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: loadgen --port PORT [--conns 2] [--threads 1] [--depth 1] [--keys 1] [--seconds 3]\n\
         \x20              [--key-count 1000] [--prefix bench:key:] [--tls-ca PATH] [--handshakes N]\n\
         Sends pipelined batches of classic gets on loopback and prints a JSON summary."
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        port: 0,
        conns: 2,
        threads: 1,
        depth: 1,
        keys: 1,
        seconds: 3.0,
        key_count: 1000,
        prefix: "bench:key:".into(),
        tls_ca: None,
        handshakes: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else { usage() };
        let bad = |what: &str| -> ! {
            eprintln!("loadgen: {flag} wants {what}, got {value:?}");
            std::process::exit(2)
        };
        match flag.as_str() {
            "--port" => a.port = value.parse().unwrap_or_else(|_| bad("a port")),
            "--conns" => a.conns = value.parse().unwrap_or_else(|_| bad("a count")),
            "--threads" => a.threads = value.parse().unwrap_or_else(|_| bad("a count")),
            "--depth" => a.depth = value.parse().unwrap_or_else(|_| bad("a count")),
            "--keys" => a.keys = value.parse().unwrap_or_else(|_| bad("a count")),
            "--seconds" => a.seconds = value.parse().unwrap_or_else(|_| bad("seconds")),
            "--key-count" => a.key_count = value.parse().unwrap_or_else(|_| bad("a count")),
            "--prefix" => a.prefix = value,
            "--tls-ca" => a.tls_ca = Some(value),
            "--handshakes" => a.handshakes = value.parse().unwrap_or_else(|_| bad("a count")),
            _ => usage(),
        }
    }
    if a.port == 0 || a.conns == 0 || a.threads == 0 || a.depth == 0 || a.keys == 0 || a.key_count == 0 {
        usage()
    }
    a
}

/// 64 distinct pipelined batches for connection `seed`, cycled through.
fn batches(a: &Args, seed: usize) -> Vec<Vec<u8>> {
    (0..64)
        .map(|b| {
            let mut out = Vec::new();
            for r in 0..a.depth {
                out.extend_from_slice(b"get");
                let base = seed * 7919 + b * a.depth * a.keys + r * a.keys;
                for j in 0..a.keys {
                    out.extend_from_slice(format!(" {}{}", a.prefix, (base + j) % a.key_count).as_bytes());
                }
                out.extend_from_slice(b"\r\n");
            }
            out
        })
        .collect()
}

/// A failed connection makes the whole run meaningless: say which and stop.
fn die(port: u16, what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("loadgen: 127.0.0.1:{port}: {what}: {e}");
    std::process::exit(1)
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

fn tls_connector(ca: &str) -> TlsConnector {
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap_or_else(|e| die(0, ca, format!("{e:?}"))) {
        roots
            .add(cert.unwrap_or_else(|e| die(0, ca, format!("{e:?}"))))
            .unwrap_or_else(|e| die(0, ca, e));
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| die(0, "TLS", e))
        .with_root_certificates(roots)
        .with_no_client_auth();
    // every connection pays a full handshake (no session resumption): the worst case
    let mut config = config;
    config.resumption = tokio_rustls::rustls::client::Resumption::disabled();
    TlsConnector::from(Arc::new(config))
}

async fn connect(port: u16, tls: Option<&TlsConnector>) -> Box<dyn Stream> {
    let s = TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| die(port, "cannot connect", e));
    s.set_nodelay(true).unwrap_or_else(|e| die(port, "set TCP_NODELAY", e));
    match tls {
        None => Box::new(s),
        Some(c) => {
            let name = ServerName::try_from("127.0.0.1").expect("an IP address");
            Box::new(
                c.connect(name, s)
                    .await
                    .unwrap_or_else(|e| die(port, "TLS handshake", e)),
            )
        }
    }
}

/// `n` new connections in turn, each with one `version`: the cost of a connection.
async fn handshakes(port: u16, tls: Option<TlsConnector>, n: usize) {
    let started = Instant::now();
    let mut buf = [0u8; 256];
    for _ in 0..n {
        let mut s = connect(port, tls.as_ref()).await;
        s.write_all(b"version\r\n")
            .await
            .unwrap_or_else(|e| die(port, "write failed", e));
        let got = s.read(&mut buf).await.unwrap_or_else(|e| die(port, "read failed", e));
        if !buf[..got].starts_with(b"VERSION") {
            die(port, "version", String::from_utf8_lossy(&buf[..got]))
        }
        let _ = s.shutdown().await;
    }
    println!(
        "{{\"handshakes\": {n}, \"seconds\": {:.3}}}",
        started.elapsed().as_secs_f64()
    );
}

/// One connection's loop: returns (requests answered, batch latencies in microseconds).
async fn connection(
    port: u16,
    tls: Option<TlsConnector>,
    batches: Vec<Vec<u8>>,
    depth: usize,
    deadline: Instant,
) -> (u64, Vec<u32>) {
    let mut s = connect(port, tls.as_ref()).await;
    let mut buf = vec![0u8; 256 * 1024];
    let mut lat = Vec::new();
    let mut done = 0u64;
    let mut i = 0;
    while Instant::now() < deadline {
        let t0 = Instant::now();
        s.write_all(&batches[i % batches.len()])
            .await
            .unwrap_or_else(|e| die(port, "write failed", e));
        i += 1;
        // Count END lines; `carry` keeps a tail so an END split across reads is still seen.
        let mut ends = 0;
        let mut carry: Vec<u8> = Vec::new();
        while ends < depth {
            let n = s.read(&mut buf).await.unwrap_or_else(|e| die(port, "read failed", e));
            if n == 0 {
                die(port, "read failed", "the server closed the connection")
            }
            carry.extend_from_slice(&buf[..n]);
            ends += carry.windows(5).filter(|w| w == b"END\r\n").count();
            let keep = carry.len().min(4);
            carry.drain(..carry.len() - keep);
        }
        lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        done += depth as u64;
    }
    (done, lat)
}

fn main() {
    let a = parse_args();
    let tls = a.tls_ca.as_deref().map(tls_connector);
    if a.handshakes > 0 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(handshakes(a.port, tls, a.handshakes));
        return;
    }
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let started = Instant::now();
    let per_thread: Vec<Vec<usize>> = (0..a.threads)
        .map(|t| (0..a.conns).filter(|c| c % a.threads == t).collect())
        .collect();
    let handles: Vec<_> = per_thread
        .into_iter()
        .map(|conns| {
            let work: Vec<_> = conns.iter().map(|&c| batches(&a, c)).collect();
            let (port, depth, tls) = (a.port, a.depth, tls.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let tasks: Vec<_> = work
                        .into_iter()
                        .map(|b| tokio::spawn(connection(port, tls.clone(), b, depth, deadline)))
                        .collect();
                    let mut out = Vec::new();
                    for t in tasks {
                        out.push(t.await.expect("connection task"));
                    }
                    out
                })
            })
        })
        .collect();
    let mut requests = 0u64;
    let mut lat: Vec<u32> = Vec::new();
    for h in handles {
        for (n, l) in h.join().expect("thread") {
            requests += n;
            lat.extend(l);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len() as f64) * p) as usize).copied().unwrap_or(0) as f64 / 1000.0;
    println!(
        "{{\"requests\": {requests}, \"seconds\": {seconds:.3}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}}}",
        pct(0.5),
        pct(0.99)
    );
}
