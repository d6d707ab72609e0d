//! McBucketRoute: bucket-based placement (mcrouter's, for pools whose servers change often):
//! each key is put in one of `total_buckets` buckets by Ch3, and a bucketized pool below places
//! the *bucket* on a server instead of the key, so a server change moves whole buckets and a
//! bucket's keys stay together. `total_buckets_by_prefix` (`{"prefix": n}`) keeps the keys of a
//! prefix in `n` buckets only: bucket = Ch3(prefix + Ch3(key, n), total_buckets).
//!
//! mcrouter builds it only around a PoolRoute with `"bucketize": true` (and the same fields);
//! that is how it is built here too, and `McBucketRoute` with a `target` is also accepted. The
//! bucket travels with the request (`Request::bucket`); a pool below that has
//! `useBucketHashSelector` (or is bucketized itself) hashes its decimal form. A bucketized pool
//! with no McBucketRoute above answers with mcrouter's error. `bucketization_keyspace` names the
//! bucket space (shown in `route_handles`).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_str, required};
use crate::hash::{HashFunc, furc_hash};
use crate::protocol::{Reply, Request, Res};

/// Ch3's largest pool (2^23): more buckets cannot be hashed to.
const MAX_BUCKETS: i64 = 1 << 23;

pub struct McBucketRoute {
    pub target: RouteRef,
    pub total_buckets: u32,
    /// `total_buckets_by_prefix`, longest prefix first.
    pub by_prefix: Vec<(Vec<u8>, u32)>,
    pub keyspace: String,
}

impl McBucketRoute {
    pub fn bucket(&self, key: &[u8]) -> u64 {
        if let Some((prefix, n)) = self.by_prefix.iter().find(|(p, _)| key.starts_with(p)) {
            let mut k = prefix.clone();
            k.extend_from_slice(furc_hash(key, *n).to_string().as_bytes());
            return u64::from(furc_hash(&k, self.total_buckets));
        }
        u64::from(furc_hash(key, self.total_buckets))
    }

    fn stamped(&self, req: &Request) -> Request {
        let mut r = req.clone();
        r.bucket = Some(self.bucket(&req.routing_key()));
        r
    }
}

impl Route for McBucketRoute {
    fn route_name(&self) -> String {
        format!(
            "bucketize|total_buckets={}|bucketization_keyspace={}|prefix_map_enabled={}",
            self.total_buckets,
            self.keyspace,
            !self.by_prefix.is_empty()
        )
    }

    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.target, &self.stamped(req));
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        Box::pin(async move { self.target.route(&self.stamped(req)).await })
    }
}

/// A pool hashed by bucket (mcrouter's BucketHashSelector): `func` over the decimal bucket id
/// with `salt`.
pub struct BucketHashRoute {
    pub children: Vec<RouteRef>,
    pub func: HashFunc,
    pub salt: Vec<u8>,
}

impl BucketHashRoute {
    fn pick(&self, req: &Request) -> Option<&RouteRef> {
        let bucket = req.bucket?.to_string();
        Some(&self.children[self.func.pick(bucket.as_bytes(), &self.salt, self.children.len())])
    }
}

impl Route for BucketHashRoute {
    fn route_name(&self) -> String {
        format!("hash|{}|bucketized", self.func.name())
    }

    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        if let Some(c) = self.pick(req) {
            visit(c, req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        match self.pick(req) {
            Some(c) => c.route(req),
            None => Box::pin(async move {
                Reply::error(
                    Res::LocalError,
                    "The context doesn't contain bucket id. You must use McBucketRoute in front of bucketized PoolRoute",
                )
            }),
        }
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.pick(req)?.first_get_target(req)
    }
}

/// McBucketRoute around `target` with the bucket settings of `obj` (a PoolRoute's or its own).
pub fn wrap(target: RouteRef, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let bad = |what: String| format!("McBucketRoute: {what}");
    let total = match obj.get("total_buckets") {
        Some(Value::Number(n)) => n.as_i64().filter(|n| (1..=MAX_BUCKETS).contains(n)),
        None => return Err(bad("no total number of buckets (`total_buckets`)".into())),
        Some(_) => None,
    }
    .ok_or_else(|| bad(format!("`total_buckets` must be an integer from 1 to {MAX_BUCKETS}")))? as u32;
    let mut by_prefix = Vec::new();
    match obj.get("total_buckets_by_prefix") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (prefix, n) in map {
                let n = n
                    .as_i64()
                    .filter(|n| (1..=i64::from(total)).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "bucket count of `{prefix}` must be in range (0, {total}], got {n}"
                        ))
                    })?;
                by_prefix.push((prefix.as_bytes().to_vec(), n as u32));
            }
        }
        Some(other) => return Err(bad(format!("`total_buckets_by_prefix` must be an object, not {other}"))),
    }
    by_prefix.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
    let keyspace = get_str(obj, "bucketization_keyspace")
        .map_err(bad)?
        .ok_or_else(|| bad("must have `bucketization_keyspace`".into()))?
        .to_string();
    Ok(Arc::new(McBucketRoute {
        target,
        total_buckets: total,
        by_prefix,
        keyspace,
    }))
}

