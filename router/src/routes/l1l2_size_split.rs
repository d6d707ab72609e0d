//! L1L2SizeSplitRoute: small values live in `l1`, large ones in `l2` with a small sentinel in
//! `l1` (mcrouter's, for an l1 of fast small servers in front of an l2 with room for big values).
//!
//! A `set` whose value is at least `threshold` bytes (and whose exptime is at least
//! `ttl_threshold`, when that is given; and whose key leaves room for a suffix) is stored in
//! `l2` first, then an empty sentinel with client flag 0x20 (mcrouter's `MC_MSG_FLAG_SIZE_SPLIT`)
//! in `l1`; with `both_full_set` the full value goes to `l1` and, once stored, in the background
//! to `l2`. A `get`/`gets` asks `l1`; a hit carrying the flag is fetched from `l2` (the same key,
//! or `key|==|<sentinel value>` for a sentinel with a value) and answered with l2's value and
//! flags (and l1's cas for `gets`). If l2 misses, the stale sentinel is removed (a `gets` then
//! `cas` with exptime -1, so a newer l1 value is never touched) and `gets` tries again up to
//! `retries` times (default 1, at most 10); `get` answers `SERVER_ERROR` as mcrouter's local error.
//! Everything else — deletes, other updates, meta commands — goes to `l1` only, as in mcrouter:
//! a delete removes the sentinel, which makes the l2 copy unreachable. `failure_ttl` is checked
//! but only mcrouter's lease-set reads it; the text protocol has none.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_i64, required};
use crate::protocol::{Cmd, Reply, Request, Res};

/// mcrouter's `MC_MSG_FLAG_SIZE_SPLIT`: the client flag that marks an l1 sentinel.
pub const SIZE_SPLIT_FLAG: u32 = 0x20;
/// mcrouter's key suffix for values stored in l2 under a sentinel's number.
const HASH_ALIAS: &[u8] = b"|==|";
/// The longest key mcrouter lets the split add a suffix to: 255 less `|==|` and 20 digits.
const MAX_SPLIT_KEY: usize = 255 - 4 - 20;
const MAX_RETRIES: i64 = 10;

pub struct L1L2SizeSplitRoute {
    pub l1: RouteRef,
    pub l2: RouteRef,
    pub threshold: usize,
    pub ttl_threshold: i64,
    pub both_full_set: bool,
    pub retries: u32,
}

/// A classic get reply's `(flags, data, cas)`.
fn value_of(reply: &Reply) -> Option<(u32, Bytes, Option<u64>)> {
    let (flags, data) = reply.value_parts()?;
    let line_end = crate::protocol::reply::first_line_end(&reply.wire);
    let cas = std::str::from_utf8(&reply.wire[..line_end])
        .ok()?
        .split(' ')
        .nth(4)
        .and_then(|c| c.parse().ok());
    Some((flags, data, cas))
}

/// The `VALUE` block a client asking for `key` gets.
fn value_reply(key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) -> Reply {
    let mut out = BytesMut::with_capacity(key.len() + data.len() + 48);
    out.put_slice(b"VALUE ");
    out.put_slice(key);
    out.put_slice(format!(" {flags} {}", data.len()).as_bytes());
    if let Some(cas) = cas {
        out.put_slice(format!(" {cas}").as_bytes());
    }
    out.put_slice(b"\r\n");
    out.put_slice(data);
    out.put_slice(b"\r\n");
    Reply::new(Res::Found, out.freeze())
}

impl L1L2SizeSplitRoute {
    fn set_goes_to_l1(&self, req: &Request) -> bool {
        self.threshold == 0
            || req.value.len() < self.threshold
            || (self.ttl_threshold != 0 && req.exptime < self.ttl_threshold)
            || req.key.len() > MAX_SPLIT_KEY
    }

