//! The delete spool: failed deletes are written to disk and replayed before their server serves again.
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
//! not UTF-8 is stored base64-encoded as an `md` with flag `b`.) Every file operation goes through
//! one writer thread, in order. Appends are batched and fsync'd before they are acknowledged (group
//! commit); a delete whose write or fsync failed, or that would pass the server's bound, is refused
//! (`crate::ack`: the client sees an error, never a silent drop).
//!
//! A server with spooled deletes is out of the read path (TKO) until they are replayed
//! (`catch_up`): the replay takes the file (renamed to `.replaying<N>`), sends its deletes in order,
//! pipelined, and puts the unsent rest back *in front of* the deletes spooled meanwhile; when the
//! writer finds the file empty it clears the server's TKO in the same step, so a delete spooled just
//! after that is seen by its destination, which holds the server out again. Leftovers of a crash
//! during replay are merged back in front at start-up. A server's bound (`--spool-max-mb`) counts
//! the deletes being replayed too.

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

/// Deletes of a replay sent to the server before their replies are awaited.
const REPLAY_WINDOW: usize = 256;

/// Runs on the writer thread when a server's spool is found empty (clears its TKO).
type OnEmpty = Box<dyn FnOnce() + Send>;

enum Msg {
    Append {
        server: String,
        line: String,
        ack: oneshot::Sender<Result<(), String>>,
    },
    /// Take the server's file for replay or, if it holds nothing, run `on_empty`.
    TakeOrClear {
        server: String,
        on_empty: OnEmpty,
        ack: oneshot::Sender<Take>,
    },
    /// A replay of a taken file of `taken` bytes ended; `rest` (unsent, in order) goes back in front.
    Finish {
        server: String,
        taken: u64,
        rest: Vec<String>,
        ack: oneshot::Sender<()>,
    },
}

enum Take {
    Taken(PathBuf, u64),
    Cleared,
    Failed(String),
}

/// How the writer makes a file durable (a parameter so tests can make it fail).
type SyncFn = fn(&File) -> std::io::Result<()>;

