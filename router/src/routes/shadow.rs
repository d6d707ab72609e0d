//! ShadowRoute (mcrouter's `children` + `shadows`): each child answers as usual, and a copy of
//! the request goes in the background to each shadow whose `index_range` (child indices
//! [start, end), as mcrouter reads it; default all, warned: mcrouter shadows none) holds the child and whose `key_fraction_range` (default [0, 1])
//! holds the key's hash. Shadow replies are thrown away: the client's answer — and for a delete,
//! whether it counts as acknowledged — is only ever the child's. Like Pool|X, the route is one
//! per child: in a list it stands for all of them, elsewhere it must have one child.
//!
//! The key's place in [0, 1] is SpookyHashV2-32 of the key over 2^32 (mcrouter's wiki names
//! SpookyHashV2; its exact seed is not documented, so the shadowed fraction is the same size as
//! mcrouter's but not necessarily the same keys). `shadow_policy` other than "default" is
//! rejected.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef, required};
use crate::config::Builder;
use crate::protocol::{Reply, Request};

pub struct Shadow {
    pub target: RouteRef,
    pub key_range: (f64, f64),
}

pub struct ShadowRoute {
    pub child: RouteRef,
    pub shadows: Vec<Shadow>,
}

fn key_fraction(key: &[u8]) -> f64 {
    crate::hash::spooky32(key, 0) as f64 / u32::MAX as f64
}

impl Route for ShadowRoute {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.child, req);
        let f = key_fraction(&req.routing_key());
        for s in &self.shadows {
            if s.key_range.0 <= f && f <= s.key_range.1 {
                visit(&s.target, req);
            }
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        let f = key_fraction(&req.routing_key());
        for s in &self.shadows {
            if s.key_range.0 <= f && f <= s.key_range.1 {
                super::all_async::spawn_to(&s.target, req);
            }
        }
        self.child.route(req)
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        // a batched get would skip the shadows: only when none takes this key
        let f = key_fraction(&req.routing_key());
        if self.shadows.iter().any(|s| s.key_range.0 <= f && f <= s.key_range.1) {
            return None;
        }
        self.child.first_get_target(req)
    }

    fn first_server(&self, req: &Request) -> Option<&crate::server::Server> {
        // the child answers; the shadows only get copies
        self.child.first_server(req)
    }
}

fn pair(v: Option<&Value>, handle: &str, field: &str) -> Result<Option<(f64, f64)>, String> {
    let Some(v) = v else { return Ok(None) };
    let bad = || format!("{handle}: `{field}` must be a list of two numbers");
    let a = v.as_array().filter(|a| a.len() == 2).ok_or_else(bad)?;
    Ok(Some((a[0].as_f64().ok_or_else(bad)?, a[1].as_f64().ok_or_else(bad)?)))
}

/// One entry of `shadows`: the children (or pool servers) it copies, its target and key range.
struct Parsed {
    index_range: (usize, usize),
    target: RouteRef,
    key_range: (f64, f64),
}

