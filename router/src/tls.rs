//! TLS on both sides of the router, with rustls (ring provider; no OpenSSL).
//!
//! - **Clients** (`--ssl-port`): a [`Listener`] holds the server certificate, key and (optionally)
//!   the CA that client certificates must chain to; [`Listener::reload`] reads the files again
//!   (SIGHUP, or the files changing), and the next handshake uses them while connections already
//!   open keep going on the session they have.
//! - **Servers** (a pool with `"security_mech": "tls"`, mcrouter's pool option): a [`Upstream`]
//!   holds the CA that memcached's certificates must chain to (`--pem-ca-path`), and the router's
//!   own client certificate if given (`--pem-cert-path`/`--pem-key-path`) for memcached's
//!   `ssl_verify_mode`. A server's certificate must name the host it is reached at (or
//!   `--ssl-service-identity`).
//!
//! A refused handshake is one log line naming the peer and the reason ([`reason`]), at most
//! [`LOG_BURST`] a second ([`FailureLog`]); the rest are counted and summed up in one line.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;

/// How long a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshake failures logged one by one per second at most; more are counted and summed up.
pub const LOG_BURST: u32 = 5;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of the PEM file `path` (at least one), or an error naming the file.
pub fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |e: &dyn std::fmt::Display| format!("{what} {}: {e}", path.display());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&pem_error(e)))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&pem_error(e)))?;
    if certs.is_empty() {
        return Err(bad(&"no PEM certificate (-----BEGIN CERTIFICATE-----) in it"));
    }
    Ok(certs)
}

/// The private key of the PEM file `path`, or an error naming the file.
pub fn read_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{what} {}: {}", path.display(), pem_error(e)))
}

fn pem_error(e: rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(e) => format!("cannot read: {e}"),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM private key in it".into(),
        other => format!("not valid PEM: {other:?}"),
    }
}

fn roots(path: &Path, what: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path, what)? {
        roots
            .add(cert)
            .map_err(|e| format!("{what} {}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

/// What the client-facing TLS listener is built from (mcrouter's `--server-pem-*` flags).
#[derive(Clone, Debug)]
pub struct ListenerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates are verified against this CA when presented.
    pub ca: Option<PathBuf>,
    /// Clients must present a certificate (`--ssl-require-peer-certs`).
    pub require_client_cert: bool,
}

impl ListenerFiles {
    /// Read the files and build the rustls config (errors name the file and the flag).
    pub fn build(&self) -> Result<Arc<ServerConfig>, String> {
        let certs = read_certs(&self.cert, "--server-pem-cert-path")?;
        let key = read_key(&self.key, "--server-pem-key-path")?;
        let provider = provider();
        let verifier = match &self.ca {
            Some(ca) => {
                let b = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots(ca, "--server-pem-ca-path")?),
                    provider.clone(),
                );
                let b = if self.require_client_cert {
                    b
                } else {
                    b.allow_unauthenticated()
                };
                b.build()
                    .map_err(|e| format!("--server-pem-ca-path {}: {e}", ca.display()))?
            }
            None if self.require_client_cert => {
                return Err(
                    "--ssl-require-peer-certs needs a CA to check them: --server-pem-ca-path (or --pem-ca-path)".into(),
                );
            }
            None => WebPkiClientVerifier::no_client_auth(),
        };
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| {
                format!(
                    "--server-pem-cert-path {} / --server-pem-key-path {}: {e}",
                    self.cert.display(),
                    self.key.display()
                )
            })?;
        Ok(Arc::new(config))
    }
}

/// The client-facing TLS setup, reloadable.
pub struct Listener {
    pub files: ListenerFiles,
    current: RwLock<Arc<ServerConfig>>,
    pub failures: FailureLog,
}

impl Listener {
    pub fn new(files: ListenerFiles) -> Result<Arc<Listener>, String> {
        let config = files.build()?;
        Ok(Arc::new(Listener {
            files,
            current: RwLock::new(config),
            failures: FailureLog::default(),
        }))
    }

    /// The acceptor for the next handshake.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Read the certificate files again; on an error the old ones keep serving.
    pub fn reload(&self) -> Result<(), String> {
        let config = self.files.build()?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(())
    }
}

/// What TLS connections to servers are built from (mcrouter's `--pem-*` flags).
#[derive(Clone, Debug, Default)]
pub struct UpstreamFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name servers' certificates must carry (`--ssl-service-identity`); else the host of the
    /// server's address.
    pub service_identity: Option<String>,
}

impl UpstreamFiles {
    pub fn build(&self) -> Result<Arc<ClientConfig>, String> {
        let Some(ca) = &self.ca else {
            return Err("no --pem-ca-path".into());
        };
        let b = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots(ca, "--pem-ca-path")?);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => b
                .with_client_auth_cert(read_certs(cert, "--pem-cert-path")?, read_key(key, "--pem-key-path")?)
                .map_err(|e| {
                    format!(
                        "--pem-cert-path {} / --pem-key-path {}: {e}",
                        cert.display(),
                        key.display()
                    )
                })?,
            (None, None) => b.with_no_client_auth(),
            _ => return Err("--pem-cert-path and --pem-key-path go together".into()),
        };
        Ok(Arc::new(config))
    }
}

