//! Accepting clients, and refusing them at the connection limit as memcached does.
//!
//! memcached 1.6.18 at its `-c` limit accepts a new client, writes `ERROR Too many open
//! connections` and closes it (counted in `rejected_connections`; verified here with
//! `memcached -c 40`). The router does the same, at two limits:
//!
//! - its client limit (`--conn-limit`, by default the file-descriptor limit less a reserve for
//!   server connections, the spool and the metrics endpoint), checked before a client is served;
//! - running out of file descriptors anyway (EMFILE/ENFILE from `accept`: the limit was lowered,
//!   or other fds took the room). The router keeps one spare fd open for this: it closes it,
//!   accepts the waiting client with the freed slot, answers and closes it, and opens the spare
//!   again, so clients are never left hanging in the accept queue and the loop never spins.
//!
//! Each change of state (limit reached, out of fds, accepting again) is one log line; refused
//! clients are counted (`rejected_connections` in `stats`, `squeal_router_rejected_connections_total`
//! in `/metrics`), not logged one by one.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::shared::Shared;
use crate::{connection, tls};

/// What memcached answers a client over its connection limit.
pub const TOO_MANY: &[u8] = b"ERROR Too many open connections\r\n";

/// File descriptors kept out of the client limit by default (server connections and their probes,
/// spool files, the metrics endpoint, the runtime's own): this many, or an eighth of the fd limit
/// if that is more.
const RESERVE_MIN: u64 = 32;

/// How long a refused client may take to close its side before the router closes anyway.
const LINGER: Duration = Duration::from_millis(500);
/// Refused clients given that moment at once, at most (each holds an fd meanwhile).
const MAX_LINGERING: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Accepting,
    AtLimit,
    OutOfFds,
}

/// The process's soft limit on open files (from `/proc/self/limits`: no `getrlimit` call, no
/// `unsafe`), if it can be read.
pub fn fd_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// The default client limit for fd limit `fds`: `fds` less max(32, fds / 8), at least 1.
pub fn default_conn_limit(fds: u64) -> u64 {
    fds.saturating_sub(RESERVE_MIN.max(fds / 8)).max(1)
}

/// Is `e` the process (or the system) being out of file descriptors?
fn out_of_fds(e: &std::io::Error) -> bool {
    // EMFILE 24, ENFILE 23 on Linux
    matches!(e.raw_os_error(), Some(23) | Some(24))
}

struct Acceptor {
    shared: Arc<Shared>,
    limit: u64,
    state: State,
    /// Refused since the last change of state (reported when accepting again).
    refused: u64,
    spare: Option<std::fs::File>,
    /// Refused clients still being given their moment to close.
    lingering: Arc<std::sync::atomic::AtomicUsize>,
    /// A TLS port (`--ssl-port`): clients are served after their handshake.
    tls: Option<Arc<tls::Listener>>,
}

fn spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

impl Acceptor {
    fn enter(&mut self, next: State) {
        if next == self.state {
            return;
        }
        let limit = self.limit;
        match next {
            State::AtLimit => eprintln!(
                "squeal-router: client connection limit ({limit}) reached: new clients get \"ERROR Too many open connections\" until some leave"
            ),
            State::OutOfFds => eprintln!(
                "squeal-router: out of file descriptors: new clients get \"ERROR Too many open connections\" until some leave (raise the fd limit, or lower --conn-limit)"
            ),
            State::Accepting => eprintln!(
                "squeal-router: accepting new clients again ({} refused meanwhile)",
                self.refused
            ),
        }
        self.refused = 0;
        self.state = next;
    }

