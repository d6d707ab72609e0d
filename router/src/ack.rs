//! When the router acknowledges a delete: the one rule, in one place.
//!
//! A cache that misses a delete serves stale data, and squeal moves its datamarker past a delete
//! once the router has acknowledged it. So a delete is acknowledged (`DELETED`/`NOT_FOUND`,
//! `HD`/`NF`) only when every destination it was sent to either has it (the server answered) or has
//! it durably spooled (written and fsync'd; replayed before that server serves reads again, see
//! `spool` and `server`). Otherwise the client gets the error (`SERVER_ERROR …`) and retries.
//!
//! A destination's delete that failed with a failover-type error is spooled here (`spool_failed`);
//! its reply stays that error, marked `spooled`, so a failover route above still sends the delete
//! on to gutter (which may hold the key meanwhile). A delete that could not be spooled — no spool,
//! spool full, write or fsync failed — is *lost* for this rule, and any route that sent the delete
//! to several destinations answers with a lost reply if there is one. Routes do not decide this
//! themselves; they call one of:
//!
//! - `worst` (AllSyncRoute; L1L2CacheRoute and MigrateRoute for the deletes they send to both):
//!   the worst reply, a spooled delete ranking as the `NOT_FOUND` it will be (`severity`);
//! - `delete_answer` (AllFastestRoute, and `after_failover` for FailoverRoute,
//!   FailoverWithExptimeRoute, SaltedFailoverRoute): the first lost reply, else the first answered;
//! - `any_lost` (AllMajorityRoute, whose other requests follow the majority).
//!
//! At the end, `for_client` turns a spooled delete's error into the `NOT_FOUND` mcrouter answers
//! for it.
//!
//! The exceptions are the handles that do not wait for their children by design (AllAsyncRoute,
//! AllInitialRoute's other children): a delete they lose is counted and logged, never reported.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::context::Context;
use crate::protocol::{Reply, Request, Res};
use crate::server::Server;

/// Whether `reply` to a delete counts as delivered: the server answered (not an error), or the delete
/// is durably spooled.
pub fn delivered(reply: &Reply) -> bool {
    !reply.res.is_error() || reply.spooled
}

/// A delete that did not reach its destination and is not spooled either.
pub fn lost(req: &Request, reply: &Reply) -> bool {
    req.is_delete() && !delivered(reply)
}

/// A destination's delete failed with a failover-type error: spool it for `server` (of pool `pool`).
/// Spooled, the reply is marked so and the server is held out of the read path until the spool is
/// replayed to it (`Server::hold`); refused, the reply says why and stays an error.
pub async fn spool_failed(
    ctx: &Arc<Context>,
    server: &Arc<Server>,
    pool: &str,
    req: &Request,
    mut reply: Reply,
) -> Reply {
    let Some(spool) = ctx.spool.as_ref() else {
        return reply; // no spool: the error stands
    };
    match spool.append(&server.addr, pool, req).await {
        Ok(()) => {
            ctx.stats.spooled_deletes.fetch_add(1, Relaxed);
            // A delete that failed while the server was not TKO (a timeout, a lost connection), or
            // was spooled just after a replay ended: the server must not serve reads until it has
            // this delete.
            server.hold("a delete to it was spooled");
            reply.spooled = true;
            reply
        }
        Err(why) => {
            ctx.stats.spool_dropped.fetch_add(1, Relaxed);
            // keep the failover-type class: a failover route still sends the delete to gutter
            Reply::error(
                reply.res,
                &format!("delete not delivered to {} and not spooled: {why}", server.addr),
            )
        }
    }
}

/// AllSyncRoute's ranking: a spooled delete counts as the `NOT_FOUND` it will be answered with, so
/// any error that was not spooled (a refused replica) ranks worse than every spooled one.
pub fn severity(reply: &Reply) -> u8 {
    if reply.spooled {
        Res::NotFound.severity()
    } else {
        reply.res.severity()
    }
}

/// The reply with the highest severity (the first one among equals), every request alike
/// (AllSyncRoute's answer, mcrouter's order); for deletes a spooled one ranks as the `NOT_FOUND` it
/// is answered with, below any that was neither delivered nor spooled ([`severity`]). `None` for no
/// replies.
pub fn worst(replies: Vec<Reply>) -> Option<Reply> {
    let mut best: Option<Reply> = None;
    for r in replies {
        match &best {
            Some(b) if severity(b) >= severity(&r) => {}
            _ => best = Some(r),
        }
    }
    best
}

/// The answer to a delete sent to several destinations, from all their `replies`: every one must
/// have it or have it spooled, so a lost one is the answer; else the first that answered (not an
/// error), else the first (spooled) one.
pub fn delete_answer(mut replies: Vec<Reply>) -> Reply {
    debug_assert!(!replies.is_empty());
    let pick = replies
        .iter()
        .position(|r| !delivered(r))
        .or_else(|| replies.iter().position(|r| !r.res.is_error()))
        .unwrap_or(0);
    replies.swap_remove(pick)
}