/// `shadows` and `shadow_policy` of a ShadowRoute or a PoolRoute (`handle`), as mcrouter's
/// `makeShadowRoutes` reads them: `index_range` [start, end) — end excluded, as mcrouter's
/// `start <= i < end`; the wiki's Shadowing setup says so too.
fn parse(b: &mut Builder, obj: &Map<String, Value>, handle: &str) -> Result<Vec<Parsed>, String> {
    match obj.get("shadow_policy") {
        None => {}
        Some(Value::String(p)) if p == "default" => {}
        Some(other) => {
            return Err(format!(
                "{handle}: shadow_policy {other} is not supported (only \"default\")"
            ));
        }
    }
    let list = required(obj, "shadows", handle)?
        .as_array()
        .ok_or_else(|| format!("{handle}: `shadows` must be a list"))?;
    let mut shadows = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let s = s
            .as_object()
            .ok_or_else(|| format!("{handle}: shadows[{i}] must be an object"))?;
        let target = b.route(required(s, "target", handle)?)?;
        let index_range = match pair(s.get("index_range"), handle, "index_range")? {
            Some((start, end)) if start >= 0.0 && start <= end && end.fract() == 0.0 && start.fract() == 0.0 => {
                (start as usize, end as usize)
            }
            Some(_) => {
                return Err(format!(
                    "{handle}: shadows[{i}].index_range must be two whole numbers, start <= end"
                ));
            }
            None => {
                b.warnings.push(format!(
                    "{handle}: shadows[{i}] has no `index_range`: here every server is shadowed (mcrouter shadows none)"
                ));
                (0, usize::MAX)
            }
        };
        let keys = pair(s.get("key_fraction_range"), handle, "key_fraction_range")?.unwrap_or((0.0, 1.0));
        if !(0.0..=1.0).contains(&keys.0) || !(0.0..=1.0).contains(&keys.1) || keys.0 > keys.1 {
            return Err(format!(
                "{handle}: shadows[{i}].key_fraction_range must be within [0, 1], low first"
            ));
        }
        for field in s.keys() {
            if !["target", "index_range", "key_fraction_range"].contains(&field.as_str()) {
                b.warnings
                    .push(format!("{handle}: shadows[{i}]: unknown field `{field}` ignored"));
            }
        }
        shadows.push(Parsed {
            index_range,
            target,
            key_range: keys,
        });
    }
    Ok(shadows)
}

/// Each of `children` with a ShadowRoute around it when some shadow's index range holds it.
fn wrap(children: Vec<RouteRef>, shadows: &[Parsed]) -> Vec<RouteRef> {
    children
        .into_iter()
        .enumerate()
        .map(|(i, child)| {
            let mine = shadows
                .iter()
                .filter(|s| s.index_range.0 <= i && i < s.index_range.1)
                .map(|s| Shadow {
                    target: s.target.clone(),
                    key_range: s.key_range,
                })
                .collect::<Vec<_>>();
            if mine.is_empty() {
                child
            } else {
                Arc::new(ShadowRoute { child, shadows: mine }) as RouteRef
            }
        })
        .collect()
}

/// The routes of a ShadowRoute: one per child.
pub fn build_list(b: &mut Builder, obj: &Map<String, Value>) -> Result<Vec<RouteRef>, String> {
    let children = b.children(required(obj, "children", "ShadowRoute")?)?;
    let shadows = parse(b, obj, "ShadowRoute")?;
    Ok(wrap(children, &shadows))
}

