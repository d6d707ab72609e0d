//! The memcached ASCII wire format, classic and meta, with no I/O.
//!
//! `cmd` is the command vocabulary; `parse` reads what clients send (strictly: a bad line becomes a
//! `CLIENT_ERROR` reply and the connection survives) into `request`s, which re-encode themselves for
//! servers; `binary` refuses the binary protocol. `reply` parses what servers answer
//! into a result class that route handles reason about, keeping the raw bytes to pass through.
//! Keeping this apart from sockets makes it testable with plain bytes and fuzzable.

pub mod binary;
pub mod cmd;
pub mod lease;
pub mod meta;
pub mod numbers;
pub mod parse;
pub mod reply;
pub mod request;

pub use cmd::{Cmd, Op};
pub use parse::{Command, ParseOutcome};
pub use reply::{Reply, ReplyKind, Res};
pub use request::Request;
