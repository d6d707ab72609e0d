//! One delivery connection to a destination (a router, or memcached): the delivery thread's (delivery.rs) socket,
//! non-blocking on its `mio` poll. It connects, does the TLS handshake when `[tls]` asks for it (rustls, the
//! server's certificate checked against the CA and the name dialled), writes what it is given, and reads the
//! replies into one `Reply` per batch, as `squeal.delivery.batcher.DeleteProtocol` reads them: `MN` closes the
//! oldest batch in flight, `NF` / `HD` are fine, `OK` is a flush done, `SERVER_ERROR …` and any other line are
//! errors of that batch. What the replies mean (retry, fail over, acknowledge) is the thread's to decide.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;

use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use rustls::pki_types::ServerName;
use rustls::ClientConnection;

use crate::conn::{rustls_reason, Tls};

const READ_SIZE: usize = 64 * 1024;

/// The replies of one batch, complete at its `MN`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// Lines other than `NF`, `HD`, `OK` and `MN` (the `SERVER_ERROR`s among them).
    pub errors: Vec<Vec<u8>>,
    pub server_errors: u32,
    /// `OK`s: flushes done.
    pub oks: usize,
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    Connecting,
    Handshaking,
    Ready,
}

pub struct Link {
    sock: TcpStream,
    pub addr: String,
    host: String,        // (the name the certificate must be valid for)
    ca: Option<PathBuf>, // (named when a certificate is not signed by it)
    tls: Option<ClientConnection>,
    phase: Phase,
    out: Vec<u8>, // bytes for the socket not written yet (plaintext; rustls buffers its own)
    inbuf: Vec<u8>,
    current: Reply, // the replies of the oldest batch in flight so far
    token: Token,
    // Asked to be told when the socket is writable: only while connecting or while bytes wait. Edge-triggered
    // EPOLLOUT also fires at every TCP acknowledgement that frees send buffer, a wake-up (and a futile read)
    // per ack of the peer if it were asked for all the time.
    writable: bool,
}

