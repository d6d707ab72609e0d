//! A client's byte stream, plaintext or TLS (`ClientStream`): the connection loop is the same
//! for both.

use bytes::BytesMut;
use futures_util::future::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;

/// A client's byte stream, plaintext or TLS: the connection code is the same for both.
pub trait ClientStream: AsyncWrite + Unpin + Send + 'static {
    /// Wait until `read_now` may find something.
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send + '_;
    /// Read what is there into `buf` without waiting: `Ok(None)` if nothing was, `Ok(Some(0))` at
    /// the end of the stream.
    fn read_now(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<usize>>;
    /// The TCP connection underneath.
    fn tcp(&self) -> &TcpStream;
}

impl ClientStream for TcpStream {
    fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send + '_ {
        TcpStream::readable(self)
    }
    fn read_now(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<usize>> {
        crate::server::connection::read_ready(self, buf)
    }
    fn tcp(&self) -> &TcpStream {
        self
    }
}

/// A client over TLS. rustls may hold decrypted bytes that the socket no longer shows as
/// readable, so after a read that brought something the next read is tried before waiting.
pub struct TlsClient {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    more: bool,
}

impl TlsClient {
    pub fn new(stream: tokio_rustls::server::TlsStream<TcpStream>) -> TlsClient {
        // the client's first request may have come with its last handshake message
        TlsClient { stream, more: true }
    }
}

impl AsyncWrite for TlsClient {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl ClientStream for TlsClient {
    async fn readable(&self) -> std::io::Result<()> {
        if self.more {
            Ok(())
        } else {
            self.stream.get_ref().0.readable().await
        }
    }
    fn read_now(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<usize>> {
        match self.stream.read_buf(buf).now_or_never() {
            None => {
                self.more = false;
                Ok(None)
            }
            Some(Ok(n)) => {
                self.more = n > 0;
                Ok(Some(n))
            }
            Some(Err(e)) => Err(e),
        }
    }
    fn tcp(&self) -> &TcpStream {
        self.stream.get_ref().0
    }
}
