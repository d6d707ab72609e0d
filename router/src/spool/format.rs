//! The spool's file format: mcrouter's asynclog v2 (`AS2.0`), one JSON array per line, one file
//! per server (see the module doc of `crate::spool`). Encoding and decoding only, no I/O.

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use crate::protocol::{Cmd, Request};

pub(super) fn file_name(server: &str) -> String {
    let safe: String = server
        .chars()
        .map(|c| if c == ':' || c == '/' { '_' } else { c })
        .collect();
    format!("{safe}.asynclog")
}

pub(super) fn server_of(file: &str) -> Option<String> {
    let stem = file.strip_suffix(".asynclog")?;
    let (host, port) = stem.rsplit_once('_')?;
    Some(format!("{host}:{port}"))
}

/// One spool line for a failed delete.
pub fn entry_line(server: &str, pool: &str, req: &Request) -> String {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let host = match server.rsplit_once(':') {
        Some((h, p)) => format!("[{h}]:{p}"),
        None => server.to_string(),
    };
    let mut body = serde_json::Map::new();
    body.insert("h".into(), json!(host));
    body.insert("p".into(), json!(pool));
    let flags: Vec<String> = req
        .meta
        .iter()
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .collect();
    match std::str::from_utf8(&req.key) {
        Ok(k) => {
            body.insert("k".into(), json!(k));
            if req.cmd == Cmd::MetaDelete {
                body.insert("op".into(), json!(Cmd::MetaDelete.name()));
                body.insert("f".into(), json!(flags.join(" ")));
            } else {
                body.insert("op".into(), json!(Cmd::Delete.name()));
            }
        }
        Err(_) => {
            body.insert(
                "k".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(&req.key)),
            );
            body.insert("op".into(), json!(Cmd::MetaDelete.name()));
            body.insert("f".into(), json!("b"));
        }
    }
    json!(["AS2.0", ts, "C", Value::Object(body)]).to_string()
}

/// The delete request a spool line stands for.
pub fn parse_entry(line: &str) -> Option<Request> {
    let v: Value = serde_json::from_str(line).ok()?;
    let arr = v.as_array()?;
    if arr.first()?.as_str()? != "AS2.0" {
        return None;
    }
    let body = arr.get(3)?.as_object()?;
    let key = body.get("k")?.as_str()?;
    if body.get("op").and_then(Value::as_str) == Some(Cmd::MetaDelete.name()) {
        let mut req = Request::simple(Cmd::MetaDelete, Bytes::copy_from_slice(key.as_bytes()));
        let flags = body.get("f").and_then(Value::as_str).unwrap_or("");
        for f in flags.split(' ').filter(|f| !f.is_empty() && *f != "q") {
            if f == "b" {
                req.base64_key = true;
            }
            req.meta.push(Bytes::copy_from_slice(f.as_bytes()));
        }
        Some(req)
    } else {
        Some(Request::simple(Cmd::Delete, Bytes::copy_from_slice(key.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_roundtrip() {
        let req = Request::simple(Cmd::Delete, Bytes::from_static(b"user:1"));
        let line = entry_line("127.0.0.1:11211", "wildcard", &req);
        assert!(line.starts_with("[\"AS2.0\","), "{line}");
        assert!(line.contains("\"h\":\"[127.0.0.1]:11211\""), "{line}");
        let back = parse_entry(&line).unwrap();
        assert_eq!(back.cmd, Cmd::Delete);
        assert_eq!(&back.key[..], b"user:1");
        // keys with control bytes (memcached takes them) survive the JSON line
        let odd = Request::simple(Cmd::Delete, Bytes::from_static(b"a\x01\r\x1b\x7fz"));
        let line = entry_line("127.0.0.1:11211", "p", &odd);
        assert!(!line.contains(['\r', '\n']), "{line}");
        assert_eq!(&parse_entry(&line).unwrap().key[..], b"a\x01\r\x1b\x7fz");

        let mut md = Request::simple(Cmd::MetaDelete, Bytes::from_static(b"k"));
        md.meta = vec![Bytes::from_static(b"I"), Bytes::from_static(b"T3")];
        let back = parse_entry(&entry_line("h:1", "p", &md)).unwrap();
        assert_eq!(back.cmd, Cmd::MetaDelete);
        assert_eq!(back.meta.len(), 2);
        assert_eq!(server_of(&file_name("127.0.0.1:11211")).unwrap(), "127.0.0.1:11211");
    }
}