/// The server-facing TLS setup, reloadable (new connections use the files as last read).
pub struct Upstream {
    pub files: UpstreamFiles,
    current: RwLock<Arc<ClientConfig>>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").field("files", &self.files).finish()
    }
}

impl Upstream {
    pub fn new(files: UpstreamFiles) -> Result<Arc<Upstream>, String> {
        let config = files.build()?;
        Ok(Arc::new(Upstream {
            files,
            current: RwLock::new(config),
        }))
    }

    pub fn reload(&self) -> Result<(), String> {
        let config = self.files.build()?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(())
    }

    /// A TLS session over `tcp` to the server at `addr` ("host:port"), its certificate verified.
    pub async fn connect(
        &self,
        addr: &str,
        tcp: TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let host = match &self.files.service_identity {
            Some(name) => name.clone(),
            None => host_of(addr).to_string(),
        };
        let name = ServerName::try_from(host.clone()).map_err(|e| format!("TLS: bad server name `{host}`: {e}"))?;
        let config = self.current.read().unwrap_or_else(|e| e.into_inner()).clone();
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake failed: {}", reason(&e, Peer::Server)))
    }
}

/// The host part of "host:port" or "[v6]:port".
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Which end of a handshake the router is: it accepts TLS clients and it dials TLS servers, and a
/// peer that does not speak TLS at all is a different mistake on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The router accepted the connection on a TLS port.
    Client,
    /// The router dialled a server of a TLS pool.
    Server,
}

/// Why a handshake with `peer` failed, in words an operator can act on.
pub fn reason(e: &io::Error, peer: Peer) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<E>()) else {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof => "the peer closed the connection during the handshake".into(),
            _ => e.to_string(),
        };
    };
    let cert = |c: &C| match c {
        C::UnknownIssuer => "certificate not signed by a trusted CA (unknown issuer)".to_string(),
        C::Expired | C::ExpiredContext { .. } => format!("certificate expired ({tls})"),
        C::NotValidYet | C::NotValidYetContext { .. } => format!("certificate not valid yet ({tls})"),
        C::NotValidForName | C::NotValidForNameContext { .. } => format!("hostname mismatch ({tls})"),
        C::BadSignature => "certificate has a bad signature".into(),
        C::Revoked => "certificate revoked".into(),
        _ => tls.to_string(),
    };
    match tls {
        E::InvalidCertificate(c) => format!("peer's {}", cert(c)),
        E::NoCertificatesPresented => "the client presented no certificate (--ssl-require-peer-certs)".into(),
        E::AlertReceived(a) => {
            let why = match a {
                A::UnknownCA => "it does not trust our certificate's CA",
                A::CertificateExpired => "it finds our certificate expired",
                A::BadCertificate | A::CertificateUnknown => "it rejected our certificate",
                A::CertificateRequired => "it requires a client certificate and we sent none",
                A::HandshakeFailure => "no common protocol or cipher",
                A::ProtocolVersion => "no common TLS version",
                _ => "",
            };
            if why.is_empty() {
                format!("the peer refused the handshake (alert {a:?})")
            } else {
                format!("the peer refused the handshake: {why} (alert {a:?})")
            }
        }
        E::InvalidMessage(_) | E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => match peer {
            Peer::Client => format!("not a TLS handshake from the client (a plaintext client on a TLS port?): {tls}"),
            Peer::Server => format!(
                "the server did not answer in TLS (a plaintext memcached? start it with -Z, or remove \"security_mech\": \"tls\" from its pool): {tls}"
            ),
        },
        other => other.to_string(),
    }
}

/// TLS clients that came to a plaintext port (see `crate::connection`), logged as handshake
/// failures are.
pub static PLAINTEXT_PORT: std::sync::LazyLock<FailureLog> = std::sync::LazyLock::new(FailureLog::default);

/// Handshake failures, logged one line each up to [`LOG_BURST`] a second, then summed up.
#[derive(Default)]
pub struct FailureLog {
    state: Mutex<(Option<Instant>, u32, u64)>,
    pub total: std::sync::atomic::AtomicU64,
}

impl FailureLog {
    /// Log (or count) one failure: `what` names the side and the peer.
    pub fn note(&self, what: &str, why: &str) {
        self.total.fetch_add(1, Relaxed);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (start, logged, suppressed) = &mut *st;
        if start.is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1)) {
            if *suppressed > 0 {
                eprintln!(
                    "squeal-router: {suppressed} more TLS handshake failures not logged one by one (see tls_handshake_failures in stats)"
                );
            }
            *start = Some(now);
            *logged = 0;
            *suppressed = 0;
        }
        if *logged < LOG_BURST {
            *logged += 1;
            eprintln!("squeal-router: TLS: {what}: {why}");
        } else {
            *suppressed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_addresses() {
        assert_eq!(host_of("127.0.0.1:11211"), "127.0.0.1");
        assert_eq!(host_of("[::1]:11211"), "::1");
        assert_eq!(host_of("cache.example:1"), "cache.example");
    }

    #[test]
    fn missing_files_are_named() {
        let files = ListenerFiles {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
            ca: None,
            require_client_cert: false,
        };
        let e = files.build().err().unwrap();
        assert!(
            e.contains("--server-pem-cert-path /nonexistent/cert.pem: cannot read"),
            "{e}"
        );
        let e = UpstreamFiles::default().build().err().unwrap();
        assert!(e.contains("--pem-ca-path"), "{e}");
    }
}
