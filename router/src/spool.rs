//! The delete spool: failed deletes are written to disk and replayed when their server returns.
//!
//! A cache that misses a delete serves stale data until the item expires, so a delete the router
//! could not deliver (server TKO, connect error, timeout) is appended to a per-server file in
//! mcrouter's asynclog v2 format, one JSON array per line:
//!
//! ```text
//! ["AS2.0", 1700000000.123, "C", {"h": "[127.0.0.1]:11211", "p": "wildcard", "k": "user:1", "op": "delete"}]
//! ```
//!
//! (`op` is `delete` or `md`; an `md` keeps its meta flags in `f`, e.g. `"f": "I T3"`; a key that is
//! not UTF-8 is stored base64-encoded as an `md` with flag `b`.) Appends go through one writer
//! thread that batches them and fsyncs before acknowledging (group commit), so a delete the
//! client saw acknowledged survives a crash. Each server's file is bounded; past the bound a
//! delete is refused (the client sees an error, never a silent drop). Replay takes the file
//! (renamed to `.replaying`), sends each delete, and puts back whatever failed; leftovers of a
//! crash during replay are merged back at start-up.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::Context;
use crate::protocol::{Cmd, Request};
use crate::server::Server;

enum Msg {
    Append {
        server: String,
        line: String,
        ack: oneshot::Sender<bool>,
    },
    Take {
        server: String,
        ack: oneshot::Sender<Option<PathBuf>>,
    },
    Restore {
        server: String,
        lines: Vec<String>,
        ack: oneshot::Sender<()>,
    },
}

pub struct Spool {
    dir: PathBuf,
    tx: std::sync::mpsc::Sender<Msg>,
    sizes: Arc<Mutex<HashMap<String, u64>>>,
    replaying: Mutex<HashSet<String>>,
}

fn file_name(server: &str) -> String {
    let safe: String = server
        .chars()
        .map(|c| if c == ':' || c == '/' { '_' } else { c })
        .collect();
    format!("{safe}.asynclog")
}

fn server_of(file: &str) -> Option<String> {
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
                body.insert("op".into(), json!("md"));
                body.insert("f".into(), json!(flags.join(" ")));
            } else {
                body.insert("op".into(), json!("delete"));
            }
        }
        Err(_) => {
            body.insert(
                "k".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(&req.key)),
            );
            body.insert("op".into(), json!("md"));
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
    if body.get("op").and_then(Value::as_str) == Some("md") {
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

impl Spool {
    /// Open (create) the spool directory, merge crash leftovers, start the writer thread.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Spool> {
        fs::create_dir_all(dir)?;
        let mut sizes = HashMap::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(base) = name
                .split_once(".asynclog.replaying")
                .map(|(b, _)| format!("{b}.asynclog"))
            {
                let leftover = fs::read(entry.path())?;
                let mut f = OpenOptions::new().create(true).append(true).open(dir.join(&base))?;
                f.write_all(&leftover)?;
                f.sync_all()?;
                fs::remove_file(entry.path())?;
            }
        }
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(server) = server_of(&name) {
                let len = entry.metadata()?.len();
                if len > 0 {
                    sizes.insert(server, len);
                }
            }
        }
        let total: u64 = sizes.values().sum();
        if total > 0 {
            eprintln!(
                "squeal-router: spool {} holds {total} bytes of deletes for {} servers",
                dir.display(),
                sizes.len()
            );
        }
        let sizes = Arc::new(Mutex::new(sizes));
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = Writer {
            dir: dir.to_path_buf(),
            max_bytes,
            sizes: sizes.clone(),
            files: HashMap::new(),
            seq: 0,
        };
        std::thread::Builder::new()
            .name("spool-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(Spool {
            dir: dir.to_path_buf(),
            tx,
            sizes,
            replaying: Mutex::new(HashSet::new()),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Durably append a failed delete for `server`; false if the spool refused it (full, I/O error).
    pub async fn append(&self, server: &str, pool: &str, req: &Request) -> bool {
        let (ack, rx) = oneshot::channel();
        let line = entry_line(server, pool, req);
        if self
            .tx
            .send(Msg::Append {
                server: server.to_string(),
                line,
                ack,
            })
            .is_err()
        {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Servers that have spooled deletes waiting.
    pub fn servers_with_entries(&self) -> Vec<String> {
        self.sizes
            .lock()
            .expect("spool sizes")
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(s, _)| s.clone())
            .collect()
    }

    async fn take(&self, server: &str) -> Option<PathBuf> {
        let (ack, rx) = oneshot::channel();
        self.tx
            .send(Msg::Take {
                server: server.to_string(),
                ack,
            })
            .ok()?;
        rx.await.ok().flatten()
    }

    async fn restore(&self, server: &str, lines: Vec<String>) {
        let (ack, rx) = oneshot::channel();
        if self
            .tx
            .send(Msg::Restore {
                server: server.to_string(),
                lines,
                ack,
            })
            .is_ok()
        {
            let _ = rx.await;
        }
    }
}

struct Writer {
    dir: PathBuf,
    max_bytes: u64,
    sizes: Arc<Mutex<HashMap<String, u64>>>,
    files: HashMap<String, File>,
    seq: u64,
}

impl Writer {
    fn file(&mut self, server: &str) -> std::io::Result<&mut File> {
        if !self.files.contains_key(server) {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(file_name(server)))?;
            self.files.insert(server.to_string(), f);
        }
        Ok(self.files.get_mut(server).expect("just inserted"))
    }

    fn size(&self, server: &str) -> u64 {
        *self.sizes.lock().expect("spool sizes").get(server).unwrap_or(&0)
    }

    fn add_size(&self, server: &str, n: u64) {
        *self
            .sizes
            .lock()
            .expect("spool sizes")
            .entry(server.to_string())
            .or_insert(0) += n;
    }

    fn run(mut self, rx: std::sync::mpsc::Receiver<Msg>) {
        while let Ok(first) = rx.recv() {
            // Group commit: take everything queued, write, fsync each touched file once, then ack.
            let mut batch = vec![first];
            while let Ok(m) = rx.try_recv() {
                batch.push(m);
            }
            let mut acks: Vec<(oneshot::Sender<bool>, bool)> = Vec::new();
            let mut touched: HashSet<String> = HashSet::new();
            for msg in batch {
                match msg {
                    Msg::Append { server, line, ack } => {
                        let ok = self.size(&server) + (line.len() as u64) < self.max_bytes
                            && self.file(&server).and_then(|f| writeln!(f, "{line}")).is_ok();
                        if ok {
                            self.add_size(&server, line.len() as u64 + 1);
                            touched.insert(server);
                        } else {
                            eprintln!("squeal-router: spool for {server} full or failing; delete refused");
                        }
                        acks.push((ack, ok));
                    }
                    Msg::Take { server, ack } => {
                        self.sync(&mut touched, &mut acks);
                        self.files.remove(&server);
                        let from = self.dir.join(file_name(&server));
                        self.seq += 1;
                        let to = self.dir.join(format!("{}.replaying{}", file_name(&server), self.seq));
                        let taken = fs::rename(&from, &to).is_ok();
                        self.sizes.lock().expect("spool sizes").remove(&server);
                        let _ = ack.send(taken.then_some(to));
                    }
                    Msg::Restore { server, lines, ack } => {
                        let mut n = 0;
                        if let Ok(f) = self.file(&server) {
                            for line in &lines {
                                if writeln!(f, "{line}").is_ok() {
                                    n += line.len() as u64 + 1;
                                }
                            }
                        }
                        self.add_size(&server, n);
                        touched.insert(server);
                        self.sync(&mut touched, &mut acks);
                        let _ = ack.send(());
                    }
                }
            }
            self.sync(&mut touched, &mut acks);
        }
    }

    fn sync(&mut self, touched: &mut HashSet<String>, acks: &mut Vec<(oneshot::Sender<bool>, bool)>) {
        for server in touched.drain() {
            if let Some(f) = self.files.get(&server)
                && let Err(e) = f.sync_data()
            {
                eprintln!("squeal-router: fsync of spool for {server} failed: {e}");
            }
        }
        for (ack, ok) in acks.drain(..) {
            let _ = ack.send(ok);
        }
    }
}

