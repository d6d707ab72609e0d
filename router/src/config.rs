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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::context::Context;
use crate::flush::FlushTarget;
use crate::protocol::{Reply, Request, Res};
use crate::routes::destination::Destination;
use crate::routes::{RouteRef, get_i64, lookup};
use crate::server::Server;
use crate::stats::RouteCounters;

pub struct Builder<'c> {
    ctx: &'c Arc<Context>,
    pools: Map<String, Value>,
    pool_cache: HashMap<String, Vec<RouteRef>>,
    named: HashMap<String, RouteRef>,
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
    servers: HashMap<String, Arc<Server>>,
    /// The get counters of every pool built (shown in `stats` once the config loads).
    pool_gets: Vec<Arc<crate::stats::PoolCounters>>,
    /// Lists that `"$children_list$"` stands for while a handle is built around them (the
    /// EagerShardSelection routes build one child per shard this way; mcrouter's factory does the same).
    children_lists: Vec<Vec<RouteRef>>,
}

/// The string that stands for the destinations of the shard being built (mcrouter's spelling).
pub const CHILDREN_LIST: &str = "$children_list$";

impl<'c> Builder<'c> {
    pub fn new(ctx: &'c Arc<Context>, pools: Map<String, Value>) -> Builder<'c> {
        Builder {
            ctx,
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

    /// The config's server at `addr`, over TLS or not (a server is one connection: the same
    /// address cannot be both in one config; a reload that changes it makes a new server).
    fn server(&mut self, addr: &str, tls: bool) -> Result<Arc<Server>, String> {
        if let Some(s) = self.servers.get(addr) {
            if s.tls != tls {
                return Err(format!(
                    "server {addr} is reached over TLS in one pool and in plaintext in another (`security_mech`)"
                ));
            }
            return Ok(s.clone());
        }
        let s = match self.ctx.live_server(addr) {
            Some(s) if s.tls == tls => s,
            _ => Server::new(addr.to_string(), tls, self.ctx),
        };
        self.servers.insert(addr.to_string(), s.clone());
        Ok(s)
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
                    let h = lookup(ty).ok_or_else(|| format!("{} in `{s}`", crate::routes::unknown_type(ty)))?;
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
                } else if let Some(h) = lookup(s) {
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
                let h = lookup(ty).ok_or_else(|| crate::routes::unknown_type(ty))?;
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
        let Some(h) = lookup(ty) else { return };
        for field in obj.keys() {
            if field != "type" && field != "name" && !h.fields.contains(&field.as_str()) {
                self.warnings.push(format!(
                    "{ty}: unknown field `{field}` ignored (knows: {})",
                    h.fields.join(", ")
                ));
            }
        }
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
                        None if item.get("type").and_then(Value::as_str) == Some("ShadowRoute") => {
                            let obj = item.as_object().expect("an object has a type");
                            self.types_used.insert("ShadowRoute");
                            let list = crate::routes::shadow::build_list(self, obj)?;
                            self.warn_unknown_fields("ShadowRoute", obj);
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

    /// Field `field` of a pool given by name or inline.
    pub fn pool_field(&self, v: &Value, field: &str) -> Option<Value> {
        match v {
            Value::String(name) => self.pools.get(name)?.get(field).cloned(),
            Value::Object(obj) => obj.get(field).cloned(),
            _ => None,
        }
    }

    /// A WeightedCh3 route read the `weights` of this pool.
    pub fn weights_used(&mut self, v: &Value) {
        let name = match v {
            Value::String(name) => name.as_str(),
            Value::Object(obj) => obj.get("name").and_then(Value::as_str).unwrap_or("inline"),
            _ => return,
        };
        self.weighted_pools.insert(name.to_string());
    }

    /// The destinations of a pool given by name or inline (`{"name"?, "servers": [...]}`).
    pub fn pool(&mut self, v: &Value) -> Result<Vec<RouteRef>, String> {
        match v {
            Value::String(name) => {
                if let Some(d) = self.pool_cache.get(name) {
                    return Ok(d.clone());
                }
                let def = self
                    .pools
                    .get(name)
                    .cloned()
                    .ok_or_else(|| format!("unknown pool `{name}`"))?;
                let dests = self.build_pool(name, &def)?;
                self.built_pools.insert(name.clone());
                self.pool_cache.insert(name.clone(), dests.clone());
                Ok(dests)
            }
            Value::Object(obj) => {
                let name = obj.get("name").and_then(Value::as_str).unwrap_or("inline").to_string();
                let dests = self.build_pool(&name, v)?;
                if name != "inline" {
                    self.pool_cache.insert(name, dests.clone());
                }
                Ok(dests)
            }
            other => Err(format!("a pool must be a name or an object, not {}", short(other))),
        }
    }

    fn build_pool(&mut self, name: &str, def: &Value) -> Result<Vec<RouteRef>, String> {
        let obj = def
            .as_object()
            .ok_or_else(|| format!("pool `{name}` must be an object"))?;
        let servers = obj
            .get("servers")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("pool `{name}`: `servers` must be a list of \"host:port\""))?;
        self.check_pool_fields(name, obj)?;
        let timeout = match get_i64(obj, "server_timeout").map_err(|e| format!("pool `{name}`: {e}"))? {
            Some(ms) if ms > 0 => Duration::from_millis(ms as u64),
            Some(_) => return Err(format!("pool `{name}`: `server_timeout` must be positive")),
            None => self.ctx.opts.server_timeout,
        };
        let pool_tls = pool_security_mech(name, obj)?;
        let port_override = match get_i64(obj, "port_override").map_err(|e| format!("pool `{name}`: {e}"))? {
            None => None,
            Some(p) => Some(
                u16::try_from(p)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("pool `{name}`: `port_override` must be from 1 to 65535, not {p}"))?,
            ),
        };
        let pool: Arc<str> = Arc::from(name);
        let gets = self.ctx.stats.pool_counters(name);
        self.pool_gets.push(gets.clone());
        let mut dests: Vec<RouteRef> = Vec::with_capacity(servers.len());
        for (index, s) in servers.iter().enumerate() {
            if s.is_object() {
                // as mcrouter: a route handle may stand in a pool's place of a server
                let route = self
                    .route(s)
                    .map_err(|e| format!("pool `{name}`: servers[{index}]: {e}"))?;
                dests.push(route);
                continue;
            }
            let given = s.as_str().ok_or_else(|| {
                format!("pool `{name}`: servers[{index}] must be \"host:port\" or a route handle object, not {s}")
            })?;
            let overridden = port_override.map(|p| with_port(given, p));
            let addr = overridden.as_deref().unwrap_or(given);
            if let Some(p) = server_protocol(addr)
                && !p.eq_ignore_ascii_case("ascii")
            {
                return Err(unsupported_protocol(name, &format!("\"{p}\" (server `{addr}`)")));
            }
            let tls = server_security_mech(addr)
                .map_err(|e| format!("pool `{name}`: server `{addr}`: {e}"))?
                .unwrap_or(pool_tls);
            let addr = normalize_addr(addr).ok_or_else(|| format!("pool `{name}`: bad server address `{addr}`"))?;
            if addr.ends_with(":0") {
                self.warnings.push(format!(
                    "pool `{name}`: server `{addr}` has port 0, where no server listens: every request to it fails"
                ));
            }
            if tls && self.ctx.opts.upstream_tls.is_none() {
                return Err(format!(
                    "pool `{name}`: server {addr} is reached over TLS (`security_mech`), which needs --pem-ca-path (the CA that signed the servers' certificates)"
                ));
            }
            let server = self.server(&addr, tls).map_err(|e| format!("pool `{name}`: {e}"))?;
            self.flush_targets.push(FlushTarget {
                server: server.clone(),
                timeout,
            });
            dests.push(Arc::new(Destination {
                server,
                pool: pool.clone(),
                timeout,
                ctx: self.ctx.clone(),
                index,
                gets: gets.clone(),
            }));
        }
        Ok(dests)
    }

    /// mcrouter's pool fields: `protocol` other than ascii cannot work (rejected); fields the
    /// router cannot honour are warned about, never silently dropped.
    fn check_pool_fields(&mut self, name: &str, obj: &Map<String, Value>) -> Result<(), String> {
        const KNOWS: &[&str] = &[
            "servers",
            "server_timeout",
            "weights",
            "keep_routing_prefix",
            "protocol",
            "connect_timeout",
            "name",
            "security_mech",
            "use_ssl",
            "type",
            // read by the ShardSelection routes (mcrouter keeps a pool's shard map in the pool)
            "shards",
            "shadow_shards",
            // an empty pool: an error (default) or NullRoute's answers (PoolRoute)
            "error_on_empty",
            "port_override",
        ];
        match obj.get("type") {
            None => {}
            Some(Value::String(t)) if is_pool_type(t) => {}
            Some(other) => return Err(format!("pool `{name}`: `type` must be \"Pool\", not {other}")),
        }
        match obj.get("protocol") {
            None => {}
            Some(Value::String(p)) if p.eq_ignore_ascii_case("ascii") => {}
            Some(other) => return Err(unsupported_protocol(name, &other.to_string())),
        }
        match obj.get("keep_routing_prefix") {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => self.warnings.push(format!(
                "pool `{name}`: `keep_routing_prefix: true` is not supported: the routing prefix is stripped before forwarding"
            )),
            Some(other) => return Err(format!("pool `{name}`: `keep_routing_prefix` must be true or false, not {other}")),
        }
        if obj.contains_key("connect_timeout") {
            self.warnings.push(format!(
                "pool `{name}`: `connect_timeout` ignored: --connect-timeout-ms applies (connections are shared by address)"
            ));
        }
        for field in obj.keys() {
            if !KNOWS.contains(&field.as_str()) {
                self.warnings.push(format!(
                    "pool `{name}`: unknown field `{field}` ignored (knows: {})",
                    KNOWS.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Pools with `weights` that no WeightedCh3 PoolRoute reads.
    fn warn_unused_weights(&mut self) {
        let mut unused: Vec<&String> = self
            .pools
            .iter()
            .filter(|(name, def)| def.get("weights").is_some() && !self.weighted_pools.contains(*name))
            .map(|(name, _)| name)
            .collect();
        unused.sort();
        let lines: Vec<String> = unused
            .into_iter()
            .map(|name| {
                format!("pool `{name}`: `weights` ignored (only a PoolRoute with hash_func WeightedCh3 reads them)")
            })
            .collect();
        self.warnings.extend(lines);
    }

    /// The servers `flush_all` goes to: those of every pool of the config, including `pools`
    /// entries no route uses (built here; one that cannot be built is a warning and a `problem`
    /// that fails every flush), each server once with the longest timeout of its pools.
    fn take_flush_targets(&mut self) -> (Vec<FlushTarget>, Vec<String>) {
        let mut problems = Vec::new();
        let unused: Vec<(String, Value)> = self
            .pools
            .iter()
            .filter(|(name, _)| !self.built_pools.contains(*name))
            .map(|(name, def)| (name.clone(), def.clone()))
            .collect();
        for (name, def) in unused {
            if let Err(e) = self.build_pool(&name, &def) {
                self.warnings.push(format!(
                    "{e} (pool used by no route; flush_all will fail until it is fixed)"
                ));
                problems.push(format!("{e} (not flushed)"));
            }
        }
        let mut targets: Vec<FlushTarget> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for t in self.flush_targets.drain(..) {
            match index.get(&t.server.addr) {
                Some(&i) => targets[i].timeout = targets[i].timeout.max(t.timeout),
                None => {
                    index.insert(t.server.addr.clone(), targets.len());
                    targets.push(t);
                }
            }
        }
        (targets, problems)
    }
}

/// `host:port` (an optional mcrouter `:ascii:plain`-style suffix dropped; `[v6]:port` kept).
/// mcrouter's `security_mech` of a pool (`"tls"`, `"plain"`; the older `"use_ssl": true` means
/// tls): does the pool reach its servers over TLS?
fn pool_security_mech(name: &str, obj: &Map<String, Value>) -> Result<bool, String> {
    match (obj.get("security_mech"), obj.get("use_ssl")) {
        (Some(Value::String(m)), _) => security_mech(m).map_err(|e| format!("pool `{name}`: {e}")),
        (Some(other), _) => Err(format!("pool `{name}`: `security_mech` must be a string, not {other}")),
        (None, Some(Value::Bool(b))) => Ok(*b),
        (None, Some(other)) => Err(format!("pool `{name}`: `use_ssl` must be true or false, not {other}")),
        (None, None) => Ok(false),
    }
}

fn security_mech(m: &str) -> Result<bool, String> {
    match m {
        "tls" | "ssl" => Ok(true),
        "plain" | "none" => Ok(false),
        other => Err(format!(
            "security_mech `{other}` is not supported (the router knows \"tls\" and \"plain\")"
        )),
    }
}

/// `protocol: caret`/`thrift` (mcrouter's binary protocols) are out of scope: say so.
fn unsupported_protocol(pool: &str, protocol: &str) -> String {
    format!(
        "pool `{pool}`: protocol {protocol} is not supported (the router speaks memcached's ascii protocol only; \
         caret and thrift are out of scope, docs/router.md)"
    )
}

/// A server entry with its port set to `port` (mcrouter's `port_override`): `host` and `host:1`
/// both become `host:port`; a `:protocol:mech` suffix stays.
fn with_port(addr: &str, port: u16) -> String {
    let (host, rest) = match addr.strip_prefix('[') {
        Some(s) => match s.split_once(']') {
            Some((h, r)) => (format!("[{h}]"), r.strip_prefix(':').unwrap_or(r)),
            None => return addr.to_string(),
        },
        None => match addr.split_once(':') {
            Some((h, r)) => (h.to_string(), r),
            None => (addr.to_string(), ""),
        },
    };
    match rest.split_once(':') {
        Some((_, suffix)) => format!("{host}:{port}:{suffix}"),
        None => format!("{host}:{port}"),
    }
}

/// `"Pool"` (or mcrouter's lower-case `"pool"`): an inline pool object's type.
fn is_pool_type(t: &str) -> bool {
    t == "Pool" || t == "pool"
}

/// What follows the host in a server entry, mcrouter's `host:port:protocol:mech` (`port:…`).
fn after_host(addr: &str) -> &str {
    match addr.strip_prefix('[') {
        Some(s) => s.split_once("]:").map_or("", |(_, r)| r),
        None => addr.split_once(':').map_or("", |(_, r)| r),
    }
}

/// A server entry's own protocol (`host:port:protocol[:mech]`), if it has one.
fn server_protocol(addr: &str) -> Option<&str> {
    after_host(addr).split(':').nth(1).filter(|p| !p.is_empty())
}

/// A server entry's own security mech, mcrouter's `host:port:protocol:mech` form (e.g.
/// `127.0.0.1:11211:ascii:ssl`), if it has one.
fn server_security_mech(addr: &str) -> Result<Option<bool>, String> {
    match after_host(addr).split(':').nth(2) {
        None | Some("") => Ok(None),
        Some(m) => security_mech(m).map(Some),
    }
}

fn normalize_addr(addr: &str) -> Option<String> {
    let (host, rest) = if let Some(stripped) = addr.strip_prefix('[') {
        let (h, r) = stripped.split_once("]:")?;
        (format!("[{h}]"), r)
    } else {
        let (h, r) = addr.split_once(':')?;
        (h.to_string(), r)
    };
    let port = rest.split(':').next()?;
    // any 16-bit port, as mcrouter: port 0 is legal (warned at load: nothing listens there)
    let port: u16 = port.parse().ok()?;
    if host.is_empty() {
        return None;
    }
    Some(format!("{host}:{port}"))
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 { format!("{}…", &s[..80]) } else { s }
}

/// A route tree with the request counters of its label.
type Labeled = (RouteRef, Arc<RouteCounters>);

enum Root {
    Single(Labeled),
    Aliased {
        aliases: Vec<(Vec<u8>, Labeled)>,
        default: Labeled,
    },
}

/// A loaded config: the route tree plus routing-prefix selection.
pub struct RouterConfig {
    root: Root,
    /// Where requests that match no route are counted (the stats' `none` route).
    unroutable: Arc<RouteCounters>,
    pub types_used: Vec<&'static str>,
    /// Config fields that were ignored, one line each, for the load log.
    pub warnings: Vec<String>,
    pub pools: usize,
    /// Every server of every pool, for `flush_all` (see `crate::flush`).
    pub flush_targets: Vec<FlushTarget>,
    /// Pools that could not be built (used by no route): each fails every `flush_all`.
    pub flush_problems: Vec<String>,
    /// Every server the config uses, once (installed in the `Context` when the config serves).
    pub servers: Vec<Arc<Server>>,
    /// MD5 of the config text, hex (`__mcrouter__.config_md5_digest`).
    pub md5: String,
    /// When it was built (`__mcrouter__.config_age`).
    pub loaded_at: std::time::Instant,
}

/// The routing prefix of a key (`/region/cluster/`), if it has one.
fn routing_prefix(key: &[u8]) -> Option<usize> {
    if key.first() != Some(&b'/') {
        return None;
    }
    let second = key[1..].iter().position(|&b| b == b'/')? + 1;
    let third = key[second + 1..].iter().position(|&b| b == b'/')? + second + 1;
    (second > 1 && third > second + 1).then_some(third + 1)
}

impl RouterConfig {
    /// Choose the tree for `req`, stripping a matched routing prefix from its key, and count the
    /// request on the chosen route (or as unroutable).
    pub fn select(&self, req: &mut Request) -> Result<(&RouteRef, &Arc<RouteCounters>), Reply> {
        match self.choose(req) {
            Ok((route, counters)) => {
                counters.count_cmd(req.cmd);
                Ok((route, counters))
            }
            Err(reply) => {
                self.unroutable.count_cmd(req.cmd);
                Err(reply)
            }
        }
    }

    /// The tree for `req` (its routing prefix stripped), counting nothing: admin requests.
    pub fn route_for(&self, req: &mut Request) -> Result<&RouteRef, Reply> {
        self.choose(req).map(|(route, _)| route)
    }

    fn choose(&self, req: &mut Request) -> Result<&Labeled, Reply> {
        match &self.root {
            Root::Single(r) => Ok(r),
            Root::Aliased { aliases, default } => {
                if req.base64_key {
                    return Ok(default);
                }
                let Some(len) = routing_prefix(&req.key) else {
                    return Ok(default);
                };
                let prefix = &req.key[..len];
                match aliases.iter().find(|(a, _)| a.as_slice() == prefix) {
                    Some((_, r)) => {
                        req.key = req.key.slice(len..);
                        if req.key.is_empty() {
                            return Err(Reply::error(Res::ClientError, "bad command line format"));
                        }
                        Ok(r)
                    }
                    None => Err(Reply::error(Res::ClientError, "no route for this routing prefix")),
                }
            }
        }
    }
}

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
    let mut b = Builder::new(ctx, pools);
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
mod tests {
    use super::*;
    use crate::options::Options;
    use crate::protocol::Cmd;
    use crate::testing::{req, run};

    fn ctx() -> Arc<Context> {
        Context::new(Options::default(), None)
    }

    #[test]
    fn a_server_on_port_0_loads_warned_as_one_nothing_can_answer() {
        // mcrouter's test_probe_timeout reloads to this config (mcrouter takes any 16-bit port)
        run(async {
            let cfg = load(
                &ctx(),
                r#"{"pools": {"foo": {"servers": ["localhost:0"]}}, "route": "PoolRoute|foo"}"#,
                None,
            )
            .unwrap();
            assert_eq!(
                cfg.warnings,
                ["pool `foo`: server `localhost:0` has port 0, where no server listens: every request to it fails"]
            );
        });
    }

    #[test]
    fn every_registered_handle_loads() {
        run(async {
            let c = ctx();
            let text = r#"{
              "pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "server_timeout": 200},
                        "b": {"servers": ["127.0.0.1:3"]}},
              "named_handles": [{"name": "gutter", "type": "PoolRoute", "pool": "b"}],
              "route": {"type": "PrefixSelectorRoute", "policies": {
                  "h:": {"type": "HashRoute", "children": "Pool|a", "hash_func": "Crc32", "salt": "x"},
                  "s:": {"type": "AllSyncRoute", "children": "Pool|a"},
                  "as:": {"type": "AllAsyncRoute", "children": ["PoolRoute|a", "gutter"]},
                  "ai:": {"type": "AllInitialRoute", "children": "Pool|a"},
                  "am:": {"type": "AllMajorityRoute", "children": "Pool|a"},
                  "f:": {"type": "FailoverRoute", "children": ["PoolRoute|a", "gutter"]},
                  "mf:": {"type": "MissFailoverRoute", "children": ["PoolRoute|a", "PoolRoute|b"]},
                  "w:": {"type": "WarmUpRoute", "cold": "PoolRoute|a", "warm": "PoolRoute|b", "exptime": 30},
                  "o:": {"type": "OperationSelectorRoute", "operation_policies": {"delete": "NullRoute"},
                         "default_policy": {"type": "PoolRoute", "pool": {"name": "inl", "servers": ["127.0.0.1:4"]}}},
                  "m:": {"type": "ModifyExptimeRoute", "target": "PoolRoute|a", "exptime": 10, "action": "min"},
                  "tl:": {"type": "TransparentLeaseRoute", "target": "PoolRoute|a", "lease_ttl": 5},
                  "e:": "ErrorRoute|fenced",
                  "n:": "NullRoute",
                  "af:": "AllFastestRoute|Pool|a",
                  "r:": {"type": "RandomRoute", "children": ["Pool|a", "gutter"]},
                  "la:": {"type": "LatestRoute", "children": "Pool|a", "failover_count": 2},
                  "lb:": {"type": "LoadBalancerRoute", "children": "Pool|a", "salt": "s"},
                  "sf:": "SaltedFailoverRoute|a",
                  "sh:": {"type": "AllSyncRoute", "children": [
                      {"type": "ShadowRoute", "children": "Pool|a",
                       "shadows": [{"target": "PoolRoute|b", "index_range": [0, 0], "key_fraction_range": [0, 0.5]}]}]},
                  "sh1:": {"type": "ShadowRoute", "children": ["PoolRoute|a"], "shadows": [{"target": "gutter"}]},
                  "mi:": {"type": "MigrateRoute", "from": "PoolRoute|a", "to": "PoolRoute|b", "start_time": 1700000000},
                  "l1:": {"type": "L1L2CacheRoute", "l1": "PoolRoute|b", "l2": "PoolRoute|a", "upgradingL1Exptime": 10},
                  "li:": {"type": "LatencyInjectionRoute", "child": "PoolRoute|a", "before_latency_ms": 1},
                  "mk:": {"type": "ModifyKeyRoute", "target": "PoolRoute|a", "ensure_key_prefix": "p:"},
                  "dn:": "DevNullRoute",
                  "bh:": {"type": "BlackholeRoute", "default": "PoolRoute|a", "policies": {}},
                  "ss:": {"type": "ShardSelectionRoute", "pool": "a", "shards": [[1], "2,3"]},
                  "es:": {"type": "EagerShardSelectionRoute", "children_type": "LatestRoute", "children_settings": {},
                          "pools": [{"pool": "a", "shards": [[1], [2]]}]},
                  "ess:": {"type": "EagerShardSelectionShadowRoute", "children_type": "LoadBalancerRoute",
                           "children_settings": {}, "shadow_children_type": "LatestRoute", "shadow_children_settings": {},
                           "pools": [{"pool": "a", "shards": [[1], [2]], "shadow_shards": [[2], [1]]}]},
                  "di:": {"type": "DistributionRoute", "child": "PoolRoute|a"},
                  "ls:": {"type": "L1L2SizeSplitRoute", "l1": "PoolRoute|b", "l2": "PoolRoute|a", "threshold": 100},
                  "hs:": {"type": "HashStopAllowListRoute", "target": "PoolRoute|a", "prefixes": ["hs:"]},
                  "mb:": {"type": "McBucketRoute", "total_buckets": 10, "bucketization_keyspace": "k",
                          "target": {"type": "PoolRoute", "pool": "a", "useBucketHashSelector": true}},
                  "rg:": {"type": "RoutingGroupRoute", "routing_group_policies": {"delete_like": "PoolRoute|a"}},
                  "pp:": {"type": "PrefixPolicyRoute", "default_policy": "PoolRoute|a"},
                  "hi:": "HostIdRoute|Pool|a"},
                "wildcard": {"type": "FailoverWithExptimeRoute", "normal": "PoolRoute|a",
                             "failover": ["gutter"], "failover_exptime": 10}}
            }"#;
            let cfg = load(&c, text, None).unwrap();
            let expected: std::collections::BTreeSet<&str> = crate::routes::REGISTRY.iter().map(|h| h.name).collect();
            let used: std::collections::BTreeSet<&str> = cfg.types_used.iter().copied().collect();
            assert_eq!(used, expected);
            // Servers are shared by address: 4 distinct, live once the config serves.
            assert_eq!(cfg.servers.len(), 4);
            assert!(c.all_servers().is_empty());
            c.install(&cfg.servers);
            assert_eq!(c.all_servers().len(), 4);
        });
    }

    #[test]
    fn a_rejected_config_leaves_no_server_behind_and_a_reload_retires_removed_ones() {
        run(async {
            let c = ctx();
            let first = load(
                &c,
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]}}, "route": "PoolRoute|p"}"#,
                None,
            )
            .unwrap();
            let shared = crate::shared::Shared::new(c.clone(), first);
            let before: Vec<String> = {
                let mut a: Vec<String> = c.all_servers().iter().map(|s| s.addr.clone()).collect();
                a.sort();
                a
            };
            assert_eq!(before, ["127.0.0.1:1", "127.0.0.1:2"]);
            // fails after building pool `p` with a third server: none of it stays
            let bad = r#"{"pools": {"p": {"servers": ["127.0.0.1:3"]}},
                         "route": {"type": "FailoverRoute", "children": ["PoolRoute|p", "PoolRoute|nope"]}}"#;
            assert!(load(&c, bad, None).is_err());
            let mut now: Vec<String> = c.all_servers().iter().map(|s| s.addr.clone()).collect();
            now.sort();
            assert_eq!(now, before);
            // a reload keeps the server it still uses (same object: connection, TKO state) and drops the other
            let kept = c.live_server("127.0.0.1:1").unwrap();
            let next = load(
                &c,
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1"]}}, "route": "PoolRoute|p"}"#,
                None,
            )
            .unwrap();
            shared.replace(next);
            let live = c.all_servers();
            assert_eq!(live.len(), 1);
            assert!(Arc::ptr_eq(&live[0], &kept));
        });
    }

    #[test]
    fn errors_say_why() {
        run(async {
            let c = ctx();
            let cases = [
                ("{", "invalid JSON"),
                (r#"{"pools": {}}"#, "neither"),
                (r#"{"route": "PoolRoute|nope"}"#, "unknown pool `nope`"),
                (
                    r#"{"route": {"type": "BogusRoute"}}"#,
                    "unknown route handle type `BogusRoute`: not supported by squeal-router (docs/router.md lists the handles it supports)",
                ),
                (
                    r#"{"route": {"type": "KeyParseRoute", "target": "NullRoute"}}"#,
                    "mcrouter's route handle `KeyParseRoute` is not supported by squeal-router (it chooses the part of the key a McBucketRoute below hashes",
                ),
                (
                    r#"{"route": {"type": "FailoverRoute", "children": ["SRRoute|x"]}}"#,
                    "mcrouter's route handle `SRRoute` is not supported by squeal-router (it is Meta's service-router lookup; docs/router.md) in `SRRoute|x`",
                ),
                (
                    r#"{"pools": {"a": {"servers": ["nohost"]}}, "route": "PoolRoute|a"}"#,
                    "bad server address",
                ),
                (r#"{"route": "NullRoute", "routes": []}"#, "both"),
                (
                    r#"{"route": {"type": "OperationSelectorRoute", "operation_policies": {"frob": "NullRoute"}}}"#,
                    "unknown operation",
                ),
                (
                    r#"{"route": {"type": "L1L2CacheRoute", "l1": "NullRoute", "l2": "NullRoute"}}"#,
                    "L1L2CacheRoute: missing `upgradingL1Exptime`",
                ),
                (
                    r#"{"route": {"type": "LatencyInjectionRoute", "child": "NullRoute"}}"#,
                    "LatencyInjectionRoute: give one of before_latency_ms",
                ),
                (
                    r#"{"route": {"type": "ModifyKeyRoute", "target": "NullRoute", "replace_key_prefix": "a", "modify_inplace": true}}"#,
                    "ModifyKeyRoute: `replace_key_prefix` and `modify_inplace` cannot be used together",
                ),
                (
                    r#"{"route": {"type": "ShadowRoute", "children": ["NullRoute", "NullRoute"], "shadows": []}}"#,
                    "ShadowRoute: 2 children where one route is expected",
                ),
                (
                    r#"{"route": {"type": "ShadowRoute", "children": ["NullRoute"], "shadows": [], "shadow_policy": "x"}}"#,
                    "ShadowRoute: shadow_policy \"x\" is not supported",
                ),
                (
                    r#"{"route": {"type": "MigrateRoute", "from": "NullRoute", "to": "NullRoute"}}"#,
                    "MigrateRoute: missing `start_time`",
                ),
                (
                    r#"{"route": {"type": "LatestRoute", "children": ["NullRoute"], "failover_count": 0}}"#,
                    "LatestRoute: `failover_count` must be at least 1",
                ),
                (
                    r#"{"route": {"type": "BlackholeRoute", "default": "NullRoute"}}"#,
                    "BlackholeRoute: missing `policies`",
                ),
            ];
            for (text, want) in cases {
                let err = load(&c, text, None).err().unwrap_or_else(|| panic!("{text} loaded"));
                assert!(err.contains(want), "{text}: {err}");
            }
        });
    }

    #[test]
    fn routing_prefix_aliases_strip() {
        run(async {
            let c = ctx();
            let text = r#"{"routes": [{"aliases": ["/east/a/"], "route": "NullRoute"},
                                      {"aliases": ["/west/b/"], "route": "ErrorRoute|west"}]}"#;
            let cfg = load(&c, text, None).unwrap();
            let mut r = req(Cmd::Get, "/west/b/user:1");
            let route = cfg.select(&mut r).ok().unwrap().0;
            assert_eq!(&r.key[..], b"user:1");
            assert_eq!(route.route(&r).await.res, Res::LocalError);
            let mut r = req(Cmd::Get, "user:1");
            assert_eq!(cfg.select(&mut r).ok().unwrap().0.route(&r).await.res, Res::Miss);
            let mut r = req(Cmd::Get, "/north/x/k");
            assert!(cfg.select(&mut r).is_err());
            assert_eq!(routing_prefix(b"/a/b/c"), Some(5));
            assert_eq!(routing_prefix(b"/ab"), None);
            assert_eq!(routing_prefix(b"//b/c"), None);
        });
    }

    #[test]
    fn requests_count_on_their_route_across_reloads() {
        run(async {
            let c = ctx();
            let text = r#"{"routes": [{"aliases": ["/east/a/"], "route": "NullRoute"},
                                      {"aliases": ["/west/b/"], "route": "NullRoute"}]}"#;
            let cfg = load(&c, text, None).unwrap();
            for key in ["/west/b/k", "/west/b/k2", "k", "/east/a/k"] {
                cfg.select(&mut req(Cmd::Get, key)).ok().unwrap();
            }
            cfg.select(&mut req(Cmd::Delete, "/west/b/k")).ok().unwrap();
            assert!(cfg.select(&mut req(Cmd::Get, "/north/x/k")).is_err()); // counted as route `none`
            // a config that fails to load leaves no route behind, not even its valid first alias
            let bad = r#"{"routes": [{"aliases": ["/north/x/"], "route": "NullRoute"},
                                     {"aliases": ["nope"], "route": "NullRoute"}]}"#;
            assert!(load(&c, bad, None).is_err());
            let again = load(&c, text, None).unwrap(); // a reload keeps the counts
            again.select(&mut req(Cmd::Get, "/west/b/k")).ok().unwrap();
            let text = c.stats.memcached_text(0);
            for line in [
                "route:/west/b/:cmd_get 3",
                "route:/west/b/:cmd_delete 1",
                "route:/east/a/:cmd_get 2",
                "route:none:cmd_get 1",
            ] {
                assert!(text.contains(line), "{line} missing from {text}");
            }
            assert!(text.contains("STAT cmd_get 6\r\n"), "{text}");
            assert!(!c.stats.prometheus_text(0).contains("/north/x/"));
        });
    }

    #[test]
    fn unknown_fields_are_reported_not_fatal() {
        run(async {
            let c = ctx();
            let text = r#"{"pools": {"p": {"servers": ["127.0.0.1:1"]}}, "timeouts": 5,
                       "route": {"type": "FailoverRoute", "failover_errors": ["tko"],
                                 "children": ["PoolRoute|p", {"type": "PoolRoute", "pool": "p", "hsah": "Ch3"}]}}"#;
            let cfg = load(&c, text, None).unwrap();
            let w = cfg.warnings.join("\n");
            for want in [
                "FailoverRoute: unknown field `failover_errors`",
                "PoolRoute: unknown field `hsah`",
                "`timeouts`",
            ] {
                assert!(w.contains(want), "{want} not in {w}");
            }
            assert_eq!(cfg.warnings.len(), 3, "{w}");
            let clean = load(
                &c,
                r#"{"route": {"type": "ErrorRoute", "response": "x", "name": "e"}}"#,
                None,
            )
            .unwrap();
            assert!(clean.warnings.is_empty(), "{:?}", clean.warnings);
        });
    }

    #[test]
    fn fields_a_handle_cannot_honour_are_warned_about() {
        run(async {
            let c = ctx();
            let text = r#"{"route": {"type": "PrefixSelectorRoute", "policies": {
                "a:": {"type": "L1L2CacheRoute", "l1": "NullRoute", "l2": "NullRoute", "upgradingL1Exptime": 5, "ncacheUpdatePeriod": 3},
                "b:": {"type": "LatencyInjectionRoute", "child": "NullRoute", "request_payload_latency": true},
                "c:": {"type": "ModifyKeyRoute", "target": "NullRoute", "set_routing_prefix": "/a/b/"},
                "d:": {"type": "LoadBalancerRoute", "children": ["NullRoute"], "load_ttl_ms": 5, "default_server_load_percent": 50},
                "e:": {"type": "BlackholeRoute", "default": "NullRoute", "policies": {}},
                "f:": {"type": "LatestRoute", "children": ["NullRoute"], "thresholds": {}}},
                "wildcard": "NullRoute"}}"#;
            let cfg = load(&c, text, None).unwrap();
            let w = cfg.warnings.join("\n");
            for want in [
                "L1L2CacheRoute: `ncacheUpdatePeriod` ignored",
                "LatencyInjectionRoute: `request_payload_latency` ignored",
                "ModifyKeyRoute: `set_routing_prefix` ignored",
                "LoadBalancerRoute: `default_server_load_percent` ignored",
                "BlackholeRoute: `policies` match Carbon request fields",
                "LatestRoute: `thresholds` ignored",
            ] {
                assert!(w.contains(want), "{want} not in {w}");
            }
            assert_eq!(cfg.warnings.len(), 6, "{w}");
        });
    }

    #[test]
    fn flush_targets_are_every_server_of_every_pool_once() {
        run(async {
            let c = ctx();
            let text = r#"{
              "pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "server_timeout": 200},
                        "b": {"servers": ["127.0.0.1:2"], "server_timeout": 700},
                        "unused": {"servers": ["127.0.0.1:3"]}},
              "route": {"type": "PrefixSelectorRoute",
                        "policies": {"x:": {"type": "PoolRoute", "pool": {"name": "inl", "servers": ["127.0.0.1:4"]}},
                                     "y:": "PoolRoute|b"},
                        "wildcard": "PoolRoute|a"}
            }"#;
            let cfg = load(&c, text, None).unwrap();
            let mut got: Vec<(String, u128)> = cfg
                .flush_targets
                .iter()
                .map(|t| (t.server.addr.clone(), t.timeout.as_millis()))
                .collect();
            got.sort();
            let want = [
                ("127.0.0.1:1", 200),
                ("127.0.0.1:2", 700), // in two pools: the longer timeout
                ("127.0.0.1:3", 1000),
                ("127.0.0.1:4", 1000),
            ];
            assert_eq!(got, want.map(|(a, t)| (a.to_string(), t)));
            assert!(cfg.flush_problems.is_empty() && cfg.warnings.is_empty());
            // a pool no route uses still loads as before if it is broken, but no flush can succeed
            let text = r#"{"pools": {"a": {"servers": ["127.0.0.1:1"]}, "bad": {"servers": ["nohost"]}},
                           "route": "PoolRoute|a"}"#;
            let cfg = load(&c, text, None).unwrap();
            assert_eq!(cfg.flush_targets.len(), 1);
            assert_eq!(
                cfg.flush_problems,
                ["pool `bad`: bad server address `nohost` (not flushed)"]
            );
            assert!(cfg.warnings[0].contains("flush_all will fail"), "{:?}", cfg.warnings);
        });
    }

    #[test]
    fn pool_lists_inside_children_and_as_a_single_route() {
        run(async {
            let c = ctx();
            let text = r#"{"pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]},
                                   "one": {"servers": ["127.0.0.1:3"]}},
                         "route": {"type": "FailoverRoute", "children": ["Pool|a", "Pool|one", "NullRoute"]}}"#;
            assert!(load(&c, text, None).is_ok());
            // one server: usable wherever a route is expected
            let text = r#"{"pools": {"one": {"servers": ["127.0.0.1:3"]}}, "route": "Pool|one"}"#;
            assert_eq!(load(&c, text, None).unwrap().servers.len(), 1);
            let text = r#"{"pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]}},
                         "route": {"type": "ModifyExptimeRoute", "target": "Pool|a", "exptime": 1}}"#;
            let err = load(&c, text, None).err().unwrap();
            assert!(
                err.contains("`Pool|a` is 2 destinations where one route is expected"),
                "{err}"
            );
        });
    }

    #[test]
    fn inline_pool_objects_stand_where_a_pool_name_may() {
        run(async {
            let c = ctx();
            // in a list: every server; where one route is expected: one server; in a PoolRoute
            let text = r#"{"route": {"type": "FailoverRoute", "children": [
                {"type": "Pool", "name": "B1", "servers": ["127.0.0.1:1", "127.0.0.1:2"]},
                {"type": "ModifyExptimeRoute", "exptime": 5, "target": {"type": "Pool", "servers": ["127.0.0.1:3"]}},
                {"type": "PoolRoute", "pool": {"type": "Pool", "name": "C", "servers": ["127.0.0.1:4"]}}]}}"#;
            let cfg = load(&c, text, None).unwrap();
            assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
            assert_eq!(cfg.servers.len(), 4);
            let mut names = Vec::new();
            let mut r = req(Cmd::Get, "k");
            let root = cfg.select(&mut r).ok().unwrap().0.clone();
            root.traverse(&r, &mut |child, _| names.push(child.route_name()));
            assert_eq!(names.len(), 4, "{names:?}");
            assert!(
                names[0].contains("pool=B1|id=0") && names[1].contains("pool=B1|id=1"),
                "{names:?}"
            );
            let err = load(
                &c,
                r#"{"route": {"type": "Pool", "servers": ["127.0.0.1:1", "127.0.0.1:2"]}}"#,
                None,
            )
            .err()
            .unwrap();
            assert!(
                err.contains("an inline `Pool` is 2 destinations where one route is expected"),
                "{err}"
            );
            let err = load(
                &c,
                r#"{"route": {"type": "PoolRoute", "pool": {"type": "Poo", "servers": []}}}"#,
                None,
            )
            .err()
            .unwrap();
            assert!(err.contains("`type` must be \"Pool\""), "{err}");
        });
    }

    #[test]
    fn a_pool_server_may_be_a_route_handle_as_in_mcrouter() {
        run(async {
            let c = ctx();
            let text = r#"{"route": {"type": "ShardSelectionRoute", "shards": [[1], [2]],
                "pool": {"type": "Pool", "servers": [{"type": "ErrorRoute", "response": "one"}, "127.0.0.1:5"]}}}"#;
            let cfg = load(&c, text, None).unwrap();
            let mut r = req(Cmd::Get, "k:1:x");
            let reply = cfg.select(&mut r).ok().unwrap().0.route(&r).await;
            assert_eq!(&reply.wire[..], b"SERVER_ERROR one\r\n");
            assert_eq!(cfg.servers.len(), 1);
            let err = load(
                &c,
                r#"{"pools": {"p": {"servers": [5]}}, "route": "PoolRoute|p"}"#,
                None,
            )
            .err()
            .unwrap();
            assert!(
                err.contains("pool `p`: servers[0] must be \"host:port\" or a route handle object, not 5"),
                "{err}"
            );
        });
    }

    #[test]
    fn caret_and_thrift_are_refused_as_out_of_scope_in_the_pool_or_a_server() {
        run(async {
            let c = ctx();
            for (text, want) in [
                (
                    r#"{"pools": {"p": {"servers": ["127.0.0.1:1:caret"]}}, "route": "PoolRoute|p"}"#,
                    r#"pool `p`: protocol "caret" (server `127.0.0.1:1:caret`) is not supported"#,
                ),
                (
                    r#"{"pools": {"p": {"servers": ["[::1]:1:thrift:ssl"]}}, "route": "PoolRoute|p"}"#,
                    r#"protocol "thrift" (server `[::1]:1:thrift:ssl`)"#,
                ),
                (
                    r#"{"pools": {"p": {"servers": ["127.0.0.1:1"], "protocol": "thrift"}}, "route": "PoolRoute|p"}"#,
                    "caret and thrift are out of scope",
                ),
            ] {
                let err = load(&c, text, None).err().unwrap_or_else(|| panic!("{text} loaded"));
                assert!(err.contains(want), "{want} not in {err}");
            }
            let ascii = r#"{"pools": {"p": {"servers": ["127.0.0.1:1:ascii:plain"]}}, "route": "PoolRoute|p"}"#;
            assert!(load(&c, ascii, None).is_ok());
        });
    }

    #[test]
    fn config_params_reach_the_macros() {
        run(async {
            let c = ctx();
            let text = r#"{"pools": {"A": {"servers": ["127.0.0.1:%PORT%"]}}, "route": "PoolRoute|%POOL%"}"#;
            let params = [
                ("PORT".to_string(), "7".to_string()),
                ("POOL".to_string(), "A".to_string()),
            ];
            let cfg = load_from(&c, text, None, None, &params).unwrap();
            assert_eq!(cfg.servers[0].addr, "127.0.0.1:7");
            let err = load(&c, text, None).err().unwrap();
            assert!(err.contains("'%PORT%': no such parameter"), "{err}");
        });
    }

    #[test]
    fn routes_may_be_a_single_entry_object() {
        run(async {
            let c = ctx();
            let text = r#"{"routes": {"aliases": ["/east/a/", "/east/b/"], "route": "ErrorRoute|x"}}"#;
            let cfg = load(&c, text, None).unwrap();
            let mut r = req(Cmd::Get, "/east/b/k");
            assert_eq!(cfg.select(&mut r).ok().unwrap().0.route(&r).await.res, Res::LocalError);
            assert_eq!(&r.key[..], b"k");
            let err = load(&c, r#"{"routes": 5}"#, None).err().unwrap();
            assert!(err.contains("`routes` must be"), "{err}");
        });
    }

    #[test]
    fn routes_may_map_each_alias_to_its_route_as_mcrouter_reads_them() {
        run(async {
            let c = ctx();
            let text = r#"{"routes": {"/east/a/": "ErrorRoute|a", "/east/b/": "NullRoute"}}"#;
            let cfg = load(&c, text, Some("/east/b/")).unwrap();
            let mut r = req(Cmd::Get, "/east/a/k");
            assert_eq!(cfg.select(&mut r).ok().unwrap().0.route(&r).await.res, Res::LocalError);
            let mut r = req(Cmd::Get, "k");
            assert_ne!(cfg.select(&mut r).ok().unwrap().0.route(&r).await.res, Res::LocalError);
        });
    }

    #[test]
    fn pool_fields_are_honoured_warned_or_rejected() {
        run(async {
            let c = ctx();
            // weights feed a WeightedCh3 PoolRoute: a zero-weight server gets nothing
            let text = r#"{"pools": {"w": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "weights": [1.0, 0.0]},
                                   "k": {"servers": ["127.0.0.1:3"], "keep_routing_prefix": true,
                                         "connect_timeout": 5, "protocol": "ascii", "frob": 1},
                                   "unused_w": {"servers": ["127.0.0.1:4"], "weights": [1]}},
                         "route": {"type": "PrefixSelectorRoute", "policies": {"k:": "PoolRoute|k"},
                                   "wildcard": {"type": "PoolRoute", "pool": "w", "hash": {"hash_func": "WeightedCh3"}}}}"#;
            let cfg = load(&c, text, None).unwrap();
            let w = cfg.warnings.join("\n");
            for want in [
                "pool `k`: `keep_routing_prefix: true` is not supported",
                "pool `k`: `connect_timeout` ignored",
                "pool `k`: unknown field `frob` ignored",
                "pool `unused_w`: `weights` ignored",
            ] {
                assert!(w.contains(want), "{want} not in {w}");
            }
            assert!(!w.contains("pool `w`"), "{w}");
            let mut hit_second = 0;
            for i in 0..200 {
                let r = req(Cmd::Get, &format!("key{i}"));
                let route = cfg.select(&mut r.clone()).ok().unwrap().0.clone();
                if let Some(dest) = route.first_get_target(&r) {
                    hit_second += usize::from(dest.server.addr.ends_with(":2"));
                }
            }
            assert_eq!(hit_second, 0);
            // fewer weights than servers: padded with 0.5 and said so
            let text = r#"{"pools": {"w": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "weights": [1.0]}},
                         "route": {"type": "PoolRoute", "pool": "w", "hash_func": "WeightedCh3"}}"#;
            let cfg = load(&c, text, None).unwrap();
            assert!(
                cfg.warnings.join("\n").contains("missing ones count as 0.5"),
                "{:?}",
                cfg.warnings
            );
            let bad = [
                (
                    r#"{"pools": {"p": {"servers": ["127.0.0.1:1"], "protocol": "caret"}}, "route": "PoolRoute|p"}"#,
                    "pool `p`: protocol \"caret\" is not supported",
                ),
                (
                    r#"{"pools": {"p": {"servers": ["127.0.0.1:1"]}}, "route": {"type": "PoolRoute", "pool": "p", "hash_func": "WeightedCh3"}}"#,
                    "PoolRoute: hash_func WeightedCh3 needs `weights`",
                ),
                (
                    r#"{"pools": {"p": {"servers": ["127.0.0.1:1"], "weights": [2]}}, "route": {"type": "PoolRoute", "pool": "p", "hash_func": "WeightedCh3"}}"#,
                    "every weight must be a number from 0.0 to 1.0",
                ),
            ];
            for (text, want) in bad {
                let err = load(&c, text, None).err().unwrap_or_else(|| panic!("{text} loaded"));
                assert!(err.contains(want), "{want} not in {err}");
            }
        });
    }

    #[test]
    fn port_override_sets_every_servers_port() {
        assert_eq!(with_port("localhost", 7), "localhost:7");
        assert_eq!(with_port("h:1", 7), "h:7");
        assert_eq!(with_port("h:1:ascii:ssl", 7), "h:7:ascii:ssl");
        assert_eq!(with_port("[::1]:1", 7), "[::1]:7");
        assert_eq!(with_port("[::1]", 7), "[::1]:7");
        run(async {
            let c = ctx();
            let text = r#"{"pools": {"p": {"servers": ["127.0.0.1", "127.0.0.2:5"], "port_override": 11311}}, "route": "PoolRoute|p"}"#;
            let cfg = load(&c, text, None).unwrap();
            let mut addrs: Vec<_> = cfg.servers.iter().map(|s| s.addr.clone()).collect();
            addrs.sort();
            assert_eq!(addrs, ["127.0.0.1:11311", "127.0.0.2:11311"]);
            let bad = r#"{"pools": {"p": {"servers": ["h"], "port_override": 0}}, "route": "PoolRoute|p"}"#;
            assert!(
                load(&c, bad, None)
                    .err()
                    .unwrap()
                    .contains("`port_override` must be from 1 to 65535")
            );
        });
    }

    #[test]
    fn addresses() {
        assert_eq!(normalize_addr("127.0.0.1:11211").unwrap(), "127.0.0.1:11211");
        assert_eq!(
            normalize_addr("127.0.0.1:11211:ascii:plain").unwrap(),
            "127.0.0.1:11211"
        );
        assert_eq!(normalize_addr("[::1]:5").unwrap(), "[::1]:5");
        // port 0 is a port (mcrouter takes it; the load warns), 65536 is not
        assert_eq!(normalize_addr("h:0").unwrap(), "h:0");
        for bad in ["h:65536", "h:", ":5", "h", "h:PORT"] {
            assert!(normalize_addr(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn security_mech_as_mcrouter_spells_it() {
        let obj = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert_eq!(
            pool_security_mech("p", &obj(serde_json::json!({"security_mech": "tls"}))),
            Ok(true)
        );
        assert_eq!(
            pool_security_mech("p", &obj(serde_json::json!({"security_mech": "plain"}))),
            Ok(false)
        );
        assert_eq!(
            pool_security_mech("p", &obj(serde_json::json!({"use_ssl": true}))),
            Ok(true)
        );
        assert_eq!(pool_security_mech("p", &obj(serde_json::json!({}))), Ok(false));
        let e = pool_security_mech("p", &obj(serde_json::json!({"security_mech": "tls_to_plain"}))).unwrap_err();
        assert!(e.contains("pool `p`") && e.contains("tls_to_plain"), "{e}");
        assert_eq!(server_security_mech("127.0.0.1:1:ascii:ssl"), Ok(Some(true)));
        assert_eq!(server_security_mech("[::1]:1:ascii:plain"), Ok(Some(false)));
        assert_eq!(server_security_mech("127.0.0.1:1"), Ok(None));
        assert_eq!(server_security_mech("127.0.0.1:1:ascii"), Ok(None));
        assert!(server_security_mech("127.0.0.1:1:ascii:x").is_err());
        assert_eq!(
            normalize_addr("127.0.0.1:11211:ascii:ssl").as_deref(),
            Some("127.0.0.1:11211")
        );
    }
}
