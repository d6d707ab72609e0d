//! The request model: one single-key request as it travels down the route tree, and its encoding
//! for servers.
//!
//! Every request forwarded to a server gets exactly one reply: `noreply` and the meta `q` flag are
//! stripped by the parser (`parse.rs`) and honoured by the router itself (see `Request::suppress`), so
//! server connections can match replies to requests purely by order.

use bytes::{BufMut, Bytes, BytesMut};

use super::cmd::{COMMANDS, Cmd, Op};
use super::meta;
use super::numbers::strtol32;
use super::reply::{Reply, Res};

/// One single-key request as it travels down the route tree.
#[derive(Clone, Debug)]
pub struct Request {
    pub cmd: Cmd,
    /// The key as forwarded (routing prefix already stripped; base64 text for meta `b` keys).
    pub key: Bytes,
    pub client_flags: u32,
    /// Classic exptime (storage, touch). Meta commands keep theirs in the `T` flag.
    pub exptime: i64,
    pub cas: u64,
    pub delta: u64,
    /// Storage payload without the trailing CRLF.
    pub value: Bytes,
    /// Meta flag tokens, passed through untouched except that `q` is removed.
    pub meta: Vec<Bytes>,
    /// `noreply` (classic) or `q` (meta): the router decides what to suppress.
    pub quiet: bool,
    /// Meta `b` flag: `key` is base64; routing hashes the decoded bytes.
    pub base64_key: bool,
    /// A `set` or `ms` whose value the router refused as too large (the value was never read into
    /// memory). memcached drops the key's old value on that error, so the request still travels
    /// its route as the update it is, but each server gets an unlink of the key instead (`delete`,
    /// or `md` for `ms`), and the answer is `SERVER_ERROR object too large for cache`.
    pub too_large: bool,
    /// Set only by `__mcrouter__.route(...)` (see `crate::admin`): destinations record themselves
    /// here and answer as a server that is up would by default, sending nothing.
    pub recording: Option<std::sync::Arc<crate::recording::Recorder>>,
    /// The bucket a McBucketRoute above put the key in (mcrouter keeps it in the request's
    /// context): a bucketized pool below hashes it instead of the key.
    pub bucket: Option<u64>,
}

/// Where a key's hash stop `|#|` starts, if it has one.
fn hash_stop(key: &[u8]) -> Option<usize> {
    key.windows(3).position(|w| w == b"|#|")
}

impl Request {
    pub(super) fn new(cmd: Cmd, key: Bytes) -> Request {
        Request {
            cmd,
            key,
            client_flags: 0,
            exptime: 0,
            cas: 0,
            delta: 0,
            value: Bytes::new(),
            meta: Vec::new(),
            quiet: false,
            base64_key: false,
            too_large: false,
            recording: None,
            bucket: None,
        }
    }

    /// A plain single-key request (used for gets split out of multi-gets and for internal traffic).
    pub fn simple(cmd: Cmd, key: Bytes) -> Request {
        Request::new(cmd, key)
    }

    /// The mcrouter operation this request counts as.
    pub fn op(&self) -> Op {
        match self.cmd {
            Cmd::MetaSet => match self.meta_flag(b'M').and_then(|m| m.first().copied()) {
                Some(b'E' | b'e') => Op::Add,
                Some(b'A' | b'a') => Op::Append,
                Some(b'P' | b'p') => Op::Prepend,
                Some(b'R' | b'r') => Op::Replace,
                _ => Op::Set,
            },
            Cmd::MetaArith => match self.meta_flag(b'M').and_then(|m| m.first().copied()) {
                Some(b'D' | b'd' | b'-') => Op::Decr,
                _ => Op::Incr,
            },
            cmd => COMMANDS[cmd as usize].op,
        }
    }

    pub fn is_get(&self) -> bool {
        matches!(self.cmd, Cmd::Get | Cmd::Gets | Cmd::Gat | Cmd::Gats | Cmd::MetaGet)
    }

