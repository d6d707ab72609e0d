//! `flush_all` through the router, opt-in with `--enable-flush-cmd` (mcrouter's flag).
//!
//! A flush goes to every server of every pool of the loaded config (the pools named in `pools`,
//! whether a route uses them or not, and inline pools), each server once, all at the same time.
//! The client gets `OK` only if every server answered `OK`; anything else (an error reply, a
//! timeout, a lost connection, a TKO server failing fast, a pool that could not be built) fails
//! the whole flush with one `SERVER_ERROR` line naming what failed, worst first, so the caller
//! retries: a flush that did not reach every cache is never acknowledged. Servers that did answer
//! `OK` are flushed all the same; retrying is harmless (flushing twice is flushing).
//!
//! `stats reset` goes the same way to the same servers (not opt-in: it resets counters, no data),
//! and is `RESET` only if every server answered `RESET`.
//!
//! Each server gets `flush_all` or `flush_all <delay>` (never `noreply`: every forwarded request
//! is answered, see `protocol::request`). The job is queued on the server's connection when the
//! flush is first polled, which the client connection does in request order, so on each server the
//! flush lands after the requests the client sent before it and before those it sent after.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::join_all;

use crate::protocol::{Reply, Res};
use crate::server::Server;

/// One server to flush, with the longest timeout of the pools it serves.
#[derive(Clone)]
pub struct FlushTarget {
    pub server: Arc<Server>,
    pub timeout: Duration,
}

/// At most this many failures are named in the error line (then "and N more").
const NAMED: usize = 4;
/// A server's error text is cut to this many bytes in the error line.
const WHY_MAX: usize = 200;

/// The line sent to each server.
pub fn server_line(delay: Option<i64>) -> Bytes {
    match delay {
        Some(d) => Bytes::from(format!("flush_all {d}\r\n")),
        None => Bytes::from_static(b"flush_all\r\n"),
    }
}

/// What one server answered, for the error line: its reply without `SERVER_ERROR ` or CRLF.
fn why(reply: &Reply) -> String {
    let end = reply
        .wire
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(reply.wire.len());
    let line = String::from_utf8_lossy(&reply.wire[..end]);
    let line = line.strip_prefix("SERVER_ERROR ").unwrap_or(&line);
    let mut cut = line.len().min(WHY_MAX);
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    if line.is_empty() {
        format!("no reply ({})", reply.res.name())
    } else {
        line[..cut].to_string()
    }
}

/// Flush every target (`problems`: pools of the config that could not be built, each a failure).
/// `Ok(servers flushed)`, or `Err(text)` for the line `SERVER_ERROR flush_all <text>`.
pub async fn flush_all(targets: &[FlushTarget], problems: &[String], delay: Option<i64>) -> Result<usize, String> {
    to_every_server(targets, problems, server_line(delay), b"OK").await
}

/// `stats reset` to every target, as [`flush_all`]: `Ok` only if every server answered `RESET`,
/// else `Err(text)` for the line `SERVER_ERROR stats reset <text>`.
pub async fn stats_reset(targets: &[FlushTarget], problems: &[String]) -> Result<usize, String> {
    to_every_server(targets, problems, Bytes::from_static(b"stats reset\r\n"), b"RESET").await
}

