//! Server replies: framing (how many bytes one reply spans) and a result class for routing.
//!
//! A reply keeps its raw bytes (`wire`) so the router passes servers' answers through unchanged;
//! `res` is what route handles look at (hit or miss, stored, which kind of error).

use bytes::{Bytes, BytesMut};

/// The end of a get's answer.
pub const END: &[u8] = b"END\r\n";

/// Result class of a reply, roughly mcrouter's result codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Res {
    Found,
    Stored,
    Deleted,
    Touched,
    Ok,
    Miss,
    NotFound,
    NotStored,
    Exists,
    Busy,
    Tko,
    ConnectError,
    ConnectTimeout,
    Timeout,
    RemoteError,
    LocalError,
    ClientError,
}

impl Res {
    /// AllSyncRoute's order: the reply with the highest severity wins.
    pub fn severity(self) -> u8 {
        match self {
            Res::Found | Res::Stored | Res::Deleted | Res::Touched | Res::Ok => 0,
            Res::Miss | Res::NotFound | Res::NotStored | Res::Exists => 1,
            Res::Busy | Res::Tko | Res::ConnectError | Res::ConnectTimeout | Res::Timeout => 2,
            Res::RemoteError => 4,
            Res::LocalError => 5,
            Res::ClientError => 6,
        }
    }

    /// Errors after which FailoverRoute / FailoverWithExptimeRoute try the next destination.
    pub fn is_failover_error(self) -> bool {
        matches!(
            self,
            Res::Busy
                | Res::Tko
                | Res::ConnectError
                | Res::ConnectTimeout
                | Res::Timeout
                | Res::RemoteError
                | Res::LocalError
        )
    }

    pub fn is_error(self) -> bool {
        self.severity() >= 2
    }

    pub fn is_hit(self) -> bool {
        self == Res::Found
    }

    pub fn name(self) -> &'static str {
        match self {
            Res::Found => "found",
            Res::Stored => "stored",
            Res::Deleted => "deleted",
            Res::Touched => "touched",
            Res::Ok => "ok",
            Res::Miss => "miss",
            Res::NotFound => "notfound",
            Res::NotStored => "notstored",
            Res::Exists => "exists",
            Res::Busy => "busy",
            Res::Tko => "tko",
            Res::ConnectError => "connect_error",
            Res::ConnectTimeout => "connect_timeout",
            Res::Timeout => "timeout",
            Res::RemoteError => "remote_error",
            Res::LocalError => "local_error",
            Res::ClientError => "client_error",
        }
    }
}

/// How a server frames the reply to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// Classic get/gets: `VALUE` blocks then `END`. `wire` keeps the blocks, not the `END`.
    Values,
    /// One line.
    Line,
    /// mg/ma: one line, plus a data block after `VA <len>`.
    Meta,
    /// That many `Meta` replies back to back: the answer to as many pipelined meta gets sent as one
    /// job (`Server::send_meta_gets`). `wire` keeps them all; the caller splits them.
    Metas(u32),
}

/// One reply for one request.
#[derive(Clone, Debug)]
pub struct Reply {
    pub res: Res,
    pub wire: Bytes,
    /// A failed delete that was written to the spool (answered as not-found if nothing better).
    pub spooled: bool,
    /// `VALUE` blocks in a multi-key get's reply from a server (its hits, counted while framing).
    pub values: u32,
    /// A `lease-get`'s lease token for the client, set where the lease is read (a destination) and
    /// replaced by a FailoverRoute that pairs leases: 1 for a hot miss (someone else holds
    /// the lease), 0 for none (a hit; 0 is never a token: see `crate::lease_tokens`).
    pub lease_token: u64,
}

impl Reply {
    pub fn new(res: Res, wire: Bytes) -> Reply {
        Reply {
            res,
            wire,
            spooled: false,
            values: 0,
            lease_token: 0,
        }
    }

    /// A one-line reply; `text` without CRLF.
    pub fn line(res: Res, text: &str) -> Reply {
        let mut b = BytesMut::with_capacity(text.len() + 2);
        b.extend_from_slice(text.as_bytes());
        b.extend_from_slice(b"\r\n");
        Reply::new(res, b.freeze())
    }

    /// An error made by the router itself.
    pub fn error(res: Res, msg: &str) -> Reply {
        if res == Res::ClientError {
            Reply::line(res, &format!("CLIENT_ERROR {msg}"))
        } else {
            Reply::line(res, &format!("SERVER_ERROR {msg}"))
        }
    }

    /// For a classic `VALUE <key> <flags> <bytes> [<cas>]` reply: (flags, data).
    pub fn value_parts(&self) -> Option<(u32, Bytes)> {
        let nl = self.wire.iter().position(|&b| b == b'\n')?;
        let line = std::str::from_utf8(&self.wire[..nl]).ok()?.trim_end();
        let mut it = line.split(' ');
        if it.next()? != "VALUE" {
            return None;
        }
        let _key = it.next()?;
        let flags: u32 = it.next()?.parse().ok()?;
        let len: usize = it.next()?.parse().ok()?;
        let start = nl + 1;
        if self.wire.len() < start + len {
            return None;
        }
        Some((flags, self.wire.slice(start..start + len)))
    }