    /// A get counted in get hits and misses: `get`/`gets`/`mg`, but not one that also touches
    /// (`gat`/`gats`, `mg … T`): memcached counts those as touches, not gets.
    #[inline]
    pub fn counts_as_get(&self) -> bool {
        match self.cmd {
            Cmd::Get | Cmd::Gets | Cmd::LeaseGet => true,
            Cmd::MetaGet => !self.meta.iter().any(|t| t.first() == Some(&b'T')),
            _ => false,
        }
    }

    pub fn is_delete(&self) -> bool {
        matches!(self.cmd, Cmd::Delete | Cmd::MetaDelete)
    }

    /// Requests that carry an exptime the router may rewrite (storage commands and touch).
    pub fn has_exptime(&self) -> bool {
        matches!(
            self.cmd,
            Cmd::Set
                | Cmd::Add
                | Cmd::Replace
                | Cmd::Append
                | Cmd::Prepend
                | Cmd::Cas
                | Cmd::Touch
                | Cmd::Gat
                | Cmd::Gats
                | Cmd::LeaseSet
                | Cmd::MetaSet
        )
    }

    /// The value of meta flag `flag` (bytes after the letter), if present.
    pub fn meta_flag(&self, flag: u8) -> Option<&[u8]> {
        self.meta.iter().find(|t| t.first() == Some(&flag)).map(|t| &t[1..])
    }

