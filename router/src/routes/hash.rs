//! HashRoute: picks one child by hashing the key (Ch3 by default, or Crc32), with an optional salt.
//!
//! Hashes the routing key: the decoded bytes for base64 meta keys, after any routing prefix is
//! stripped, so the same key lands on the same server whichever way it is sent.

use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_str, required};
use crate::hash::HashFunc;
use crate::protocol::{Reply, Request};

pub struct HashRoute {
    pub children: Vec<RouteRef>,
    pub func: HashFunc,
    pub salt: Vec<u8>,
}

impl Route for HashRoute {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        let i = self.func.pick(&req.routing_key(), &self.salt, self.children.len());
        visit(&self.children[i], req);
    }

    fn route_name(&self) -> String {
        let salt = if self.salt.is_empty() {
            String::new()
        } else {
            format!("|salt={}", String::from_utf8_lossy(&self.salt))
        };
        format!("hash|{}{salt}", self.func.name())
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        let i = self.func.pick(&req.routing_key(), &self.salt, self.children.len());
        self.children[i].route(req)
    }

    fn first_get_target(&self, req: &Request) -> Option<&crate::routes::destination::Destination> {
        let i = self.func.pick(&req.routing_key(), &self.salt, self.children.len());
        self.children[i].first_get_target(req)
    }

    fn first_server(&self, req: &Request) -> Option<&crate::server::Server> {
        let i = self.func.pick(&req.routing_key(), &self.salt, self.children.len());
        self.children[i].first_server(req)
    }
}

/// `hash_settings` of a route that hashes over the servers of `pool` (`n` of them), with the
/// pool's own `weights` as the fallback; the pool's weights are marked used when WeightedCh3 reads
/// them.
pub fn pool_hash_settings(
    b: &mut Builder,
    obj: &Map<String, Value>,
    handle: &str,
    pool: &Value,
    n: usize,
) -> Result<(HashFunc, Vec<u8>), String> {
    let pool_weights = b.pool_field(pool, "weights");
    let (func, salt) = hash_settings(b, obj, handle, pool_weights.as_ref(), n)?;
    if pool_weights.is_some() && matches!(func, HashFunc::WeightedCh3(_)) {
        b.weights_used(pool);
    }
    Ok((func, salt))
}

/// `hash_func`/`salt`/`weights` from the handle itself or from a `hash` field (string or
/// object); `pool_weights` are the `weights` of the pool a PoolRoute hashes over. WeightedCh3
/// needs weights (0.0 to 1.0); missing ones count as 0.5 and extra ones are ignored, as in
/// mcrouter, with a load warning. `n` is the number of destinations.
pub fn hash_settings(
    b: &mut Builder,
    obj: &Map<String, Value>,
    handle: &str,
    pool_weights: Option<&Value>,
    n: usize,
) -> Result<(HashFunc, Vec<u8>), String> {
    let mut func_name = get_str(obj, "hash_func")?.map(str::to_string);
    let mut salt = get_str(obj, "salt")?.unwrap_or("").as_bytes().to_vec();
    let mut weights = obj.get("weights");
    match obj.get("hash") {
        Some(Value::String(s)) => func_name = Some(s.clone()),
        Some(Value::Object(h)) => {
            if let Some(f) = get_str(h, "hash_func")? {
                func_name = Some(f.to_string());
            }
            if let Some(s) = get_str(h, "salt")? {
                salt = s.as_bytes().to_vec();
            }
            weights = h.get("weights").or(weights);
        }
        _ => {}
    }
    let weights = weights.or(pool_weights);
    let func = match func_name {
        None => HashFunc::Ch3,
        Some(name) => HashFunc::from_name(&name)
            .ok_or_else(|| format!("unknown hash_func `{name}` (Ch3, Crc32, WeightedCh3, ConstShard)"))?,
    };
    if let HashFunc::WeightedCh3(_) = func {
        let list = weights
            .ok_or_else(|| format!("{handle}: hash_func WeightedCh3 needs `weights` (one per server, 0.0 to 1.0)"))?
            .as_array()
            .ok_or_else(|| format!("{handle}: `weights` must be a list of numbers"))?;
        let mut w = Vec::with_capacity(n);
        for v in list.iter().take(n) {
            match v.as_f64() {
                Some(x) if (0.0..=1.0).contains(&x) => w.push(x),
                _ => {
                    return Err(format!(
                        "{handle}: every weight must be a number from 0.0 to 1.0, not {v}"
                    ));
                }
            }
        }
        if list.len() < n {
            b.warnings.push(format!(
                "{handle}: {} weights for {n} servers: the missing ones count as 0.5 (as in mcrouter)",
                list.len()
            ));
        } else if list.len() > n {
            b.warnings.push(format!(
                "{handle}: {} weights for {n} servers: the extra ones are ignored",
                list.len()
            ));
        }
        w.resize(n, 0.5);
        return Ok((HashFunc::WeightedCh3(w), salt));
    }
    if weights.is_some() && pool_weights.is_none() {
        b.warnings.push(format!(
            "{handle}: `weights` ignored (only hash_func WeightedCh3 reads them)"
        ));
    }
    Ok((func, salt))
}

