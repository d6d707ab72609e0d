//! EagerShardSelectionShadowRoute: an EagerShardSelectionRoute that also sends a share of each
//! shard's requests, in the background, to the servers that will take the shard over
//! (`shadow_shards`) — how mcrouter warms a new shard layout with live traffic before it moves.
//!
//! Config: as EagerShardSelectionRoute, plus `shadow_children_type` and
//! `shadow_children_settings` (required, as in mcrouter; CustomJsonmRoute is not allowed there),
//! `shadow_shards` in each `pools` entry or its pool, and `shadow_weights` (default 1.0). If some
//! pool has no `shadow_shards`, the route is a plain EagerShardSelectionRoute.
//!
//! A request whose shard has shadow servers is copied to them with probability
//! `floor(100 × shadows × shadow_weights) ÷ (servers + shadows)` percent (integer division),
//! mcrouter's formula: with the same number of shadow and normal servers and weight 1, half the
//! requests. Shadow replies are thrown away (as ShadowRoute's): the client's answer, and whether
//! a delete counts as delivered, is only ever the normal servers'.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::eager_shard_selection::{group_per_shard, group_template, shard_servers};
use super::error::ErrorRoute;
use super::random::Rng;
use super::shard_selection::{ShardSelection, key_shard, out_of_range};
use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle};
use crate::protocol::{Reply, Request};

pub struct ShardSelectionWithShadow {
    pub normal: ShardSelection,
    pub shadows: Vec<RouteRef>,
    pub shard_to_shadow: HashMap<u32, usize>,
    /// Per shadow route: the percentage of its shard's requests it gets a copy of.
    pub percent: Vec<u16>,
    pub rng: Rng,
}

impl ShardSelectionWithShadow {
    fn shadow_of(&self, req: &Request) -> Option<usize> {
        key_shard(req).and_then(|s| self.shard_to_shadow.get(&s).copied())
    }
}

impl Route for ShardSelectionWithShadow {
    fn route_name(&self) -> String {
        "selection|key-shard-id|shadow_enabled".into()
    }

    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        self.normal.traverse(req, visit);
        if let Some(i) = self.shadow_of(req) {
            visit(&self.shadows[i], req);
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        if let Some(i) = self.shadow_of(req)
            && self.rng.next() % 100 < u64::from(self.percent[i])
            && req.recording.is_none()
        {
            super::all_async::spawn_to(&self.shadows[i], req);
        }
        self.normal.route(req)
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        // a batched get would skip the shadow copy: only for keys no shadow may take
        match self.shadow_of(req) {
            Some(i) if self.percent[i] > 0 => None,
            _ => self.normal.first_get_target(req),
        }
    }
}

/// mcrouter's share of a shard's requests that its shadow servers get, in percent.
pub fn shadow_percent(servers: usize, shadows: usize, weight: f64) -> u16 {
    // mcrouter: (uint16_t)(100 * shadows * weight) / (servers + shadows)
    let scaled = (100.0 * shadows as f64 * weight).clamp(0.0, f64::from(u16::MAX)) as u16;
    (usize::from(scaled) / (servers + shadows).max(1)) as u16
}

pub const EAGER_SHARD_SELECTION_SHADOW_ROUTE: Handle = Handle {
    name: "EagerShardSelectionShadowRoute",
    build,
    shorthand: None,
    fields: &[
        "pools",
        "children_type",
        "children_settings",
        "out_of_range",
        "shadow_children_type",
        "shadow_children_settings",
        "shadow_weights",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    const HANDLE: &str = "EagerShardSelectionShadowRoute";
    let template = group_template(b, obj, ("children_type", "children_settings"), HANDLE, true)?;
    let shadow_template = group_template(
        b,
        obj,
        ("shadow_children_type", "shadow_children_settings"),
        HANDLE,
        false,
    )?;
    let weight = match obj.get("shadow_weights") {
        None => 1.0,
        Some(v) => v
            .as_f64()
            .filter(|w| *w >= 0.0)
            .ok_or_else(|| format!("{HANDLE}: `shadow_weights` must be a number of at least 0, not {v}"))?,
    };
    let by_shard = shard_servers(b, obj, "shards", HANDLE)?
        .ok_or_else(|| format!("{HANDLE}: every entry of `pools` needs `shards` (in it or in its pool)"))?;
    let servers_of: HashMap<u32, usize> = by_shard.iter().map(|(s, v)| (*s, v.len())).collect();
    let (children, shard_to_child) = group_per_shard(b, &template, by_shard, HANDLE)?;
    let out_of_range = out_of_range(b, obj)?;
    let by_shadow = shard_servers(b, obj, "shadow_shards", HANDLE)?.unwrap_or_default();
    if children.is_empty() && by_shadow.is_empty() {
        b.warnings
            .push(format!("{HANDLE}: no shard has a server: every request gets an error"));
        return Ok(Arc::new(ErrorRoute {
            response: format!("{HANDLE} has an empty list of destinations"),
        }));
    }
    let normal = ShardSelection {
        children,
        shard_to_child,
        out_of_range,
    };
    if by_shadow.is_empty() {
        return Ok(Arc::new(normal));
    }
    let percent_of: HashMap<u32, u16> = by_shadow
        .iter()
        .map(|(s, v)| {
            (
                *s,
                shadow_percent(servers_of.get(s).copied().unwrap_or(0), v.len(), weight),
            )
        })
        .collect();
    let (shadows, shard_to_shadow) = group_per_shard(b, &shadow_template, by_shadow, HANDLE)?;
    let mut percent = vec![0; shadows.len()];
    for (shard, &i) in &shard_to_shadow {
        percent[i] = percent_of[shard];
    }
    Ok(Arc::new(ShardSelectionWithShadow {
        normal,
        shadows,
        shard_to_shadow,
        percent,
        rng: Rng::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn the_shadowed_share_is_mcrouters_formula() {
        assert_eq!(shadow_percent(1, 1, 1.0), 50);
        assert_eq!(shadow_percent(2, 1, 1.0), 33);
        assert_eq!(shadow_percent(0, 2, 1.0), 100); // a shard only the new layout serves
        assert_eq!(shadow_percent(1, 1, 0.5), 25);
        assert_eq!(shadow_percent(1, 1, 2.0), 100);
        assert_eq!(shadow_percent(3, 1, 0.0), 0);
    }

    #[test]
    fn shadows_get_their_share_and_never_answer() {
        let (normal, other, shadow) = (
            Fake::new("normal", Res::Deleted),
            Fake::new("other", Res::Deleted),
            Fake::new("shadow", Res::RemoteError),
        );
        let route = ShardSelectionWithShadow {
            normal: ShardSelection {
                children: vec![normal.clone(), other.clone()],
                shard_to_child: [(1, 0), (2, 1)].into_iter().collect(),
                out_of_range: Fake::new("oor", Res::LocalError),
            },
            shadows: vec![shadow.clone()],
            shard_to_shadow: [(1, 0)].into_iter().collect(),
            percent: vec![50],
            rng: Rng::new(),
        };
        run(async {
            for i in 0..2000 {
                let r = route.route(&req(Cmd::Delete, &format!("k:1:{i}"))).await;
                assert_eq!(r.res, Res::Deleted);
                route.route(&req(Cmd::Delete, &format!("k:2:{i}"))).await;
            }
            // the background copies run once the routing task yields
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!((normal.count(), other.count()), (2000, 2000));
        let copies = shadow.count();
        assert!((800..1200).contains(&copies), "{copies} of 2000 shadowed");
        assert!(shadow.seen.lock().unwrap().iter().all(|r| r.key.starts_with(b"k:1:")));
    }
}