pub struct Spool {
    dir: PathBuf,
    tx: std::sync::mpsc::Sender<Msg>,
    /// Bytes spooled per server: its file plus a file being replayed.
    sizes: Arc<Mutex<HashMap<String, u64>>>,
    /// One replay per server at a time.
    replay_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
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

/// `dir/<file>` written as `first` lines followed by the bytes of the files `then` (those that
/// exist), made durable and renamed into place: how older deletes go back in front of newer ones.
fn rewrite(dir: &Path, file: &str, first: &[String], then: &[PathBuf], sync: SyncFn) -> std::io::Result<()> {
    let tmp = dir.join(format!("{file}.restore"));
    let mut out = File::create(&tmp)?;
    let mut head = String::new();
    for line in first {
        head.push_str(line);
        head.push('\n');
    }
    out.write_all(head.as_bytes())?;
    for path in then {
        match fs::read(path) {
            Ok(data) => {
                out.write_all(&data)?;
                if data.last().is_some_and(|&b| b != b'\n') {
                    out.write_all(b"\n")?; // a torn last line must not swallow the next file's first
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    sync(&out)?;
    fs::rename(&tmp, dir.join(file))?;
    File::open(dir)?.sync_all()
}

fn sync_data(f: &File) -> std::io::Result<()> {
    f.sync_data()
}

impl Spool {
    /// Open (create) the spool directory, merge crash leftovers, start the writer thread.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Spool> {
        Spool::open_with(dir, max_bytes, sync_data)
    }

    fn open_with(dir: &Path, max_bytes: u64, sync: SyncFn) -> std::io::Result<Spool> {
        fs::create_dir_all(dir)?;
        // Leftovers of a crash mid-replay (`<file>.replaying<N>`) are older than what `<file>` holds:
        // they go back in front of it, oldest first. A `.restore` is an unfinished rewrite: its
        // sources are all still there.
        let mut leftovers: HashMap<String, Vec<(u64, PathBuf)>> = HashMap::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".restore") {
                fs::remove_file(entry.path())?;
            } else if let Some((stem, seq)) = name.split_once(".asynclog.replaying") {
                let seq = seq.parse().unwrap_or(0);
                leftovers
                    .entry(format!("{stem}.asynclog"))
                    .or_default()
                    .push((seq, entry.path()));
            }
        }
        for (file, mut parts) in leftovers {
            parts.sort();
            let mut sources: Vec<PathBuf> = parts.iter().map(|(_, p)| p.clone()).collect();
            sources.push(dir.join(&file));
            rewrite(dir, &file, &[], &sources, sync)?;
            for (_, p) in parts {
                fs::remove_file(p)?;
            }
        }
        let mut sizes = HashMap::new();
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
            torn: HashSet::new(),
            seq: 0,
            sync,
        };
        std::thread::Builder::new()
            .name("spool-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(Spool {
            dir: dir.to_path_buf(),
            tx,
            sizes,
            replay_locks: Mutex::new(HashMap::new()),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Durably append a failed delete for `server`; `Err(why)` if the spool refused it (full, or the
    /// write or the fsync failed).
    pub async fn append(&self, server: &str, pool: &str, req: &Request) -> Result<(), String> {
        let (ack, rx) = oneshot::channel();
        let line = entry_line(server, pool, req);
        self.tx
            .send(Msg::Append {
                server: server.to_string(),
                line,
                ack,
            })
            .map_err(|_| "spool writer stopped".to_string())?;
        rx.await.unwrap_or_else(|_| Err("spool writer stopped".into()))
    }

    /// Whether deletes for `server` are waiting (or being replayed).
    pub fn has_entries(&self, server: &str) -> bool {
        self.sizes
            .lock()
            .expect("spool sizes")
            .get(server)
            .is_some_and(|n| *n > 0)
    }

    /// Servers that have spooled deletes waiting.
    pub fn servers_with_entries(&self) -> Vec<String> {
        let mut servers: Vec<String> = self
            .sizes
            .lock()
            .expect("spool sizes")
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(s, _)| s.clone())
            .collect();
        servers.sort();
        servers
    }

    fn replay_lock(&self, server: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.replay_locks
            .lock()
            .expect("replay locks")
            .entry(server.to_string())
            .or_default()
            .clone()
    }

    async fn take_or_clear(&self, server: &str, on_empty: OnEmpty) -> Take {
        let (ack, rx) = oneshot::channel();
        let msg = Msg::TakeOrClear {
            server: server.to_string(),
            on_empty,
            ack,
        };
        if self.tx.send(msg).is_err() {
            return Take::Failed("spool writer stopped".into());
        }
        rx.await.unwrap_or_else(|_| Take::Failed("spool writer stopped".into()))
    }

    async fn finish(&self, server: &str, taken: u64, rest: Vec<String>) {
        let (ack, rx) = oneshot::channel();
        let msg = Msg::Finish {
            server: server.to_string(),
            taken,
            rest,
            ack,
        };
        if self.tx.send(msg).is_ok() {
            let _ = rx.await;
        }
    }
}

struct Writer {
    dir: PathBuf,
    max_bytes: u64,
    sizes: Arc<Mutex<HashMap<String, u64>>>,
    files: HashMap<String, File>,
    /// Servers whose last write failed part-way: their next line starts on a line of its own.
    torn: HashSet<String>,
    seq: u64,
    sync: SyncFn,
}

/// An append waiting for its batch's fsync: (server, ack, outcome so far).
type Pending = (String, oneshot::Sender<Result<(), String>>, Result<(), String>);

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

    fn set_size(&self, server: &str, f: impl FnOnce(u64) -> u64) {
        let mut sizes = self.sizes.lock().expect("spool sizes");
        let n = f(*sizes.get(server).unwrap_or(&0));
        if n == 0 {
            sizes.remove(server);
        } else {
            sizes.insert(server.to_string(), n);
        }
    }

    fn run(mut self, rx: std::sync::mpsc::Receiver<Msg>) {
        while let Ok(first) = rx.recv() {
            // Group commit: take everything queued, write, fsync each touched file once, then ack.
            let mut batch = vec![first];
            while let Ok(m) = rx.try_recv() {
                batch.push(m);
            }
            let mut pending: Vec<Pending> = Vec::new();
            let mut touched: HashSet<String> = HashSet::new();
            for msg in batch {
                match msg {
                    Msg::Append { server, line, ack } => {
                        let outcome = self.append(&server, &line);
                        match &outcome {
                            Ok(()) => {
                                touched.insert(server.clone());
                            }
                            Err(why) => eprintln!("squeal-router: spool for {server}: delete refused ({why})"),
                        }
                        pending.push((server, ack, outcome));
                    }
                    Msg::TakeOrClear { server, on_empty, ack } => {
                        self.sync(&mut touched, &mut pending);
                        let _ = ack.send(self.take_or_clear(&server, on_empty));
                    }
                    Msg::Finish {
                        server,
                        taken,
                        rest,
                        ack,
                    } => {
                        self.sync(&mut touched, &mut pending);
                        self.finish(&server, taken, rest);
                        let _ = ack.send(());
                    }
                }
            }
            self.sync(&mut touched, &mut pending);
        }
    }

    fn append(&mut self, server: &str, line: &str) -> Result<(), String> {
        let size = self.size(server);
        let mut buf = String::with_capacity(line.len() + 2);
        if self.torn.contains(server) {
            buf.push('\n');
        }
        buf.push_str(line);
        buf.push('\n');
        if size + buf.len() as u64 > self.max_bytes {
            return Err(format!(
                "spool full: {size} bytes of the {} allowed (--spool-max-mb)",
                self.max_bytes
            ));
        }
        let f = self
            .file(server)
            .map_err(|e| format!("cannot open the spool file: {e}"))?;
        if let Err(e) = f.write_all(buf.as_bytes()) {
            self.torn.insert(server.to_string());
            self.files.remove(server);
            return Err(format!("spool write failed: {e}"));
        }
        self.torn.remove(server);
        self.set_size(server, |n| n + buf.len() as u64);
        Ok(())
    }

    /// fsync every touched file, then answer the batch's appends: those of a file whose fsync
    /// failed are refused (their lines may be on disk or not; a later fsync cannot tell).
    fn sync(&mut self, touched: &mut HashSet<String>, pending: &mut Vec<Pending>) {
        let mut failed: HashMap<String, String> = HashMap::new();
        for server in touched.drain() {
            if let Some(f) = self.files.get(&server)
                && let Err(e) = (self.sync)(f)
            {
                eprintln!("squeal-router: fsync of the spool for {server} failed: {e}; its deletes are refused");
                self.files.remove(&server);
                failed.insert(server, format!("spool fsync failed: {e}"));
            }
        }
        for (server, ack, outcome) in pending.drain(..) {
            let outcome = match (outcome, failed.get(&server)) {
                (Ok(()), Some(why)) => Err(why.clone()),
                (outcome, _) => outcome,
            };
            let _ = ack.send(outcome);
        }
    }

    fn take_or_clear(&mut self, server: &str, on_empty: OnEmpty) -> Take {
        self.files.remove(server);
        self.torn.remove(server);
        let from = self.dir.join(file_name(server));
        match fs::metadata(&from) {
            Ok(m) if m.len() > 0 => {
                self.seq += 1;
                let to = self.dir.join(format!("{}.replaying{}", file_name(server), self.seq));
                match fs::rename(&from, &to) {
                    Ok(()) => Take::Taken(to, m.len()),
                    Err(e) => Take::Failed(format!("cannot take {}: {e}", from.display())),
                }
            }
            Ok(_) => self.cleared(server, &from, on_empty),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.cleared(server, &from, on_empty),
            Err(e) => Take::Failed(format!("cannot read {}: {e}", from.display())),
        }
    }

    /// Nothing (left) to replay: `on_empty` runs here, before any later append is written.
    fn cleared(&mut self, server: &str, file: &Path, on_empty: OnEmpty) -> Take {
        let _ = fs::remove_file(file);
        self.set_size(server, |_| 0);
        on_empty();
        Take::Cleared
    }

    fn finish(&mut self, server: &str, taken: u64, rest: Vec<String>) {
        let back: u64 = rest.iter().map(|l| l.len() as u64 + 1).sum();
        if !rest.is_empty() {
            self.files.remove(server);
            let file = file_name(server);
            if let Err(e) = rewrite(&self.dir, &file, &rest, &[self.dir.join(&file)], self.sync) {
                // not in front, but not lost either
                eprintln!(
                    "squeal-router: cannot put {} unsent deletes back in front of the spool for {server} ({e}); appending them",
                    rest.len()
                );
                let mut tail = String::from("\n");
                for line in &rest {
                    tail.push_str(line);
                    tail.push('\n');
                }
                let sync = self.sync;
                if let Err(e) = self
                    .file(server)
                    .and_then(|f| f.write_all(tail.as_bytes()).and_then(|()| sync(f)))
                {
                    eprintln!(
                        "squeal-router: cannot append them either ({e}); they stay in the .replaying file until restart"
                    );
                }
            }
        }
        self.set_size(server, |n| n.saturating_sub(taken) + back);
    }
}

/// Replay `server`'s spooled deletes until none are left, then clear its TKO (in order with spool
/// appends, see the module doc). False if a delete could not be delivered: the server stays TKO
/// and the unsent deletes stay spooled, in order. Without a spool, just clears TKO.
pub async fn catch_up(ctx: &Arc<Context>, server: &Arc<Server>) -> bool {
    let Some(spool) = ctx.spool.as_ref() else {
        server.clear_tko();
        return true;
    };
    let lock = spool.replay_lock(&server.addr);
    let _one_at_a_time = lock.lock().await;
    loop {
        let on_empty: OnEmpty = {
            let server = server.clone();
            Box::new(move || server.clear_tko())
        };
        match spool.take_or_clear(&server.addr, on_empty).await {
            Take::Cleared => return true,
            Take::Failed(why) => {
                eprintln!("squeal-router: replay to {} not possible: {why}", server.addr);
                return false;
            }
            Take::Taken(path, taken) => {
                if !replay(ctx, spool, server, &path, taken).await {
                    return false;
                }
            }
        }
    }
}

/// Send the deletes of one taken file, in order; put back what was not delivered. True if all were.
async fn replay(ctx: &Context, spool: &Spool, server: &Arc<Server>, path: &Path, taken: u64) -> bool {
    let text = match tokio::fs::read(path).await {
        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
        Err(e) => {
            // left as it is: start-up merges it back in front
            eprintln!("squeal-router: cannot read spool {}: {e}", path.display());
            return false;
        }
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut replayed = 0u64;
    let mut failed_at = None;
    'window: for (w, window) in lines.chunks(REPLAY_WINDOW).enumerate() {
        let reqs: Vec<Option<Request>> = window.iter().map(|l| parse_entry(l)).collect();
        let sendable: Vec<Request> = reqs.iter().flatten().cloned().collect();
        let mut replies = server.send_all(&sendable, ctx.opts.server_timeout).await.into_iter();
        for (i, (req, line)) in reqs.iter().zip(window).enumerate() {
            if req.is_none() {
                eprintln!(
                    "squeal-router: skipping unreadable spool line for {}: {line}",
                    server.addr
                );
                continue;
            }
            let reply = replies.next().expect("one reply per request");
            if reply.res.is_failover_error() {
                failed_at = Some(w * REPLAY_WINDOW + i);
                break 'window;
            }
            replayed += 1;
        }
    }
    ctx.stats.replayed_deletes.fetch_add(replayed, Relaxed);
    let rest: Vec<String> = match failed_at {
        Some(i) => lines[i..].iter().map(|l| l.to_string()).collect(),
        None => Vec::new(),
    };
    if rest.is_empty() {
        eprintln!("squeal-router: replayed {replayed} spooled deletes to {}", server.addr);
    } else {
        eprintln!(
            "squeal-router: replay to {} stopped after {replayed} deletes; {} kept in the spool, in order",
            server.addr,
            rest.len()
        );
    }
    let delivered = rest.is_empty();
    spool.finish(&server.addr, taken, rest).await;
    let _ = tokio::fs::remove_file(path).await;
    delivered
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

    use crate::routes::testing::run;
    use std::sync::atomic::{AtomicBool, Ordering};

    const SRV: &str = "127.0.0.1:7";

    fn tmpdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("squeal-spool-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn del(key: &str) -> Request {
        Request::simple(Cmd::Delete, Bytes::copy_from_slice(key.as_bytes()))
    }

    /// The keys of a spool file's readable lines, in order (replay skips the others).
    fn keys(path: &Path) -> Vec<String> {
        fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(parse_entry)
            .map(|r| String::from_utf8(r.key.to_vec()).unwrap())
            .collect()
    }

    fn never() -> OnEmpty {
        Box::new(|| panic!("the spool is not empty"))
    }

    #[test]
    fn the_unsent_rest_of_a_replay_goes_back_in_front_of_newer_deletes() {
        let dir = tmpdir("order");
        run(async {
            let spool = Spool::open(&dir, 1 << 20).unwrap();
            for k in ["a", "b", "c"] {
                spool.append(SRV, "p", &del(k)).await.unwrap();
            }
            let Take::Taken(path, taken) = spool.take_or_clear(SRV, never()).await else {
                panic!("nothing taken");
            };
            spool.append(SRV, "p", &del("d")).await.unwrap(); // spooled while the replay runs
            // `a` was delivered, then the server failed again
            let rest: Vec<String> = fs::read_to_string(&path)
                .unwrap()
                .lines()
                .skip(1)
                .map(String::from)
                .collect();
            spool.finish(SRV, taken, rest).await;
            let file = dir.join(file_name(SRV));
            assert_eq!(keys(&file), ["b", "c", "d"]);
            // the bound counts what is left: b, c, d
            let len = fs::metadata(&file).unwrap().len();
            assert_eq!(spool.sizes.lock().unwrap().get(SRV), Some(&len));
            assert!(spool.has_entries(SRV));
            // all delivered: empty, and the next take clears in the writer's order
            let Take::Taken(path, taken) = spool.take_or_clear(SRV, never()).await else {
                panic!("nothing taken");
            };
            spool.finish(SRV, taken, Vec::new()).await;
            fs::remove_file(path).unwrap();
            let cleared = Arc::new(AtomicBool::new(false));
            let flag = cleared.clone();
            assert!(matches!(
                spool
                    .take_or_clear(SRV, Box::new(move || flag.store(true, Ordering::SeqCst)))
                    .await,
                Take::Cleared
            ));
            assert!(cleared.load(Ordering::SeqCst) && !spool.has_entries(SRV));
        });
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn crash_leftovers_are_merged_back_in_front_oldest_first() {
        let dir = tmpdir("leftovers");
        let line = |k: &str| entry_line(SRV, "p", &del(k)) + "\n";
        let file = file_name(SRV);
        fs::write(dir.join(&file), line("d")).unwrap();
        fs::write(dir.join(format!("{file}.replaying3")), line("b") + &line("c")).unwrap();
        fs::write(
            dir.join(format!("{file}.replaying1")),
            line("a") + "[\"AS2.0\", 1, \"C\", {\"k\": \"tor",
        )
        .unwrap();
        fs::write(dir.join(format!("{file}.restore")), line("half-written")).unwrap();
        let spool = Spool::open(&dir, 1 << 20).unwrap();
        assert_eq!(keys(&dir.join(&file)), ["a", "b", "c", "d"]);
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [file]);
        assert!(spool.has_entries(SRV));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_fsync_refuses_the_deletes_of_its_batch() {
        let dir = tmpdir("fsync");
        run(async {
            let spool = Spool::open_with(&dir, 1 << 20, |_| Err(std::io::Error::other("injected EIO"))).unwrap();
            let err = spool.append(SRV, "p", &del("k")).await.unwrap_err();
            assert!(err.contains("fsync failed: injected EIO"), "{err}");
        });
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_bound_counts_deletes_being_replayed() {
        let dir = tmpdir("bound");
        run(async {
            let one = entry_line(SRV, "p", &del("k")).len() as u64 + 1;
            let spool = Spool::open(&dir, 2 * one + one / 2).unwrap();
            spool.append(SRV, "p", &del("k")).await.unwrap();
            spool.append(SRV, "p", &del("k")).await.unwrap();
            let full = spool.append(SRV, "p", &del("k")).await.unwrap_err();
            assert!(full.contains("spool full"), "{full}");
            let Take::Taken(path, taken) = spool.take_or_clear(SRV, never()).await else {
                panic!("nothing taken");
            };
            assert!(
                spool.append(SRV, "p", &del("k")).await.is_err(),
                "still full while replaying"
            );
            spool.finish(SRV, taken, Vec::new()).await;
            fs::remove_file(path).unwrap();
            spool.append(SRV, "p", &del("k")).await.unwrap();
            // a bound of 0 refuses everything
            let none = Spool::open(&dir.join("zero"), 0).unwrap();
            assert!(none.append(SRV, "p", &del("k")).await.is_err());
        });
        let _ = fs::remove_dir_all(&dir);
    }
}
