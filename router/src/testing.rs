//! Helpers for the crate's unit tests: requests as tests write them, and a runtime to run them on.

use std::future::Future;

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
