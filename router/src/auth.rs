//! memcached ascii authentication (`memcached -Y FILE`), kept per hop.
//!
//! memcached 1.6.18 with `-Y` answers every command of an unauthenticated connection
//! `CLIENT_ERROR unauthenticated` except a `set` (any key, flags and exptime) whose value is
//! `user password`: if that pair is in the file the answer is `STORED` and the connection is
//! authenticated. The router's server connections are shared by every client, so a client's login
//! must never reach them: with `--auth-file` the router checks clients itself against a file in
//! `-Y` format and forwards nothing of the login; with `--upstream-auth-file` it logs in to each new
//! server connection (and probe) with the first entry of that file before sending anything else.
//! Without `--upstream-auth-file` it asks each new server connection `version` first, and a server
//! that answers `CLIENT_ERROR unauthenticated` gets nothing else: else the first client `set` that
//! happens to be a login would log in the shared connection for every client (see `prepare`).

use std::fmt;
use std::path::Path;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A client's login `set` as memcached -Y judges it, and the answer it gets.
#[derive(Debug, PartialEq, Clone, Copy)]
pub enum Login {
    Accepted,
    Refused,
    BadFormat,
}

impl Login {
    pub fn reply(self) -> &'static [u8] {
        match self {
            Login::Accepted => b"STORED\r\n",
            Login::Refused => b"CLIENT_ERROR authentication failure\r\n",
            Login::BadFormat => b"CLIENT_ERROR bad authentication token format\r\n",
        }
    }
}

/// Entries of a `-Y` file: `user:password`, one a line.
#[derive(Clone)]
pub struct AuthFile {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for AuthFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthFile({} entries)", self.entries.len())
    }
}

/// Compare without an early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl AuthFile {
    /// Read a file in memcached's `-Y` format (`user:password` lines; blank lines skipped).
    pub fn read(path: &Path) -> Result<AuthFile, String> {
        let text = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        AuthFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &[u8]) -> Result<AuthFile, String> {
        let mut entries = Vec::new();
        for (n, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let colon = line.iter().position(|&b| b == b':');
            match colon {
                Some(i) if i > 0 && i + 1 < line.len() && !line.contains(&b' ') => {
                    entries.push((line[..i].to_vec(), line[i + 1..].to_vec()))
                }
                _ => return Err(format!("line {}: not `user:password`", n + 1)),
            }
        }
        if entries.is_empty() {
            return Err("no `user:password` entry".into());
        }
        Ok(AuthFile { entries })
    }

    /// What memcached 1.6.18 -Y answers a login `set` with this value (observed there): the value is
    /// split into words at spaces (runs of spaces count as one, leading and trailing ones are skipped);
    /// fewer than two words is a malformed token, else the first two are user and password (any later
    /// word is ignored).
    pub fn check(&self, value: &[u8]) -> Login {
        let mut words = value.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let (Some(user), Some(pass)) = (words.next(), words.next()) else {
            return Login::BadFormat;
        };
        // every entry is compared, so the time taken does not tell which one matched
        let ok = self
            .entries
            .iter()
            .fold(false, |ok, (u, p)| ok | (same(u, user) & same(p, pass)));
        if ok { Login::Accepted } else { Login::Refused }
    }

    /// The login request for a server: a `set` of the first entry, as memcached's ascii auth takes it.
    pub fn login_request(&self) -> UpstreamLogin {
        let (user, pass) = &self.entries[0];
        let mut value = user.clone();
        value.push(b' ');
        value.extend_from_slice(pass);
        let mut req = format!("set squeal-router-auth 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        UpstreamLogin(Bytes::from(req))
    }
}

/// The bytes that log the router in to a server (`--upstream-auth-file`).
#[derive(Clone)]
pub struct UpstreamLogin(Bytes);

impl fmt::Debug for UpstreamLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UpstreamLogin(..)")
    }
}

/// Why a fresh server connection was not made ready for requests.
#[derive(Debug, PartialEq)]
pub enum NotReady {
    /// Without `--upstream-auth-file`, the server answered `CLIENT_ERROR unauthenticated`
    /// (memcached `-Y`): it wants a login the router does not have.
    LoginDemanded,
    /// Anything else (an I/O error, a refused login, an unexpected answer), with the reason.
    Failed(String),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::LoginDemanded => f.write_str(
                "server demands a login (CLIENT_ERROR unauthenticated) and the router has no --upstream-auth-file",
            ),
            NotReady::Failed(why) => f.write_str(why),
        }
    }
}

