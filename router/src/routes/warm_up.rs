//! WarmUpRoute: brings a cold cluster up by reading through a warm one (paper section 4.3).
//!
//! Updates go to `cold` only. A get (classic or meta) that misses on `cold` is sent to `warm`; on
//! a hit the client gets warm's reply and the value is added to cold in the background with the
//! configured `exptime`. For a meta lease get (`mg … N`), cold answering with a won lease (`W`,
//! empty value) counts as a miss: if warm has the value, the client gets it (no fill needed from
//! the client) and the router fills cold; otherwise the client keeps cold's lease.
//!
//! Deletes leave a hold-off in cold (paper section 4.3, memcached having dropped
//! `delete K <time>`): a delete becomes `md K I T3`, which marks the item stale for 3 s instead of
//! removing it, so a warm-up `add` racing with the delete (warm may still hold the old value
//! until its own delete lands) fails instead of putting the old value back. A key absent from
//! cold gets a hold-off item made with `ms K 0 ME T3` then `md K I T3`. The client sees the usual
//! delete reply (`DELETED`/`NOT_FOUND`, or memcached's `HD`/`NF` for `md`).
//!
//! A stale item in cold is a miss: memcached 1.6.18 still answers a classic `get` with the stale
//! value (measured on this machine), so classic gets are sent to cold as `mg K v f [c]` and an
//! `X` (stale) reply goes on to warm; the add of warm's value then fails while the hold-off lasts.
//! A stale meta reply goes on to warm too, and its fill is always an add (never a set over the
//! stale item, even when cold handed out its `W` token).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_i64, required};
use crate::context::Context;
use crate::protocol::reply::first_line_end;
use crate::protocol::{Cmd, Reply, Request, Res};

pub struct WarmUp {
    pub cold: RouteRef,
    pub warm: RouteRef,
    pub exptime: i64,
    pub ctx: Option<Arc<Context>>,
}

/// Seconds a delete's hold-off lasts (memcached's clock ticks once a second: `T2` gave only
/// 1.07–1.76 s here, so `T3` is the shortest that guarantees 2 s).
pub const HOLD_OFF_SECS: u32 = 3;

/// An empty-valued lease cold handed out on a miss (not a stale item's recache token).
fn is_lease_win(reply: &Reply) -> bool {
    reply.wire.starts_with(b"VA 0 ") && reply.meta_has_flag(b'W') && !reply.meta_has_flag(b'X')
}

/// The meta get that stands in for a classic get on cold: value, client flags, cas for `gets`/`gats`,
/// the touch of a `gat`/`gats`. (An `mg` of a stale item takes its win token, as a classic get does
/// not: the price of seeing the hold-off, docs/router.md "WarmUpRoute".)
fn cold_meta_get(req: &Request) -> Request {
    let mut mg = Request::simple(Cmd::MetaGet, req.key.clone());
    mg.meta = vec![Bytes::from_static(b"v"), Bytes::from_static(b"f")];
    if matches!(req.cmd, Cmd::Gets | Cmd::Gats) {
        mg.meta.push(Bytes::from_static(b"c"));
    }
    if matches!(req.cmd, Cmd::Gat | Cmd::Gats) {
        mg.meta.push(Bytes::from(format!("T{}", req.exptime)));
    }
    mg
}

/// Cold's `mg` reply as the classic `VALUE` block (or a classic miss); errors pass through.
fn classic_reply(req: &Request, cold: Reply) -> Reply {
    if !cold.res.is_hit() {
        if cold.res.is_error() {
            return cold;
        }
        return Reply::new(Res::Miss, Bytes::new());
    }
    let Some((flags, value)) = meta_value(&cold) else {
        return Reply::new(Res::Miss, Bytes::new());
    };
    let mut out = BytesMut::with_capacity(req.key.len() + value.len() + 48);
    out.put_slice(b"VALUE ");
    out.put_slice(&req.key);
    out.put_slice(format!(" {flags} {}", value.len()).as_bytes());
    if matches!(req.cmd, Cmd::Gets | Cmd::Gats) {
        let cas = meta_token(&cold, b'c').unwrap_or(0);
        out.put_slice(format!(" {cas}").as_bytes());
    }
    out.put_slice(b"\r\n");
    out.put_slice(&value);
    out.put_slice(b"\r\n");
    Reply::new(Res::Found, out.freeze())
}

/// The numeric value of flag `flag` in a meta reply line (e.g. `c` in `VA 2 f5 c9`).
fn meta_token(reply: &Reply, flag: u8) -> Option<u64> {
    reply.wire[..first_line_end(&reply.wire)]
        .split(|&b| b == b' ')
        .skip(1)
        .find(|t| t.first() == Some(&flag))
        .and_then(|t| std::str::from_utf8(&t[1..]).ok()?.parse().ok())
}