    /// Answer `stream` memcached's refusal and close it. With fds to spare, the client gets a
    /// moment to close its side first (closing with its request unread would reset the
    /// connection, and the answer with it); out of fds, it is closed at once.
    fn refuse(&mut self, stream: TcpStream, linger: bool) {
        self.refused += 1;
        self.shared.ctx.stats.rejected_connections.fetch_add(1, Relaxed);
        if let Some(tls) = &self.tls {
            // the refusal goes inside TLS, as memcached -Z sends it; out of fds, just close
            if linger && self.lingering.load(Relaxed) < MAX_LINGERING {
                let lingering = self.lingering.clone();
                lingering.fetch_add(1, Relaxed);
                let acceptor = tls.acceptor();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(LINGER, async {
                        let mut s = acceptor.accept(stream).await.ok()?;
                        s.write_all(TOO_MANY).await.ok()?;
                        s.shutdown().await.ok()
                    })
                    .await;
                    lingering.fetch_sub(1, Relaxed);
                });
            }
            return;
        }
        let _ = stream.try_write(TOO_MANY);
        if !linger || self.lingering.load(Relaxed) >= MAX_LINGERING {
            drain(&stream);
            return;
        }
        let lingering = self.lingering.clone();
        lingering.fetch_add(1, Relaxed);
        tokio::spawn(async move {
            let mut stream = stream;
            let _ = tokio::time::timeout(LINGER, async {
                let _ = stream.shutdown().await;
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
            lingering.fetch_sub(1, Relaxed);
        });
    }

    async fn run(mut self, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let ctx = self.shared.ctx.clone();
                    let stats = &ctx.stats;
                    if stats.curr_connections.load(Relaxed) >= self.limit {
                        self.enter(State::AtLimit);
                        self.refuse(stream, true);
                        continue;
                    }
                    self.enter(State::Accepting);
                    if self.spare.is_none() {
                        self.spare = spare_fd();
                    }
                    // counted here, not in the task: a burst accepted before any task runs must
                    // still see the limit
                    stats.curr_connections.fetch_add(1, Relaxed);
                    stats.total_connections.fetch_add(1, Relaxed);
                    match &self.tls {
                        None => {
                            tokio::spawn(connection::serve(self.shared.clone(), stream));
                        }
                        Some(tls) => {
                            tokio::spawn(handshake(self.shared.clone(), tls.clone(), stream, peer));
                        }
                    }
                }
                Err(e) if out_of_fds(&e) => {
                    self.enter(State::OutOfFds);
                    // free the spare slot, take the waiting client with it, refuse it, take it back
                    self.spare = None;
                    match listener.accept().now_or_never() {
                        Some(Ok((stream, _))) => self.refuse(stream, false),
                        Some(Err(_)) | None => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                    self.spare = spare_fd();
                    if self.spare.is_none() {
                        // not even the spare came back: wait for fds to be freed
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                Err(e) => {
                    // a client that reset before it was accepted, and the like: nothing to wait for
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    ) {
                        eprintln!("squeal-router: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }
}

/// Serve a client of a TLS port after its handshake; a failed one is one line in the log (at
/// most `tls::LOG_BURST` a second) naming the client and the reason, and the client is closed.
async fn handshake(shared: Arc<Shared>, tls: Arc<tls::Listener>, stream: TcpStream, peer: std::net::SocketAddr) {
    let stats = &shared.ctx.stats;
    let fail = |why: String| {
        stats.tls_handshake_failures.fetch_add(1, Relaxed);
        tls.failures.note(&format!("client {peer}"), &why);
        stats.curr_connections.fetch_sub(1, Relaxed);
    };
    // A TLS client starts with a handshake record (content type 22); anything else is a client
    // speaking plaintext (or something else) to the TLS port: say so rather than rustls's parse error.
    let mut first = [0u8; 16];
    let peeked = tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await;
    match peeked {
        Ok(Ok(0)) | Ok(Err(_)) => {
            stats.curr_connections.fetch_sub(1, Relaxed);
            return; // gone before saying anything: nothing to report
        }
        Ok(Ok(n)) if first[0] != 22 => {
            let shown = String::from_utf8_lossy(&first[..n]).escape_debug().to_string();
            return fail(format!(
                "not a TLS client: a plaintext client on the TLS port? (it sent \"{shown}\"); closed"
            ));
        }
        Ok(Ok(_)) => {}
        Err(_) => return fail("no TLS handshake within 10 s; closed".into()),
    }
    let accepted = tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, tls.acceptor().accept(stream)).await;
    match accepted {
        Ok(Ok(s)) => {
            stats.tls_handshakes.fetch_add(1, Relaxed);
            connection::serve(shared.clone(), connection::TlsClient::new(s)).await
        }
        Ok(Err(e)) => fail(format!("handshake failed: {}", tls::reason(&e, tls::Peer::Client))),
        Err(_) => fail("handshake not finished within 10 s; closed".into()),
    }
}

/// Read what the client has already sent (so that closing does not reset the connection over
/// unread bytes and lose the answer), without waiting for more.
fn drain(stream: &TcpStream) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.try_read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

/// Accept clients on `listener` for ever, at most `limit` at a time (see the module docs); over
/// TLS (after a handshake) if `tls` is given.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, limit: u64, tls: Option<Arc<tls::Listener>>) {
    shared.ctx.stats.max_connections.store(limit, Relaxed);
    let acceptor = Acceptor {
        shared,
        limit,
        state: State::Accepting,
        refused: 0,
        spare: spare_fd(),
        lingering: Default::default(),
        tls,
    };
    acceptor.run(listener).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limit_leaves_room_for_servers() {
        assert_eq!(default_conn_limit(64), 32);
        assert_eq!(default_conn_limit(1024), 896);
        assert_eq!(default_conn_limit(10), 1);
        assert!(fd_limit().is_some_and(|n| n > 0));
    }
}
