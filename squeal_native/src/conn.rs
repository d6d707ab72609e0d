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
//! Authentication: `mysql_native_password` (MariaDB's default), directly or after an auth switch.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::BytesMut;
use mysql_common::constants::CapabilityFlags;
use mysql_common::io::ParseBuf;
use mysql_common::packets::{
    AuthPlugin, AuthSwitchRequest, BinlogDumpFlags, ComBinlogDump, ComRegisterSlave, ErrPacket,
    HandshakePacket, HandshakeResponse,
};
use mysql_common::proto::codec::PacketCodec;
use mysql_common::proto::MySerialize;
use mysql_common::scramble::scramble_native;

/// Why a connection failed or ended.
#[derive(Debug)]
pub enum ConnError {
    /// An error packet from the server (e.g. 1236: the binlog position is gone; 1045: access denied).
    Server { code: u16, message: String },
    /// The socket failed, timed out or was closed.
    Io(io::Error),
    /// The server said something this client does not handle (an auth plugin, an odd packet).
    Protocol(String),
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnError::Server { code, message } => write!(f, "({code}, {message:?})"),
            ConnError::Io(e) => write!(f, "{e}"),
            ConnError::Protocol(m) => write!(f, "{m}"),
        }
    }
}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        ConnError::Io(e)
    }
}

const COM_QUERY: u8 = 0x03;
const MAX_PACKET: u32 = 1 << 30;

pub struct Conn {
    sock: TcpStream,
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
            sock,
            codec,
            rbuf: BytesMut::with_capacity(1 << 16),
            caps: CapabilityFlags::CLIENT_PROTOCOL_41,
        };
        conn.handshake(user, password)?;
        Ok(conn)
    }

    fn handshake(&mut self, user: &str, password: &str) -> Result<(), ConnError> {
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
                        other => {
                            return Err(ConnError::Protocol(format!(
                            "the server asks for auth plugin {:?}; the native reader speaks only \
                                 mysql_native_password (use [squeal] reader = \"python\")",
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
            let want = 1 << 16;
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
        self.sock.try_clone().ok()
    }
}
