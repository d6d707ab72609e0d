//! `/metrics` (Prometheus text) and `/healthz` over HTTP/1.1, served by hyper.
//!
//! hyper does the HTTP (request parsing, keep-alive, `HEAD`, pipelining, limits); this module
//! only maps a path to a body. The exposition text itself is written by `stats` (see
//! docs/router.md for why it is not the prometheus-client crate).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::shared::Shared;

/// Prometheus' text exposition format, version 0.0.4.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A client must send its request head within this long (a connection that sends nothing is
/// closed, as the hand-written responder did before).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // e.g. out of file descriptors: back off instead of spinning, and log the first
                // failure only (a scraper waiting in the queue would make it 20 lines a second)
                if !failing {
                    eprintln!("squeal-router: metrics accept failed: {e} (retrying; logged once)");
                    failing = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if failing {
            eprintln!("squeal-router: metrics accepting again");
            failing = false;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let reply = respond(&shared, &req);
                async move { Ok::<_, Infallible>(reply) }
            });
            // errors are a client's (a bad request, a reset, a timeout): hyper has answered or
            // closed, there is nothing more to do
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The answer to one request, by path (any method; hyper leaves the body out for `HEAD`).
fn respond<B>(shared: &Shared, req: &Request<B>) -> Response<Full<Bytes>> {
    let ctx = &shared.ctx;
    let (status, ctype, body) = match req.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            PROMETHEUS_TEXT,
            Bytes::from(ctx.stats.prometheus_text(ctx.servers_tko())),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", Bytes::from_static(b"ok\n")),
        _ => (StatusCode::NOT_FOUND, "text/plain", Bytes::from_static(b"not found\n")),
    };
    let mut reply = Response::new(Full::new(body));
    *reply.status_mut() = status;
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    reply
}
