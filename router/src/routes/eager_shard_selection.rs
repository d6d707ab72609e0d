//! EagerShardSelectionRoute: ShardSelectionRoute over several pools ("tiers") whose servers may
//! serve the same shard; the servers of each shard are grouped under one route of
//! `children_type`, built once per shard at load (mcrouter's `createEagerShardSelectionRoute`).
//!
//! Config: `pools` (a list of `{"pool": NAME or inline pool, "shards": […]}`; the shard map may
//! also sit in the pool), `children_type` and `children_settings` (both required, as in mcrouter),
//! `out_of_range`. `children_type` is `LoadBalancerRoute`, `LatestRoute`, any other handle that
//! takes `children` (mcrouter lets its embedder add such names; here every registered one may
//! be used), or `CustomJsonmRoute`: then `children_settings` is a route handle of its own in
//! which the string `"$children_list$"` stands for the shard's servers. A shard's servers come
//! in `pools` order, then server order. The shard id comes from the key, as in
//! `shard_selection.rs`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::RouteRef;
use super::error::ErrorRoute;
use super::shard_selection::{ShardSelection, out_of_range, pool_shards};
use crate::build::{Builder, CHILDREN_LIST, Handle, required};

/// Each shard's servers across `pools` (by shard id, in order), from their `field` maps
/// (`shards` or `shadow_shards`). `None` when some pool has no such map.
pub fn shard_servers(
    b: &mut Builder,
    obj: &Map<String, Value>,
    field: &str,
    handle: &str,
) -> Result<Option<BTreeMap<u32, Vec<RouteRef>>>, String> {
    let pools = required(obj, "pools", handle)?
        .as_array()
        .ok_or_else(|| format!("{handle}: `pools` must be a list of {{\"pool\": …, \"shards\": […]}}"))?;
    let mut by_shard: BTreeMap<u32, Vec<RouteRef>> = BTreeMap::new();
    for (i, entry) in pools.iter().enumerate() {
        let at = format!("{handle}: pools[{i}]");
        let entry = entry
            .as_object()
            .ok_or_else(|| format!("{at} must be an object with `pool` and `{field}`"))?;
        let pool = entry.get("pool").ok_or_else(|| format!("{at}: missing `pool`"))?;
        let servers = b.pool(pool).map_err(|e| format!("{at}: {e}"))?;
        let Some(shards) = pool_shards(b, entry, pool, field, servers.len(), &at)? else {
            return Ok(None);
        };
        for (server, ids) in servers.iter().zip(shards) {
            for id in ids {
                by_shard.entry(id).or_default().push(server.clone());
            }
        }
    }
    Ok(Some(by_shard))
}

/// The handle each shard's group is built from: `type_field` (`children_type` or
/// `shadow_children_type`) with `settings_field`, its `children` being `"$children_list$"`.
pub fn group_template(
    b: &Builder,
    obj: &Map<String, Value>,
    (type_field, settings_field): (&str, &str),
    handle: &str,
    allow_jsonm: bool,
) -> Result<Value, String> {
    let ty = obj
        .get(type_field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{handle}: `{type_field}` not found or not a string"))?;
    let settings = obj
        .get(settings_field)
        .and_then(Value::as_object)
        .ok_or_else(|| format!("{handle}: `{settings_field}` not found or not an object"))?;
    Ok(if ty == "CustomJsonmRoute" {
        if !allow_jsonm {
            return Err(format!(
                "{handle}: `{type_field}` CustomJsonmRoute is not supported (as in mcrouter)"
            ));
        }
        Value::Object(settings.clone())
    } else {
        match b.handle(ty) {
            Some(h) if h.shorthand == Some("children") => {
                let mut t = settings.clone();
                t.insert("type".into(), Value::String(ty.into()));
                t.insert("children".into(), Value::String(CHILDREN_LIST.into()));
                Value::Object(t)
            }
            _ => {
                return Err(format!(
                    "{handle}: `{type_field}` {ty} is not supported (LoadBalancerRoute, LatestRoute, \
                     CustomJsonmRoute, or another handle that takes `children`)"
                ));
            }
        }
    })
}

/// One route per shard from `template` (see [`group_template`]): the routes and the shard →
/// route index map.
pub fn group_per_shard(
    b: &mut Builder,
    template: &Value,
    by_shard: BTreeMap<u32, Vec<RouteRef>>,
    handle: &str,
) -> Result<(Vec<RouteRef>, HashMap<u32, usize>), String> {
    let mut routes = Vec::with_capacity(by_shard.len());
    let mut index = HashMap::with_capacity(by_shard.len());
    for (shard, servers) in by_shard {
        let route = b
            .with_children_list(servers, |b| b.route(template))
            .map_err(|e| format!("{handle}: shard {shard}: {e}"))?;
        index.insert(shard, routes.len());
        routes.push(route);
    }
    Ok((routes, index))
}

pub const EAGER_SHARD_SELECTION_ROUTE: Handle = Handle {
    name: "EagerShardSelectionRoute",
    build,
    shorthand: None,
    fields: &["pools", "children_type", "children_settings", "out_of_range"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    const HANDLE: &str = "EagerShardSelectionRoute";
    let template = group_template(b, obj, ("children_type", "children_settings"), HANDLE, true)?;
    let by_shard = shard_servers(b, obj, "shards", HANDLE)?
        .ok_or_else(|| format!("{HANDLE}: every entry of `pools` needs `shards` (in it or in its pool)"))?;
    if by_shard.is_empty() {
        b.warnings
            .push(format!("{HANDLE}: no shard has a server: every request gets an error"));
        return Ok(Arc::new(ErrorRoute {
            response: format!("{HANDLE} has an empty list of destinations"),
        }));
    }
    let (children, shard_to_child) = group_per_shard(b, &template, by_shard, HANDLE)?;
    let out_of_range = out_of_range(b, obj)?;
    Ok(Arc::new(ShardSelection {
        children,
        shard_to_child,
        out_of_range,
    }))
}
