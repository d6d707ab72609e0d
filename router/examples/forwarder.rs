//! The cheapest possible TCP proxy, for bench/router_bench.py's `--forwarder` baseline: every client
//! connection gets its own connection to the backend and bytes are copied both ways, unparsed.
//! Whatever CPU per request this costs, any proxy that forwards over TCP pays at least as much, so
//! it separates the router's own costs from those of proxying itself.
//!
//!     cargo build --release --example forwarder
//!     target/release/examples/forwarder --port 22122 --backend 127.0.0.1:11211

use tokio::net::{TcpListener, TcpStream};

fn parse_args() -> (u16, String) {
    let mut port = None;
    let mut backend = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next()) {
            ("--port", Some(v)) => port = v.parse().ok(),
            ("--backend", Some(v)) => backend = Some(v),
            _ => port = None,
        }
    }
    match (port, backend) {
        (Some(p), Some(b)) => (p, b),
        _ => {
            eprintln!(
                "usage: forwarder --port PORT --backend HOST:PORT\nCopies bytes between each client and its own backend connection."
            );
            std::process::exit(2)
        }
    }
}

async fn forward(mut client: TcpStream, backend: String) {
    let Ok(mut server) = TcpStream::connect(&backend).await else {
        eprintln!("forwarder: cannot connect to {backend}");
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

fn main() {
    let (port, backend) = parse_args();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap_or_else(|e| {
            eprintln!("forwarder: cannot listen on 127.0.0.1:{port}: {e}");
            std::process::exit(1)
        });
        loop {
            if let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, backend.clone()));
            }
        }
    });
}
