//! Building route handles from their config objects: the `Builder` every handle's `build` is
//! given, and what a handle tells it (`Handle`: its config name, its `build`, the fields it reads).
//!
//! The Builder turns a config value into a route: a `"Type|rest"` shorthand, a handle object, the
//! name of a handle built earlier, `"Pool|NAME"` or an inline pool (`build/pools.rs`: pools, their
//! servers and destinations), `"$children_list$"`. It knows handle types only through the
//! `Registry` it is given (`crate::registry`, which sits above every handle), so that the handles,
//! which use the Builder, are not named by it. Errors name the path of the problem.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::context::Context;
use crate::flush::FlushTarget;
use crate::routes::RouteRef;
use crate::server::Server;

mod pools;

/// Builds a handle from its config object (`"Type|rest"` shorthands arrive as objects, see below).
pub type Constructor = fn(&mut Builder, &Map<String, Value>) -> Result<RouteRef, String>;

/// A registry entry: config `type` name, constructor, known fields, and the field that the `rest` of a
/// `"Type|rest"` shorthand fills (e.g. `"PoolRoute|wildcard"` means `{"pool": "wildcard"}`).
pub struct Handle {
    pub name: &'static str,
    pub build: Constructor,
    pub shorthand: Option<&'static str>,
    /// Config fields the handle reads (besides `type` and `name`); others draw a load warning.
    pub fields: &'static [&'static str],
}

/// Builds the list of routes a handle stands for inside a `children` list.
pub type ListConstructor = fn(&mut Builder, &Map<String, Value>) -> Result<Vec<RouteRef>, String>;

/// The handle types a config may name (`crate::registry::REGISTRY`).
pub struct Registry {
    pub handles: &'static [Handle],
    /// Handles that stand for several routes where `children` are listed (ShadowRoute: one per child).
    pub lists: &'static [(&'static str, ListConstructor)],
    /// The load error for a type that is not in `handles`.
    pub unknown: fn(&str) -> String,
}

pub struct Builder<'c> {
    ctx: &'c Arc<Context>,
    registry: &'static Registry,
    pools: Map<String, Value>,
    pool_cache: HashMap<String, Vec<RouteRef>>,
    pub(crate) named: HashMap<String, RouteRef>,
    /// Every handle type built (for tests and the load log line).
    pub types_used: std::collections::BTreeSet<&'static str>,
    /// Fields the router does not understand (mcrouter options it lacks, typos): logged, ignored.
    pub warnings: Vec<String>,
    /// Every server of every pool built so far (named or inline), for `flush_all`; may repeat.
    flush_targets: Vec<FlushTarget>,
    /// Names of `pools` entries built so far.
    built_pools: std::collections::HashSet<String>,
    /// Pools whose `weights` a WeightedCh3 PoolRoute read (the others' are warned about).
    weighted_pools: std::collections::HashSet<String>,
    /// The config's servers by address: the live ones reused (a reload keeps their connections and
    /// TKO state), others new. Nothing outside the config refers to them until it is installed.
    pub(crate) servers: HashMap<String, Arc<Server>>,
    /// The get counters of every pool built (shown in `stats` once the config loads).
    pub(crate) pool_gets: Vec<Arc<crate::stats::PoolCounters>>,
    /// Lists that `"$children_list$"` stands for while a handle is built around them (the
    /// EagerShardSelection routes build one child per shard this way; mcrouter's factory does the same).
    children_lists: Vec<Vec<RouteRef>>,
}

/// The string that stands for the destinations of the shard being built (mcrouter's spelling).
pub const CHILDREN_LIST: &str = "$children_list$";

