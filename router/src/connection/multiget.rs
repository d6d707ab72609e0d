//! Multi-key gets: the keys of one `get k1 k2 ...` are gathered per server (those whose route
//! asks one server first), sent as one multi-key get per server, and the servers' VALUE blocks
//! are split back to the keys that asked, in the order the client asked them. Keys whose batch
//! fails over, and keys without a single first server, take their full route. The client loop
//! (`super`) queues the answer like any other.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future::join_all;

use crate::config::{RouterConfig, select_route};
use crate::context::Context;
use crate::protocol::reply::{END, first_line_end, parse_decimal};
use crate::protocol::{Cmd, Reply, Request, Res};
use crate::routes::RouteRef;
use crate::routes::destination::Destination;
use crate::stats::RouteCounters;

/// The answer for one key of a multi-key get.
enum Part {
    Pending,
    Miss,
    /// A VALUE block inside the reply of batch number `.0`.
    Batched(usize, std::ops::Range<usize>),
    Routed(Reply),
}

/// Keys that one server answers first, sent as one multi-key get.
struct Batch<'c> {
    dest: &'c Destination,
    members: Vec<usize>,
}

/// A multi-key `get`: keys whose route asks one server first are batched into one multi-key get
/// per server; the others (and the keys of any batch that fails over) take their full route.
/// VALUE blocks go back in the order the keys were asked.
pub(super) async fn multi_get_reply(ctx: &Context, config: &RouterConfig, cmd: Cmd, keys: Vec<Bytes>) -> Bytes {
    let n = keys.len();
    let mut reqs: Vec<Request> = Vec::with_capacity(n);
    // each key's route and the counters of its label
    let mut routes: Vec<Option<(&RouteRef, &Arc<RouteCounters>)>> = Vec::with_capacity(n);
    let mut parts: Vec<Part> = Vec::with_capacity(n);
    let mut batches: Vec<Batch> = Vec::new();
    let mut stripped = false;
    let mut asked: Vec<Option<Bytes>> = Vec::with_capacity(n);
    for (i, k) in keys.into_iter().enumerate() {
        let mut req = Request::simple(cmd, k);
        let (route, client_key) = select_route(config, &mut req);
        stripped |= client_key.is_some();
        asked.push(client_key);
        match route {
            Ok((route, route_counters)) => {
                if let Some(dest) = route.first_get_target(&req) {
                    match batches.iter_mut().find(|b| std::ptr::eq(b.dest, dest)) {
                        Some(b) => b.members.push(i),
                        None => {
                            // room for every key left: one server often has them all
                            let mut members = Vec::with_capacity(n - i);
                            members.push(i);
                            batches.push(Batch { dest, members })
                        }
                    }
                }
                routes.push(Some((route, route_counters)));
                parts.push(Part::Pending);
            }
            Err(e) => {
                routes.push(None);
                parts.push(Part::Routed(e));
            }
        }
        reqs.push(req);
    }
    let gets = cmd == Cmd::Gets;
    let replies: Vec<Reply> = if batches.len() == 1 {
        vec![send_batch(&batches[0], gets, &reqs).await]
    } else {
        join_all(batches.iter().map(|b| send_batch(b, gets, &reqs))).await
    };
    if let [reply] = &replies[..]
        && batches[0].members.len() == n
        && !stripped
        && !reply.res.is_error()
    {
        // One server had every key, as asked: its VALUE blocks are the answer.
        count_values(reply.values, n, &batches[0].dest.gets.gets, routes[0].map(|r| r.1));
        let mut out = BytesMut::with_capacity(reply.wire.len() + END.len());
        out.put_slice(&reply.wire);
        out.put_slice(END);
        return out.freeze();
    }
    for (b, (batch, reply)) in batches.iter().zip(&replies).enumerate() {
        if reply.res.is_failover_error() {
            continue; // these keys take their full route below
        }
        if reply.res.is_error() {
            for &i in &batch.members {
                parts[i] = Part::Routed(reply.clone());
            }
            continue;
        }
        split_values(b, &reply.wire, &batch.members, &reqs, &mut parts);
        for &i in &batch.members {
            batch.dest.gets.gets.count(match parts[i] {
                Part::Batched(..) => Res::Found,
                _ => Res::Miss,
            });
        }
    }
    // The other keys take their full route, handed to it together: a route may batch them
    // (TransparentLeaseRoute sends one batch of `mg`s per server).
    let mut slow: Vec<(&RouteRef, Vec<usize>)> = Vec::new();
    for i in (0..n).filter(|&i| matches!(parts[i], Part::Pending)) {
        let (route, _) = routes[i].expect("pending keys have a route");
        match slow.iter_mut().find(|(r, _)| same_route(r, route)) {
            Some((_, members)) => members.push(i),
            None => {
                let mut members = Vec::with_capacity(n - i);
                members.push(i);
                slow.push((route, members));
            }
        }
    }
    // One route for every key, as asked: it may write the VALUE blocks straight into the answer
    // (TransparentLeaseRoute does), instead of a reply per key that is copied here.
    if let [(route, members)] = &slow[..]
        && members.len() == n
        && !stripped
    {
        let mut out = BytesMut::new();
        let results = match route.route_multi_get_into(&reqs, &mut out) {
            Some(answer) => Some(answer.await),
            None => None,
        };
        if let Some(results) = results {
            for (i, res) in results.into_iter().enumerate() {
                if let Some((_, c)) = routes[i] {
                    c.gets.count(res);
                }
                if res.is_error() {
                    // one key's error makes that key a miss, as below
                    ctx.stats.errors.fetch_add(1, Relaxed);
                }
            }
            out.put_slice(END);
            return out.freeze();
        }
    }
    if !slow.is_empty() {
        let outs = join_all(
            slow.iter()
                .map(|(route, members)| route.route_multi_get(members.iter().map(|&i| &reqs[i]).collect())),
        )
        .await;
        for ((_, members), replies) in slow.iter().zip(outs) {
            for (&i, r) in members.iter().zip(replies) {
                parts[i] = Part::Routed(r);
            }
        }
    }
    let client_key = |i: usize| asked[i].as_deref().unwrap_or(&reqs[i].key);
    // sized once for every value (a client key with a routing prefix may still grow it)
    let size: usize = parts
        .iter()
        .map(|p| match p {
            Part::Batched(_, range) => range.len(),
            Part::Routed(reply) => reply.wire.len(),
            _ => 0,
        })
        .sum();
    let mut out = BytesMut::with_capacity(size + END.len());
    for (i, part) in parts.iter().enumerate() {
        if let Some((_, c)) = routes[i] {
            c.gets.count(match part {
                Part::Batched(..) => Res::Found,
                Part::Miss => Res::Miss,
                Part::Routed(reply) => reply.res,
                Part::Pending => Res::LocalError,
            });
        }
        match part {
            Part::Batched(b, range) => {
                append_value(&mut out, client_key(i), &reqs[i], &replies[*b].wire[range.clone()])
            }
            Part::Routed(reply) if reply.res.is_hit() => append_value(&mut out, client_key(i), &reqs[i], &reply.wire),
            Part::Routed(reply) if reply.res.is_error() => {
                // one key's error makes that key a miss, as mcrouter answers a multi-get
                ctx.stats.errors.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }
    out.put_slice(END);
    out.freeze()
}

/// The same handle (not merely an equal one).
fn same_route(a: &RouteRef, b: &RouteRef) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

async fn send_batch(batch: &Batch<'_>, gets: bool, reqs: &[Request]) -> Reply {
    let keys: Vec<&Bytes> = batch.members.iter().map(|&i| &reqs[i].key).collect();
    batch.dest.server.send_multi_get(gets, &keys, batch.dest.timeout).await
}

/// Hits and misses of a multi-get that one server answered whole (`n` keys, all of one route):
/// its VALUE blocks (counted by the server connection while framing them) are the hits.
fn count_values(values: u32, n: usize, pool: &crate::stats::HitCounters, route: Option<&Arc<RouteCounters>>) {
    let hits = u64::from(values);
    let misses = (n as u64).saturating_sub(hits);
    for c in [Some(pool), route.map(|r| &r.gets)].into_iter().flatten() {
        c.hits.fetch_add(hits, Relaxed);
        c.misses.fetch_add(misses, Relaxed);
    }
}

/// Hand the VALUE blocks of batch `batch`'s reply to the keys that asked (in order; absent = miss).
fn split_values(batch: usize, wire: &[u8], members: &[usize], reqs: &[Request], parts: &mut [Part]) {
    let mut pos = 0;
    let mut j = 0;
    while pos < wire.len() {
        let Some(nl) = wire[pos..].iter().position(|&b| b == b'\n') else {
            break;
        };
        let line = &wire[pos..pos + first_line_end(&wire[pos..])];
        let mut toks = line.split(|&b| b == b' ').filter(|t| !t.is_empty());
        let (Some(b"VALUE"), Some(key), Some(_flags), Some(len)) = (toks.next(), toks.next(), toks.next(), toks.next())
        else {
            break;
        };
        let Some(len) = parse_decimal(len) else {
            break;
        };
        let end = (pos + nl + 1 + len + 2).min(wire.len());
        while j < members.len() && reqs[members[j]].key[..] != key[..] {
            parts[members[j]] = Part::Miss;
            j += 1;
        }
        if j < members.len() {
            parts[members[j]] = Part::Batched(batch, pos..end);
            j += 1;
        }
        pos = end;
    }
    for &i in &members[j.min(members.len())..] {
        parts[i] = Part::Miss;
    }
}

/// Append a server's VALUE block, with the client's key if a routing prefix was stripped.
pub(super) fn append_value(out: &mut BytesMut, orig: &[u8], req: &Request, block: &[u8]) {
    if orig.len() == req.key.len() || !block.starts_with(b"VALUE ") {
        out.put_slice(block);
        return;
    }
    let after = 6 + req.key.len();
    if block.len() < after || block[6..after] != req.key[..] {
        out.put_slice(block);
        return;
    }
    out.put_slice(b"VALUE ");
    out.put_slice(orig);
    out.put_slice(&block[after..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_values_split_by_key_in_order() {
        let reqs: Vec<Request> = ["a", "b", "c"]
            .iter()
            .map(|k| Request::simple(Cmd::Get, Bytes::from_static(k.as_bytes())))
            .collect();
        let wire = b"VALUE a 0 1\r\nx\r\nVALUE c 5 2\r\nyz\r\n";
        let mut parts: Vec<Part> = (0..3).map(|_| Part::Pending).collect();
        split_values(0, wire, &[0, 1, 2], &reqs, &mut parts);
        assert!(matches!(&parts[0], Part::Batched(0, r) if &wire[r.clone()] == b"VALUE a 0 1\r\nx\r\n"));
        assert!(matches!(parts[1], Part::Miss));
        assert!(matches!(&parts[2], Part::Batched(0, r) if &wire[r.clone()] == b"VALUE c 5 2\r\nyz\r\n"));
        // keys with a CR or other control bytes (memcached takes them) are matched whole
        let reqs: Vec<Request> = [&b"a\rb"[..], b"\x01", b"c\r"]
            .iter()
            .map(|k| Request::simple(Cmd::Get, Bytes::copy_from_slice(k)))
            .collect();
        let wire = b"VALUE a\rb 0 1\r\nx\r\nVALUE c\r 0 1\r\ny\r\n";
        let mut parts: Vec<Part> = (0..3).map(|_| Part::Pending).collect();
        split_values(0, wire, &[0, 1, 2], &reqs, &mut parts);
        assert!(matches!(&parts[0], Part::Batched(0, r) if &wire[r.clone()] == b"VALUE a\rb 0 1\r\nx\r\n"));
        assert!(matches!(parts[1], Part::Miss));
        assert!(matches!(&parts[2], Part::Batched(0, r) if &wire[r.clone()] == b"VALUE c\r 0 1\r\ny\r\n"));
    }
}