    /// For a meta reply: whether its flag list contains the bare flag `flag` (e.g. `W`, `Z`, `X`).
    pub fn meta_has_flag(&self, flag: u8) -> bool {
        self.wire[..first_line_end(&self.wire)]
            .split(|&b| b == b' ')
            .skip(1)
            .any(|t| t.first() == Some(&flag))
    }
}

/// Where the first line of `wire` ends: before its `\r\n` (or a bare `\n`); the end of `wire` if it
/// has no newline. A CR elsewhere belongs to the line: keys may hold one (memcached 1.6.18 stores
/// `a\rb`), and a meta `k` flag or a `VALUE` line echoes them.
pub fn first_line_end(wire: &[u8]) -> usize {
    match memchr::memchr(b'\n', wire) {
        Some(nl) if nl > 0 && wire[nl - 1] == b'\r' => nl - 1,
        Some(nl) => nl,
        None => wire.len(),
    }
}

/// A reply the router cannot frame: the server connection is out of sync and must be closed.
#[derive(Debug)]
pub struct Desync;

fn line_at(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let nl = memchr::memchr(b'\n', &buf[pos..])? + pos;
    let end = if nl > pos && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    Some((&buf[pos..end], nl + 1))
}

fn classify_line(line: &[u8], meta: bool) -> Option<Res> {
    let head = line.split(|&b| b == b' ').next().unwrap_or(b"");
    Some(match head {
        b"STORED" => Res::Stored,
        b"NOT_STORED" => Res::NotStored,
        b"EXISTS" => Res::Exists,
        b"NOT_FOUND" => Res::NotFound,
        b"DELETED" => Res::Deleted,
        b"TOUCHED" => Res::Touched,
        b"OK" | b"VERSION" | b"MN" | b"RESET" => Res::Ok,
        b"HD" => {
            if meta {
                Res::Found
            } else {
                Res::Ok
            }
        }
        b"NF" => Res::NotFound,
        b"NS" => Res::NotStored,
        b"EX" => Res::Exists,
        b"EN" => Res::Miss,
        b"ME" => Res::Found,
        b"ERROR" | b"CLIENT_ERROR" => Res::ClientError,
        b"SERVER_ERROR" => Res::RemoteError,
        h if !h.is_empty() && h.iter().all(u8::is_ascii_digit) => Res::Found,
        _ => return None,
    })
}

fn token_len(line: &[u8], index: usize) -> Option<usize> {
    parse_decimal(line.split(|&b| b == b' ').filter(|t| !t.is_empty()).nth(index)?)
}

/// Digits to a number, None unless all digits (and no overflow).
pub fn parse_decimal(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |acc, &d| {
        d.is_ascii_digit()
            .then_some(())
            .and_then(|_| acc.checked_mul(10)?.checked_add(usize::from(d - b'0')))
    })
}

/// Frame one reply at the start of `buf`: `Ok(Some((res, consumed, keep)))` where the reply's
/// bytes to pass on are `buf[..keep]`; `Ok(None)` if more bytes are needed.
pub fn parse_reply(buf: &[u8], kind: ReplyKind) -> Result<Option<(Res, usize, usize)>, Desync> {
    Ok(parse_reply_counted(buf, kind)?.map(|(res, consumed, keep, _)| (res, consumed, keep)))
}