impl Link {
    /// Start connecting to `host:port` (the answer comes as a socket event: `pump`). `tls`: the configuration is
    /// read afresh, as the Python sender's context is, so renewed certificate files count from the next connect.
    pub fn open(
        host: &str,
        port: u16,
        tls: Option<&Tls>,
        registry: &Registry,
        token: Token,
    ) -> Result<Link, String> {
        let addr = format!("{host}:{port}");
        let fail = |e: &dyn std::fmt::Display| format!("connect to {addr}: {e}");
        let tls_conn = match tls {
            None => None,
            Some(settings) => {
                let config = Arc::new(settings.config().map_err(|e| fail(&e))?);
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| fail(&format!("TLS: bad server name {host}: {e}")))?;
                Some(ClientConnection::new(config, name).map_err(|e| fail(&e))?)
            }
        };
        let resolved: SocketAddr = (host, port)
            .to_socket_addrs()
            .and_then(|mut it| it.next().ok_or_else(|| ErrorKind::NotFound.into()))
            .map_err(|e| fail(&e))?;
        let mut sock = TcpStream::connect(resolved).map_err(|e| fail(&e))?;
        registry
            .register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| fail(&e))?;
        Ok(Link {
            sock,
            addr,
            host: host.to_string(),
            ca: tls.and_then(|t| t.ca.clone()),
            tls: tls_conn,
            phase: Phase::Connecting,
            out: Vec::new(),
            inbuf: Vec::new(),
            current: Reply::default(),
            token,
            writable: true,
        })
    }

    /// Connected (and the handshake done): batches may be sent.
    pub fn ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    pub fn connecting(&self) -> bool {
        self.phase != Phase::Ready
    }

    /// Write `payload` (as much as the socket takes now; the rest when it is writable again: `pump`).
    pub fn send(&mut self, payload: &[u8], registry: &Registry) -> Result<(), String> {
        let queued = match self.tls.as_mut() {
            Some(tls) => tls.writer().write_all(payload),
            None => {
                self.out.extend_from_slice(payload);
                Ok(())
            }
        };
        queued
            .and_then(|()| self.flush())
            .and_then(|()| self.interest(registry))
            .map_err(|e| format!("connection lost: {e}"))
    }

    /// After a socket event: finish the connect or the handshake, write what waits, read. Returns the batches'
    /// replies completed since (in order), and why the connection ended if it did (after those replies).
    pub fn pump(&mut self, registry: &Registry) -> (Vec<Reply>, Option<String>) {
        let mut ended = self.move_bytes().err();
        if ended.is_none() {
            ended = self
                .interest(registry)
                .err()
                .map(|e| format!("connection lost: {e}"));
        }
        (self.replies(), ended)
    }

    /// Ask for writability only while connecting or while bytes wait for the socket.
    fn interest(&mut self, registry: &Registry) -> io::Result<()> {
        let waiting = match &self.tls {
            Some(tls) => tls.wants_write(),
            None => !self.out.is_empty(),
        };
        let want = self.phase == Phase::Connecting || waiting;
        if want != self.writable {
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            registry.reregister(&mut self.sock, self.token, interest)?;
            self.writable = want;
        }
        Ok(())
    }

    fn move_bytes(&mut self) -> Result<(), String> {
        let addr = self.addr.clone();
        if self.phase == Phase::Connecting {
            if let Some(e) = self.sock.take_error().map_err(|e| e.to_string())? {
                return Err(format!("connect to {addr}: {e}"));
            }
            match self.sock.peer_addr() {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotConnected => return Ok(()), // not yet
                Err(e) => return Err(format!("connect to {addr}: {e}")),
            }
            let _ = self.sock.set_nodelay(true);
            self.phase = if self.tls.is_some() {
                Phase::Handshaking
            } else {
                Phase::Ready
            };
        }
        let closed = self.read()?;
        if self.phase == Phase::Handshaking
            && self.tls.as_ref().is_some_and(|t| !t.is_handshaking())
        {
            self.phase = Phase::Ready;
        }
        self.flush().map_err(|e| format!("connection lost: {e}"))?;
        match (closed, &self.phase) {
            (false, _) => Ok(()),
            (true, Phase::Ready) => Err("connection lost: closed by the peer".into()),
            (true, _) => Err(format!(
                "connect to {addr}: TLS to {addr} failed: the connection closed during the handshake"
            )),
        }
    }

    /// Read until the socket would block; whether the peer closed the connection.
    fn read(&mut self) -> Result<bool, String> {
        let mut buf = vec![0u8; READ_SIZE];
        loop {
            let n = match self.sock.read(&mut buf) {
                Ok(0) => return Ok(true),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("connection lost: {e}")),
            };
            let Some(tls) = self.tls.as_mut() else {
                self.inbuf.extend_from_slice(&buf[..n]);
                continue;
            };
            let mut records = &buf[..n];
            while !records.is_empty() {
                tls.read_tls(&mut records)
                    .map_err(|e| format!("connection lost: {e}"))?;
                if let Err(e) = tls.process_new_packets() {
                    let _ = tls.write_tls(&mut self.sock); // (its alert goes out before the close)
                    let reason = rustls_reason(&e, &self.host, &self.ca);
                    let addr = &self.addr;
                    return Err(format!("connect to {addr}: TLS to {addr} failed: {reason}"));
                }
                // the plaintext taken out record by record: rustls holds a bounded amount of it
                let mut plain = [0u8; 4096];
                loop {
                    match tls.reader().read(&mut plain) {
                        Ok(0) => return Ok(true), // close_notify
                        Ok(m) => self.inbuf.extend_from_slice(&plain[..m]),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => return Err(format!("connection lost: {e}")),
                    }
                }
            }
        }
    }

    /// Write what waits until the socket would block.
    fn flush(&mut self) -> io::Result<()> {
        if self.phase == Phase::Connecting {
            return Ok(());
        }
        if let Some(tls) = self.tls.as_mut() {
            while tls.wants_write() {
                match tls.write_tls(&mut self.sock) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(());
        }
        let mut written = 0;
        while written < self.out.len() {
            match self.sock.write(&self.out[written..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.drain(..written);
        Ok(())
    }

    /// The batches completed by the `MN`s among the complete lines read so far.
    fn replies(&mut self) -> Vec<Reply> {
        let mut done = Vec::new();
        let Some(end) = self.inbuf.windows(2).rposition(|w| w == b"\r\n") else {
            return done;
        };
        let lines: Vec<u8> = self.inbuf.drain(..end + 2).collect();
        for line in lines.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            match line {
                b"" | b"NF" | b"HD" => {} // (a miss is fine: nothing cached under that key)
                b"MN" => done.push(std::mem::take(&mut self.current)),
                b"OK" => self.current.oks += 1,
                _ => {
                    if line.starts_with(b"SERVER_ERROR") {
                        self.current.server_errors += 1;
                    }
                    self.current.errors.push(line.to_vec());
                }
            }
        }
        done
    }

    /// Close the connection and take it off the poll.
    pub fn close(mut self, registry: &Registry) {
        let _ = registry.deregister(&mut self.sock);
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}
