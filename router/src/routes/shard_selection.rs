//! ShardSelectionRoute: each server of a pool serves a list of shards; a key goes to the server
//! that serves its shard (mcrouter's `createShardSelectionRoute`, the sharded layout its users run
//! for TAO-style data where the web tier knows each key's shard).
//!
//! mcrouter leaves "which shard is this request's" to the router that embeds it (its selectors
//! read a Carbon request field). A memcached text request has only its key, so the shard id is
//! read from the key as mcrouter's own ConstShard does (`crate::hash::shard_id`: the field between
//! the first two colons, `user:1234:profile` → shard 1234). A key without one, or whose shard no
//! server lists, goes to `out_of_range` (default: an ErrorRoute, `SERVER_ERROR Invalid
//! destination index.` as mcrouter answers).
//!
//! Config: `pool` (a name or an inline pool), `shards` (one entry per server, in the pool's
//! order: a list of ids or a string `"1,2,3"`; read from the pool first, then beside it, as
//! mcrouter does), `out_of_range`. A shard listed for two servers goes to the first (mcrouter
//! picks one at random per load; a fixed choice keeps routers of a fleet in agreement).
//!
//! The shard-map parsing and the selection itself live here; the Eager variants
//! (`eager_shard_selection.rs`, `eager_shard_selection_shadow.rs`) build on them.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::error::ErrorRoute;
use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, required};
use crate::protocol::{Reply, Request};

/// Picks a child by the key's shard id; keys with no listed shard go to `out_of_range`.
pub struct ShardSelection {
    pub children: Vec<RouteRef>,
    pub shard_to_child: HashMap<u32, usize>,
    pub out_of_range: RouteRef,
}

/// The shard id of a request's key, if it has one.
pub fn key_shard(req: &Request) -> Option<u32> {
    crate::hash::shard_id(&req.routing_key())
}

impl ShardSelection {
    pub fn select(&self, req: &Request) -> &RouteRef {
        key_shard(req)
            .and_then(|shard| self.shard_to_child.get(&shard))
            .map_or(&self.out_of_range, |&i| &self.children[i])
    }
}

impl Route for ShardSelection {
    fn route_name(&self) -> String {
        "selection|key-shard-id".into()
    }

    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(self.select(req), req);
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        self.select(req).route(req)
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        self.select(req).first_get_target(req)
    }
}

/// One server's shards: a list of ids or a string of comma-separated ids (`"1, 2, 3,"`, spaces
/// and a trailing comma allowed, as mcrouter's parser takes them).
fn server_shards(v: &Value, at: &str) -> Result<Vec<u32>, String> {
    let bad = |what: &dyn std::fmt::Display| {
        format!(
            "{at}: {what} is not a shard id (ids are integers from 0 to {})",
            u32::MAX
        )
    };
    match v {
        Value::Array(ids) => ids
            .iter()
            .map(|id| id.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad(id)))
            .collect(),
        Value::String(s) => s
            .split(',')
            .map(str::trim)
            .filter(|id| !id.is_empty())
            .map(|id| id.parse::<u32>().map_err(|_| bad(&format!("`{id}`"))))
            .collect(),
        other => Err(format!(
            "{at} must be a list of shard ids or a string of comma-separated ids, not {other}"
        )),
    }
}