impl<'c> Builder<'c> {
    pub fn new(ctx: &'c Arc<Context>, registry: &'static Registry, pools: Map<String, Value>) -> Builder<'c> {
        Builder {
            ctx,
            registry,
            pools,
            pool_cache: HashMap::new(),
            named: HashMap::new(),
            types_used: Default::default(),
            warnings: Vec::new(),
            flush_targets: Vec::new(),
            built_pools: Default::default(),
            weighted_pools: Default::default(),
            servers: HashMap::new(),
            pool_gets: Vec::new(),
            children_lists: Vec::new(),
        }
    }

    /// Build with `"$children_list$"` standing for `list` (in `children`, or as one route).
    pub fn with_children_list<T>(&mut self, list: Vec<RouteRef>, build: impl FnOnce(&mut Self) -> T) -> T {
        self.children_lists.push(list);
        let out = build(self);
        self.children_lists.pop();
        out
    }

    fn children_list(&self) -> Result<Vec<RouteRef>, String> {
        self.children_lists
            .last()
            .cloned()
            .ok_or_else(|| format!("`{CHILDREN_LIST}` outside the children settings of an EagerShardSelection route"))
    }

    /// One route from a list of destinations: as in mcrouter, only a list of exactly one is.
    fn one_of(mut dests: Vec<RouteRef>, what: &str, hint: &str) -> Result<RouteRef, String> {
        if dests.len() != 1 {
            return Err(format!(
                "{what} is {} destinations where one route is expected ({hint})",
                dests.len()
            ));
        }
        Ok(dests.remove(0))
    }

    /// The handle named `ty`, if the registry has one.
    pub fn handle(&self, ty: &str) -> Option<&'static Handle> {
        self.registry.handles.iter().find(|h| h.name == ty)
    }

    pub fn ctx(&self) -> &Arc<Context> {
        self.ctx
    }

    /// Build one route handle.
    pub fn route(&mut self, v: &Value) -> Result<RouteRef, String> {
        match v {
            Value::String(s) => {
                if let Some((ty, rest)) = s.split_once('|') {
                    if ty == "Pool" {
                        // as in mcrouter: a list of destinations stands for one route only
                        // when it has exactly one
                        let dests = self.pool(&Value::String(rest.to_string()))?;
                        return Self::one_of(
                            dests,
                            &format!("`{s}`"),
                            &format!("use `PoolRoute|{rest}` to hash over them, or put it in `children`"),
                        );
                    }
                    let h = self
                        .handle(ty)
                        .ok_or_else(|| format!("{} in `{s}`", (self.registry.unknown)(ty)))?;
                    let mut obj = Map::new();
                    obj.insert("type".into(), Value::String(ty.to_string()));
                    if let Some(field) = h.shorthand {
                        obj.insert(field.into(), Value::String(rest.to_string()));
                    }
                    self.types_used.insert(h.name);
                    (h.build)(self, &obj).map_err(|e| format!("{s}: {e}"))
                } else if s == CHILDREN_LIST {
                    let list = self.children_list()?;
                    Self::one_of(list, &format!("`{CHILDREN_LIST}`"), "put it in `children`")
                } else if let Some(r) = self.named.get(s) {
                    Ok(r.clone())
                } else if let Some(h) = self.handle(s) {
                    self.types_used.insert(h.name);
                    (h.build)(self, &Map::new()).map_err(|e| format!("{s}: {e}"))
                } else {
                    Err(format!("`{s}` is neither a route handle type nor a named handle"))
                }
            }
            Value::Object(obj) => {
                let ty = match obj.get("type") {
                    Some(Value::String(t)) => t.as_str(),
                    Some(_) => return Err("`type` must be a string".into()),
                    None if obj.contains_key("policies") || obj.contains_key("wildcard") => "PrefixSelectorRoute",
                    None => {
                        return Err(format!("route handle object without `type`: {}", short(v)));
                    }
                };
                if is_pool_type(ty) {
                    // an inline pool where one route is expected: as `"Pool|NAME"`
                    let dests = self.pool(v)?;
                    return Self::one_of(
                        dests,
                        "an inline `Pool`",
                        "put it in `children`, or in a PoolRoute's `pool`",
                    );
                }
                let h = self.handle(ty).ok_or_else(|| (self.registry.unknown)(ty))?;
                self.types_used.insert(h.name);
                let r = (h.build)(self, obj).map_err(|e| if e.starts_with(ty) { e } else { format!("{ty}: {e}") })?;
                self.warn_unknown_fields(h.name, obj);
                if let Some(Value::String(name)) = obj.get("name") {
                    self.named.insert(name.clone(), r.clone());
                }
                Ok(r)
            }
            other => Err(format!(
                "a route handle must be an object or a string, not {}",
                short(other)
            )),
        }
    }

    /// Fields of handle `ty` it does not read (mcrouter options it lacks, typos): logged.
    fn warn_unknown_fields(&mut self, ty: &str, obj: &Map<String, Value>) {
        let Some(h) = self.handle(ty) else { return };
        for field in obj.keys() {
            if field != "type" && field != "name" && !h.fields.contains(&field.as_str()) {
                self.warnings.push(format!(
                    "{ty}: unknown field `{field}` ignored (knows: {})",
                    h.fields.join(", ")
                ));
            }
        }
    }

    /// The handle type of `item` if it stands for a list of routes in `children`, and its builder.
    fn list_constructor(&self, item: &Value) -> Option<(&'static str, ListConstructor)> {
        let ty = item.get("type").and_then(Value::as_str)?;
        self.registry.lists.iter().find(|(name, _)| *name == ty).copied()
    }

    /// A `children` value: a list of handles, `"Pool|NAME"`, or a single handle.
    pub fn children(&mut self, v: &Value) -> Result<Vec<RouteRef>, String> {
        match v {
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    match item.as_str().and_then(|s| s.strip_prefix("Pool|")) {
                        // a pool inside a list stands for all its destinations, in order
                        Some(name) => out.extend(self.pool(&Value::String(name.to_string()))?),
                        // so do an inline `{"type": "Pool", …}` and `$children_list$`
                        None if item.get("type").and_then(Value::as_str).is_some_and(is_pool_type) => {
                            out.extend(self.pool(item)?)
                        }
                        None if item.as_str() == Some(CHILDREN_LIST) => out.extend(self.children_list()?),
                        // so does a ShadowRoute (one route per child)
                        None if self.list_constructor(item).is_some() => {
                            let obj = item.as_object().expect("an object has a type");
                            let (ty, build_list) = self.list_constructor(item).expect("checked");
                            self.types_used.insert(ty);
                            let list = build_list(self, obj)?;
                            self.warn_unknown_fields(ty, obj);
                            out.extend(list);
                        }
                        None => out.push(self.route(item)?),
                    }
                }
                Ok(out)
            }
            Value::String(s) if s.starts_with("Pool|") => self.pool(&Value::String(s["Pool|".len()..].to_string())),
            Value::String(s) if s == CHILDREN_LIST => self.children_list(),
            Value::Object(obj) if obj.get("type").and_then(Value::as_str).is_some_and(is_pool_type) => self.pool(v),
            // one handle is a list of one (a ShadowRoute there stands for all its routes)
            other => self.children(&Value::Array(vec![other.clone()])),
        }
    }
}

/// `"Pool"` (or mcrouter's lower-case `"pool"`): an inline pool object's type.
fn is_pool_type(t: &str) -> bool {
    t == "Pool" || t == "pool"
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 { format!("{}…", &s[..80]) } else { s }
}

// ---- config field helpers shared by constructors ----

pub fn get_i64(obj: &Map<String, Value>, field: &str) -> Result<Option<i64>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| format!("`{field}` must be an integer")),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|_| format!("`{field}` must be an integer")),
        Some(_) => Err(format!("`{field}` must be an integer")),
    }
}

pub fn get_str<'a>(obj: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("`{field}` must be a string")),
    }
}

pub fn required<'a>(obj: &'a Map<String, Value>, field: &str, handle: &str) -> Result<&'a Value, String> {
    obj.get(field).ok_or_else(|| format!("{handle}: missing `{field}`"))
}
