//! memcached ascii authentication (`memcached -Y FILE`), kept per hop.
//!
//! memcached 1.6.18 with `-Y` answers every command of an unauthenticated connection
//! `CLIENT_ERROR unauthenticated` except a `set` (any key, flags and exptime) whose value is
//! `user password`: if that pair is in the file the answer is `STORED` and the connection is
//! authenticated. The router's server connections are shared by every client, so a client's login
//! must never reach them: with `--auth-file` the router checks clients itself against a file in
//! `-Y` format and forwards nothing of the login; with `--upstream-auth-file` it logs in to each new
//! server connection (and probe) with the first entry of that file before sending anything else.

use std::fmt;
use std::path::Path;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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

    /// Whether a login `set`'s value (`user password`) names an entry of the file.
    pub fn check(&self, value: &[u8]) -> bool {
        let Some(sp) = value.iter().position(|&b| b == b' ') else {
            return false;
        };
        let (user, pass) = (&value[..sp], &value[sp + 1..]);
        // every entry is compared, so the time taken does not tell which one matched
        self.entries
            .iter()
            .fold(false, |ok, (u, p)| ok | (same(u, user) & same(p, pass)))
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

impl UpstreamLogin {
    /// Log in on a fresh server connection; `Err` with the reason if the server did not answer
    /// `STORED`. The caller bounds the time.
    pub async fn login(&self, stream: &mut TcpStream) -> Result<(), String> {
        stream
            .write_all(&self.0)
            .await
            .map_err(|e| format!("upstream login: {e}"))?;
        let mut line = Vec::new();
        let mut buf = [0u8; 256];
        while !line.ends_with(b"\r\n") {
            let n = stream
                .read(&mut buf)
                .await
                .map_err(|e| format!("upstream login: {e}"))?;
            if n == 0 {
                return Err("upstream login: connection closed".into());
            }
            line.extend_from_slice(&buf[..n]);
            if line.len() > 1024 {
                break;
            }
        }
        if line == b"STORED\r\n" {
            Ok(())
        } else {
            let text = String::from_utf8_lossy(&line);
            Err(format!("upstream login refused: {}", text.trim_end()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memcacheds_format_and_checks_logins() {
        let f = AuthFile::parse(b"alice:secret\n\nbob:pw2\r\n").unwrap();
        assert!(f.check(b"alice secret"));
        assert!(f.check(b"bob pw2"));
        assert!(!f.check(b"alice pw2"));
        assert!(!f.check(b"alice secret "));
        assert!(!f.check(b"alicesecret"));
        assert!(!f.check(b""));
        assert_eq!(
            &f.login_request().0[..],
            b"set squeal-router-auth 0 0 12\r\nalice secret\r\n"
        );
        assert!(!format!("{f:?} {:?}", f.login_request()).contains("secret"));
        for bad in [&b""[..], b"alice secret\n", b":pw\n", b"alice:\n", b"alice\n"] {
            assert!(AuthFile::parse(bad).is_err(), "{bad:?}");
        }
    }
}
