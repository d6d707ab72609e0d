//! Lease replies: an `mg … v f c N…` reply read for its value and lease state, the classic value
//! block a lease-get answers with, and the classic answer to a lease fill sent as `ms … C<token>`.
//! Reading and writing only, no I/O (destinations and TransparentLeaseRoute use it, and the connection
//! that answers `lease-get`).

use bytes::{Bytes, BytesMut};

use super::reply::{Reply, Res, first_line_end};

/// What an `mg KEY v f c N…` answered with a value (`VA`); its data is read in place.
pub struct MgValue<'a> {
    pub flags: u32,
    pub cas: u64,
    pub data: &'a [u8],
    /// `W`: this request won the lease (the item was missing or stale).
    pub won: bool,
    /// Another client holds the lease (`Z`, or a stale `X` without `W`).
    pub held: bool,
    /// `X`: the value is stale (marked by `md … I`).
    pub stale: bool,
}

/// Read an `mg … v f c` reply (its bytes, as the server sent them): its value, or `Err` for any
/// other reply (`Err(None)`: pass it on as it is; `Err(Some(error))`: a `VA` reply that cannot be
/// read).
pub fn read_mg(wire: &[u8]) -> Result<MgValue<'_>, Option<Reply>> {
    let end = first_line_end(wire);
    let Some(line) = wire[..end].strip_prefix(b"VA ") else {
        return Err(None);
    };
    let malformed = || Some(Reply::error(Res::RemoteError, "malformed mg reply"));
    // one pass over the line's bytes, no allocation: this runs for every key of every lease get
    let mut tokens = Tokens(line);
    let Some(len) = tokens.next().and_then(decimal) else {
        return Err(malformed());
    };
    // the first `f…` / `c…` token counts, as memcached sends one of each
    let (mut flags, mut cas) = (None, None);
    let (mut won, mut z, mut x) = (false, false, false);
    for token in tokens {
        match token {
            [b'f', n @ ..] if !n.is_empty() => flags = flags.or(Some(decimal(n))),
            [b'c', n @ ..] if !n.is_empty() => cas = cas.or(Some(decimal(n))),
            b"W" => won = true,
            b"Z" => z = true,
            b"X" => x = true,
            _ => {}
        }
    }
    let (Some(Some(flags)), Some(Some(cas))) = (flags, cas) else {
        return Err(malformed());
    };
    let Ok(flags) = u32::try_from(flags) else {
        return Err(malformed());
    };
    // data starts after the line's CRLF
    let start = (end + 2).min(wire.len());
    let Some(data) = usize::try_from(len)
        .ok()
        .and_then(|len| wire.get(start..start.checked_add(len)?))
    else {
        return Err(Some(Reply::error(Res::RemoteError, "short mg value")));
    };
    Ok(MgValue {
        flags,
        cas,
        data,
        won,
        held: !won && (z || x),
        stale: x,
    })
}

/// A line's space-separated tokens (an empty one between two spaces, as `split` gives): a plain
/// byte loop, which costs about half of `split`'s iterator on these short lines.
struct Tokens<'a>(&'a [u8]);

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let line = std::mem::take(&mut self.0);
        if line.is_empty() {
            return None;
        }
        let mut end = 0;
        while end < line.len() && line[end] != b' ' {
            end += 1;
        }
        // past the space; an empty rest after a trailing space ends the tokens, as memcached's
        // lines never end in one
        self.0 = line.get(end + 1..).unwrap_or_default();
        Some(&line[..end])
    }
}