/// A failover route's answer: `tried` are the replies of the children it tried, in order (each one
/// after the previous failed with a failover-type error; the last one is the first success or the
/// last failure). A delete went to every tried destination: [`delete_answer`]. Other requests get
/// the last reply.
pub fn after_failover(req: &Request, mut tried: Vec<Reply>) -> Reply {
    debug_assert!(!tried.is_empty());
    if req.is_delete() {
        return delete_answer(tried);
    }
    tried.pop().expect("a failover route tries at least one child")
}

/// For routes that may answer before every child has (AllMajorityRoute): the first lost reply of a
/// delete, which must be the answer.
pub fn any_lost<'r>(req: &Request, replies: impl IntoIterator<Item = &'r Reply>) -> Option<&'r Reply> {
    replies.into_iter().find(|r| lost(req, r))
}

/// The reply as the client sees it: a spooled delete is answered `NOT_FOUND` (`NF` for `md`), as
/// mcrouter answers it: the delete will be delivered.
pub fn for_client(req: &Request, reply: Reply) -> Reply {
    if !(reply.spooled && reply.res.is_error()) {
        return reply;
    }
    if req.cmd.is_meta() {
        Reply::new(Res::NotFound, req.meta_line("NF"))
    } else {
        Reply::line(Res::NotFound, "NOT_FOUND")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Cmd;
    use crate::testing::req;

    fn spooled(res: Res) -> Reply {
        let mut r = Reply::error(res, "down");
        r.spooled = true;
        r
    }

    #[test]
    fn a_delete_is_acknowledged_only_if_every_destination_has_it_or_spooled_it() {
        let del = req(Cmd::Delete, "k");
        let gutter_ok = Reply::line(Res::Deleted, "DELETED");
        // normal spooled, gutter answered: gutter's answer
        let r = after_failover(&del, vec![spooled(Res::Tko), gutter_ok.clone()]);
        assert_eq!(r.res, Res::Deleted);
        // normal refused by the spool: the refusal, whatever gutter said
        let refused = Reply::error(Res::Tko, "delete not delivered to x and not spooled: spool full");
        let r = after_failover(&del, vec![refused.clone(), gutter_ok.clone()]);
        assert!(r.res.is_error() && !r.spooled && r.wire.starts_with(b"SERVER_ERROR delete not delivered"));
        // both spooled: acknowledged (as NOT_FOUND)
        let r = after_failover(&del, vec![spooled(Res::Tko), spooled(Res::ConnectError)]);
        assert!(r.spooled && delivered(&r));
        assert_eq!(&for_client(&del, r).wire[..], b"NOT_FOUND\r\n");
        // normal spooled, gutter lost it: not acknowledged
        let r = after_failover(&del, vec![spooled(Res::Tko), Reply::error(Res::Timeout, "timeout")]);
        assert!(lost(&del, &r));
        // other requests: the last reply, as before
        let get = req(Cmd::Get, "k");
        let r = after_failover(&get, vec![Reply::error(Res::Tko, "down"), Reply::line(Res::Miss, "")]);
        assert_eq!(r.res, Res::Miss);
    }

    #[test]
    fn worst_and_delete_answer() {
        let ok = Reply::line(Res::Deleted, "DELETED");
        let miss = Reply::line(Res::NotFound, "NOT_FOUND");
        let lost_one = Reply::error(Res::Timeout, "timeout");
        assert!(worst(vec![]).is_none());
        assert!(worst(vec![ok.clone(), spooled(Res::Tko)]).unwrap().spooled);
        assert_eq!(
            worst(vec![spooled(Res::Tko), lost_one.clone()]).unwrap().res,
            Res::Timeout
        );
        // first among equals
        assert!(!worst(vec![miss.clone(), spooled(Res::Tko)]).unwrap().spooled);
        assert_eq!(
            delete_answer(vec![ok.clone(), spooled(Res::Tko), lost_one]).res,
            Res::Timeout
        );
        assert_eq!(delete_answer(vec![spooled(Res::Tko), miss]).res, Res::NotFound);
        let both = delete_answer(vec![spooled(Res::Tko), spooled(Res::ConnectError)]);
        assert_eq!((both.res, both.spooled), (Res::Tko, true));
    }

    #[test]
    fn spooled_ranks_below_every_unspooled_error() {
        for res in [
            Res::Busy,
            Res::Tko,
            Res::ConnectError,
            Res::Timeout,
            Res::RemoteError,
            Res::LocalError,
        ] {
            assert!(severity(&spooled(res)) < severity(&Reply::error(res, "x")), "{res:?}");
            assert!(severity(&spooled(Res::RemoteError)) < severity(&Reply::error(res, "x")));
        }
        assert_eq!(severity(&spooled(Res::Tko)), Res::NotFound.severity());
    }

    #[test]
    fn client_sees_not_found_for_a_spooled_delete() {
        let mut md = req(Cmd::MetaDelete, "k");
        md.meta = vec![bytes::Bytes::from_static(b"O9")];
        assert_eq!(&for_client(&md, spooled(Res::Tko)).wire[..], b"NF O9\r\n");
        let plain = Reply::error(Res::Tko, "down");
        assert_eq!(for_client(&md, plain.clone()).wire, plain.wire);
    }
}
