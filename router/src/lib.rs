//! squeal-router: a memcached-protocol proxy that reads mcrouter's JSON config dialect.
//!
//! Layers, bottom up: `protocol` (wire format, no I/O), `server` (per-server connections, TKO),
//! `spool` (failed deletes to disk and back), `ack` (when a delete counts as acknowledged), `routes` (route handles, one per file) built by
//! `config` from JSON, `connection` (one client connection: buffered reads, replies in request
//! order; `connection::multiget` batches a multi-key get per server), `flush` (opt-in `flush_all` to every server of the config), `metrics_http` (Prometheus
//! `/metrics`), `accept` (accepting clients; refusing them at the connection limit as memcached
//! does), `admin` (`get __mcrouter__.*` admin requests, answered by the router itself).
//! `main` wires them together.

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