/// The `md` that deletes by leaving a hold-off: the client's flags (for `md`), plus `I`, and a
/// `T` of `HOLD_OFF_SECS` unless the client asked for an invalidation with its own TTL.
fn hold_off_delete(req: &Request) -> Request {
    let mut md = Request::simple(Cmd::MetaDelete, req.key.clone());
    if req.cmd == Cmd::MetaDelete {
        md.meta = req.meta.clone();
        md.base64_key = req.base64_key;
    }
    if !md.meta.iter().any(|t| &t[..] == b"I") {
        // without I, a T means nothing to memcached: ours replaces it
        md.meta.retain(|t| t.first() != Some(&b'T'));
        md.meta.push(Bytes::from_static(b"I"));
    }
    if md.meta_flag(b'T').is_none() {
        md.meta.push(Bytes::from(format!("T{HOLD_OFF_SECS}")));
    }
    md
}

/// `ms K 0 ME T3` and `md K I T3`: the hold-off for a key cold does not have.
fn absent_hold_off(req: &Request) -> (Request, Request) {
    let mut ms = Request::simple(Cmd::MetaSet, req.key.clone());
    ms.meta = vec![Bytes::from_static(b"ME"), Bytes::from(format!("T{HOLD_OFF_SECS}"))];
    let mut md = Request::simple(Cmd::MetaDelete, req.key.clone());
    md.meta = vec![Bytes::from_static(b"I"), Bytes::from(format!("T{HOLD_OFF_SECS}"))];
    if req.cmd == Cmd::MetaDelete && req.base64_key {
        for r in [&mut ms, &mut md] {
            r.base64_key = true;
            r.meta.push(Bytes::from_static(b"b"));
        }
    }
    (ms, md)
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
                if req.base64_key {
                    ms.base64_key = true;
                    ms.meta.push(Bytes::from_static(b"b"));
                }
                if lease {
                    // Set over our lease only while it is still the item cold holds: its cas
                    // now, and `C` on the set, so a delete in between (`md I` bumps the cas and
                    // marks it stale) makes the set fail instead of undoing the delete.
                    let mut probe = Request::simple(Cmd::MetaGet, req.key.clone());
                    probe.meta = vec![Bytes::from_static(b"c")];
                    if req.base64_key {
                        probe.base64_key = true;
                        probe.meta.push(Bytes::from_static(b"b"));
                    }
                    let now = cold.route(&probe).await;
                    if !now.res.is_hit() || now.meta_has_flag(b'X') {
                        return;
                    }
                    let Some(cas) = meta_token(&now, b'c') else {
                        return;
                    };
                    ms.meta.push(Bytes::from(format!("C{cas}")));
                } else {
                    ms.meta.push(Bytes::from_static(b"ME"));
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

impl WarmUp {
    async fn delete(&self, req: &Request) -> Reply {
        let md = hold_off_delete(req);
        let reply = self.cold.route(&md).await;
        if reply.res == Res::NotFound && !reply.spooled {
            // absent: make the hold-off item; a fill that slipped in between is marked stale too
            let (ms, md) = absent_hold_off(req);
            self.cold.route(&ms).await;
            self.cold.route(&md).await;
        }
        if req.cmd == Cmd::MetaDelete || reply.res.is_error() {
            return reply;
        }
        match reply.res {
            Res::NotFound => Reply::line(Res::NotFound, "NOT_FOUND"),
            Res::Exists => Reply::line(Res::Exists, "EXISTS"),
            _ => Reply::line(Res::Deleted, "DELETED"),
        }
    }

    async fn get(&self, req: &Request) -> Reply {
        let meta = req.cmd == Cmd::MetaGet;
        let cold = if meta {
            self.cold.route(req).await
        } else {
            let mg = cold_meta_get(req);
            self.cold.route(&mg).await
        };
        let stale = cold.res.is_hit() && cold.meta_has_flag(b'X');
        let lease = meta && is_lease_win(&cold);
        let cold_answer = |cold: Reply| if meta { cold } else { classic_reply(req, cold) };
        if cold.res.is_hit() && !lease && !stale {
            return cold_answer(cold);
        }
        if cold.res.is_error() && !cold.res.is_failover_error() {
            return cold_answer(cold);
        }
        let warm_req;
        let to_warm = if meta {
            warm_req = warm_meta_get(req);
            &warm_req
        } else {
            req
        };
        let warm = self.warm.route(to_warm).await;
        if warm.res.is_hit() && !(meta && (warm.meta_has_flag(b'W') || warm.meta_has_flag(b'Z'))) {
            self.fill(req, &warm, lease);
            return warm;
        }
        if stale && !meta {
            return Reply::new(Res::Miss, Bytes::new());
        }
        cold_answer(cold)
    }
}

impl Route for WarmUp {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.cold, req);
        if req.is_get() {
            visit(&self.warm, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        match req.cmd {
            Cmd::Get | Cmd::Gets | Cmd::Gat | Cmd::Gats | Cmd::MetaGet => Box::pin(self.get(req)),
            Cmd::Delete | Cmd::MetaDelete => Box::pin(self.delete(req)),
            _ => self.cold.route(req),
        }
    }
}

pub const WARM_UP_ROUTE: Handle = Handle {
    name: "WarmUpRoute",
    build,
    shorthand: None,
    fields: &["cold", "warm", "exptime"],
};

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
    use std::collections::HashMap;
    use std::sync::Mutex;

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

    /// A tiny memcached model with stale items (`md I`), enough for the hold-off: mg (v f c, X/W),
    /// md (I, T), ms (ME, C), add, classic get (which, like memcached, serves stale items).
    #[derive(Default)]
    struct Mem {
        items: Mutex<HashMap<Bytes, Item>>,
        seen: Mutex<Vec<String>>,
    }

    #[derive(Clone)]
    struct Item {
        value: Bytes,
        flags: u32,
        cas: u64,
        stale: bool,
    }

    impl Mem {
        fn put(&self, key: &str, value: &str) {
            self.items.lock().unwrap().insert(
                Bytes::copy_from_slice(key.as_bytes()),
                Item {
                    value: Bytes::copy_from_slice(value.as_bytes()),
                    flags: 5,
                    cas: 1,
                    stale: false,
                },
            );
        }
        fn get(&self, key: &str) -> Option<Item> {
            self.items.lock().unwrap().get(key.as_bytes()).cloned()
        }
        fn seen(&self) -> Vec<String> {
            self.seen.lock().unwrap().clone()
        }
    }

    impl Route for Mem {
        fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
            let mut wire = BytesMut::new();
            req.encode(&mut wire);
            let line = String::from_utf8_lossy(&wire);
            self.seen.lock().unwrap().push(line.lines().next().unwrap().to_string());
            let mut items = self.items.lock().unwrap();
            let has = |f: &[u8]| req.meta.iter().any(|t| &t[..] == f);
            let reply = match req.cmd {
                Cmd::Get | Cmd::Gets => match items.get(&req.key) {
                    Some(it) => {
                        let head = format!(
                            "VALUE {} {} {}\r\n",
                            String::from_utf8_lossy(&req.key),
                            it.flags,
                            it.value.len()
                        );
                        let mut b = BytesMut::from(head.as_bytes());
                        b.put_slice(&it.value);
                        b.put_slice(b"\r\n");
                        Reply::new(Res::Found, b.freeze())
                    }
                    None => Reply::new(Res::Miss, Bytes::new()),
                },
                Cmd::MetaGet => match items.get(&req.key) {
                    Some(it) => {
                        let mut head = format!("VA {} f{} c{}", it.value.len(), it.flags, it.cas);
                        if it.stale {
                            head.push_str(" X W");
                        }
                        let mut b = BytesMut::from(head.as_bytes());
                        b.put_slice(b"\r\n");
                        b.put_slice(&it.value);
                        b.put_slice(b"\r\n");
                        Reply::new(Res::Found, b.freeze())
                    }
                    None => Reply::line(Res::Miss, "EN"),
                },
                Cmd::MetaDelete => match items.get_mut(&req.key) {
                    Some(it) if has(b"I") => {
                        it.stale = true;
                        it.cas += 1;
                        Reply::line(Res::Ok, "HD")
                    }
                    Some(_) => {
                        items.remove(&req.key);
                        Reply::line(Res::Ok, "HD")
                    }
                    None => Reply::line(Res::NotFound, "NF"),
                },
                Cmd::MetaSet | Cmd::Add => {
                    let add = req.cmd == Cmd::Add || has(b"ME");
                    let cas: Option<u64> = req
                        .meta_flag(b'C')
                        .map(|c| std::str::from_utf8(c).unwrap().parse().unwrap());
                    let ok = match items.get(&req.key) {
                        Some(it) => !add && cas.is_none_or(|c| c == it.cas),
                        None => cas.is_none(),
                    };
                    if ok {
                        let flags = req
                            .meta_flag(b'F')
                            .map_or(req.client_flags, |f| std::str::from_utf8(f).unwrap().parse().unwrap());
                        let item = Item {
                            value: req.value.clone(),
                            flags,
                            cas: 10,
                            stale: false,
                        };
                        items.insert(req.key.clone(), item);
                        Reply::line(Res::Stored, "HD")
                    } else {
                        Reply::line(Res::NotStored, "NS")
                    }
                }
                _ => Reply::line(Res::Stored, "STORED"),
            };
            Box::pin(async move { reply })
        }
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn pair() -> (Arc<Mem>, Arc<Mem>, WarmUp) {
        let (cold, warm) = (Arc::new(Mem::default()), Arc::new(Mem::default()));
        let r = WarmUp {
            cold: cold.clone(),
            warm: warm.clone(),
            exptime: 60,
            ctx: None,
        };
        (cold, warm, r)
    }

    #[test]
    fn delete_leaves_a_hold_off_that_a_late_warm_copy_cannot_undo() {
        let (cold, warm, r) = pair();
        cold.put("k", "v1");
        warm.put("k", "v1");
        run(async {
            let del = r.route(&req(Cmd::Delete, "k")).await;
            assert_eq!(&del.wire[..], b"DELETED\r\n");
            assert_eq!(cold.seen(), vec!["md k I T3"]);
            assert!(cold.get("k").unwrap().stale);
            // warm's delete is late: the get is served from warm, but the fill cannot land
            let got = r.route(&req(Cmd::Get, "k")).await;
            assert_eq!(&got.wire[..], b"VALUE k 5 2\r\nv1\r\n");
            settle().await;
            assert!(cold.get("k").unwrap().stale, "the add must not replace the hold-off");
            assert_eq!(cold.seen().last().unwrap(), "add k 5 60 2");
            // once warm is deleted too, the stale item in cold is a miss
            warm.items.lock().unwrap().clear();
            let got = r.route(&req(Cmd::Get, "k")).await;
            assert_eq!(got.res, Res::Miss);
            assert!(got.wire.is_empty());
        });
    }

    #[test]
    fn delete_of_an_absent_key_creates_the_hold_off() {
        let (cold, warm, r) = pair();
        warm.put("k", "v1");
        run(async {
            let del = r.route(&req(Cmd::Delete, "k")).await;
            assert_eq!(&del.wire[..], b"NOT_FOUND\r\n");
            assert_eq!(cold.seen(), vec!["md k I T3", "ms k 0 ME T3", "md k I T3"]);
            let it = cold.get("k").unwrap();
            assert!(it.stale && it.value.is_empty());
            let got = r.route(&req(Cmd::Gets, "k")).await;
            assert!(got.wire.starts_with(b"VALUE k 5 2"), "served from warm");
            settle().await;
            assert!(cold.get("k").unwrap().stale);
        });
    }

    #[test]
    fn meta_delete_keeps_client_flags_and_reply() {
        let (cold, _warm, r) = pair();
        cold.put("k", "v1");
        let mut md = req(Cmd::MetaDelete, "k");
        md.meta = vec![Bytes::from_static(b"O7"), Bytes::from_static(b"T1")];
        md.quiet = true;
        let reply = run(r.route(&md));
        assert_eq!(&reply.wire[..], b"HD\r\n");
        assert_eq!(cold.seen(), vec!["md k O7 I T3"]);
        let mut md = req(Cmd::MetaDelete, "k");
        md.meta = vec![Bytes::from_static(b"I"), Bytes::from_static(b"T30")];
        run(r.route(&md));
        assert_eq!(cold.seen().last().unwrap(), "md k I T30");
        let mut md = req(Cmd::MetaDelete, "gone");
        md.meta = vec![Bytes::from_static(b"O8")];
        let reply = run(r.route(&md));
        assert_eq!(reply.res, Res::NotFound);
        assert_eq!(cold.seen()[2..], ["md gone O8 I T3", "ms gone 0 ME T3", "md gone I T3"]);
    }

    #[test]
    fn classic_get_hits_cold_through_meta_get() {
        let (cold, warm, r) = pair();
        cold.put("k", "v1");
        let got = run(r.route(&req(Cmd::Gets, "k")));
        assert_eq!(&got.wire[..], b"VALUE k 5 2 1\r\nv1\r\n");
        assert_eq!(cold.seen(), vec!["mg k v f c"]);
        assert!(warm.seen().is_empty());
    }

    #[test]
    fn stale_meta_get_goes_to_warm_and_fills_with_an_add_only() {
        let (cold, warm, r) = pair();
        cold.put("k", "old");
        cold.items.lock().unwrap().get_mut(&b"k"[..]).unwrap().stale = true;
        warm.put("k", "v1");
        let mut mg = req(Cmd::MetaGet, "k");
        mg.meta = vec![Bytes::from_static(b"v"), Bytes::from_static(b"N30")];
        run(async {
            let got = r.route(&mg).await;
            assert!(got.wire.ends_with(b"v1\r\n"), "{:?}", got.wire);
            settle().await;
        });
        assert!(cold.seen().last().unwrap().contains(" ME"), "{:?}", cold.seen());
        assert!(cold.get("k").unwrap().stale);
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
