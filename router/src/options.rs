//! The router's tunables from the command line (`main` fills them; every layer reads them).

use std::sync::Arc;
use std::time::Duration;

use crate::{auth, protocol, tls};

/// Tunables from the command line.
#[derive(Clone, Debug)]
pub struct Options {
    /// Per-request timeout for servers of pools without `server_timeout`.
    pub server_timeout: Duration,
    pub connect_timeout: Duration,
    /// First TKO probe after this long; then x1.5 up to `probe_max`.
    pub probe_initial: Duration,
    pub probe_max: Duration,
    /// `--enable-flush-cmd`: forward `flush_all` to every server of every pool (else refused).
    pub enable_flush: bool,
    /// `--max-item-size`: longer values are refused as memcached refuses items over its `-I`.
    pub max_value: usize,
    /// `--auth-file`: clients log in to the router (memcached `-Y` style); their login never
    /// reaches a server.
    pub client_auth: Option<std::sync::Arc<auth::AuthFile>>,
    /// `--upstream-auth-file`: the router logs in to every new server connection with this.
    pub upstream_login: Option<auth::UpstreamLogin>,
    /// `--pem-ca-path` (and `--pem-cert-path`/`--pem-key-path`): TLS to the servers of pools with
    /// `"security_mech": "tls"`.
    pub upstream_tls: Option<Arc<tls::Upstream>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            server_timeout: Duration::from_millis(1000),
            connect_timeout: Duration::from_millis(1000),
            probe_initial: Duration::from_secs(10),
            probe_max: Duration::from_secs(60),
            enable_flush: false,
            max_value: protocol::parse::MAX_VALUE_LEN,
            client_auth: None,
            upstream_login: None,
            upstream_tls: None,
        }
    }
}
