//! Replaying a server's spool: its deletes are sent in order, pipelined, before the server serves
//! again (see the module doc of `crate::spool`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::Spool;
use super::format::parse_entry;
use super::writer::{OnEmpty, Take};
use crate::protocol::Request;
use crate::server::Server;
use crate::stats::Stats;

/// Deletes of a replay sent to the server before their replies are awaited.
const REPLAY_WINDOW: usize = 256;

/// Replay `server`'s spooled deletes until none are left, then clear its TKO (in order with spool
/// appends, see the module doc). False if a delete could not be delivered: the server stays TKO
/// and the unsent deletes stay spooled, in order. Without a spool, just clears TKO. `timeout` is
/// each delete's (`--server-timeout-ms`); replayed deletes are counted in `stats`.
pub async fn catch_up(spool: Option<&Spool>, stats: &Stats, timeout: Duration, server: &Arc<Server>) -> bool {
    let Some(spool) = spool else {
        server.clear_tko();
        return true;
    };
    let lock = spool.replay_lock(&server.addr);
    let _one_at_a_time = lock.lock().await;
    loop {
        let on_empty: OnEmpty = {
            let server = server.clone();
            Box::new(move || server.clear_tko())
        };
        match spool.take_or_clear(&server.addr, on_empty).await {
            Take::Cleared => return true,
            Take::Failed(why) => {
                eprintln!("squeal-router: replay to {} not possible: {why}", server.addr);
                return false;
            }
            Take::Taken(path, taken) => {
                if !replay(spool, stats, timeout, server, &path, taken).await {
                    return false;
                }
            }
        }
    }
}

/// Send the deletes of one taken file, in order; put back what was not delivered. True if all were.
async fn replay(
    spool: &Spool,
    stats: &Stats,
    timeout: Duration,
    server: &Arc<Server>,
    path: &Path,
    taken: u64,
) -> bool {
    let text = match tokio::fs::read(path).await {
        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
        Err(e) => {
            // left as it is: start-up merges it back in front
            eprintln!("squeal-router: cannot read spool {}: {e}", path.display());
            return false;
        }
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut replayed = 0u64;
    let mut failed_at = None;
    'window: for (w, window) in lines.chunks(REPLAY_WINDOW).enumerate() {
        let reqs: Vec<Option<Request>> = window.iter().map(|l| parse_entry(l)).collect();
        let sendable: Vec<Request> = reqs.iter().flatten().cloned().collect();
        let mut replies = server.send_all(&sendable, timeout).await.into_iter();
        for (i, (req, line)) in reqs.iter().zip(window).enumerate() {
            if req.is_none() {
                eprintln!(
                    "squeal-router: skipping unreadable spool line for {}: {line}",
                    server.addr
                );
                continue;
            }
            let reply = replies.next().expect("one reply per request");
            if reply.res.is_failover_error() {
                failed_at = Some(w * REPLAY_WINDOW + i);
                break 'window;
            }
            replayed += 1;
        }
    }
    stats.replayed_deletes.fetch_add(replayed, Relaxed);
    let rest: Vec<String> = match failed_at {
        Some(i) => lines[i..].iter().map(|l| l.to_string()).collect(),
        None => Vec::new(),
    };
    if rest.is_empty() {
        eprintln!("squeal-router: replayed {replayed} spooled deletes to {}", server.addr);
    } else {
        eprintln!(
            "squeal-router: replay to {} stopped after {replayed} deletes; {} kept in the spool, in order",
            server.addr,
            rest.len()
        );
    }
    let delivered = rest.is_empty();
    spool.finish(&server.addr, taken, rest).await;
    let _ = tokio::fs::remove_file(path).await;
    delivered
}