/// Replay `server`'s spooled deletes in the background (one replay per server at a time).
pub fn spawn_replay(ctx: &Arc<Context>, server: Arc<Server>) {
    let Some(spool) = ctx.spool.as_ref() else {
        return;
    };
    if !spool.replaying.lock().expect("replaying").insert(server.addr.clone()) {
        return;
    }
    let ctx = ctx.clone();
    tokio::spawn(async move {
        replay(&ctx, &server).await;
        if let Some(spool) = ctx.spool.as_ref() {
            spool.replaying.lock().expect("replaying").remove(&server.addr);
        }
    });
}

async fn replay(ctx: &Arc<Context>, server: &Arc<Server>) {
    let Some(spool) = ctx.spool.as_ref() else {
        return;
    };
    let Some(path) = spool.take(&server.addr).await else {
        return;
    };
    let text = match tokio::fs::read_to_string(&path).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("squeal-router: cannot read spool {}: {e}", path.display());
            return;
        }
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut replayed = 0u64;
    let mut failed_at = None;
    for (i, line) in lines.iter().enumerate() {
        let Some(req) = parse_entry(line) else {
            eprintln!(
                "squeal-router: skipping unreadable spool line for {}: {line}",
                server.addr
            );
            continue;
        };
        let reply = server.send(&req, ctx.opts.server_timeout).await;
        if reply.res.is_failover_error() {
            failed_at = Some(i);
            break;
        }
        replayed += 1;
        ctx.stats.replayed_deletes.fetch_add(1, Relaxed);
    }
    if let Some(i) = failed_at {
        let rest: Vec<String> = lines[i..].iter().map(|l| l.to_string()).collect();
        eprintln!(
            "squeal-router: replay to {} stopped after {replayed} deletes; {} kept in the spool",
            server.addr,
            rest.len()
        );
        spool.restore(&server.addr, rest).await;
    } else {
        eprintln!("squeal-router: replayed {replayed} spooled deletes to {}", server.addr);
    }
    let _ = tokio::fs::remove_file(&path).await;
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

        let mut md = Request::simple(Cmd::MetaDelete, Bytes::from_static(b"k"));
        md.meta = vec![Bytes::from_static(b"I"), Bytes::from_static(b"T3")];
        let back = parse_entry(&entry_line("h:1", "p", &md)).unwrap();
        assert_eq!(back.cmd, Cmd::MetaDelete);
        assert_eq!(back.meta.len(), 2);
        assert_eq!(server_of(&file_name("127.0.0.1:11211")).unwrap(), "127.0.0.1:11211");
    }
}
