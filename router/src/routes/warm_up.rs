//! WarmUpRoute: brings a cold cluster up by reading through a warm one (paper section 4.3).
//!
//! Updates and deletes go to `cold` only. A get (classic or meta) that misses on `cold` is sent to
//! `warm`; on a hit the client gets warm's reply and the value is added to cold in the background
//! with the configured `exptime`. For a meta lease get (`mg … N`), cold answering with a won lease
//! (`W`, empty value) counts as a miss: if warm has the value, the client gets it (no fill needed
//! from the client) and the router fills cold; otherwise the client keeps cold's lease.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, get_i64, required};
use crate::Context;
use crate::config::Builder;
use crate::protocol::{Cmd, Reply, Request, Res};

pub struct WarmUp {
    pub cold: RouteRef,
    pub warm: RouteRef,
    pub exptime: i64,
    pub ctx: Option<Arc<Context>>,
}

fn is_lease_win(reply: &Reply) -> bool {
    reply.wire.starts_with(b"VA 0 ") && reply.meta_has_flag(b'W')
}

/// The meta get to send to warm: the client's, minus flags that would change warm's state.
fn warm_meta_get(req: &Request) -> Request {
    let mut r = req.clone();
    r.meta.retain(|t| !matches!(t.first(), Some(b'N' | b'E' | b'T' | b'R')));
    r
}

impl WarmUp {
    fn fill(&self, req: &Request, warm_reply: &Reply, lease: bool) {
        let cold = self.cold.clone();
        let warm = self.warm.clone();
        let ctx = self.ctx.clone();
        let exptime = self.exptime;
        let req = req.clone();
        let warm_reply = warm_reply.clone();
        tokio::spawn(async move {
            let add = if req.cmd.is_meta() {
                // Fetch value and client flags from warm, then add (or set over our lease) to cold.
                let mut get = Request::simple(Cmd::MetaGet, req.key.clone());
                get.meta = vec![Bytes::from_static(b"v"), Bytes::from_static(b"f")];
                if req.base64_key {
                    get.base64_key = true;
                    get.meta.push(Bytes::from_static(b"b"));
                }
                let got = warm.route(&get).await;
                let Some((flags, value)) = meta_value(&got) else {
                    return;
                };
                let mut ms = Request::simple(Cmd::MetaSet, req.key.clone());
                ms.value = value;
                ms.meta = vec![Bytes::from(format!("F{flags}")), Bytes::from(format!("T{exptime}"))];
                if !lease {
                    ms.meta.push(Bytes::from_static(b"ME"));
                }
                if req.base64_key {
                    ms.base64_key = true;
                    ms.meta.push(Bytes::from_static(b"b"));
                }
                ms
            } else {
                let Some((flags, value)) = warm_reply.value_parts() else {
                    return;
                };
                let mut add = Request::simple(Cmd::Add, req.key.clone());
                add.client_flags = flags;
                add.exptime = exptime;
                add.value = value;
                add
            };
            let r = cold.route(&add).await;
            if matches!(r.res, Res::Stored | Res::Ok | Res::Found)
                && let Some(ctx) = ctx
            {
                ctx.stats.warmup_fills.fetch_add(1, Relaxed);
            }
        });
    }
}

/// (client flags, value) of a `VA <len> … f<flags> …` reply.
fn meta_value(reply: &Reply) -> Option<(u32, Bytes)> {
    if !reply.wire.starts_with(b"VA ")
        || reply.meta_has_flag(b'W')
        || reply.meta_has_flag(b'Z')
        || reply.meta_has_flag(b'X')
    {
        return None;
    }
    let nl = reply.wire.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&reply.wire[..nl]).ok()?.trim_end();
    let mut it = line.split(' ');
    it.next();
    let len: usize = it.next()?.parse().ok()?;
    let flags = it
        .find_map(|t| t.strip_prefix('f'))
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    let start = nl + 1;
    (reply.wire.len() >= start + len).then(|| (flags, reply.wire.slice(start..start + len)))
}

impl Route for WarmUp {
    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        if !matches!(req.cmd, Cmd::Get | Cmd::Gets | Cmd::MetaGet) {
            return self.cold.route(req);
        }
        Box::pin(async move {
            let cold = self.cold.route(req).await;
            let lease = req.cmd == Cmd::MetaGet && is_lease_win(&cold);
            if cold.res.is_hit() && !lease {
                return cold;
            }
            if cold.res.is_error() && !cold.res.is_failover_error() {
                return cold;
            }
            let warm_req;
            let to_warm = if req.cmd == Cmd::MetaGet {
                warm_req = warm_meta_get(req);
                &warm_req
            } else {
                req
            };
            let warm = self.warm.route(to_warm).await;
            if warm.res.is_hit() && !(req.cmd == Cmd::MetaGet && (warm.meta_has_flag(b'W') || warm.meta_has_flag(b'Z')))
            {
                self.fill(req, &warm, lease);
                return warm;
            }
            cold
        })
    }
}

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let cold = b.route(required(obj, "cold", "WarmUpRoute")?)?;
    let warm = b.route(required(obj, "warm", "WarmUpRoute")?)?;
    let exptime = get_i64(obj, "exptime")?.unwrap_or(0);
    Ok(Arc::new(WarmUp {
        cold,
        warm,
        exptime,
        ctx: Some(b.ctx().clone()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::testing::*;

    #[test]
    fn miss_on_cold_reads_warm_and_fills() {
        let cold = Fake::new("cold", Res::Miss);
        let warm = Fake::new("warm", Res::Found);
        let r = WarmUp {
            cold: cold.clone(),
            warm: warm.clone(),
            exptime: 77,
            ctx: None,
        };
        run(async {
            let reply = r.route(&req(Cmd::Get, "k")).await;
            assert_eq!(reply.res, Res::Found);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        let fill = cold.last();
        assert_eq!(fill.cmd, Cmd::Add);
        assert_eq!(fill.exptime, 77);
        assert_eq!(fill.client_flags, 7);
        assert_eq!(&fill.value[..], b"wa");
    }

    #[test]
    fn writes_go_to_cold_only() {
        let cold = Fake::new("cold", Res::Stored);
        let warm = Fake::new("warm", Res::Stored);
        let r = WarmUp {
            cold: cold.clone(),
            warm: warm.clone(),
            exptime: 77,
            ctx: None,
        };
        run(r.route(&set_req("k", 0)));
        run(r.route(&req(Cmd::Delete, "k")));
        assert_eq!((cold.count(), warm.count()), (2, 0));
    }

    #[test]
    fn meta_value_parsing() {
        let r = Reply::new(Res::Found, Bytes::from_static(b"VA 3 f12 t-1\r\nabc\r\n"));
        assert_eq!(meta_value(&r), Some((12, Bytes::from_static(b"abc"))));
        let w = Reply::new(Res::Found, Bytes::from_static(b"VA 0 c6 t30 W\r\n\r\n"));
        assert!(is_lease_win(&w));
        assert_eq!(meta_value(&w), None);
    }
}