    async fn set(&self, req: &Request) -> Reply {
        if self.both_full_set {
            let reply = self.l1.route(req).await;
            if reply.res == Res::Stored {
                super::all_async::spawn_to(&self.l2, req);
            }
            return reply;
        }
        // l2 first, so no reader finds a sentinel before the value it stands for
        let reply = self.l2.route(req).await;
        if reply.res != Res::Stored {
            return reply;
        }
        let mut sentinel = req.clone();
        sentinel.value = Bytes::new();
        sentinel.client_flags |= SIZE_SPLIT_FLAG;
        self.l1.route(&sentinel).await
    }

    /// The l2 request for an l1 sentinel holding `sentinel`.
    fn l2_get(req: &Request, sentinel: &[u8]) -> Request {
        if sentinel.is_empty() {
            return Request::simple(Cmd::Get, req.key.clone());
        }
        Request::simple(Cmd::Get, Bytes::from([&req.key[..], HASH_ALIAS, sentinel].concat()))
    }

    /// Removes l1's sentinel if it still holds `sentinel` (a newer value is left alone).
    async fn delete_sentinel(&self, req: &Request, sentinel: &Bytes) {
        let l1 = self.l1.route(&Request::simple(Cmd::Gets, req.key.clone())).await;
        if let Some((_, data, Some(cas))) = value_of(&l1)
            && data == sentinel
        {
            let mut expire = Request::simple(Cmd::Cas, req.key.clone());
            expire.cas = cas;
            expire.exptime = -1;
            self.l1.route(&expire).await;
        }
    }

    async fn get(&self, req: &Request) -> Reply {
        let mut retries_left = if req.cmd == Cmd::Gets { self.retries } else { 0 };
        loop {
            let l1 = self.l1.route(req).await;
            let Some((_, sentinel, cas)) = value_of(&l1).filter(|(f, _, _)| f & SIZE_SPLIT_FLAG != 0) else {
                return l1;
            };
            if sentinel.is_empty() && req.cmd == Cmd::Get {
                // mcrouter: a plain set's sentinel; l2 has the value under the same key
                return self.l2.route(req).await;
            }
            let l2 = self.l2.route(&Self::l2_get(req, &sentinel)).await;
            if let Some((l2_flags, data, _)) = value_of(&l2) {
                return value_reply(&req.key, l2_flags, &data, cas.filter(|_| req.cmd == Cmd::Gets));
            }
            if l2.res.is_error() {
                if l2.res.is_failover_error() {
                    self.delete_sentinel(req, &sentinel).await;
                }
                return l2;
            }
            self.delete_sentinel(req, &sentinel).await;
            if retries_left == 0 {
                return Reply::error(Res::LocalError, "L1L2SizeSplitRoute: value missing from l2");
            }
            retries_left -= 1;
        }
    }
}

impl Route for L1L2SizeSplitRoute {
    fn route_name(&self) -> String {
        "l1l2-sizesplit".into()
    }

    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.l1, req);
        if matches!(req.cmd, Cmd::Get | Cmd::Gets | Cmd::Set) {
            visit(&self.l2, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            match req.cmd {
                Cmd::Get | Cmd::Gets if req.recording.is_none() => self.get(req).await,
                Cmd::Set if !req.too_large && !self.set_goes_to_l1(req) => self.set(req).await,
                _ => self.l1.route(req).await,
            }
        })
    }
}

fn non_negative(obj: &Map<String, Value>, field: &str) -> Result<Option<i64>, String> {
    match get_i64(obj, field).map_err(|e| format!("L1L2SizeSplitRoute: {e}"))? {
        Some(n) if n < 0 => Err(format!("L1L2SizeSplitRoute: `{field}` must be nonnegative")),
        n => Ok(n),
    }
}