/// The shard map of one pool: `field` (`shards` or `shadow_shards`) of the pool object, else of
/// `entry` (the handle, or an entry of `pools`), as mcrouter looks for it. `None` if neither has
/// one; an error if it is not one entry per server.
pub fn pool_shards(
    b: &Builder,
    entry: &Map<String, Value>,
    pool: &Value,
    field: &str,
    servers: usize,
    handle: &str,
) -> Result<Option<Vec<Vec<u32>>>, String> {
    let Some(json) = b.pool_field(pool, field).or_else(|| entry.get(field).cloned()) else {
        return Ok(None);
    };
    let list = json
        .as_array()
        .ok_or_else(|| format!("{handle}: `{field}` must be a list (one entry per server)"))?;
    if list.len() != servers {
        return Err(format!(
            "{handle}: `{field}` must have the same number of entries as servers in `pool`. \
             Servers size: {servers}. Shards size: {}.",
            list.len()
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| server_shards(v, &format!("{handle}: `{field}[{i}]`")))
        .collect::<Result<_, _>>()
        .map(Some)
}

/// `out_of_range` if given, else mcrouter's default: an ErrorRoute.
pub fn out_of_range(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    match obj.get("out_of_range") {
        None | Some(Value::Null) => Ok(Arc::new(ErrorRoute {
            response: "Invalid destination index.".into(),
        })),
        Some(v) => b.route(v).map_err(|e| format!("out_of_range: {e}")),
    }
}

pub const SHARD_SELECTION_ROUTE: Handle = Handle {
    name: "ShardSelectionRoute",
    build,
    shorthand: None,
    fields: &["pool", "shards", "out_of_range"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    const HANDLE: &str = "ShardSelectionRoute";
    let pool = required(obj, "pool", HANDLE)?;
    let children = b.pool(pool)?;
    let out_of_range = out_of_range(b, obj)?;
    if children.is_empty() {
        b.warnings.push(format!(
            "{HANDLE}: the pool has no servers: every request gets an error"
        ));
        return Ok(Arc::new(ErrorRoute {
            response: format!("{HANDLE} has an empty list of destinations"),
        }));
    }
    let shards = pool_shards(b, obj, pool, "shards", children.len(), HANDLE)?
        .ok_or_else(|| format!("{HANDLE}: `shards` not found (in the pool or beside it)"))?;
    let mut shard_to_child = HashMap::new();
    for (i, ids) in shards.iter().enumerate() {
        for &id in ids {
            shard_to_child.entry(id).or_insert(i);
        }
    }
    Ok(Arc::new(ShardSelection {
        children,
        shard_to_child,
        out_of_range,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    fn selection(fakes: &[Arc<Fake>], map: &[(u32, usize)]) -> ShardSelection {
        ShardSelection {
            children: fakes.iter().map(|f| f.clone() as RouteRef).collect(),
            shard_to_child: map.iter().copied().collect(),
            out_of_range: Fake::new("oor", Res::LocalError),
        }
    }

    #[test]
    fn keys_go_to_the_server_of_their_shard() {
        let (a, b) = (Fake::new("a", Res::Stored), Fake::new("b", Res::Stored));
        let r = selection(&[a.clone(), b.clone()], &[(1, 0), (3, 0), (2, 1)]);
        run(async {
            for key in ["u:1:x", "u:3:y", "u:2:z", "u:2:", "p:1:q:r"] {
                r.route(&set_req(key, 0)).await;
            }
            // no shard id, or one no server lists: out of range
            for key in ["u:4:x", "plain", "u:x:1:y", "u:2"] {
                assert_eq!(r.route(&req(Cmd::Get, key)).await.res, Res::LocalError, "{key}");
            }
        });
        assert_eq!((a.count(), b.count()), (3, 2));
        assert_eq!(&a.last().key[..], b"p:1:q:r");
    }

    #[test]
    fn shard_lists_as_mcrouter_writes_them() {
        let at = "t";
        assert_eq!(server_shards(&serde_json::json!([1, 2, 3]), at), Ok(vec![1, 2, 3]));
        assert_eq!(server_shards(&serde_json::json!("4, 5, 6,"), at), Ok(vec![4, 5, 6]));
        assert_eq!(server_shards(&serde_json::json!(""), at), Ok(vec![]));
        let e = server_shards(&serde_json::json!([1, "2"]), "ShardSelectionRoute: `shards[1]`").unwrap_err();
        assert!(e.contains("`shards[1]`: \"2\" is not a shard id"), "{e}");
        let e = server_shards(&serde_json::json!("1,x"), at).unwrap_err();
        assert!(e.contains("`x` is not a shard id"), "{e}");
        assert!(server_shards(&serde_json::json!([-1]), at).is_err());
        assert!(server_shards(&serde_json::json!(7), at).is_err());
    }
}
