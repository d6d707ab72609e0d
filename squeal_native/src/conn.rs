//! A replica connection to MariaDB, just enough to ask for the binlog.
//!
//! Why not the `mysql` crate's `Conn::get_binlog_stream`: it sends `COM_BINLOG_DUMP` with every flag but
//! `BINLOG_DUMP_NON_BLOCK` cleared, and MariaDB sends annotate-rows events (the statement text, the
//! source of `/* mcd: */` keys) only to a replica that sets `BINLOG_SEND_ANNOTATE_ROWS_EVENT` (2) in that
//! command. So this module runs the connection phase itself, but every packet is framed, parsed and
//! serialized by `mysql_common` (the `mysql` crate's own protocol layer): `PacketCodec`, `HandshakePacket`,
//! `HandshakeResponse`, `AuthSwitchRequest`, `ErrPacket`, `ComRegisterSlave`, `ComBinlogDump`. No byte
//! of the protocol is parsed here by hand.
//!
//! Authentication: `mysql_native_password` (MariaDB's default) or `ed25519` (MariaDB's `auth_ed25519`
//! plugin), directly or after an auth switch.
//!
//! TLS (`Tls`): after the server's greeting the client sends an `SslRequest` (mysql_common's packet), runs
//! a TLS handshake with rustls on the same socket — verifying the server's certificate and name against the
//! CA given — and continues the connection phase inside it. A failed check is `ConnError::Tls`, whose text
//! names the server and the reason as the Python reader's does.

use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{CertificateError, ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use bytes::BytesMut;
use mysql_common::constants::CapabilityFlags;
use mysql_common::io::ParseBuf;
use mysql_common::packets::{
    AuthPlugin, AuthSwitchRequest, BinlogDumpFlags, ComBinlogDump, ComRegisterSlave, ErrPacket,
    HandshakePacket, HandshakeResponse, SslRequest,
};
use mysql_common::proto::codec::PacketCodec;
use mysql_common::proto::MySerialize;
use mysql_common::scramble::{create_response_for_ed25519, scramble_native};

/// Why a connection failed or ended.
#[derive(Debug)]
pub enum ConnError {
    /// An error packet from the server (e.g. 1236: the binlog position is gone; 1045: access denied).
    Server { code: u16, message: String },
    /// The socket failed, timed out or was closed.
    Io(io::Error),
    /// The server said something this client does not handle (an auth plugin, an odd packet).
    Protocol(String),
    /// TLS could not be set up: (server "host:port", reason). Certificate problems, a server without TLS,
    /// unreadable PEM files.
    Tls(String, String),
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnError::Server { code, message } => write!(f, "({code}, {message:?})"),
            ConnError::Io(e) => write!(f, "{e}"),
            ConnError::Protocol(m) => write!(f, "{m}"),
            ConnError::Tls(server, reason) => write!(f, "TLS to MariaDB {server} failed: {reason}"),
        }
    }
}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        ConnError::Io(e)
    }
}

const COM_QUERY: u8 = 0x03;
/// Bytes asked of the socket per read (plaintext), and the TLS transport's read buffer (`Buffered`).
const READ_SIZE: usize = 1 << 16;
const MAX_PACKET: u32 = 1 << 30;
const UTF8MB4_GENERAL_CI: u8 = 45;

/// How to dial with TLS: the CA the server's certificate must chain to, and squeal's own certificate.
#[derive(Clone, Debug, Default)]
pub struct Tls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl Tls {
    /// A rustls client configuration (read afresh at every connect: renewed files count at once).
    pub(crate) fn config(&self) -> Result<ClientConfig, String> {
        let ca = self
            .ca
            .as_ref()
            .ok_or("TLS needs a CA to verify the server with ([tls] ca in the topology)")?;
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(ca)
            .map_err(|e| format!("cannot read the CA {}: {e}", ca.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("cannot read the CA {}: {e}", ca.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("bad CA certificate in {}: {e}", ca.display()))?;
        }
        if roots.is_empty() {
            return Err(format!("no certificate in the CA file {}", ca.display()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?
            .with_root_certificates(roots);
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| {
                        format!("cannot read squeal's certificate {}: {e}", cert.display())
                    })?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("cannot read squeal's key {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("squeal's certificate and key: {e}"))
            }
            _ => Ok(builder.with_no_client_auth()),
        }
    }
}

/// Why a TLS handshake failed, in the words the Python reader (OpenSSL) uses where there is a match.
fn tls_reason(e: &io::Error, host: &str, ca: &Option<PathBuf>) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(err) => rustls_reason(err, host, ca),
        None => e.to_string(),
    }
}

/// A rustls error in the words of `router_config.handshake_failure_reason` (OpenSSL's) where there is a match:
/// every client of a TLS server logs the same reason for the same failure.
pub(crate) fn rustls_reason(err: &rustls::Error, host: &str, ca: &Option<PathBuf>) -> String {
    match err {
        rustls::Error::InvalidCertificate(c) => {
            let why = match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    let ca = ca
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default();
                    format!("unknown issuer (not signed by the CA squeal trusts: {ca})")
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "certificate has expired".into()
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "certificate is not yet valid".into()
                }
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    format!("Hostname mismatch, certificate is not valid for '{host}'")
                }
                other => format!("{other:?}"),
            };
            format!("certificate verify failed: {why}")
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("the server does not answer TLS on this port (a plaintext port?) ({err})")
        }
        other => other.to_string(),
    }
}