/// PoolRoute's `shadows` (mcrouter builds them the same way): each server of the pool whose
/// index a shadow's `index_range` holds copies its requests to that shadow, so a key is shadowed
/// when the pool's hash sends it to one of those servers.
pub fn wrap_pool(b: &mut Builder, obj: &Map<String, Value>, servers: Vec<RouteRef>) -> Result<Vec<RouteRef>, String> {
    if !obj.contains_key("shadows") {
        return Ok(servers);
    }
    let shadows = parse(b, obj, "PoolRoute")?;
    Ok(wrap(servers, &shadows))
}

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let mut list = build_list(b, obj)?;
    if list.len() != 1 {
        return Err(format!(
            "ShadowRoute: {} children where one route is expected (put it in a `children` list)",
            list.len()
        ));
    }
    Ok(list.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn the_shadow_gets_a_copy_but_never_the_say() {
        let main = Fake::new("main", Res::Tko);
        let shadow = Fake::new("shadow", Res::Deleted);
        let r = ShadowRoute {
            child: main.clone(),
            shadows: vec![Shadow {
                target: shadow.clone(),
                key_range: (0.0, 1.0),
            }],
        };
        let reply = run(async {
            let reply = r.route(&req(Cmd::Delete, "k")).await;
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            reply
        });
        // the shadow has the delete, the child lost it: not acknowledged
        assert_eq!(shadow.count(), 1);
        assert!(crate::ack::lost(&req(Cmd::Delete, "k"), &reply));
        // an empty key range shadows nothing
        let r = ShadowRoute {
            child: main.clone(),
            shadows: vec![Shadow {
                target: shadow.clone(),
                key_range: (2.0, 2.0),
            }],
        };
        run(r.route(&req(Cmd::Get, "k")));
        assert_eq!((main.count(), shadow.count()), (2, 1));
    }

    /// Every handle `key`'s get traverses in `config` (mcrouter's `route_handles`), with the
    /// load's warnings.
    fn handles(config: &str, key: &str) -> (Vec<String>, Vec<String>) {
        fn walk(route: &RouteRef, req: &Request, out: &mut Vec<String>) {
            out.push(route.route_name());
            route.traverse(req, &mut |child, r| walk(child, r, out));
        }
        run(async {
            let ctx = crate::Context::new(crate::Options::default(), None);
            let cfg = crate::config::load(&ctx, config, None).unwrap();
            let mut r = req(Cmd::Get, key);
            let root = cfg.route_for(&mut r).ok().unwrap().clone();
            let mut out = Vec::new();
            walk(&root, &r, &mut out);
            (out, cfg.warnings.clone())
        })
    }

    fn reaches(handles: &[String], addr: &str) -> bool {
        handles.iter().any(|h| h.contains(&format!("ap={addr}:")))
    }

    #[test]
    fn index_range_ends_before_its_second_number_as_in_mcrouter() {
        // mcrouter's ShadowRoute takes child i when start <= i < end (ShadowRoute-inl.h); the
        // wiki's Shadowing setup: `[0, 2]` is the first and second hosts ("non-inclusive")
        let config = r#"{"pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]},
                                   "b": {"servers": ["127.0.0.1:9"]}},
            "route": {"type": "AllSyncRoute", "children": [{"type": "ShadowRoute", "children": "Pool|a",
                "shadows": [{"target": "PoolRoute|b", "index_range": [0, 1], "key_fraction_range": [0, 1]}]}]}}"#;
        let (tree, _) = handles(config, "k");
        let shadowed: Vec<&String> = tree.iter().filter(|h| h.contains("ap=127.0.0.1:9:")).collect();
        assert_eq!(shadowed.len(), 1, "only child 0 is shadowed: {tree:?}");
        let at = tree.iter().position(|h| h == "shadow").unwrap();
        assert!(tree[at + 1].contains("ap=127.0.0.1:1:"), "{tree:?}");
    }

    #[test]
    fn a_pool_routes_shadows_copy_the_requests_of_the_servers_in_their_index_range() {
        // the wiki's Shadowing setup: PoolRoute `shadows`, hosts 0 and 1 of three shadowed
        let config = r#"{"pools": {"production": {"servers": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]},
                                   "test": {"servers": ["127.0.0.1:9"]}},
            "route": {"type": "PoolRoute", "pool": "production",
                      "shadows": [{"target": "PoolRoute|test", "index_range": [0, 2], "key_fraction_range": [0, 1]}]}}"#;
        let mut seen = [0, 0];
        for i in 0..60 {
            let (tree, warnings) = handles(config, &format!("key{i}"));
            assert!(warnings.is_empty(), "{warnings:?}");
            let shadowed = reaches(&tree, "127.0.0.1:9");
            let third = reaches(&tree, "127.0.0.1:3");
            assert_eq!(shadowed, !third, "key{i}: {tree:?}");
            seen[shadowed as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        // a key fraction range that takes no key shadows nothing
        let none = config.replace("[0, 1]", "[0, 0]");
        assert!((0..20).all(|i| !reaches(&handles(&none, &format!("key{i}")).0, "127.0.0.1:9")));
    }

    #[test]
    fn key_fraction_splits_keys() {
        let low = (0..1000)
            .filter(|i| key_fraction(format!("k{i}").as_bytes()) < 0.25)
            .count();
        assert!((180..320).contains(&low), "{low}");
    }
}