/// `parse_reply`, plus the number of `VALUE` blocks framed (0 for other kinds).
pub fn parse_reply_counted(buf: &[u8], kind: ReplyKind) -> Result<Option<(Res, usize, usize, u32)>, Desync> {
    match kind {
        ReplyKind::Values => {
            let mut pos = 0;
            let mut found = 0u32;
            loop {
                let Some((line, next)) = line_at(buf, pos) else {
                    return Ok(None);
                };
                if line.starts_with(b"VALUE ") {
                    let len = token_len(line, 3).ok_or(Desync)?;
                    if buf.len() < next + len + 2 {
                        return Ok(None);
                    }
                    pos = next + len + 2;
                    found += 1;
                } else if line == b"END" {
                    let res = if found > 0 { Res::Found } else { Res::Miss };
                    return Ok(Some((res, next, pos, found)));
                } else if pos == 0 {
                    return match classify_line(line, false) {
                        Some(res) if res.is_error() => Ok(Some((res, next, next, 0))),
                        _ => Err(Desync),
                    };
                } else {
                    return Err(Desync);
                }
            }
        }
        ReplyKind::Line | ReplyKind::Meta => {
            let Some((line, next)) = line_at(buf, 0) else {
                return Ok(None);
            };
            if kind == ReplyKind::Meta && line.starts_with(b"VA ") {
                let len = token_len(line, 1).ok_or(Desync)?;
                if buf.len() < next + len + 2 {
                    return Ok(None);
                }
                return Ok(Some((Res::Found, next + len + 2, next + len + 2, 0)));
            }
            let res = classify_line(line, kind == ReplyKind::Meta).ok_or(Desync)?;
            Ok(Some((res, next, next, 0)))
        }
        ReplyKind::Metas(n) => {
            // every request gets exactly one reply (errors too), so the n-th reply ends the batch
            let mut pos = 0;
            for _ in 0..n {
                match parse_reply_counted(&buf[pos..], ReplyKind::Meta)? {
                    Some((_, consumed, _, _)) => pos += consumed,
                    None => return Ok(None),
                }
            }
            Ok(Some((Res::Ok, pos, pos, 0)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_ends_at_its_crlf_not_at_a_cr_in_a_key() {
        assert_eq!(first_line_end(b"HD ka\rb W\r\n"), 9);
        assert_eq!(first_line_end(b"HD\n"), 2);
        assert_eq!(first_line_end(b"HD"), 2);
        let reply = Reply::new(Res::Found, Bytes::from_static(b"HD ka\rb W\r\n"));
        assert!(reply.meta_has_flag(b'W'));
        // a VALUE line whose key holds a CR frames as any other
        let wire = b"VALUE a\rb 0 1\r\nx\r\nEND\r\n";
        assert_eq!(
            parse_reply(wire, ReplyKind::Values).unwrap(),
            Some((Res::Found, 23, 18))
        );
    }

    #[test]
    fn decimals_are_all_digits_and_fit() {
        assert_eq!(parse_decimal(b"123"), Some(123));
        assert_eq!(parse_decimal(b"12x"), None);
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"99999999999999999999999"), None);
    }

    #[test]
    fn values_framing() {
        let buf = b"VALUE k 5 3\r\nabc\r\nEND\r\nSTORED\r\n";
        let (res, consumed, keep) = parse_reply(buf, ReplyKind::Values).unwrap().unwrap();
        assert_eq!((res, consumed, keep), (Res::Found, 23, 18));
        assert_eq!(
            parse_reply(b"END\r\n", ReplyKind::Values).unwrap().unwrap(),
            (Res::Miss, 5, 0)
        );
        assert!(parse_reply(b"VALUE k 5 3\r\nab", ReplyKind::Values).unwrap().is_none());
        let r = Reply::new(Res::Found, Bytes::from_static(b"VALUE k 5 3\r\nabc\r\n"));
        assert_eq!(r.value_parts(), Some((5, Bytes::from_static(b"abc"))));
    }

    #[test]
    fn meta_framing() {
        let (res, consumed, _) = parse_reply(b"VA 2 t30 W\r\nhi\r\n", ReplyKind::Meta).unwrap().unwrap();
        assert_eq!((res, consumed), (Res::Found, 16));
        let r = Reply::new(Res::Found, Bytes::from_static(b"VA 0 c6 t30 W\r\n\r\n"));
        assert!(r.meta_has_flag(b'W'));
        assert!(!r.meta_has_flag(b'Z'));
        assert_eq!(parse_reply(b"EN\r\n", ReplyKind::Meta).unwrap().unwrap().0, Res::Miss);
        assert_eq!(parse_reply(b"HD\r\n", ReplyKind::Line).unwrap().unwrap().0, Res::Ok);
        assert_eq!(
            parse_reply(b"SERVER_ERROR x\r\n", ReplyKind::Values)
                .unwrap()
                .unwrap()
                .0,
            Res::RemoteError
        );
        assert!(parse_reply(b"WHAT\r\n", ReplyKind::Line).is_err());
    }

    #[test]
    fn a_batch_of_meta_replies_ends_after_the_last_one() {
        let wire = b"VA 2 f0 c1\r\nab\r\nEN\r\nHD\r\nSERVER_ERROR x\r\nVA 1 W\r\nz\r\n";
        assert_eq!(
            parse_reply(wire, ReplyKind::Metas(4)).unwrap().unwrap(),
            (Res::Ok, 40, 40)
        );
        assert_eq!(
            parse_reply(wire, ReplyKind::Metas(5)).unwrap().unwrap(),
            (Res::Ok, 51, 51)
        );
        assert!(parse_reply(&wire[..20], ReplyKind::Metas(4)).unwrap().is_none());
        // a VA whose data is not all there yet is not the end
        assert!(parse_reply(&wire[..50], ReplyKind::Metas(5)).unwrap().is_none());
        assert!(parse_reply(b"EN\r\nWHAT\r\n", ReplyKind::Metas(2)).is_err());
    }

    #[test]
    fn severity_order() {
        assert!(Res::NotFound.severity() > Res::Deleted.severity());
        assert!(Res::Tko.severity() > Res::NotFound.severity());
        assert!(Res::ClientError.severity() > Res::RemoteError.severity());
        assert!(!Res::Miss.is_failover_error());
    }
}