/// Digits to a u64; `None` unless all digits and no overflow. Up to 19 digits cannot overflow,
/// so only a 20-digit number pays for checked arithmetic (a CAS can be that long).
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if digits.len() < 20 {
        return Some(digits.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')));
    }
    digits
        .iter()
        .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// `n` in decimal at the start of `out` (room for 20 digits): how many bytes it took.
fn put_decimal(out: &mut [u8], mut n: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - at;
    out[..len].copy_from_slice(&digits[at..]);
    len
}

/// A classic value block: `<head> <key> [<token>] <flags> <bytes> [<cas>]`, the data, CRLFs.
pub fn value_block(head: &[u8], key: &[u8], token: Option<u64>, v: &MgValue, cas: Option<u64>) -> Bytes {
    let mut out = BytesMut::new();
    write_value_block(&mut out, head, key, token, v, cas);
    out.freeze()
}

/// `value_block`, appended to `out` (the blocks of many keys can share one buffer).
pub fn write_value_block(
    out: &mut BytesMut,
    head: &[u8],
    key: &[u8],
    token: Option<u64>,
    v: &MgValue,
    cas: Option<u64>,
) {
    // the numbers and the line's CRLF made on the stack, so the block is four copies, not ten
    let mut numbers = [0u8; 4 * 21 + 2];
    let mut at = 0;
    for n in [token, Some(u64::from(v.flags)), Some(v.data.len() as u64), cas]
        .into_iter()
        .flatten()
    {
        numbers[at] = b' ';
        at += 1 + put_decimal(&mut numbers[at + 1..], n);
    }
    numbers[at..at + 2].copy_from_slice(b"\r\n");
    at += 2;
    out.reserve(head.len() + 1 + key.len() + at + v.data.len() + 2);
    out.extend_from_slice(head);
    out.extend_from_slice(b" ");
    out.extend_from_slice(key);
    out.extend_from_slice(&numbers[..at]);
    out.extend_from_slice(v.data);
    out.extend_from_slice(b"\r\n");
}

/// The classic answer to a lease fill sent as `ms … C<token>`: `STORED` for `HD`; `NOT_STORED`
/// when memcached refused it because the item changed or went since the lease (`EX`, `NF`) or
/// was not stored (`NS`); anything else (errors) as it is.
pub fn fill_reply(reply: Reply) -> Reply {
    let w = &reply.wire;
    if w.starts_with(b"HD") {
        Reply::line(Res::Stored, "STORED")
    } else if w.starts_with(b"EX") || w.starts_with(b"NF") || w.starts_with(b"NS") {
        Reply::line(Res::NotStored, "NOT_STORED")
    } else {
        reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(wire: &'static [u8]) -> Reply {
        Reply::new(Res::Found, Bytes::from_static(wire))
    }

    #[test]
    fn an_mg_reply_is_read_for_its_value_and_lease() {
        let r = reply(b"VA 2 f7 c42 W\r\nhi\r\n");
        let v = read_mg(&r.wire).ok().unwrap();
        assert_eq!(
            (v.flags, v.cas, v.data, v.won, v.held, v.stale),
            (7, 42, &b"hi"[..], true, false, false)
        );
        let r = reply(b"VA 0 c9 f0 Z\r\n\r\n");
        let v = read_mg(&r.wire).ok().unwrap();
        assert!(!v.won && v.held && !v.stale && v.data.is_empty());
        let r = reply(b"VA 1 f0 c9 X W\r\nx\r\n");
        let v = read_mg(&r.wire).ok().unwrap();
        assert!(v.won && !v.held && v.stale);
        let r = reply(b"VA 1 f0 c9 X Z\r\nx\r\n");
        let v = read_mg(&r.wire).ok().unwrap();
        assert!(v.held && v.stale);
        assert!(matches!(read_mg(&reply(b"EN\r\n").wire), Err(None)));
        assert!(matches!(read_mg(&reply(b"VA 1 c9\r\nx\r\n").wire), Err(Some(_)))); // no flags
        assert!(matches!(read_mg(&reply(b"VA 1 fx c9\r\nx\r\n").wire), Err(Some(_))));
        assert!(matches!(
            read_mg(&reply(b"VA 1 f4294967296 c9\r\nx\r\n").wire),
            Err(Some(_))
        ));
        assert!(matches!(read_mg(&reply(b"VA 5 f0 c9\r\nx\r\n").wire), Err(Some(_)))); // short
    }

    #[test]
    fn tokens_are_splits_at_spaces() {
        for line in [&b"1 f0 c9"[..], b"", b"1", b"1  f0", b" 1", b"1 f0 ", b"12 c5 W Z X"] {
            let split: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let ours: Vec<&[u8]> = Tokens(line).collect();
            // the same tokens, but for the empty one `split` gives after a trailing space (or for
            // an empty line)
            let trimmed = if split.last() == Some(&&b""[..]) {
                &split[..split.len() - 1]
            } else {
                &split[..]
            };
            assert_eq!(ours, trimmed, "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn a_value_block_is_memcacheds_classic_line() {
        let r = reply(b"VA 2 f18446744 c18446744073709551615\r\nhi\r\n");
        let v = read_mg(&r.wire).ok().unwrap();
        let cas = Some(v.cas);
        assert_eq!(
            &value_block(b"VALUE", b"k", None, &v, None)[..],
            b"VALUE k 18446744 2\r\nhi\r\n"
        );
        assert_eq!(
            &value_block(b"VALUE", b"k", None, &v, cas)[..],
            b"VALUE k 18446744 2 18446744073709551615\r\nhi\r\n"
        );
        assert_eq!(
            &value_block(b"LVALUE", b"k", Some(0), &v, None)[..],
            b"LVALUE k 0 18446744 2\r\nhi\r\n"
        );
    }
}