/// Send `line` to every target at once; `Ok(servers)` if each answered `expect`, else the failures
/// (and `problems`), worst first, at most [`NAMED`] of them named.
async fn to_every_server(
    targets: &[FlushTarget],
    problems: &[String],
    line: Bytes,
    expect: &[u8],
) -> Result<usize, String> {
    let is_ok = |reply: &Reply| reply.wire.trim_ascii_end() == expect;
    let replies = join_all(targets.iter().map(|t| {
        let line = line.clone();
        async move {
            if t.server.is_tko() {
                Reply::error(Res::Tko, "tko: server is marked down")
            } else {
                t.server.send_line(line, t.timeout).await
            }
        }
    }))
    .await;
    let mut failed: Vec<(&FlushTarget, Reply)> = targets.iter().zip(replies).filter(|(_, r)| !is_ok(r)).collect();
    if failed.is_empty() && problems.is_empty() {
        return Ok(targets.len());
    }
    // worst first (an error reply that is not an error class, e.g. `ERROR`, counts as a client error)
    let severity = |r: &Reply| {
        if r.res.is_error() {
            r.res.severity()
        } else {
            Res::ClientError.severity()
        }
    };
    failed.sort_by(|a, b| {
        severity(&b.1)
            .cmp(&severity(&a.1))
            .then_with(|| a.0.server.addr.cmp(&b.0.server.addr))
    });
    let mut items: Vec<String> = problems.to_vec();
    items.extend(failed.iter().map(|(t, r)| format!("{} ({})", t.server.addr, why(r))));
    let total = items.len();
    let mut text = if failed.is_empty() {
        "failed: ".to_string()
    } else {
        format!("failed on {} of {} servers: ", failed.len(), targets.len())
    };
    text += &items[..total.min(NAMED)].join("; ");
    if total > NAMED {
        text += &format!("; and {} more", total - NAMED);
    }
    Err(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Context;
    use crate::options::Options;
    use crate::testing::{fake_memcached, run};

    fn target(ctx: &Arc<Context>, addr: &str) -> FlushTarget {
        FlushTarget {
            server: crate::server::Server::new(addr.to_string(), false, ctx),
            timeout: Duration::from_millis(500),
        }
    }

    fn ctx() -> Arc<Context> {
        let opts = Options {
            connect_timeout: Duration::from_millis(300),
            ..Options::default()
        };
        Context::new(opts, None)
    }

    #[test]
    fn ok_only_when_every_server_says_ok() {
        run(async {
            let c = ctx();
            let (a, seen_a) = fake_memcached(|_| "OK\r\n").await;
            let (b, seen_b) = fake_memcached(|_| "OK\r\n").await;
            let targets = [target(&c, &a), target(&c, &b)];
            assert_eq!(flush_all(&targets, &[], None).await, Ok(2));
            assert_eq!(flush_all(&targets, &[], Some(30)).await, Ok(2));
            for seen in [seen_a, seen_b] {
                assert_eq!(*seen.lock().unwrap(), ["flush_all", "flush_all 30"]);
            }
            // nothing to flush is a success
            assert_eq!(flush_all(&[], &[], None).await, Ok(0));
        });
    }

    #[test]
    fn any_failure_fails_the_flush_and_names_the_server() {
        run(async {
            let c = ctx();
            let (ok, seen_ok) = fake_memcached(|_| "OK\r\n").await;
            let (bad, _) = fake_memcached(|_| "SERVER_ERROR out of memory\r\n").await;
            let (refusing, _) = fake_memcached(|_| "CLIENT_ERROR flush_all not allowed\r\n").await;
            // a port nothing listens on: connect error, then TKO
            let gone = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().to_string()
            };
            let targets = [target(&c, &ok), target(&c, &bad)];
            let err = flush_all(&targets, &[], None).await.unwrap_err();
            assert_eq!(err, format!("failed on 1 of 2 servers: {bad} (out of memory)"));
            assert_eq!(
                seen_ok.lock().unwrap().len(),
                1,
                "the healthy server is flushed all the same"
            );

            let gone_target = target(&c, &gone);
            let targets = [target(&c, &ok), target(&c, &refusing), gone_target.clone()];
            let err = flush_all(&targets, &[], None).await.unwrap_err();
            assert!(err.starts_with("failed on 2 of 3 servers: "), "{err}");
            assert!(
                err.contains(&format!("{refusing} (CLIENT_ERROR flush_all not allowed)")),
                "{err}"
            );
            assert!(err.contains(&format!("{gone} (connect error")), "{err}");
            // now TKO: fails fast, never a false OK
            assert!(gone_target.server.is_tko());
            let err = flush_all(&[gone_target], &[], None).await.unwrap_err();
            assert!(err.contains("tko: server is marked down"), "{err}");

            // a pool that could not be built fails the flush even if every server answered OK
            let problem = "pool `p` not flushed: bad server address `nohost`".to_string();
            let err = flush_all(&[target(&c, &ok)], std::slice::from_ref(&problem), None)
                .await
                .unwrap_err();
            assert_eq!(err, format!("failed: {problem}"));
        });
    }

    #[test]
    fn stats_reset_wants_reset_from_every_server() {
        run(async {
            let c = ctx();
            let (a, seen_a) = fake_memcached(|_| "RESET\r\n").await;
            let (b, _) = fake_memcached(|_| "ERROR\r\n").await;
            assert_eq!(stats_reset(&[target(&c, &a)], &[]).await, Ok(1));
            assert_eq!(*seen_a.lock().unwrap(), ["stats reset"]);
            let err = stats_reset(&[target(&c, &a), target(&c, &b)], &[]).await.unwrap_err();
            assert_eq!(err, format!("failed on 1 of 2 servers: {b} (ERROR)"));
        });
    }

    #[test]
    fn long_failure_lists_are_cut() {
        let problems: Vec<String> = (0..6).map(|i| format!("pool `p{i}` not flushed")).collect();
        let err = run(flush_all(&[], &problems, None)).unwrap_err();
        assert!(err.ends_with("pool `p3` not flushed; and 2 more"), "{err}");
    }
}