/// The socket: plaintext, or TLS over it once the server agreed.
enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, Buffered>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => t.sock.0.get_ref(),
        }
    }
}

/// The socket under TLS, read through a buffer as large as a plaintext read (`read_packet` asks for 64 KiB):
/// rustls reads at most 4 KiB from its transport at a time, so a binlog stream over TLS took a `recvfrom` per
/// 4 KiB where plaintext takes one per 64 KiB. Writes go straight to the socket.
struct Buffered(BufReader<TcpStream>);

impl Read for Buffered {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Buffered {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.get_mut().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.get_mut().flush()
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(t) => t.flush(),
        }
    }
}

pub struct Conn {
    sock: Stream,
    codec: PacketCodec,
    rbuf: BytesMut,
    caps: CapabilityFlags,
}

impl Conn {
    /// Connects and authenticates. `timeout` bounds the connect and every later read (heartbeats keep an
    /// idle binlog stream under it).
    pub fn connect(
        host: &str,
        port: u16,
        user: &str,
        password: &str,
        timeout: Duration,
        tls: Option<&Tls>,
    ) -> Result<Conn, ConnError> {
        let addr = (host, port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| ConnError::Protocol(format!("cannot resolve {host}:{port}")))?;
        let sock = TcpStream::connect_timeout(&addr, timeout)?;
        sock.set_nodelay(true)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let mut codec = PacketCodec::default();
        codec.max_allowed_packet = MAX_PACKET as usize;
        let mut conn = Conn {
            sock: Stream::Plain(sock),
            codec,
            rbuf: BytesMut::with_capacity(1 << 16),
            caps: CapabilityFlags::CLIENT_PROTOCOL_41,
        };
        conn.handshake(host, port, user, password, tls)?;
        Ok(conn)
    }

