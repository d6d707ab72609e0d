//! Loading mcrouter's JSON config dialect into a route tree.
//!
//! Top level: `pools` (name → `{servers, server_timeout}`), optional `named_handles`, and exactly
//! one of `route` (one tree) or `routes` (`[{"aliases": ["/a/b/"], "route": …}]`, selected by the
//! key's routing prefix, which is stripped before forwarding). A handle is an object with `type`,
//! a `"Type|rest"` shorthand string, or the name of a handle defined earlier with `"name"`.
//! `"Pool|NAME"` as `children` is one destination per server of the pool. An object without
//! `type` but with `policies`/`wildcard` is a PrefixSelectorRoute (the implicit root).
//! The text goes through `crate::preprocess` (which reads mcrouter's JSON dialect, `crate::jsonc`) first.
//! Errors name the path of the problem so a rejected reload says why.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::build::Builder;
use crate::context::Context;

mod select;

use select::{Root, routing_prefix};
pub use select::{RouterConfig, Selected, select_route};

/// Parse and build a config. `default_prefix` picks the default of a `routes` config (mcrouter's
/// `--route-prefix`); without it, the first alias of the first entry is the default.
pub fn load(ctx: &Arc<Context>, text: &str, default_prefix: Option<&str>) -> Result<RouterConfig, String> {
    load_from(ctx, text, default_prefix, None, &[])
}

/// [`load`] for a config read from a file in `dir`: its `@import(path)`s read files relative to `dir`,
/// and `params` (mcrouter's `--config-params`) are constants its macros can read.
pub fn load_from(
    ctx: &Arc<Context>,
    text: &str,
    default_prefix: Option<&str>,
    dir: Option<&std::path::Path>,
    params: &[(String, String)],
) -> Result<RouterConfig, String> {
    let v = crate::preprocess::expand_file(text, default_prefix, dir, params)?;
    let top = v.as_object().ok_or("config must be a JSON object")?;
    let pools = match top.get("pools") {
        None => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(_) => return Err("`pools` must be an object".into()),
    };
    let pool_count = pools.len();
    let mut b = Builder::new(ctx, &crate::registry::REGISTRY, pools);
    match top.get("named_handles") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                if item.get("name").and_then(Value::as_str).is_none() {
                    return Err("named_handles: every entry needs a `name`".into());
                }
                b.route(item).map_err(|e| format!("named_handles: {e}"))?;
            }
        }
        Some(Value::Object(map)) => {
            for (name, item) in map {
                let r = b.route(item).map_err(|e| format!("named_handles.{name}: {e}"))?;
                b.named.insert(name.clone(), r);
            }
        }
        Some(_) => return Err("`named_handles` must be a list or an object".into()),
    }
    let root = match (top.get("route"), top.get("routes")) {
        (Some(_), Some(_)) => return Err("config has both `route` and `routes`: use one".into()),
        (None, None) => return Err("config has neither `route` nor `routes`".into()),
        (Some(r), None) => Root::Single((
            b.route(r).map_err(|e| format!("route: {e}"))?,
            ctx.stats.route_counters("default"),
        )),
        (None, Some(routes @ (Value::Array(_) | Value::Object(_)))) => {
            // a list of `{aliases, route}` entries; or, as mcrouter, an object mapping each alias to
            // its route; or one `{aliases, route}` entry on its own
            let entries: Vec<Value> = match routes {
                Value::Array(entries) => entries.clone(),
                Value::Object(one) if one.contains_key("aliases") => vec![routes.clone()],
                Value::Object(by_alias) => by_alias
                    .iter()
                    .map(|(alias, route)| serde_json::json!({"aliases": [alias], "route": route}))
                    .collect(),
                _ => unreachable!("matched as a list or an object"),
            };
            let mut aliases = Vec::new();
            for (i, entry) in entries.iter().enumerate() {
                let list = entry
                    .get("aliases")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("routes[{i}]: `aliases` must be a list"))?;
                let tree = b
                    .route(
                        entry
                            .get("route")
                            .ok_or_else(|| format!("routes[{i}]: missing `route`"))?,
                    )
                    .map_err(|e| format!("routes[{i}].route: {e}"))?;
                for a in list {
                    let a = a
                        .as_str()
                        .ok_or_else(|| format!("routes[{i}]: aliases must be strings"))?;
                    if routing_prefix(a.as_bytes()) != Some(a.len()) {
                        return Err(format!(
                            "routes[{i}]: alias `{a}` is not a routing prefix like /region/cluster/"
                        ));
                    }
                    let counters = ctx.stats.route_counters(a);
                    aliases.push((a.as_bytes().to_vec(), (tree.clone(), counters)));
                }
            }
            let default = match default_prefix {
                Some(p) => aliases
                    .iter()
                    .find(|(a, _)| a.as_slice() == p.as_bytes())
                    .map(|(_, r)| r.clone())
                    .ok_or_else(|| format!("--route-prefix {p} matches no alias"))?,
                None => aliases
                    .first()
                    .map(|(_, r)| r.clone())
                    .ok_or("`routes` has no aliases")?,
            };
            Root::Aliased { aliases, default }
        }
        (None, Some(_)) => return Err("`routes` must be a list of {aliases, route} objects, or one".into()),
    };
    for field in top.keys() {
        if !["pools", "route", "routes", "named_handles"].contains(&field.as_str()) {
            b.warnings.push(format!(
                "top level: unknown field `{field}` ignored (knows: pools, route, routes, named_handles)"
            ));
        }
    }
    b.warn_unused_weights();
    let (flush_targets, flush_problems) = b.take_flush_targets();
    ctx.stats.register_pools(&b.pool_gets);
    match &root {
        Root::Single((_, counters)) => ctx.stats.register([counters]),
        Root::Aliased { aliases, .. } => ctx.stats.register(aliases.iter().map(|(_, (_, counters))| counters)),
    }
    // a handle built once per shard says the same thing once
    let mut seen = std::collections::HashSet::new();
    let warnings: Vec<String> = b.warnings.drain(..).filter(|w| seen.insert(w.clone())).collect();
    Ok(RouterConfig {
        root,
        unroutable: ctx.stats.no_route.clone(),
        warnings,
        types_used: b.types_used.into_iter().collect(),
        pools: pool_count,
        flush_targets,
        flush_problems,
        servers: b.servers.into_values().collect(),
        md5: crate::md5::md5_hex(text.as_bytes()),
        loaded_at: std::time::Instant::now(),
    })
}

#[cfg(test)]
mod handle_tests;
#[cfg(test)]
mod tests;
