//! ModifyKeyRoute: rewrites the key before `target` sees it (mcrouter's fields):
//! `ensure_key_prefix` is prepended unless the key already starts with it;
//! `replace_key_prefix` (if the key starts with it) is replaced by `ensure_key_prefix`;
//! `modify_inplace` overwrites the key's first bytes with the prefix instead of prepending.
//! `set_routing_prefix` only matters to a destination that keeps routing prefixes, which this
//! router does not do (`keep_routing_prefix`): it is warned about and ignored.
//!
//! The client gets back the key it sent: `VALUE` lines and meta `k` flags name the original key.
//! Base64 meta keys are rewritten on their decoded bytes.

use std::sync::Arc;

use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};

use super::{BoxFuture, Route, RouteRef};
use crate::build::{Builder, Handle, get_str, required};
use crate::protocol::reply::first_line_end;
use crate::protocol::{Reply, Request, Res};

/// memcached's key limit.
const MAX_KEY: usize = 250;

pub struct ModifyKey {
    pub target: RouteRef,
    pub prefix: Vec<u8>,
    pub replace: Option<Vec<u8>>,
    pub inplace: bool,
}

impl ModifyKey {
    /// The new key, if it changes.
    fn modified(&self, key: &[u8]) -> Option<Vec<u8>> {
        if let Some(old) = &self.replace
            && key.starts_with(old)
        {
            return Some([&self.prefix[..], &key[old.len()..]].concat());
        }
        if key.starts_with(&self.prefix) {
            return None;
        }
        let rest = if self.inplace && key.len() >= self.prefix.len() {
            &key[self.prefix.len()..]
        } else {
            key
        };
        Some([&self.prefix[..], rest].concat())
    }
}

/// A configured prefix: printable, so that it never turns a key into something else on the wire.
fn valid_prefix(prefix: &[u8]) -> Result<(), &'static str> {
    if prefix.len() > MAX_KEY {
        return Err("key too long");
    }
    if prefix.iter().any(|&b| b <= b' ' || b == 0x7f) {
        return Err("key has spaces or control characters");
    }
    Ok(())
}

/// A rewritten key. Its bytes came from a printable prefix and a key the parser took (which may hold
/// control bytes, as memcached's keys may), or are a base64 key's decoded bytes (any byte): only
/// its length can be wrong.
fn valid_key(key: &[u8]) -> Result<(), &'static str> {
    match key.len() {
        0 => Err("empty key"),
        n if n > MAX_KEY => Err("key too long"),
        _ => Ok(()),
    }
}

/// `wire` with the key the server saw (`sent`) put back to the client's (`asked`): in a classic
/// `VALUE` line, or a meta `k` flag.
fn restore_key(wire: &Bytes, sent: &[u8], asked: &[u8]) -> Bytes {
    let line_end = first_line_end(wire);
    let mut out = BytesMut::with_capacity(wire.len() + asked.len());
    let mut changed = false;
    for (i, token) in wire[..line_end].split(|&b| b == b' ').enumerate() {
        if i > 0 {
            out.put_u8(b' ');
        }
        let value_key = i == 1 && wire.starts_with(b"VALUE ") && token == sent;
        let meta_key = i > 0 && token.first() == Some(&b'k') && &token[1..] == sent;
        if value_key {
            out.put_slice(asked);
            changed = true;
        } else if meta_key && !wire.starts_with(b"VALUE ") {
            out.put_u8(b'k');
            out.put_slice(asked);
            changed = true;
        } else {
            out.put_slice(token);
        }
    }
    if !changed {
        return wire.clone();
    }
    out.put_slice(&wire[line_end..]);
    out.freeze()
}

impl Route for ModifyKey {
    fn traverse(&self, req: &Request, visit: &mut dyn FnMut(&RouteRef, &Request)) {
        match self.modified(&req.routing_key()) {
            Some(new) if valid_key(&new).is_ok() => {
                let mut changed = req.clone();
                changed.key = if req.base64_key {
                    Bytes::from(base64::engine::general_purpose::STANDARD.encode(&new))
                } else {
                    Bytes::from(new)
                };
                visit(&self.target, &changed);
            }
            Some(_) => {}
            None => visit(&self.target, req),
        }
    }

    fn route<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Reply> {
        let key = req.routing_key();
        let Some(new) = self.modified(&key) else {
            return self.target.route(req);
        };
        if let Err(why) = valid_key(&new) {
            let reply = Reply::error(Res::ClientError, &format!("ModifyKeyRoute: invalid key: {why}"));
            return Box::pin(async move { reply });
        }
        let mut changed = req.clone();
        changed.key = if req.base64_key {
            Bytes::from(base64::engine::general_purpose::STANDARD.encode(&new))
        } else {
            Bytes::from(new)
        };
        Box::pin(async move {
            let mut reply = self.target.route(&changed).await;
            reply.wire = restore_key(&reply.wire, &changed.key, &req.key);
            reply
        })
    }
}

