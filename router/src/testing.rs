//! Helpers for the crate's unit tests: requests as tests write them, a runtime to run them on, and a fake
//! memcached to send them to.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::protocol::{Cmd, Request};

pub fn req(cmd: Cmd, key: &str) -> Request {
    Request::simple(cmd, bytes::Bytes::copy_from_slice(key.as_bytes()))
}

pub fn set_req(key: &str, exptime: i64) -> Request {
    let mut r = req(Cmd::Set, key);
    r.exptime = exptime;
    r.value = bytes::Bytes::from_static(b"v");
    r
}

pub fn run<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A fake memcached on a free loopback port: answers each request line with `answer(line)`, except the
/// router's `version` on a new connection (see `auth::prepare`), answered as memcached does and not recorded.
/// Returns its address and the lines it saw.
pub async fn fake_memcached(answer: fn(&str) -> &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let (rd, mut wr) = stream.into_split();
                let mut lines = BufReader::new(rd).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply = if line == "version" {
                        "VERSION fake\r\n"
                    } else {
                        let reply = answer(&line);
                        log.lock().unwrap().push(line);
                        reply
                    };
                    if wr.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}