/// mcrouter's hash routes over no children: an ErrorRoute (`SERVER_ERROR HashRoute with empty
/// children, name: NAME`), or a NullRoute with `error_on_empty: false` on the pool; said at load.
pub fn over_nothing(b: &mut Builder, handle: &str, name: &str, error_on_empty: bool) -> RouteRef {
    b.warnings.push(format!(
        "{handle}: `{name}` has no servers: every request gets {}",
        if error_on_empty {
            "an error"
        } else {
            "NullRoute's answer"
        }
    ));
    if error_on_empty {
        std::sync::Arc::new(super::error::ErrorRoute {
            response: format!("HashRoute with empty children, name: {name}"),
        })
    } else {
        std::sync::Arc::new(super::null::Null)
    }
}

/// mcrouter's `hash_func` `Latest` and `LoadBalancer` are not hashes: they make a LatestRoute or a
/// LoadBalancerRoute over the children, with the `hash` object's other fields as its settings.
pub fn as_route(b: &mut Builder, obj: &Map<String, Value>, children: &[RouteRef]) -> Result<Option<RouteRef>, String> {
    let top = get_str(obj, "hash_func")?;
    let (name, settings) = match obj.get("hash") {
        Some(Value::String(f)) => (f.as_str(), Map::new()),
        Some(Value::Object(h)) if h.contains_key("hash_func") => {
            let mut settings = h.clone();
            settings.remove("hash_func");
            (get_str(h, "hash_func")?.unwrap_or_default(), settings)
        }
        _ => match top {
            Some(f) => (f, Map::new()),
            None => return Ok(None),
        },
    };
    let ty = match name {
        "Latest" => "LatestRoute",
        "LoadBalancer" => "LoadBalancerRoute",
        _ => return Ok(None),
    };
    let mut template = settings;
    template.insert("type".into(), Value::String(ty.into()));
    template.insert("children".into(), Value::String(crate::build::CHILDREN_LIST.into()));
    let template = Value::Object(template);
    b.with_children_list(children.to_vec(), |b| b.route(&template))
        .map(Some)
}

pub const HASH_ROUTE: Handle = Handle {
    name: "HashRoute",
    build,
    shorthand: Some("children"),
    fields: &["children", "hash", "hash_func", "salt", "weights"],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let children = b.children(required(obj, "children", "HashRoute")?)?;
    if children.is_empty() {
        let name = get_str(obj, "name")?.unwrap_or("").to_string();
        return Ok(over_nothing(b, "HashRoute", &name, true));
    }
    if let Some(r) = as_route(b, obj, &children)? {
        return Ok(r);
    }
    let (func, salt) = hash_settings(b, obj, "HashRoute", None, children.len())?;
    Ok(std::sync::Arc::new(HashRoute { children, func, salt }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Cmd, Res};
    use crate::routes::testing::*;

    #[test]
    fn spreads_and_is_stable() {
        let fakes: Vec<_> = (0..4).map(|_| Fake::new("x", Res::Stored)).collect();
        let route = HashRoute {
            children: fakes.iter().map(|f| f.clone() as RouteRef).collect(),
            func: HashFunc::Ch3,
            salt: vec![],
        };
        run(async {
            for i in 0..4000 {
                route.route(&req(Cmd::Get, &format!("key{i}"))).await;
            }
        });
        for f in &fakes {
            assert!(f.count() > 800 && f.count() < 1200, "{}", f.count());
        }
        let k = req(Cmd::Get, "key1");
        assert_eq!(
            HashFunc::Ch3.pick(&k.routing_key(), b"", 4),
            HashFunc::Ch3.pick(b"key1", b"", 4)
        );
    }
}