pub const MODIFY_KEY_ROUTE: Handle = Handle {
    name: "ModifyKeyRoute",
    build,
    shorthand: None,
    fields: &[
        "target",
        "set_routing_prefix",
        "ensure_key_prefix",
        "replace_key_prefix",
        "modify_inplace",
    ],
};

pub fn build(b: &mut Builder, obj: &Map<String, Value>) -> Result<RouteRef, String> {
    let target = b.route(required(obj, "target", "ModifyKeyRoute")?)?;
    let prefix = get_str(obj, "ensure_key_prefix")?.unwrap_or("").as_bytes().to_vec();
    let replace = get_str(obj, "replace_key_prefix")?.map(|s| s.as_bytes().to_vec());
    for p in [Some(&prefix), replace.as_ref()].into_iter().flatten() {
        if !p.is_empty() {
            valid_prefix(p).map_err(|why| {
                format!(
                    "ModifyKeyRoute: invalid key prefix `{}`: {why}",
                    String::from_utf8_lossy(p)
                )
            })?;
        }
    }
    let inplace = match obj.get("modify_inplace") {
        None => false,
        Some(Value::Bool(v)) => *v,
        Some(_) => return Err("ModifyKeyRoute: `modify_inplace` must be true or false".into()),
    };
    if inplace && replace.is_some() {
        return Err("ModifyKeyRoute: `replace_key_prefix` and `modify_inplace` cannot be used together".into());
    }
    if obj.contains_key("set_routing_prefix") {
        b.warnings.push(
            "ModifyKeyRoute: `set_routing_prefix` ignored: destinations never see routing prefixes here (no keep_routing_prefix)"
                .into(),
        );
    }
    Ok(Arc::new(ModifyKey {
        target,
        prefix,
        replace,
        inplace,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Cmd;
    use crate::routes::testing::*;

    fn mk(t: &Arc<Fake>, prefix: &str, replace: Option<&str>, inplace: bool) -> ModifyKey {
        ModifyKey {
            target: t.clone(),
            prefix: prefix.as_bytes().to_vec(),
            replace: replace.map(|r| r.as_bytes().to_vec()),
            inplace,
        }
    }

    #[test]
    fn prefixes_and_gives_the_client_its_key_back() {
        let t = Fake::new("t", Res::Found);
        let r = mk(&t, "foo:", None, false);
        let reply = run(r.route(&req(Cmd::Get, "k1")));
        assert_eq!(&t.last().key[..], b"foo:k1");
        assert!(reply.wire.starts_with(b"VALUE k1 7 2\r\n"), "{:?}", reply.wire);
        run(r.route(&req(Cmd::Delete, "foo:k2")));
        assert_eq!(&t.last().key[..], b"foo:k2"); // already there
        let r = mk(&t, "new:", Some("old:"), false);
        run(r.route(&req(Cmd::Delete, "old:k")));
        assert_eq!(&t.last().key[..], b"new:k");
        let r = mk(&t, "ab", None, true);
        run(r.route(&req(Cmd::Delete, "xyz")));
        assert_eq!(&t.last().key[..], b"abz");
        let long = "k".repeat(250);
        let reply = run(mk(&t, "p", None, false).route(&req(Cmd::Get, &long)));
        assert!(
            reply
                .wire
                .starts_with(b"CLIENT_ERROR ModifyKeyRoute: invalid key: key too long")
        );
    }

    #[test]
    fn meta_k_flag_names_the_client_key() {
        let wire = Bytes::from_static(b"HD kfoo:a O1\r\n");
        assert_eq!(&restore_key(&wire, b"foo:a", b"a")[..], b"HD ka O1\r\n");
        let wire = Bytes::from_static(b"VALUE foo:a 0 1\r\nx\r\n");
        assert_eq!(&restore_key(&wire, b"foo:a", b"a")[..], b"VALUE a 0 1\r\nx\r\n");
        // keys may hold a CR (as on memcached): the line ends at its CRLF only
        let wire = Bytes::from_static(b"VA 1 kfoo:a\rb O1\r\nx\r\n");
        assert_eq!(&restore_key(&wire, b"foo:a\rb", b"a\rb")[..], b"VA 1 ka\rb O1\r\nx\r\n");
        let wire = Bytes::from_static(b"VALUE foo:\x01\r 0 1\r\nx\r\n");
        assert_eq!(
            &restore_key(&wire, b"foo:\x01\r", b"\x01\r")[..],
            b"VALUE \x01\r 0 1\r\nx\r\n"
        );
    }

    #[test]
    fn keys_with_control_bytes_are_rewritten_like_others() {
        let t = Fake::new("t", Res::Found);
        let r = mk(&t, "foo:", None, false);
        run(r.route(&req(Cmd::Delete, "\u{1}k\r")));
        assert_eq!(&t.last().key[..], b"foo:\x01k\r");
        assert!(valid_prefix(b"a\x01").is_err());
    }
}
