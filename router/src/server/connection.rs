//! One connection to a memcached server: opening it (TCP or TLS, then the first exchange of
//! `auth::prepare`), a writer that batches every queued request into one write, and a reader that
//! matches replies to requests by order. What the connection is for — when to open one, TKO,
//! probes — is the `Server`'s (`crate::server`), which this does not name.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot};

use crate::auth::{self, NotReady, UpstreamLogin};
use crate::protocol::reply::parse_reply_counted;
use crate::protocol::{Reply, ReplyKind, Res};

/// A batch write is cut at this size.
const MAX_BATCH: usize = 256 * 1024;

/// A request queued for the server: its bytes, how its reply is framed, and who waits for it.
pub struct Job {
    pub data: Bytes,
    pub kind: ReplyKind,
    pub reply: oneshot::Sender<Reply>,
}

/// A connection to a server: plaintext, or TLS for a pool with `"security_mech": "tls"`.
pub enum ServerStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for ServerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection to `addr` (over TLS with `tls`), made ready for requests (`auth::prepare`: logged
/// in with `login`, or found not to demand a login) within `connect_timeout`: the one way server
/// connections and probe connections are opened. The error carries the reply code for the
/// requests waiting on it.
pub async fn open(
    addr: &str,
    tls: Option<Arc<crate::tls::Upstream>>,
    login: Option<&UpstreamLogin>,
    connect_timeout: Duration,
) -> Result<ServerStream, (Res, NotReady)> {
    let attempt = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| NotReady::Failed(format!("connect error: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let mut stream = match tls {
            None => ServerStream::Plain(tcp),
            Some(tls) => ServerStream::Tls(Box::new(tls.connect(addr, tcp).await.map_err(NotReady::Failed)?)),
        };
        let tls = matches!(stream, ServerStream::Tls(_));
        auth::prepare(&mut stream, login).await.map_err(|e| match e {
            // TLS 1.3: a server that refuses the router's certificate (or its lack of one) says so
            // only after the handshake, in an alert read with the first answer
            NotReady::Failed(m) if tls && m.contains("alert") => NotReady::Failed(format!(
                "TLS: the server refused the router after the handshake ({m}): does it demand a client certificate (--pem-cert-path) from another CA?"
            )),
            // memcached -Z resets a connection whose first bytes are not a TLS handshake
            NotReady::Failed(m) if !tls && plaintext_refused(&m) => NotReady::Failed(format!(
                "{m}: the server may require TLS (memcached -Z): set \"security_mech\": \"tls\" on its pool (with --pem-ca-path)"
            )),
            e => e,
        })?;
        Ok(stream)
    };
    match tokio::time::timeout(connect_timeout, attempt).await {
        Ok(opened) => opened.map_err(|e| (Res::ConnectError, e)),
        Err(_) => Err((Res::ConnectTimeout, NotReady::Failed("connect timeout".to_string()))),
    }
}

/// A plaintext first exchange that a TLS-only server answers by closing the connection (or with a
/// TLS alert record, 0x15 0x03).
fn plaintext_refused(message: &str) -> bool {
    [
        "reset by peer",
        "connection closed",
        "unexpected answer to version: \u{15}\u{3}",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// The reading half of a server connection.
trait ReadHalf: Send + 'static {
    /// Read what arrives into `buf` (waiting for it): the count, 0 at the end of the stream.
    fn read_some(&mut self, buf: &mut BytesMut) -> impl Future<Output = std::io::Result<usize>> + Send;
}

impl ReadHalf for OwnedReadHalf {
    async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        loop {
            self.readable().await?;
            if let Some(n) = read_ready(self.as_ref(), buf)? {
                return Ok(n);
            }
        }
    }
}

impl ReadHalf for tokio::io::ReadHalf<tokio_rustls::client::TlsStream<TcpStream>> {
    async fn read_some(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        self.read_buf(buf).await
    }
}

/// Serve `first` and then the server's queue on `stream` until the connection breaks or the queue
/// closes.
pub async fn serve(stream: ServerStream, first: Job, rx: &mut mpsc::Receiver<Job>) {
    match stream {
        ServerStream::Plain(stream) => {
            let (rd, wr) = stream.into_split();
            serve_halves(rd, wr, first, rx).await;
        }
        ServerStream::Tls(stream) => {
            let (rd, wr) = tokio::io::split(*stream);
            serve_halves(rd, wr, first, rx).await;
        }
    }
}

async fn serve_halves<R: ReadHalf, W: AsyncWrite + Unpin>(rd: R, mut wr: W, first: Job, rx: &mut mpsc::Receiver<Job>) {
    let (ptx, prx) = mpsc::unbounded_channel();
    let (dead_tx, mut dead_rx) = oneshot::channel::<()>();
    let reader = tokio::spawn(read_loop(rd, prx, dead_tx));
    let mut next = Some(first);
    let mut wbuf = BytesMut::new();
    loop {
        let job = match next.take() {
            Some(j) => j,
            None => tokio::select! {
                j = rx.recv() => match j { Some(j) => j, None => break },
                _ = &mut dead_rx => break,
            },
        };
        let mut job = Some(job);
        while let Some(j) = job.take() {
            wbuf.extend_from_slice(&j.data);
            if let Err(mpsc::error::SendError((_, reply))) = ptx.send((j.kind, j.reply)) {
                let _ = reply.send(Reply::error(Res::ConnectError, "connection to server lost"));
            }
            if wbuf.len() < MAX_BATCH {
                job = rx.try_recv().ok();
            }
        }
        if wr.write_all(&wbuf).await.is_err() || wr.flush().await.is_err() {
            break;
        }
        wbuf.clear();
    }
    // Pending requests' senders drop with the reader: their callers see a connection error.
    reader.abort();
}

type Pending = (ReplyKind, oneshot::Sender<Reply>);

/// Read what the socket has into `buf` after it reported readable: `Ok(None)` if nothing was there.
///
/// A read that came back short means the socket is drained, so readiness is cleared right away
/// (tokio only clears it if no new event arrived meanwhile); this saves the extra would-block
/// `read` per wake-up that a plain read loop pays, which matters at one request per round trip.
pub fn read_ready(stream: &TcpStream, buf: &mut BytesMut) -> std::io::Result<Option<usize>> {
    let spare = buf.capacity() - buf.len();
    let mut got = None;
    let r = stream.try_io(tokio::io::Interest::READABLE, || {
        let n = stream.try_read_buf(buf)?;
        got = Some(n);
        if n > 0 && n < spare {
            Err(std::io::ErrorKind::WouldBlock.into())
        } else {
            Ok(())
        }
    });
    match (r, got) {
        (_, Some(n)) => Ok(Some(n)),
        (Err(e), None) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        (Err(e), None) => Err(e),
        (Ok(()), None) => Ok(None),
    }
}

async fn read_loop<R: ReadHalf>(mut rd: R, mut prx: mpsc::UnboundedReceiver<Pending>, _dead: oneshot::Sender<()>) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut pending: VecDeque<Pending> = VecDeque::new();
    loop {
        while !buf.is_empty() {
            if pending.is_empty() {
                while let Ok(p) = prx.try_recv() {
                    pending.push_back(p);
                }
            }
            let Some((kind, _)) = pending.front() else {
                return; // a reply nobody asked for: out of sync
            };
            match parse_reply_counted(&buf, *kind) {
                Ok(Some((res, consumed, keep, values))) => {
                    let chunk = buf.split_to(consumed).freeze();
                    let (_, tx) = pending.pop_front().expect("front exists");
                    let mut reply = Reply::new(res, chunk.slice(..keep));
                    reply.values = values;
                    let _ = tx.send(reply);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match rd.read_some(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