pub const MC_BUCKET_ROUTE: Handle = Handle {
    name: "McBucketRoute",
    build,
    shorthand: None,
    fields: &[
        "target",
        "bucketize",
        "total_buckets",
        "total_buckets_by_prefix",
        "bucketization_keyspace",
        "salt",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let target = b.route(required(obj, "target", "McBucketRoute")?)?;
    wrap(target, obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Cmd;
    use crate::routes::testing::*;

    fn bucketed(fakes: &[Arc<Fake>], settings: serde_json::Value) -> RouteRef {
        let pool = Arc::new(BucketHashRoute {
            children: fakes.iter().map(|f| f.clone() as RouteRef).collect(),
            func: HashFunc::Ch3,
            salt: vec![],
        });
        wrap(pool, settings.as_object().unwrap()).unwrap()
    }

    #[test]
    fn keys_are_placed_by_their_bucket() {
        let fakes: Vec<_> = (0..4).map(|_| Fake::new("x", Res::Found)).collect();
        let r = bucketed(
            &fakes,
            serde_json::json!({"total_buckets": 100, "bucketization_keyspace": "ks"}),
        );
        // mcrouter's McBucketRouteTest: "getReq" is in bucket 28 of 100
        assert_eq!(furc_hash(b"getReq", 100), 28);
        run(r.route(&req(Cmd::Get, "getReq")));
        let expect = HashFunc::Ch3.pick(b"28", b"", 4);
        assert_eq!(fakes[expect].count(), 1);
        assert_eq!(fakes[expect].last().bucket, Some(28));
        // keys of one bucket share a server whatever else they hash to
        let mut servers = std::collections::HashMap::new();
        for i in 0..2000 {
            let key = format!("k{i}");
            let bucket = furc_hash(key.as_bytes(), 100);
            let before: Vec<usize> = fakes.iter().map(|f| f.count()).collect();
            run(r.route(&req(Cmd::Get, &key)));
            let server = fakes.iter().zip(before).position(|(f, b)| f.count() > b).unwrap();
            assert_eq!(*servers.entry(bucket).or_insert(server), server, "{key}");
        }
        assert_eq!(servers.len(), 100);
    }

    #[test]
    fn prefixes_keep_their_keys_in_few_buckets() {
        let fakes: Vec<_> = (0..2).map(|_| Fake::new("x", Res::Found)).collect();
        let r = McBucketRoute {
            target: fakes[0].clone(),
            total_buckets: 1000,
            by_prefix: vec![(b"feed:".to_vec(), 3)],
            keyspace: "ks".into(),
        };
        let buckets: std::collections::HashSet<u64> =
            (0..500).map(|i| r.bucket(format!("feed:{i}").as_bytes())).collect();
        assert!(buckets.len() <= 3, "{buckets:?}");
        let others: std::collections::HashSet<u64> =
            (0..500).map(|i| r.bucket(format!("user:{i}").as_bytes())).collect();
        assert!(others.len() > 300);
    }

    #[test]
    fn settings_are_checked_and_a_pool_without_a_bucket_says_why() {
        let fakes = [Fake::new("x", Res::Found)];
        for (settings, want) in [
            (
                serde_json::json!({"bucketization_keyspace": "k"}),
                "no total number of buckets",
            ),
            (
                serde_json::json!({"total_buckets": 0, "bucketization_keyspace": "k"}),
                "from 1 to 8388608",
            ),
            (
                serde_json::json!({"total_buckets": 10}),
                "must have `bucketization_keyspace`",
            ),
            (
                serde_json::json!({"total_buckets": 10, "bucketization_keyspace": "k", "total_buckets_by_prefix": {"a": 11}}),
                "bucket count of `a` must be in range (0, 10], got 11",
            ),
        ] {
            let pool: RouteRef = fakes[0].clone();
            let e = wrap(pool, settings.as_object().unwrap()).err().unwrap();
            assert!(e.contains(want), "{want} not in {e}");
        }
        let lone = BucketHashRoute {
            children: vec![fakes[0].clone()],
            func: HashFunc::Ch3,
            salt: vec![],
        };
        let reply = run(lone.route(&req(Cmd::Get, "k")));
        assert!(String::from_utf8_lossy(&reply.wire).contains("You must use McBucketRoute"));
    }
}
