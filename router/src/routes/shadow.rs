//! ShadowRoute (mcrouter's `children` + `shadows`): each child answers as usual, and a copy of
//! the request goes in the background to each shadow whose `index_range` (child indices
//! [start, end), as mcrouter reads it; default all, warned: mcrouter shadows none) holds the
//! child and whose `key_fraction_range` (default [0, 1]) holds the key's hash — or, with
//! `keys_to_shadow`, whose list holds the routing key. Shadow replies are thrown away: the
//! client's answer — and for a delete, whether it counts as acknowledged — is only ever the
//! child's. Like Pool|X, the route is one per child: in a list it stands for all of them,
//! elsewhere it must have one child. PoolRoute's `shadows` wrap the pool's servers the same way.
//!
//! The key's place in [0, 1] is SpookyHashV2-32 (seed 0) of the routing key over 2^32 − 1,
//! mcrouter's `routingKeyHash`: the same keys are shadowed (tested on mcrouter's test_shadow.py
//! vectors). `shadow_policy` other than "default" is rejected; a shadow that cannot be built is
//! left out with a warning, as mcrouter leaves it out.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, required};
use crate::protocol::{Reply, Request};

pub struct Shadow {
    pub target: RouteRef,
    pub key_range: (f64, f64),
    /// `keys_to_shadow`: when given, exactly these routing keys are shadowed (not `key_range`)
    pub keys: Option<Arc<HashSet<Vec<u8>>>>,
}

impl Shadow {
    /// Does this shadow take the request whose routing key is `key` (at `fraction` of the hash space)?
    fn takes(&self, key: &[u8], fraction: f64) -> bool {
        match &self.keys {
            Some(keys) => keys.contains(key),
            None => self.key_range.0 <= fraction && fraction <= self.key_range.1,
        }
    }
}

pub struct ShadowRoute {
    pub child: RouteRef,
    pub shadows: Vec<Shadow>,
}

pub(crate) fn key_fraction(key: &[u8]) -> f64 {
    crate::hash::spooky32(key, 0) as f64 / u32::MAX as f64
}

impl Route for ShadowRoute {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        visit(&self.child, req);
        let key = req.routing_key();
        let f = key_fraction(&key);
        for s in &self.shadows {
            if s.takes(&key, f) {
                visit(&s.target, req);
            }
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        let key = req.routing_key();
        let f = key_fraction(&key);
        for s in &self.shadows {
            if s.takes(&key, f) {
                super::all_async::spawn_to(&s.target, req);
            }
        }
        self.child.route(req)
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        // a batched get would skip the shadows: only when none takes this key
        let key = req.routing_key();
        let f = key_fraction(&key);
        if self.shadows.iter().any(|s| s.takes(&key, f)) {
            return None;
        }
        self.child.first_get_target(req)
    }

    fn first_server(&self, req: &Request) -> Option<&crate::server::Server> {
        // the child answers; the shadows only get copies
        self.child.first_server(req)
    }
}

fn pair(v: Option<&Value>, field: &str) -> Result<Option<(f64, f64)>, String> {
    let Some(v) = v else { return Ok(None) };
    let bad = || format!("`{field}` must be a list of two numbers");
    let a = v.as_array().filter(|a| a.len() == 2).ok_or_else(bad)?;
    Ok(Some((a[0].as_f64().ok_or_else(bad)?, a[1].as_f64().ok_or_else(bad)?)))
}

/// One entry of `shadows`: the children (or pool servers) it copies, its target and key range.
struct Parsed {
    index_range: (usize, usize),
    target: RouteRef,
    key_range: (f64, f64),
    keys: Option<Arc<HashSet<Vec<u8>>>>,
}