    /// After the greeting: `SslRequest`, then the TLS handshake on the socket, verifying the server.
    fn start_tls(&mut self, host: &str, port: u16, tls: &Tls) -> Result<(), ConnError> {
        let server = format!("{host}:{port}");
        let fail = |reason: String| ConnError::Tls(server.clone(), reason);
        let config = tls.config().map_err(fail)?;
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| fail(format!("{host:?} is not a host name or address: {e}")))?;
        let mut client = ClientConnection::new(Arc::new(config), name)
            .map_err(|e| fail(format!("TLS set-up: {e}")))?;
        let mut body = Vec::new();
        SslRequest::new(self.caps, MAX_PACKET, UTF8MB4_GENERAL_CI).serialize(&mut body);
        self.write_packet(&body)?;
        // The same socket (a second handle to it); the plaintext handle is dropped once TLS is up.
        let mut sock = Buffered(BufReader::with_capacity(
            READ_SIZE,
            self.sock.tcp().try_clone()?,
        ));
        while client.is_handshaking() {
            client
                .complete_io(&mut sock)
                .map_err(|e| fail(tls_reason(&e, host, &tls.ca)))?;
        }
        self.sock = Stream::Tls(Box::new(StreamOwned::new(client, sock)));
        Ok(())
    }

    fn handshake(
        &mut self,
        host: &str,
        port: u16,
        user: &str,
        password: &str,
        tls: Option<&Tls>,
    ) -> Result<(), ConnError> {
        let packet = self.read_packet()?;
        if packet.first() == Some(&0xff) {
            return Err(self.server_error(&packet));
        }
        let hs: HandshakePacket<'_> = ParseBuf(&packet)
            .parse(())
            .map_err(|e| ConnError::Protocol(format!("bad handshake: {e}")))?;
        let wanted = CapabilityFlags::CLIENT_PROTOCOL_41
            | CapabilityFlags::CLIENT_SECURE_CONNECTION
            | CapabilityFlags::CLIENT_PLUGIN_AUTH
            | CapabilityFlags::CLIENT_LONG_PASSWORD
            | CapabilityFlags::CLIENT_LONG_FLAG
            | CapabilityFlags::CLIENT_TRANSACTIONS;
        self.caps = wanted & hs.capabilities();
        let nonce = hs.nonce();
        if let Some(tls) = tls {
            if !hs.capabilities().contains(CapabilityFlags::CLIENT_SSL) {
                return Err(ConnError::Tls(
                    format!("{host}:{port}"),
                    "the server does not offer TLS (start it with --ssl-cert/--ssl-key)".into(),
                ));
            }
            self.caps |= CapabilityFlags::CLIENT_SSL;
            self.start_tls(host, port, tls)?;
        }
        let scramble = scramble_native(&nonce, password.as_bytes());
        let version = hs.server_version_parsed().unwrap_or((5, 5, 5));
        let response = HandshakeResponse::new(
            scramble.as_ref().map(|s| &s[..]),
            version,
            Some(user.as_bytes()),
            None::<&[u8]>,
            Some(AuthPlugin::MysqlNativePassword),
            self.caps,
            None,
            MAX_PACKET,
        );
        let mut body = Vec::new();
        response.serialize(&mut body);
        self.write_packet(&body)?;
        loop {
            let packet = self.read_packet()?;
            match packet.first() {
                Some(0x00) => return Ok(()),
                Some(0xff) => return Err(self.server_error(&packet)),
                Some(0xfe) => {
                    let switch: AuthSwitchRequest<'_> = ParseBuf(&packet)
                        .parse(())
                        .map_err(|e| ConnError::Protocol(format!("bad auth switch: {e}")))?;
                    match switch.auth_plugin() {
                        AuthPlugin::MysqlNativePassword => {
                            let data = scramble_native(switch.plugin_data(), password.as_bytes());
                            let reply = data.map(|d| d.to_vec()).unwrap_or_default();
                            self.write_packet(&reply)?;
                        }
                        AuthPlugin::Ed25519 => {
                            let reply =
                                create_response_for_ed25519(password.as_bytes(), switch.plugin_data());
                            self.write_packet(&reply)?;
                        }
                        other => {
                            return Err(ConnError::Protocol(format!(
                            "the server asks for auth plugin {:?}; the native reader speaks \
                                 mysql_native_password and client_ed25519 (use [squeal] reader = \"python\")",
                            String::from_utf8_lossy(other.as_bytes())
                        )))
                        }
                    }
                }
                _ => {
                    return Err(ConnError::Protocol(
                        "unexpected packet while authenticating".into(),
                    ))
                }
            }
        }
    }

    /// Runs a statement that returns no rows (`SET ...`).
    pub fn execute(&mut self, sql: &str) -> Result<(), ConnError> {
        let mut body = Vec::with_capacity(sql.len() + 1);
        body.push(COM_QUERY);
        body.extend_from_slice(sql.as_bytes());
        self.command(&body)?;
        let packet = self.read_packet()?;
        match packet.first() {
            Some(0x00) => Ok(()),
            Some(0xff) => Err(self.server_error(&packet)),
            _ => Err(ConnError::Protocol(format!("{sql:?} returned rows"))),
        }
    }

    /// Registers as a replica and asks for the binlog from the GTID position set in `@slave_connect_state`
    /// (empty file name, position 4), with annotate-rows events. Events follow as packets.
    pub fn binlog_dump(&mut self, server_id: u32) -> Result<(), ConnError> {
        let mut body = Vec::new();
        ComRegisterSlave::new(server_id).serialize(&mut body);
        self.command(&body)?;
        let packet = self.read_packet()?;
        if packet.first() == Some(&0xff) {
            return Err(self.server_error(&packet));
        }
        body.clear();
        // MariaDB reads flag 2 as BINLOG_SEND_ANNOTATE_ROWS_EVENT (MySQL's name for it is "through position").
        ComBinlogDump::new(server_id)
            .with_pos(4)
            .with_flags(BinlogDumpFlags::BINLOG_THROUGH_POSITION)
            .with_filename(&b""[..])
            .serialize(&mut body);
        self.command(&body)
    }

    /// The error of an error packet.
    pub fn server_error(&self, packet: &[u8]) -> ConnError {
        match ParseBuf(packet).parse::<ErrPacket<'_>>(self.caps) {
            Ok(ErrPacket::Error(e)) => ConnError::Server {
                code: e.error_code(),
                message: e.message_str().into_owned(),
            },
            _ => ConnError::Protocol("unreadable error packet".into()),
        }
    }

    fn command(&mut self, body: &[u8]) -> Result<(), ConnError> {
        self.codec.reset_seq_id();
        self.write_packet(body)
    }

    fn write_packet(&mut self, body: &[u8]) -> Result<(), ConnError> {
        let mut out = BytesMut::with_capacity(body.len() + 8);
        let mut src = body;
        self.codec
            .encode(&mut src, &mut out)
            .map_err(|e| ConnError::Protocol(format!("cannot frame a packet: {e}")))?;
        self.sock.write_all(&out)?;
        Ok(())
    }

    /// The next whole packet (payload only), reading from the socket as needed.
    pub fn read_packet(&mut self) -> Result<Vec<u8>, ConnError> {
        let mut out = Vec::new();
        loop {
            let done = self
                .codec
                .decode(&mut self.rbuf, &mut out)
                .map_err(|e| ConnError::Protocol(format!("bad packet: {e}")))?;
            if done {
                return Ok(out);
            }
            let start = self.rbuf.len();
            let want = READ_SIZE;
            self.rbuf.resize(start + want, 0);
            let n = match self.sock.read(&mut self.rbuf[start..]) {
                Ok(n) => n,
                Err(e) => {
                    self.rbuf.truncate(start);
                    return Err(e.into());
                }
            };
            self.rbuf.truncate(start + n);
            if n == 0 {
                return Err(ConnError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
        }
    }

    /// Makes a blocked `read_packet` on another handle return (used by `stop`).
    pub fn shutdown_handle(&self) -> Option<TcpStream> {
        self.sock.tcp().try_clone().ok()
    }
}
