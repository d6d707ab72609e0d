//! squeal-router: a memcached-protocol proxy that reads mcrouter's JSON config dialect.
//!
//! The modules form layers, each importing only from those before it (`make lint` checks that no
//! module imports another in a circle). Bottom up, in the order a request's life needs them:
//!
//! 1. Leaves, no I/O: `protocol` (the wire format: `cmd` the command vocabulary, `parse` client
//!    lines into `request`s, `reply` server answers, `meta`, `numbers`, `lease`, `binary`), `hash`,
//!    `load`, `auth`, `tls`, `lease_tokens`, `recording` (what `__mcrouter__.route` records with),
//!    `jsonc`, `md5`; and `preprocess` (mcrouter's config macros, on `jsonc` alone).
//! 2. `options` (the command line's tunables) and `stats`.
//! 3. `server` (one memcached server: timeouts, TKO, probes; its pipelined connection in
//!    `server::connection`; given what it needs of the process as a `server::Env`), `spool` (failed deletes to disk; `spool::replay` sends them back).
//! 4. `context` (process-wide state that outlives reloads: the live servers, spool, stats, options;
//!    it is the servers' `Env`).
//! 5. `ack` (when a delete counts as acknowledged) and `flush` (`flush_all` to every server).
//! 6. `routes` (the `Route` trait and the `Destination` leaf), then `build` (the `Builder` a
//!    handle's `build` gets, and pools), then the handles `routes::*` (each with its registry
//!    entry beside its `build`), then `registry` (every handle type a config may name).
//! 7. `config` (loading a config with the registry; its `select` chooses the tree for each request).
//! 8. `shared` (the config that serves, swapped on reload), `admin` (`get __mcrouter__.*`),
//!    `connection` (one client: pipelined requests, replies in order; each command's handling in
//!    `connection::commands`, multi-gets in `connection::multiget`, plaintext or TLS `connection::stream`),
//!    `metrics_http` (`/metrics`), `accept` (clients in, refused at the connection limit).
//!
//! `bin/squeal-router/` (the binary: `main` starts and stops, `cli` its command line, `reload` the
//! config and TLS reloads) wires them together; `bin/config_check.rs` checks configs.

pub mod accept;
pub mod ack;
pub mod admin;
pub mod auth;
pub mod build;
pub mod config;
pub mod connection;
pub mod context;
pub mod flush;
pub mod hash;
pub mod jsonc;
pub mod lease_tokens;
pub mod load;
pub mod md5;
pub mod metrics_http;
pub mod options;
pub mod preprocess;
pub mod protocol;
pub mod recording;
pub mod registry;
pub mod routes;
pub mod server;
pub mod shared;
pub mod spool;
pub mod stats;
#[cfg(test)]
mod testing;
pub mod tls;

pub use context::Context;
pub use options::Options;
pub use shared::Shared;
