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
//!
//! Parts: `format` (the line format), `writer` (the writer thread: append, fsync, bound, taking
//! and restoring files), `replay` (sending a server's spooled deletes back).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::protocol::Request;

mod format;
pub mod replay;
mod writer;

pub use format::{entry_line, parse_entry};
use writer::{Msg, OnEmpty, SyncFn, Take, sync_data};

pub struct Spool {
    dir: PathBuf,
    tx: std::sync::mpsc::Sender<Msg>,
    /// Bytes spooled per server: its file plus a file being replayed.
    sizes: Arc<Mutex<HashMap<String, u64>>>,
    /// One replay per server at a time.
    replay_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Spool {
    /// Open (create) the spool directory, merge crash leftovers, start the writer thread.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Spool> {
        Spool::open_with(dir, max_bytes, sync_data)
    }

    fn open_with(dir: &Path, max_bytes: u64, sync: SyncFn) -> std::io::Result<Spool> {
        let sizes = Arc::new(Mutex::new(writer::recover(dir, sync)?));
        let tx = writer::start(dir, max_bytes, sizes.clone(), sync)?;
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

#[cfg(test)]
mod tests {
    use std::fs;

    use bytes::Bytes;

    use super::*;
    use crate::protocol::Cmd;
    use crate::spool::format::file_name;

    use crate::testing::run;
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
