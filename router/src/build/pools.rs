//! Pools: `pools` entries and inline `{"type": "Pool"}` objects built into their destinations (one
//! per server, shared by address), their fields checked or warned about, server addresses in
//! mcrouter's forms, and the servers `flush_all` goes to.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{Builder, get_i64, is_pool_type, short};
use crate::flush::FlushTarget;
use crate::routes::RouteRef;
use crate::routes::destination::Destination;
use crate::server::Server;

impl Builder<'_> {
    /// The config's server at `addr`, over TLS or not (a server is one connection: the same
    /// address cannot be both in one config; a reload that changes it makes a new server).
    pub(super) fn server(&mut self, addr: &str, tls: bool) -> Result<Arc<Server>, String> {
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
    pub(crate) fn warn_unused_weights(&mut self) {
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
    pub(crate) fn take_flush_targets(&mut self) -> (Vec<FlushTarget>, Vec<String>) {
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

/// `host:port` (an optional mcrouter `:ascii:plain`-style suffix dropped; `[v6]:port` kept).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_override_replaces_the_port() {
        assert_eq!(with_port("localhost", 7), "localhost:7");
        assert_eq!(with_port("h:1", 7), "h:7");
        assert_eq!(with_port("h:1:ascii:ssl", 7), "h:7:ascii:ssl");
        assert_eq!(with_port("[::1]:1", 7), "[::1]:7");
        assert_eq!(with_port("[::1]", 7), "[::1]:7");
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
