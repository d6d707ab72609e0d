//! Binary-protocol requests: refused, as the router speaks the ASCII protocol only.

use bytes::{BufMut, Bytes, BytesMut};

/// The first byte of a memcached binary-protocol request.
pub const BINARY_REQUEST_MAGIC: u8 = 0x80;
const BINARY_HEADER_LEN: usize = 24;
/// The binary protocol's "Not supported" status.
const BINARY_NOT_SUPPORTED: u16 = 0x0083;
const BINARY_REFUSAL_TEXT: &[u8] = b"squeal-router speaks the memcached ascii protocol only";

/// The answer to a connection that opens with a binary-protocol request (`buf` starts with
/// `BINARY_REQUEST_MAGIC`): one binary response with status "Not supported" (0x0083) that echoes
/// the request's opcode and opaque and carries a short text, after which the router closes the
/// connection. `None` until the 24-byte request header is in.
pub fn binary_refusal(buf: &[u8]) -> Option<Bytes> {
    if buf.len() < BINARY_HEADER_LEN {
        return None;
    }
    let mut out = BytesMut::with_capacity(BINARY_HEADER_LEN + BINARY_REFUSAL_TEXT.len());
    out.put_u8(0x81); // response magic
    out.put_u8(buf[1]); // opcode
    out.put_u16(0); // key length
    out.put_u8(0); // extras length
    out.put_u8(0); // data type
    out.put_u16(BINARY_NOT_SUPPORTED);
    out.put_u32(BINARY_REFUSAL_TEXT.len() as u32); // total body length
    out.extend_from_slice(&buf[12..16]); // opaque
    out.put_u64(0); // cas
    out.extend_from_slice(BINARY_REFUSAL_TEXT);
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_requests_get_a_binary_not_supported() {
        let mut req = vec![0x80, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef];
        req.extend_from_slice(&[0; 8]);
        assert!(binary_refusal(&req[..23]).is_none());
        req.push(b'k');
        let r = binary_refusal(&req).unwrap();
        assert_eq!(&r[..2], &[0x81, 0x00]);
        assert_eq!(&r[6..8], &[0x00, 0x83]);
        assert_eq!(u32::from_be_bytes(r[8..12].try_into().unwrap()) as usize, r.len() - 24);
        assert_eq!(&r[12..16], &[0xde, 0xad, 0xbe, 0xef]);
    }
}
