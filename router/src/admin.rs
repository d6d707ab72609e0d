//! Admin requests: `get __mcrouter__.<command>` is answered by the router itself, never forwarded,
//! as mcrouter answers it (its wiki page "Admin requests"; value formats from its `ServiceInfo`).
//!
//! The answer is one `VALUE <key> 0 <len>` block: `version`, `options`, `options(NAME)`,
//! `config_file`, `config_age`, `config_md5_digest`, `config_sources_info`, `route(OP,KEY)` (the
//! servers the request would be sent to, one per line) and `route_handles(OP,KEY)` (the handle
//! tree it would traverse, one handle per line, indented a space per level). A command that
//! fails, or one the router does not know, answers the value `ERROR: <why>`, as mcrouter does.
//!
//! `route` runs the request through the live route tree in recording mode
//! (`Request::recording`): each destination it reaches records its server and answers as an idle
//! server would (a miss, `NOT_STORED`, `NOT_FOUND`), so nothing is sent; a server that is down
//! (TKO) answers the TKO error, so failover routes go on to the next child, as mcrouter's recording
//! does. Background copies (AllAsyncRoute, shadows) carry the recorder too and are waited for.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::config::RouterConfig;
use crate::protocol::{Cmd, Request};
use crate::recording::Recorder;
use crate::routes::RouteRef;

/// Keys that are admin requests start with this.
pub const PREFIX: &[u8] = b"__mcrouter__.";

/// How long `route` waits for background copies of the request (AllAsyncRoute, shadows).
const BACKGROUND_WAIT: Duration = Duration::from_secs(2);

pub fn is_admin(key: &[u8]) -> bool {
    key.starts_with(PREFIX)
}

/// What the router was started with, for `options` and `config_file` (set once by `main`).
#[derive(Debug, Default)]
pub struct Startup {
    pub config_file: String,
    /// Every command-line option, by its long name with `_` for `-`, and its value in effect.
    pub options: Vec<(String, String)>,
}

static STARTUP: OnceLock<Startup> = OnceLock::new();

/// Called once at start-up by `main` (later calls are ignored).
pub fn set_startup(s: Startup) {
    let _ = STARTUP.set(s);
}

/// The value of `version` (and of the `version` command, without `VERSION `).
pub fn version() -> String {
    format!("1.6.18-squeal-router-{}", env!("CARGO_PKG_VERSION"))
}

/// The whole answer to `get <key>` for an admin key: its VALUE block and nothing else (the caller
/// adds `END`). `key` is the key as the client sent it.
pub async fn value_block(config: Arc<RouterConfig>, key: Bytes) -> Bytes {
    let value = match answer(&config, &key[PREFIX.len()..]).await {
        Ok(v) => v,
        Err(e) => format!("ERROR: {e}"),
    };
    let mut out = BytesMut::with_capacity(key.len() + value.len() + 32);
    out.put_slice(b"VALUE ");
    out.put_slice(&key);
    out.put_slice(format!(" 0 {}\r\n", value.len()).as_bytes());
    out.put_slice(value.as_bytes());
    out.put_slice(b"\r\n");
    out.freeze()
}

/// `cmd` or `cmd(args)`: mcrouter splits the arguments of `route*` at the first comma only (a key
/// may hold commas), the others at every comma.
fn split(command: &[u8]) -> (&[u8], Vec<&[u8]>) {
    let Some(open) = command.iter().position(|&b| b == b'(') else {
        return (command, Vec::new());
    };
    if command.last() != Some(&b')') {
        return (command, Vec::new());
    }
    let (name, inner) = (&command[..open], &command[open + 1..command.len() - 1]);
    if inner.is_empty() {
        return (name, Vec::new());
    }
    let args = if name.starts_with(b"route") {
        match inner.iter().position(|&b| b == b',') {
            Some(c) => vec![&inner[..c], &inner[c + 1..]],
            None => Vec::new(),
        }
    } else {
        inner.split(|&b| b == b',').collect()
    };
    (name, args)
}

async fn answer(config: &RouterConfig, command: &[u8]) -> Result<String, String> {
    let (name, args) = split(command);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let startup = STARTUP.get_or_init(Startup::default);
    let mut value = match name {
        b"version" => version(),
        b"config_file" if startup.config_file.is_empty() => return Err("no config file found!".into()),
        b"config_file" => startup.config_file.clone(),
        b"config_age" => config.loaded_at.elapsed().as_secs().to_string(),
        b"config_md5_digest" => config.md5.clone(),
        b"config_sources_info" => {
            let mut fields = vec![("mcrouter_config", config.md5.clone())];
            if !startup.config_file.is_empty() {
                fields.insert(0, ("config_file", startup.config_file.clone()));
            }
            let body: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("  \"{k}\": {}", serde_json::Value::String(v.clone())))
                .collect();
            format!("{{\n{}\n}}", body.join(",\n"))
        }
        b"options" => match &args[..] {
            [] => startup.options.iter().map(|(k, v)| format!("{k} {v}\n")).collect(),
            [one] => match startup.options.iter().find(|(k, _)| k.as_bytes() == *one) {
                Some((_, v)) => v.clone(),
                None => return Err(format!("options: option {} not found", text(one))),
            },
            _ => return Err("options: 0 or 1 args expected".into()),
        },
        b"route" | b"route_handles" => {
            let [op, key] = &args[..] else {
                return Err(format!("{}: 2 args expected", text(name)));
            };
            let cmd = Cmd::from_name(op).ok_or_else(|| format!("route: unknown request {}", text(op)))?;
            let mut req = Request::simple(cmd, Bytes::copy_from_slice(key));
            let route = config
                .route_for(&mut req)
                .map_err(|reply| String::from_utf8_lossy(reply.wire.trim_ascii_end()).into_owned())?
                .clone();
            if name == b"route" {
                destinations(route, req).await.join("\r\n")
            } else {
                let mut out = String::new();
                tree(&route, &req, 0, &mut out);
                out
            }
        }
        _ => return Err(format!("unknown command: {}", text(name))),
    };
    if value.ends_with('\n') {
        value.pop();
    }
    Ok(value)
}

/// The servers `req` would be sent to, in the order they are reached, each once.
async fn destinations(route: RouteRef, mut req: Request) -> Vec<String> {
    let (recorder, mut rx) = Recorder::new();
    req.recording = Some(Arc::new(recorder));
    let _ = route.route(&req).await;
    drop(req);
    // every copy of the request (background ones too) holds the recorder: the channel closes when
    // the last is gone
    let mut out: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + BACKGROUND_WAIT;
    while let Ok(Some(addr)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

/// One line per handle `req` traverses, children indented one space more than their parent.
fn tree(route: &RouteRef, req: &Request, level: usize, out: &mut String) {
    out.push_str(&" ".repeat(level));
    out.push_str(&route.route_name());
    out.push('\n');
    route.traverse(req, &mut |child, r| tree(child, r, level + 1, out));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_split_as_mcrouter_splits_them() {
        let (n, a) = split(b"route(set,/a/b/k,1)");
        assert_eq!((n, a), (&b"route"[..], vec![&b"set"[..], &b"/a/b/k,1"[..]]));
        let (n, a) = split(b"options(num_proxies)");
        assert_eq!((n, a), (&b"options"[..], vec![&b"num_proxies"[..]]));
        let (n, a) = split(b"version");
        assert_eq!((n, a.len()), (&b"version"[..], 0));
    }
}
