//! Lease replies: an `mg … v f c N…` reply read for its value and lease state, the classic value
//! block a lease-get answers with, and the classic answer to a lease fill sent as `ms … C<token>`.
//! Reading and writing only, no I/O (destinations and TransparentLeaseRoute use it, and the connection
//! that answers `lease-get`).

use bytes::{Bytes, BytesMut};

use super::reply::{Reply, Res, first_line_end, parse_decimal};

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

/// Read an `mg … v f c` reply: its value, or `Err` for any other reply (`Err(None)`: pass it on as
/// it is; `Err(Some(error))`: a `VA` reply that cannot be read).
pub fn read_mg(reply: &Reply) -> Result<MgValue<'_>, Option<Reply>> {
    let wire = &reply.wire;
    let end = first_line_end(wire);
    let line = &wire[..end];
    if !line.starts_with(b"VA ") {
        return Err(None);
    }
    // one pass over the tokens, no allocation: this runs for every key of every lease get
    let mut toks = line.split(|&b| b == b' ').skip(1);
    let len = toks.next().and_then(parse_decimal);
    // the first `f…` / `c…` token counts, as memcached sends one of each
    let (mut flags, mut cas) = (None, None);
    let (mut won, mut z, mut x) = (false, false, false);
    for t in toks {
        match t {
            [b'f', n @ ..] if !n.is_empty() => flags = flags.or(Some(decimal(n))),
            [b'c', n @ ..] if !n.is_empty() => cas = cas.or(Some(decimal(n))),
            b"W" => won = true,
            b"Z" => z = true,
            b"X" => x = true,
            _ => {}
        }
    }
    let malformed = || Some(Reply::error(Res::RemoteError, "malformed mg reply"));
    let (Some(len), Some(Some(flags)), Some(Some(cas))) = (len, flags, cas) else {
        return Err(malformed());
    };
    let Ok(flags) = u32::try_from(flags) else {
        return Err(malformed());
    };
    // data starts after the line's CRLF
    let start = (end + 2).min(wire.len());
    let Some(data) = wire.get(start..start + len) else {
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

fn decimal(digits: &[u8]) -> Option<u64> {
    parse_decimal(digits).and_then(|n| u64::try_from(n).ok())
}

/// `n` in decimal, without the allocation `format!` makes (value blocks are made per key).
fn put_decimal(out: &mut BytesMut, mut n: u64) {
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
    out.extend_from_slice(&digits[at..]);
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
    // room for the head, the key, four numbers of 20 digits and their spaces, the data, two CRLFs
    out.reserve(head.len() + key.len() + v.data.len() + 4 * 21 + 5);
    out.extend_from_slice(head);
    out.extend_from_slice(b" ");
    out.extend_from_slice(key);
    let numbers = [token, Some(u64::from(v.flags)), Some(v.data.len() as u64), cas];
    for n in numbers.into_iter().flatten() {
        out.extend_from_slice(b" ");
        put_decimal(out, n);
    }
    out.extend_from_slice(b"\r\n");
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
        let v = read_mg(&r).ok().unwrap();
        assert_eq!(
            (v.flags, v.cas, v.data, v.won, v.held, v.stale),
            (7, 42, &b"hi"[..], true, false, false)
        );
        let r = reply(b"VA 0 c9 f0 Z\r\n\r\n");
        let v = read_mg(&r).ok().unwrap();
        assert!(!v.won && v.held && !v.stale && v.data.is_empty());
        let r = reply(b"VA 1 f0 c9 X W\r\nx\r\n");
        let v = read_mg(&r).ok().unwrap();
        assert!(v.won && !v.held && v.stale);
        let r = reply(b"VA 1 f0 c9 X Z\r\nx\r\n");
        let v = read_mg(&r).ok().unwrap();
        assert!(v.held && v.stale);
        assert!(matches!(read_mg(&reply(b"EN\r\n")), Err(None)));
        assert!(matches!(read_mg(&reply(b"VA 1 c9\r\nx\r\n")), Err(Some(_)))); // no flags
        assert!(matches!(read_mg(&reply(b"VA 1 fx c9\r\nx\r\n")), Err(Some(_))));
        assert!(matches!(read_mg(&reply(b"VA 1 f4294967296 c9\r\nx\r\n")), Err(Some(_))));
        assert!(matches!(read_mg(&reply(b"VA 5 f0 c9\r\nx\r\n")), Err(Some(_)))); // short
    }

    #[test]
    fn a_value_block_is_memcacheds_classic_line() {
        let r = reply(b"VA 2 f18446744 c18446744073709551615\r\nhi\r\n");
        let v = read_mg(&r).ok().unwrap();
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
