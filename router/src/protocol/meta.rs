//! Meta command flags checked as memcached 1.6.18 checks them, before anything is forwarded.
//!
//! memcached reads a meta line's flags in one pass (`_meta_flag_preparse`): the first byte of each
//! token names the flag, a flag may not repeat, numbers are read as it reads them, and the first
//! failure decides the error. The router makes that pass itself, for two reasons. Framing: an `ms`
//! whose flags memcached refuses still has its value swallowed, so the router must know the line
//! is refused to answer as memcached does (a too-large value, or one without its CRLF, gets the
//! flag error there, not its own). Quiet mode: the router strips `q` before forwarding (every
//! forwarded request gets a reply), so a line memcached refuses for its `q` (`q q`, `q` and `qx`)
//! must be refused here, or the server would see a line without the fault.

use super::numbers::{strtol32, strtoul32, strtoull};

/// memcached's base64 decoding of a `b` key (its `base64_decode`): bytes outside the alphabet are
/// skipped, the alphabet characters (with `=`) must come in groups of four, and decoding stops
/// after the first group with padding. `None` where memcached fails (it returns length 0).
pub fn decode_key(src: &[u8]) -> Option<Vec<u8>> {
    fn sextet(b: u8) -> Option<u8> {
        Some(match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => 0,
            _ => return None,
        })
    }
    let count = src.iter().filter(|&&b| sextet(b).is_some()).count();
    if count == 0 || count % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(count / 4 * 3);
    let (mut block, mut n, mut pad) = ([0u8; 4], 0, 0);
    for &b in src {
        let Some(v) = sextet(b) else { continue };
        pad += usize::from(b == b'=');
        block[n] = v;
        n += 1;
        if n == 4 {
            out.extend_from_slice(&[
                (block[0] << 2) | (block[1] >> 4),
                (block[1] << 4) | (block[2] >> 2),
                (block[2] << 6) | block[3],
            ]);
            n = 0;
            if pad > 0 {
                if pad > 2 {
                    return None;
                }
                out.truncate(out.len() - pad);
                break;
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// What the flag pass learnt that the router needs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// `q`: the router hides what memcached's quiet mode hides.
    pub quiet: bool,
    /// `b`: the key is base64 (and decodes, as memcached decodes it).
    pub base64_key: bool,
    /// The `M` mode byte, if given.
    pub mode: Option<u8>,
}

const BAD_LINE: &str = "CLIENT_ERROR bad command line format\r\n";
const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format\r\n";

/// memcached's flag pass over `flags` (the tokens after the key, or after an `ms` length) for `key`:
/// the flags, or the error line memcached answers. The error's wording is
/// `_meta_flag_preparse`'s; `md` and `ma` answer their own wording for any failure (see `checked`).
pub fn preparse(key: &[u8], flags: &[impl AsRef<[u8]>]) -> Result<Flags, &'static str> {
    let mut seen = [false; 128];
    let mut out = Flags::default();
    let mut error: Option<&'static str> = None;
    // a later failure's text replaces an earlier one's (the pass goes on after most failures)
    let mut fail = |text: Option<&'static str>| {
        error = Some(text.or(error).unwrap_or(BAD_LINE));
    };
    for tok in flags {
        let tok = tok.as_ref();
        let o = tok[0];
        if o >= 127 || seen[o as usize] {
            return Err("CLIENT_ERROR duplicate flag\r\n");
        }
        seen[o as usize] = true;
        let arg = &tok[1..];
        match o {
            b'b' => {
                out.base64_key = true;
                if decode_key(key).is_none() {
                    fail(Some("CLIENT_ERROR error decoding key\r\n"));
                }
            }
            b'N' | b'T' | b'R' if strtol32(arg).is_none() => fail(Some(BAD_TOKEN)),
            b'N' | b'T' | b'R' => {}
            b'q' => out.quiet = true,
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'v' | b'h' | b'u' | b'I' => {}
            b'F' if strtoul32(arg).is_none() => fail(None),
            b'F' => {}
            b'C' if strtoull(arg).is_none() => fail(Some(BAD_TOKEN)),
            b'C' => {}
            b'M' if tok.len() != 2 => fail(Some("CLIENT_ERROR incorrect length for M token\r\n")),
            b'M' => out.mode = Some(tok[1]),
            b'J' if strtoull(arg).is_none() => fail(Some("CLIENT_ERROR invalid numeric initial value\r\n")),
            b'D' if strtoull(arg).is_none() => fail(Some("CLIENT_ERROR invalid numeric delta value\r\n")),
            b'J' | b'D' => {}
            _ => return Err("CLIENT_ERROR invalid flag\r\n"),
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The longest `O` (opaque) token `ms` takes.
const MAX_OPAQUE_LEN: usize = 32;
/// memcached refuses a meta line of this many tokens or more (its limit counts a terminal token).
pub const MAX_META_TOKENS: usize = 20;

/// `ms`'s checks, in memcached's order: the flag pass (its failure is the answer), then the mode
/// (`E A P R S`), then an `O` token over 32 bytes.
pub fn check_mset(key: &[u8], flags: &[impl AsRef<[u8]>]) -> Result<Flags, &'static str> {
    let pass = preparse(key, flags)?;
    if pass
        .mode
        .is_some_and(|m| !matches!(m, b'E' | b'A' | b'P' | b'R' | b'S'))
    {
        return Err("CLIENT_ERROR invalid mode for ms M token\r\n");
    }
    let long_opaque = flags
        .iter()
        .any(|t| t.as_ref().first() == Some(&b'O') && t.as_ref().len() > MAX_OPAQUE_LEN);
    if long_opaque {
        return Err("CLIENT_ERROR opaque token too long\r\n");
    }
    Ok(pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_keys_decode_as_memcached_decodes_them() {
        assert_eq!(decode_key(b"Zm9v"), Some(b"foo".to_vec()));
        assert_eq!(decode_key(b"Zm8="), Some(b"fo".to_vec()));
        assert_eq!(decode_key(b"Zg=="), Some(b"f".to_vec()));
        assert_eq!(decode_key(b"Zm!9v"), Some(b"foo".to_vec())); // bytes outside the alphabet skipped
        assert_eq!(decode_key(b"Zg==Zm9v"), Some(b"f".to_vec())); // stops after a padded group
        assert_eq!(decode_key(b"Zm9"), None);
        assert_eq!(decode_key(b"!!!!"), None);
        assert_eq!(decode_key(b"Z==="), None);
    }

    #[test]
    fn the_first_failure_decides_as_in_memcached() {
        let p = |flags: &[&str]| preparse(b"k", flags);
        assert_eq!(
            p(&["v", "q"]),
            Ok(Flags {
                quiet: true,
                ..Flags::default()
            })
        );
        assert_eq!(p(&["q", "q"]), Err("CLIENT_ERROR duplicate flag\r\n"));
        assert_eq!(p(&["q", "qx"]), Err("CLIENT_ERROR duplicate flag\r\n"));
        assert_eq!(p(&["9"]), Err("CLIENT_ERROR invalid flag\r\n"));
        assert_eq!(p(&["Tx"]), Err(BAD_TOKEN));
        assert_eq!(p(&["Fx"]), Err(BAD_LINE));
        assert_eq!(p(&["Tx", "Fx"]), Err(BAD_TOKEN)); // F keeps the earlier text
        assert_eq!(p(&["Tx", "Mxx"]), Err("CLIENT_ERROR incorrect length for M token\r\n"));
        assert_eq!(p(&["Tx", "!"]), Err("CLIENT_ERROR invalid flag\r\n"));
        assert_eq!(preparse(b"!!!!", &["b"]), Err("CLIENT_ERROR error decoding key\r\n"));
        assert_eq!(
            check_mset(b"k", &["MZ"]),
            Err("CLIENT_ERROR invalid mode for ms M token\r\n")
        );
        assert_eq!(check_mset(b"k", &["MZ", "Tx"]), Err(BAD_TOKEN));
        assert_eq!(
            check_mset(b"k", &[&"O".repeat(33)[..]]),
            Err("CLIENT_ERROR opaque token too long\r\n")
        );
        assert_eq!(check_mset(b"k", &["ME"]).map(|f| f.mode), Ok(Some(b'E')));
    }
}