pub const L1L2_SIZE_SPLIT_ROUTE: Handle = Handle {
    name: "L1L2SizeSplitRoute",
    build,
    shorthand: None,
    fields: &[
        "l1",
        "l2",
        "threshold",
        "ttl_threshold",
        "failure_ttl",
        "both_full_set",
        "retries",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    const HANDLE: &str = "L1L2SizeSplitRoute";
    let threshold = non_negative(obj, "threshold")?.ok_or_else(|| format!("{HANDLE}: no threshold"))?;
    let ttl_threshold = non_negative(obj, "ttl_threshold")?.unwrap_or(0);
    if non_negative(obj, "failure_ttl")? == Some(0) {
        return Err(format!("{HANDLE}: `failure_ttl` must not be zero"));
    }
    let both_full_set = match obj.get("both_full_set") {
        None => false,
        Some(Value::Bool(v)) => *v,
        Some(other) => return Err(format!("{HANDLE}: `both_full_set` must be true or false, not {other}")),
    };
    let retries = match get_i64(obj, "retries")? {
        None => 1,
        Some(n) if (1..=MAX_RETRIES).contains(&n) => n as u32,
        Some(n) => return Err(format!("{HANDLE}: `retries` must be from 1 to {MAX_RETRIES}, not {n}")),
    };
    let l1 = b.route(required(obj, "l1", HANDLE)?).map_err(|e| format!("l1: {e}"))?;
    let l2 = b.route(required(obj, "l2", HANDLE)?).map_err(|e| format!("l2: {e}"))?;
    Ok(Arc::new(L1L2SizeSplitRoute {
        l1,
        l2,
        threshold: threshold as usize,
        ttl_threshold,
        both_full_set,
        retries,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A memcached in a map: set/get/gets/cas/delete with flags and cas, enough for the split.
    struct Cache {
        items: Mutex<HashMap<Vec<u8>, (u32, Bytes, u64)>>,
        seen: Mutex<Vec<(Cmd, Vec<u8>)>>,
    }

    impl Cache {
        fn new() -> Arc<Cache> {
            Arc::new(Cache {
                items: Mutex::new(HashMap::new()),
                seen: Mutex::new(Vec::new()),
            })
        }
        fn get(&self, key: &str) -> Option<(u32, Bytes)> {
            self.items
                .lock()
                .unwrap()
                .get(key.as_bytes())
                .map(|(f, d, _)| (*f, d.clone()))
        }
        fn sets(&self) -> usize {
            self.seen.lock().unwrap().iter().filter(|(c, _)| *c == Cmd::Set).count()
        }
    }

    impl Route for Cache {
        fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
            Box::pin(async move {
                self.seen.lock().unwrap().push((req.cmd, req.key.to_vec()));
                let mut items = self.items.lock().unwrap();
                let key = req.key.to_vec();
                match req.cmd {
                    Cmd::Set => {
                        let cas = items.len() as u64 + 100;
                        items.insert(key, (req.client_flags, req.value.clone(), cas));
                        Reply::line(Res::Stored, "STORED")
                    }
                    Cmd::Cas => match items.get(&key) {
                        Some((_, _, cas)) if *cas == req.cas => {
                            if req.exptime < 0 {
                                items.remove(&key);
                            }
                            Reply::line(Res::Stored, "STORED")
                        }
                        _ => Reply::line(Res::Exists, "EXISTS"),
                    },
                    Cmd::Delete => match items.remove(&key) {
                        Some(_) => Reply::line(Res::Deleted, "DELETED"),
                        None => Reply::line(Res::NotFound, "NOT_FOUND"),
                    },
                    Cmd::Get | Cmd::Gets => match items.get(&key) {
                        Some((f, d, cas)) => value_reply(&req.key, *f, d, (req.cmd == Cmd::Gets).then_some(*cas)),
                        None => Reply::new(Res::Miss, Bytes::new()),
                    },
                    _ => Reply::line(Res::NotFound, "NOT_FOUND"),
                }
            })
        }
    }

    fn split(l1: &Arc<Cache>, l2: &Arc<Cache>, both: bool) -> L1L2SizeSplitRoute {
        L1L2SizeSplitRoute {
            l1: l1.clone(),
            l2: l2.clone(),
            threshold: 8,
            ttl_threshold: 0,
            both_full_set: both,
            retries: 1,
        }
    }

    fn set(key: &str, value: &str, flags: u32) -> Request {
        let mut r = crate::routes::testing::set_req(key, 0);
        r.value = Bytes::copy_from_slice(value.as_bytes());
        r.client_flags = flags;
        r
    }

    fn get(cmd: Cmd, key: &str) -> Request {
        crate::routes::testing::req(cmd, key)
    }

    #[test]
    fn values_at_the_threshold_go_to_l2_with_a_sentinel_in_l1() {
        let (l1, l2) = (Cache::new(), Cache::new());
        let r = split(&l1, &l2, false);
        crate::routes::testing::run(async {
            assert_eq!(r.route(&set("small", "1234567", 3)).await.res, Res::Stored);
            assert_eq!(r.route(&set("big", "12345678", 3)).await.res, Res::Stored);
            assert_eq!(l1.get("small"), Some((3, Bytes::from("1234567"))));
            assert_eq!(l2.get("small"), None);
            assert_eq!(l2.get("big"), Some((3, Bytes::from("12345678"))));
            assert_eq!(l1.get("big"), Some((3 | SIZE_SPLIT_FLAG, Bytes::new())));
            // reads see the value, with its own flags, wherever it lives
            let got = r.route(&get(Cmd::Get, "big")).await;
            assert_eq!(&got.wire[..], b"VALUE big 3 8\r\n12345678\r\n");
            let got = r.route(&get(Cmd::Get, "small")).await;
            assert_eq!(&got.wire[..], b"VALUE small 3 7\r\n1234567\r\n");
            // a delete goes to l1: the sentinel goes, and the big value cannot be read any more
            assert_eq!(r.route(&get(Cmd::Delete, "big")).await.res, Res::Deleted);
            assert_eq!(r.route(&get(Cmd::Get, "big")).await.res, Res::Miss);
            assert!(l2.seen.lock().unwrap().iter().all(|(c, _)| *c != Cmd::Delete));
        });
    }

    #[test]
    fn ttl_threshold_and_both_full_set() {
        let (l1, l2) = (Cache::new(), Cache::new());
        let mut r = split(&l1, &l2, false);
        r.ttl_threshold = 60;
        crate::routes::testing::run(async {
            let mut short = set("short", "123456789", 0);
            short.exptime = 30;
            r.route(&short).await;
            assert_eq!(l1.get("short"), Some((0, Bytes::from("123456789"))));
            assert_eq!(l2.sets(), 0);
        });
        let (l1, l2) = (Cache::new(), Cache::new());
        let r = split(&l1, &l2, true);
        crate::routes::testing::run(async {
            r.route(&set("big", "123456789", 1)).await;
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(l1.get("big"), Some((1, Bytes::from("123456789"))));
        assert_eq!(l2.get("big"), Some((1, Bytes::from("123456789"))));
    }

    #[test]
    fn a_sentinel_whose_value_is_gone_is_removed_and_gets_retries() {
        let (l1, l2) = (Cache::new(), Cache::new());
        let r = split(&l1, &l2, false);
        crate::routes::testing::run(async {
            // a sentinel pointing at an l2 key that was evicted
            l1.route(&set("k", "", SIZE_SPLIT_FLAG)).await;
            let mut with_value = set("j", "777", SIZE_SPLIT_FLAG);
            with_value.value = Bytes::from("777");
            l1.route(&with_value).await;
            l2.route(&set("j|==|777", "from-l2", 9)).await;
            let got = r.route(&get(Cmd::Gets, "j")).await;
            assert!(got.wire.starts_with(b"VALUE j 9 7 "), "{:?}", got.wire);
            // gets: the stale sentinel is removed, then the retry finds l1 empty: a miss
            let got = r.route(&get(Cmd::Gets, "k")).await;
            assert_eq!(got.res, Res::Miss);
            assert_eq!(l1.get("k"), None);
            l1.route(&with_value).await;
            l2.route(&get(Cmd::Delete, "j|==|777")).await;
            // get: no retry, mcrouter's local error
            let got = r.route(&get(Cmd::Get, "j")).await;
            assert_eq!(got.res, Res::LocalError);
            assert_eq!(l1.get("j"), None);
        });
    }
}
