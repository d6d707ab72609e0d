//! Load generator for bench/router_bench.py: the same client for direct memcached, squeal-router
//! and nutcracker, cheap enough (Rust, one thread by default) that the process under test gets
//! most of a 2-core machine.
//!
//! Every connection sends a batch of `--depth` classic `get` requests (`--keys` keys each), waits
//! for all `depth` END lines, and repeats until `--seconds` are up. Prints one JSON object:
//! requests, seconds, and p50/p99 of the batch round trip in milliseconds.
//!
//!     cargo build --release --example loadgen
//!     target/release/examples/loadgen --port 11211 --conns 32 --depth 1 --keys 1 --seconds 3

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Args {
    port: u16,
    conns: usize,
    threads: usize,
    depth: usize,
    keys: usize,
    seconds: f64,
    key_count: usize,
    prefix: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: loadgen --port PORT [--conns 2] [--threads 1] [--depth 1] [--keys 1] [--seconds 3]\n\
         \x20              [--key-count 1000] [--prefix bench:key:]\n\
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

/// One connection's loop: returns (requests answered, batch latencies in microseconds).
async fn connection(port: u16, batches: Vec<Vec<u8>>, depth: usize, deadline: Instant) -> (u64, Vec<u32>) {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| die(port, "cannot connect", e));
    s.set_nodelay(true).unwrap_or_else(|e| die(port, "set TCP_NODELAY", e));
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
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let started = Instant::now();
    let per_thread: Vec<Vec<usize>> = (0..a.threads)
        .map(|t| (0..a.conns).filter(|c| c % a.threads == t).collect())
        .collect();
    let handles: Vec<_> = per_thread
        .into_iter()
        .map(|conns| {
            let work: Vec<_> = conns.iter().map(|&c| batches(&a, c)).collect();
            let (port, depth) = (a.port, a.depth);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let tasks: Vec<_> = work
                        .into_iter()
                        .map(|b| tokio::spawn(connection(port, b, depth, deadline)))
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
