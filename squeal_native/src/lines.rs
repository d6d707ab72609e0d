//! Delete lines, byte for byte as `squeal.keys.rules.delete_line` writes them: `md <token> [b] q\r\n`.
//!
//! The token is the key as the web tier's client (meta-memcache) stores it: printable ASCII without spaces,
//! 1..=186 bytes, as is; any other key as base64 with memcached's `b` flag; a key longer than 186 bytes as
//! the base64 of its 18-byte BLAKE2b digest (memcached refuses tokens over 250 bytes).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use blake2::digest::{Update, VariableOutput};
use blake2::Blake2bVar;

/// `squeal.keys.rules.MAX_PLAIN_KEY`.
pub const MAX_PLAIN_KEY: usize = 186;

/// How a key went on the wire (`squeal_keys_rewritten_total{encoding}` counts the last two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Plain,
    Base64,
    Hashed,
}

pub fn delete_line(key: &[u8]) -> (Vec<u8>, Encoding) {
    if key.len() > MAX_PLAIN_KEY {
        let mut hasher = Blake2bVar::new(18).expect("18 is a valid BLAKE2b output size");
        hasher.update(key);
        let mut digest = [0u8; 18];
        hasher
            .finalize_variable(&mut digest)
            .expect("the buffer has the size asked for");
        return (encoded(&digest), Encoding::Hashed);
    }
    if key.is_empty() || key.iter().any(|&c| c <= 0x20 || c >= 0x7f) {
        return (encoded(key), Encoding::Base64);
    }
    let mut line = Vec::with_capacity(key.len() + 7);
    line.extend_from_slice(b"md ");
    line.extend_from_slice(key);
    line.extend_from_slice(b" q\r\n");
    (line, Encoding::Plain)
}

fn encoded(bytes: &[u8]) -> Vec<u8> {
    let mut line = b"md ".to_vec();
    line.extend_from_slice(STANDARD.encode(bytes).as_bytes());
    line.extend_from_slice(b" b q\r\n");
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_like_the_python_encoder() {
        // expected values from squeal.keys.rules.delete_line (Python's base64 and hashlib.blake2b(digest_size=18))
        assert_eq!(
            delete_line(b"user:1"),
            (b"md user:1 q\r\n".to_vec(), Encoding::Plain)
        );
        assert_eq!(
            delete_line(b"has space"),
            (b"md aGFzIHNwYWNl b q\r\n".to_vec(), Encoding::Base64)
        );
        assert_eq!(
            delete_line(b""),
            (b"md  b q\r\n".to_vec(), Encoding::Base64)
        );
        let long = [b'x'; 187];
        let (line, how) = delete_line(&long);
        assert_eq!(how, Encoding::Hashed);
        assert_eq!(line, b"md znxgscuF4IIE9GJwW4Y5baeS b q\r\n".to_vec());
        assert_eq!(delete_line(&[b'x'; 186]).1, Encoding::Plain);
    }
}
