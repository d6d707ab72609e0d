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
    let token_end = |from: usize| {
        line[from..]
            .iter()
            .position(|&b| b == b' ')
            .map_or(line.len(), |space| from + space)
    };
    let mut at = token_end(0);
    let Some(len) = decimal(&line[..at]) else {
        return Err(malformed());
    };
    // the first `f…` / `c…` token counts, as memcached sends one of each
    let (mut flags, mut cas) = (None, None);
    let (mut won, mut z, mut x) = (false, false, false);
    while at < line.len() {
        if line[at] == b' ' {
            at += 1;
            continue;
        }
        let next = token_end(at);
        let arg = &line[at + 1..next];
        match line[at] {
            b'f' if !arg.is_empty() && flags.is_none() => flags = Some(decimal(arg)),
            b'c' if !arg.is_empty() && cas.is_none() => cas = Some(decimal(arg)),
            b'W' if arg.is_empty() => won = true,
            b'Z' if arg.is_empty() => z = true,
            b'X' if arg.is_empty() => x = true,
            _ => {}
        }
        at = next;
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

/// Digits to a u64; `None` unless all digits and no overflow. Up to 19 digits cannot overflow, so
/// only a 20-digit number (a CAS can be one) pays for checked arithmetic.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        let digit = d.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        n = n.wrapping_mul(10).wrapping_add(u64::from(digit));
    }
    if digits.len() == 20 {
        return digits
            .iter()
            .try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')));
    }
    Some(n)
}

/// `n` in decimal, appended to `out` at `at` (room for 20 digits): where it ends.
fn put_decimal(out: &mut [u8], at: usize, mut n: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut first = digits.len();
    loop {
        first -= 1;
        digits[first] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - first;
    out[at..at + len].copy_from_slice(&digits[first..]);
    at + len
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
    // the line up to its CRLF made on the stack when it fits (keys are at most 250 bytes), so a
    // block is three copies into `out`, not seven
    let mut line = [0u8; 8 + 250 + 4 * 21 + 2];
    let fits = head.len() + 1 + key.len() + 4 * 21 + 2 <= line.len();
    let mut at = 0;
    if fits {
        line[..head.len()].copy_from_slice(head);
        at = head.len();
        line[at] = b' ';
        line[at + 1..at + 1 + key.len()].copy_from_slice(key);
        at += 1 + key.len();
    } else {
        out.extend_from_slice(head);
        out.extend_from_slice(b" ");
        out.extend_from_slice(key);
    }
    for n in [token, Some(u64::from(v.flags)), Some(v.data.len() as u64), cas]
        .into_iter()
        .flatten()
    {
        line[at] = b' ';
        at = put_decimal(&mut line, at + 1, n);
    }
    line[at..at + 2].copy_from_slice(b"\r\n");
    at += 2;
    out.reserve(at + v.data.len() + 2);
    out.extend_from_slice(&line[..at]);
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
    fn decimals_are_all_digits_and_fit_a_u64() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(decimal(b"1234567890123456789"), Some(1_234_567_890_123_456_789));
        assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(decimal(b"18446744073709551616"), None);
        assert_eq!(decimal(b"99999999999999999999"), None);
        assert_eq!(decimal(b"100000000000000000000"), None);
        for bad in [&b""[..], b"1x", b"-1", b" 1", b"1/"] {
            assert_eq!(decimal(bad), None, "{bad:?}");
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