    /// The bytes to hash for routing: the decoded key for base64 meta keys, and only the part
    /// before a hash stop `|#|` (mcrouter's routing key: `user:1|#|avatar` is placed with `user:1`).
    pub fn routing_key(&self) -> std::borrow::Cow<'_, [u8]> {
        if self.base64_key
            && let Some(mut decoded) = meta::decode_key(&self.key)
        {
            decoded.truncate(hash_stop(&decoded).unwrap_or(decoded.len()));
            return std::borrow::Cow::Owned(decoded);
        }
        std::borrow::Cow::Borrowed(&self.key[..hash_stop(&self.key).unwrap_or(self.key.len())])
    }

    /// Whether the key has a hash stop (see `routing_key`).
    pub fn has_hash_stop(&self) -> bool {
        if self.base64_key
            && let Some(decoded) = meta::decode_key(&self.key)
        {
            return hash_stop(&decoded).is_some();
        }
        hash_stop(&self.key).is_some()
    }

    /// The request's exptime (meta: its `T` flag; absent means 0, never expires).
    pub fn exptime(&self) -> i64 {
        if self.cmd.is_meta() {
            self.meta_flag(b'T').and_then(strtol32).map_or(0, i64::from)
        } else {
            self.exptime
        }
    }

    pub fn set_exptime(&mut self, exptime: i64) {
        if self.cmd.is_meta() {
            let token = Bytes::from(format!("T{exptime}"));
            match self.meta.iter_mut().find(|t| t.first() == Some(&b'T')) {
                Some(t) => *t = token,
                None => self.meta.push(token),
            }
        } else {
            self.exptime = exptime;
        }
    }

    /// Encode for a server: one request, always answered (no noreply, no q).
    pub fn encode(&self, out: &mut BytesMut) {
        if self.too_large {
            // memcached's answer to a too-large set: the old value goes (see `too_large`)
            let unlink = if self.cmd.is_meta() {
                Cmd::MetaDelete
            } else {
                Cmd::Delete
            };
            out.put_slice(unlink.name().as_bytes());
            out.put_u8(b' ');
            out.put_slice(&self.key);
            if self.base64_key {
                out.put_slice(b" b");
            }
            out.put_slice(b"\r\n");
            return;
        }
        match self.cmd {
            Cmd::LeaseGet => {
                // value, flags, cas, and the lease: a miss vivifies the item and wins it (`W`)
                let ttl = crate::lease_tokens::DEFAULT_TTL.as_secs();
                out.put_slice(b"mg ");
                out.put_slice(&self.key);
                out.put_slice(format!(" v f c N{ttl}\r\n").as_bytes());
                return;
            }
            Cmd::LeaseSet => {
                // stored only while the item's CAS is still the lease's token
                out.put_slice(b"ms ");
                out.put_slice(&self.key);
                let head = format!(
                    " {} F{} T{} C{}\r\n",
                    self.value.len(),
                    self.client_flags,
                    self.exptime,
                    self.cas
                );
                out.put_slice(head.as_bytes());
                out.put_slice(&self.value);
                out.put_slice(b"\r\n");
                return;
            }
            _ => {}
        }
        let name = self.cmd.name().as_bytes();
        out.reserve(name.len() + self.key.len() + self.value.len() + 64);
        out.put_slice(name);
        if matches!(self.cmd, Cmd::Gat | Cmd::Gats) {
            // the one command whose key comes after a number: `gat <exptime> <key>`
            out.put_slice(format!(" {} ", self.exptime).as_bytes());
            out.put_slice(&self.key);
            out.put_slice(b"\r\n");
            return;
        }
        out.put_u8(b' ');
        out.put_slice(&self.key);
        match self.cmd {
            Cmd::Get | Cmd::Gets | Cmd::Gat | Cmd::Gats | Cmd::Delete | Cmd::LeaseGet | Cmd::LeaseSet => {}
            Cmd::Set | Cmd::Add | Cmd::Replace | Cmd::Append | Cmd::Prepend | Cmd::Cas => {
                let head = if self.cmd == Cmd::Cas {
                    format!(
                        " {} {} {} {}",
                        self.client_flags,
                        self.exptime,
                        self.value.len(),
                        self.cas
                    )
                } else {
                    format!(" {} {} {}", self.client_flags, self.exptime, self.value.len())
                };
                out.put_slice(head.as_bytes());
            }
            Cmd::Incr | Cmd::Decr => out.put_slice(format!(" {}", self.delta).as_bytes()),
            Cmd::Touch => out.put_slice(format!(" {}", self.exptime).as_bytes()),
            Cmd::MetaSet => {
                out.put_slice(format!(" {}", self.value.len()).as_bytes());
                for t in &self.meta {
                    out.put_u8(b' ');
                    out.put_slice(t);
                }
            }
            Cmd::MetaGet | Cmd::MetaDelete | Cmd::MetaArith | Cmd::MetaDebug => {
                for t in &self.meta {
                    out.put_u8(b' ');
                    out.put_slice(t);
                }
            }
        }
        out.put_slice(b"\r\n");
        if matches!(
            self.cmd,
            Cmd::Set | Cmd::Add | Cmd::Replace | Cmd::Append | Cmd::Prepend | Cmd::Cas | Cmd::MetaSet
        ) {
            out.put_slice(&self.value);
            out.put_slice(b"\r\n");
        }
    }

    /// Whether the reply must not be sent to the client (noreply / meta quiet mode, as memcached
    /// 1.6 does it: mg hides EN; ms, md and ma hide HD (ma also its VA); errors always show).
    pub fn suppress(&self, reply: &Reply) -> bool {
        if !self.quiet {
            return false;
        }
        if !self.cmd.is_meta() {
            return true;
        }
        match self.cmd {
            Cmd::MetaGet => reply.res == Res::Miss,
            Cmd::MetaSet | Cmd::MetaDelete => reply.wire.starts_with(b"HD"),
            Cmd::MetaArith => reply.wire.starts_with(b"HD") || reply.wire.starts_with(b"VA"),
            _ => false,
        }
    }

    /// A meta reply line made by the router (e.g. `NF` for a spooled delete), echoing `O` and `k`.
    pub fn meta_line(&self, code: &str) -> Bytes {
        let mut line = BytesMut::from(code.as_bytes());
        for t in &self.meta {
            match t.first() {
                Some(b'O') => {
                    line.put_u8(b' ');
                    line.put_slice(t);
                }
                Some(b'k') => {
                    line.put_slice(b" k");
                    line.put_slice(&self.key);
                }
                Some(b'b') => line.put_slice(b" b"),
                _ => {}
            }
        }
        line.put_slice(b"\r\n");
        line.freeze()
    }
}
