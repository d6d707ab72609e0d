//! Lease replies: an `mg … v f c N…` reply read for its value and lease state, the classic value
//! block a lease-get answers with, and the classic answer to a lease fill sent as `ms … C<token>`.
//! Reading and writing only, no I/O (destinations and TransparentLeaseRoute use it, and the connection
//! that answers `lease-get`).

use bytes::{Bytes, BytesMut};

use super::reply::{Reply, Res, first_line_end};

/// What an `mg KEY v f c N…` answered with a value (`VA`).
pub struct MgValue {
    pub flags: u32,
    pub cas: u64,
    pub data: Bytes,
    /// `W`: this request won the lease (the item was missing or stale).
    pub won: bool,
    /// Another client holds the lease (`Z`, or a stale `X` without `W`).
    pub held: bool,
    /// `X`: the value is stale (marked by `md … I`).
    pub stale: bool,
}

/// Read an `mg … v f c` reply: its value, or `Err` for any other reply (`Err(None)`: pass it on as
/// it is; `Err(Some(error))`: a `VA` reply that cannot be read).
pub fn read_mg(reply: &Reply) -> Result<MgValue, Option<Reply>> {
    let wire = &reply.wire;
    let end = first_line_end(wire);
    let line = &wire[..end];
    if !line.starts_with(b"VA ") {
        return Err(None);
    }
    let toks: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let len = toks
        .get(1)
        .and_then(|t| std::str::from_utf8(t).ok()?.parse::<usize>().ok());
    let num = |flag: u8| {
        toks.iter()
            .skip(2)
            .find(|t| t.first() == Some(&flag) && t.len() > 1)
            .and_then(|t| std::str::from_utf8(&t[1..]).ok()?.parse::<u64>().ok())
    };
    let has = |flag: u8| toks.iter().skip(2).any(|t| *t == [flag]);
    let malformed = || Some(Reply::error(Res::RemoteError, "malformed mg reply"));
    let (Some(len), Some(flags), Some(cas)) = (len, num(b'f'), num(b'c')) else {
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
    let won = has(b'W');
    Ok(MgValue {
        flags,
        cas,
        data: wire.slice(start..start + data.len()),
        won,
        held: !won && (has(b'Z') || has(b'X')),
        stale: has(b'X'),
    })
}

/// A classic value block: `<head> <key> [<token>] <flags> <bytes> [<cas>]`, the data, CRLFs.
pub fn value_block(head: &[u8], key: &[u8], token: Option<u64>, v: &MgValue, cas: Option<u64>) -> Bytes {
    let mut out = BytesMut::with_capacity(v.data.len() + key.len() + 64);
    out.extend_from_slice(head);
    out.extend_from_slice(b" ");
    out.extend_from_slice(key);
    if let Some(token) = token {
        out.extend_from_slice(format!(" {token}").as_bytes());
    }
    out.extend_from_slice(format!(" {} {}", v.flags, v.data.len()).as_bytes());
    if let Some(cas) = cas {
        out.extend_from_slice(format!(" {cas}").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&v.data);
    out.extend_from_slice(b"\r\n");
    out.freeze()
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
