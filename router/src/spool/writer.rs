//! The spool's writer thread: every file operation, in order. Appends are batched and fsync'd
//! before they are acknowledged (group commit) and refused past a server's bound; replays take a
//! server's file and put their unsent rest back in front (`crate::spool::replay`); start-up merges
//! the leftovers of a crash back in front (`recover`).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::format::{file_name, server_of};

/// Runs on the writer thread when a server's spool is found empty (clears its TKO).
pub(super) type OnEmpty = Box<dyn FnOnce() + Send>;

pub(super) enum Msg {
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

pub(super) enum Take {
    Taken(PathBuf, u64),
    Cleared,
    Failed(String),
}

/// How the writer makes a file durable (a parameter so tests can make it fail).
pub(super) type SyncFn = fn(&File) -> std::io::Result<()>;

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

pub(super) fn sync_data(f: &File) -> std::io::Result<()> {
    f.sync_data()
}

/// Open (create) the spool directory and merge crash leftovers; returns the bytes spooled per
/// server.
pub(super) fn recover(dir: &Path, sync: SyncFn) -> std::io::Result<HashMap<String, u64>> {
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
    Ok(sizes)
}

/// Start the writer thread; its messages go to the returned sender.
pub(super) fn start(
    dir: &Path,
    max_bytes: u64,
    sizes: Arc<Mutex<HashMap<String, u64>>>,
    sync: SyncFn,
) -> std::io::Result<Sender<Msg>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = Writer {
        dir: dir.to_path_buf(),
        max_bytes,
        sizes,
        files: HashMap::new(),
        torn: HashSet::new(),
        seq: 0,
        sync,
    };
    std::thread::Builder::new()
        .name("spool-writer".into())
        .spawn(move || writer.run(rx))?;
    Ok(tx)
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

    fn run(mut self, rx: Receiver<Msg>) {
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