/// Make a fresh server connection ready before anything of a client is sent on it (the caller
/// bounds the time): with `--upstream-auth-file` (`login`) log in; without, ask `version`, so that
/// a server that demands a login is found here, with one round trip per connection, and never by a
/// client's login `set` authenticating the shared connection for every client.
pub async fn prepare<S>(stream: &mut S, login: Option<&UpstreamLogin>) -> Result<(), NotReady>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (request, what) = match login {
        Some(login) => (&login.0[..], "upstream login"),
        None => (&b"version\r\n"[..], "version"),
    };
    let line = exchange(stream, request)
        .await
        .map_err(|e| NotReady::Failed(format!("{what}: {e}")))?;
    match (login, &line[..]) {
        (Some(_), b"STORED\r\n") => Ok(()),
        (None, l) if l.starts_with(b"VERSION ") => Ok(()),
        (None, b"CLIENT_ERROR unauthenticated\r\n") => Err(NotReady::LoginDemanded),
        (Some(_), l) => Err(NotReady::Failed(format!(
            "upstream login refused: {}",
            String::from_utf8_lossy(l).trim_end()
        ))),
        (None, l) => Err(NotReady::Failed(format!(
            "unexpected answer to version: {}",
            String::from_utf8_lossy(l).trim_end()
        ))),
    }
}

/// Send `request` and read the one-line answer (with its CRLF; at most about 1 KB is read).
async fn exchange<S>(stream: &mut S, request: &[u8]) -> Result<Vec<u8>, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(request).await.map_err(|e| e.to_string())?;
    let mut line = Vec::new();
    let mut buf = [0u8; 256];
    while !line.ends_with(b"\r\n") {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed".into());
        }
        line.extend_from_slice(&buf[..n]);
        if line.len() > 1024 {
            break;
        }
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memcacheds_format_and_checks_logins() {
        let f = AuthFile::parse(b"alice:secret\n\nbob:pw2\r\n").unwrap();
        for (value, judged) in [
            (&b"alice secret"[..], Login::Accepted),
            (b"bob pw2", Login::Accepted),
            (b"alice pw2", Login::Refused),
            // memcached 1.6.18 -Y, observed: words at spaces, the first two count
            (b"alice secret ", Login::Accepted),
            (b"  alice   secret", Login::Accepted),
            (b"alice secret more", Login::Accepted),
            (b"alice secret\r", Login::Refused),
            (b"alicesecret", Login::BadFormat),
            (b"alice\tsecret", Login::BadFormat),
            (b"alice ", Login::BadFormat),
            (b" secret", Login::BadFormat),
            (b"", Login::BadFormat),
        ] {
            assert_eq!(f.check(value), judged, "{:?}", String::from_utf8_lossy(value));
        }
        assert_eq!(
            &f.login_request().0[..],
            b"set squeal-router-auth 0 0 12\r\nalice secret\r\n"
        );
        assert!(!format!("{f:?} {:?}", f.login_request()).contains("secret"));
        for bad in [&b""[..], b"alice secret\n", b":pw\n", b"alice:\n", b"alice\n"] {
            assert!(AuthFile::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// `prepare` on an in-memory connection whose server answers `answer`: the result and what the
    /// server was sent.
    fn prepare_against(login: Option<&UpstreamLogin>, answer: &'static [u8]) -> (Result<(), NotReady>, Vec<u8>) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (mut router, mut server) = tokio::io::duplex(4096);
            let server = tokio::spawn(async move {
                let mut got = vec![0u8; 4096];
                let n = server.read(&mut got).await.unwrap();
                server.write_all(answer).await.unwrap();
                got.truncate(n);
                got
            });
            let result = prepare(&mut router, login).await;
            (result, server.await.unwrap())
        })
    }

    #[test]
    fn a_fresh_connection_is_logged_in_or_asked_whether_it_wants_a_login() {
        let login = AuthFile::parse(b"router:rpw\n").unwrap().login_request();
        let (r, sent) = prepare_against(Some(&login), b"STORED\r\n");
        assert_eq!(
            (r, &sent[..]),
            (Ok(()), &b"set squeal-router-auth 0 0 10\r\nrouter rpw\r\n"[..])
        );
        let (r, _) = prepare_against(Some(&login), b"CLIENT_ERROR authentication failure\r\n");
        assert_eq!(
            r,
            Err(NotReady::Failed(
                "upstream login refused: CLIENT_ERROR authentication failure".into()
            ))
        );

        let (r, sent) = prepare_against(None, b"VERSION 1.6.18\r\n");
        assert_eq!((r, &sent[..]), (Ok(()), &b"version\r\n"[..]));
        // memcached 1.6.18 -Y, observed
        let (r, _) = prepare_against(None, b"CLIENT_ERROR unauthenticated\r\n");
        assert_eq!(r, Err(NotReady::LoginDemanded));
        assert!(NotReady::LoginDemanded.to_string().contains("--upstream-auth-file"));
        let (r, _) = prepare_against(None, b"ERROR\r\n");
        assert_eq!(r, Err(NotReady::Failed("unexpected answer to version: ERROR".into())));
        let (r, _) = prepare_against(None, b"");
        assert_eq!(r, Err(NotReady::Failed("version: connection closed".into())));
    }
}
