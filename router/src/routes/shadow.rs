//! ShadowRoute (mcrouter's `children` + `shadows`): each child answers as usual, and a copy of
//! the request goes in the background to each shadow whose `index_range` (child indices,
//! inclusive; default all) holds the child and whose `key_fraction_range` (default [0, 1])
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
}

fn pair(v: Option<&Value>, field: &str) -> Result<Option<(f64, f64)>, String> {
    let Some(v) = v else { return Ok(None) };
    let bad = || format!("ShadowRoute: `{field}` must be a list of two numbers");
    let a = v.as_array().filter(|a| a.len() == 2).ok_or_else(bad)?;
    Ok(Some((a[0].as_f64().ok_or_else(bad)?, a[1].as_f64().ok_or_else(bad)?)))
}

/// The routes of a ShadowRoute: one per child.
pub fn build_list(b: &mut Builder, obj: &Map<String, Value>) -> Result<Vec<RouteRef>, String> {
    let children = b.children(required(obj, "children", "ShadowRoute")?)?;
    match obj.get("shadow_policy") {
        None => {}
        Some(Value::String(p)) if p == "default" => {}
        Some(other) => {
            return Err(format!(
                "ShadowRoute: shadow_policy {other} is not supported (only \"default\")"
            ));
        }
    }
    let list = required(obj, "shadows", "ShadowRoute")?
        .as_array()
        .ok_or("ShadowRoute: `shadows` must be a list")?;
    // (index range, shadow) pairs
    let mut shadows = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let s = s
            .as_object()
            .ok_or_else(|| format!("ShadowRoute: shadows[{i}] must be an object"))?;
        let target = b.route(required(s, "target", "ShadowRoute")?)?;
        let idx = pair(s.get("index_range"), "index_range")?.unwrap_or((0.0, f64::MAX));
        let keys = pair(s.get("key_fraction_range"), "key_fraction_range")?.unwrap_or((0.0, 1.0));
        if !(0.0..=1.0).contains(&keys.0) || !(0.0..=1.0).contains(&keys.1) || keys.0 > keys.1 {
            return Err(format!(
                "ShadowRoute: shadows[{i}].key_fraction_range must be within [0, 1], low first"
            ));
        }
        for field in s.keys() {
            if !["target", "index_range", "key_fraction_range"].contains(&field.as_str()) {
                b.warnings
                    .push(format!("ShadowRoute: shadows[{i}]: unknown field `{field}` ignored"));
            }
        }
        shadows.push((idx, target, keys));
    }
    Ok(children
        .into_iter()
        .enumerate()
        .map(|(i, child)| {
            let mine = shadows
                .iter()
                .filter(|(idx, _, _)| idx.0 <= i as f64 && i as f64 <= idx.1)
                .map(|(_, target, keys)| Shadow {
                    target: target.clone(),
                    key_range: *keys,
                })
                .collect::<Vec<_>>();
            if mine.is_empty() {
                child
            } else {
                Arc::new(ShadowRoute { child, shadows: mine }) as RouteRef
            }
        })
        .collect())
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

    #[test]
    fn key_fraction_splits_keys() {
        let low = (0..1000)
            .filter(|i| key_fraction(format!("k{i}").as_bytes()) < 0.25)
            .count();
        assert!((180..320).contains(&low), "{low}");
    }
}