/// `shadows` and `shadow_policy` of a ShadowRoute or a PoolRoute (`handle`), as mcrouter's
/// `makeShadowRoutes` reads them: `index_range` [start, end) — end excluded, as mcrouter's
/// `start <= i < end`; the wiki's Shadowing setup says so too. Like mcrouter, a shadow it cannot
/// build (not an object, no or a bad `target`, bad ranges) is left out with a warning, and the
/// route loads with the others.
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
    let Some(list) = required(obj, "shadows", handle)?.as_array() else {
        b.warnings.push(format!(
            "{handle}: `shadows` is not a list: nothing is shadowed (as in mcrouter)"
        ));
        return Ok(Vec::new());
    };
    let mut shadows = Vec::new();
    for (i, s) in list.iter().enumerate() {
        match one(b, s, handle, i) {
            Ok(parsed) => shadows.push(parsed),
            Err(e) => b.warnings.push(format!(
                "{handle}: shadows[{i}] left out: {e} (mcrouter leaves out a shadow it cannot build)"
            )),
        }
    }
    Ok(shadows)
}

fn one(b: &mut Builder, s: &Value, handle: &str, i: usize) -> Result<Parsed, String> {
    let s = s.as_object().ok_or("it must be an object")?;
    let target = b.route(s.get("target").ok_or("missing `target`")?)?;
    let keys = match s.get("keys_to_shadow") {
        None => None,
        Some(list) => {
            let list = list.as_array().ok_or("`keys_to_shadow` must be a list of keys")?;
            let keys = list
                .iter()
                .map(|k| k.as_str().map(|k| k.as_bytes().to_vec()))
                .collect::<Option<HashSet<_>>>()
                .ok_or("`keys_to_shadow` must be a list of keys")?;
            (!keys.is_empty()).then_some(keys)
        }
    };
    if let Some(keys) = keys {
        // mcrouter: the listed keys, whichever child they go to; no range may narrow them
        if s.contains_key("index_range") || s.contains_key("key_fraction_range") {
            return Err(
                "a non-empty `keys_to_shadow` cannot be mixed with `index_range` or `key_fraction_range`".into(),
            );
        }
        return Ok(Parsed {
            index_range: (0, usize::MAX),
            target,
            key_range: (0.0, 1.0),
            keys: Some(Arc::new(keys)),
        });
    }
    let index_range = match pair(s.get("index_range"), "index_range")? {
        Some((start, end)) if start >= 0.0 && start <= end && end.fract() == 0.0 && start.fract() == 0.0 => {
            (start as usize, end as usize)
        }
        Some(_) => return Err("`index_range` must be two whole numbers, start <= end".into()),
        None => {
            b.warnings.push(format!(
                "{handle}: shadows[{i}] has no `index_range`: here every server is shadowed (mcrouter shadows none)"
            ));
            (0, usize::MAX)
        }
    };
    let keys = match pair(s.get("key_fraction_range"), "key_fraction_range")? {
        Some(range) => range,
        None => {
            // mcrouter's range defaults to [0, 0]: only keys hashing to exactly 0
            b.warnings.push(format!(
                "{handle}: shadows[{i}] has no `key_fraction_range`: here every key is shadowed (mcrouter shadows none)"
            ));
            (0.0, 1.0)
        }
    };
    if !(0.0..=1.0).contains(&keys.0) || !(0.0..=1.0).contains(&keys.1) || keys.0 > keys.1 {
        return Err("`key_fraction_range` must be within [0, 1], low first".into());
    }
    for field in s.keys() {
        if !["target", "index_range", "key_fraction_range", "keys_to_shadow"].contains(&field.as_str()) {
            b.warnings
                .push(format!("{handle}: shadows[{i}]: unknown field `{field}` ignored"));
        }
    }
    Ok(Parsed {
        index_range,
        target,
        key_range: keys,
        keys: None,
    })
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
                    keys: s.keys.clone(),
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

pub const SHADOW_ROUTE: Handle = Handle {
    name: "ShadowRoute",
    build,
    shorthand: None,
    fields: &["children", "shadows", "shadow_policy"],
};

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
                keys: None,
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
                keys: None,
            }],
        };
        run(r.route(&req(Cmd::Get, "k")));
        assert_eq!((main.count(), shadow.count()), (2, 1));
    }

    #[test]
    fn key_fraction_splits_keys() {
        let low = (0..1000)
            .filter(|i| key_fraction(format!("k{i}").as_bytes()) < 0.25)
            .count();
        assert!((180..320).contains(&low), "{low}");
    }
}
