//! The memcached ASCII wire format, classic and meta, with no I/O.
//!
//! `request` parses what clients send (strictly: a bad line becomes a `CLIENT_ERROR` reply and the
//! connection survives) and re-encodes requests for servers. `reply` parses what servers answer
//! into a result class that route handles reason about, keeping the raw bytes to pass through.
//! Keeping this apart from sockets makes it testable with plain bytes and fuzzable.

pub mod lease;
pub mod meta;
pub mod numbers;
pub mod reply;
pub mod request;

pub use reply::{Reply, ReplyKind, Res};
pub use request::{Cmd, Command, Op, ParseOutcome, Request};
