//! Client requests: parsing (classic and meta commands) and encoding for servers.
//!
//! Every request forwarded to a server gets exactly one reply: `noreply` and the meta `q` flag are
//! stripped here and honoured by the router itself (see `Request::suppress`), so server
//! connections can match replies to requests purely by order.

use bytes::{BufMut, Bytes, BytesMut};

use super::meta::{self, MAX_META_TOKENS};
use super::numbers::{strtol32, strtoul32, strtoull};
use super::reply::{Reply, Res};

/// memcached's key length limit.
pub const MAX_KEY_LEN: usize = 250;
/// Largest value accepted by default (memcached's default item size limit, `-I 1m`); the router's
/// `--max-item-size` changes it (see `parse_with`).
pub const MAX_VALUE_LEN: usize = 1024 * 1024;
/// The largest length memcached can read at all: its lengths are 32-bit and it adds 2 for the CRLF.
/// A longer length (as memcached reads it: see `numbers::strtol32`) is a bad command line
/// (memcached 1.6.18: `CLIENT_ERROR bad command line format`, nothing swallowed), not a value to
/// swallow.
pub const MAX_DECLARED_LEN: i32 = i32::MAX - 2;
/// The longest command line, newline included (retrieval lines aside): memcached 1.6.18 reads into a
/// 16 KiB buffer and takes a line whose newline is in it (measured: a 16,384-byte `set` line is
/// stored, a 16,385-byte one closes the connection without a reply). So does the router.
pub const MAX_LINE_LEN: usize = 16 * 1024;
/// How much of a command line (retrieval lines aside) may be buffered without its newline: memcached
/// 1.6.18 closes the connection, without a reply, once more than 2 KiB are buffered without a
/// newline (measured: 2,048 bytes are waited on, 2,049 close). A long line is therefore served only
/// if it arrives in one piece, on memcached as here (a read takes up to 16 KiB).
pub const MAX_PARTIAL_LINE_LEN: usize = 2048;
/// The bound for retrieval lines (`get`/`gets`/`gat`/`gats`), which carry many keys: memcached
/// reads get/gets lines however long they are (a client's 1,000-key multi-get is ~10 KB); past this
/// the line is refused with an error and the connection closed.
pub const MAX_GET_LINE_LEN: usize = 1024 * 1024;

/// The commands that are routed by key. Each has its row in [`COMMANDS`] (its name, its [`Op`]), in
/// this order; `MetaDebug` stays last (`Cmd::COUNT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmd {
    Get,
    Gets,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Delete,
    Incr,
    Decr,
    Touch,
    Gat,
    Gats,
    LeaseGet,
    LeaseSet,
    MetaGet,
    MetaSet,
    MetaDelete,
    MetaArith,
    MetaDebug,
}

/// The one table of command names: every [`Cmd`], in the order of its variants (a `Cmd` is its
/// own row; checked at compile time), with its name on the wire — also its `stats` label
/// (`cmd_<name>`, see `crate::stats::OPS`) and, for classic commands, its name in
/// `__mcrouter__.route(<name>,KEY)` — and the mcrouter operation it counts as ([`Op`]; the meta
/// commands `ms`/`ma` refine theirs by their `M` flag, see `Request::op`). The classic commands'
/// names are also the names of the operations (`OperationSelectorRoute`). A new command is added
/// here and to `Cmd`; parsing finds it by name here too.
pub const COMMANDS: [CmdInfo; Cmd::COUNT] = [
    CmdInfo::classic(Cmd::Get, "get", Op::Get),
    CmdInfo::classic(Cmd::Gets, "gets", Op::Gets),
    CmdInfo::classic(Cmd::Set, "set", Op::Set),
    CmdInfo::classic(Cmd::Add, "add", Op::Add),
    CmdInfo::classic(Cmd::Replace, "replace", Op::Replace),
    CmdInfo::classic(Cmd::Append, "append", Op::Append),
    CmdInfo::classic(Cmd::Prepend, "prepend", Op::Prepend),
    CmdInfo::classic(Cmd::Cas, "cas", Op::Cas),
    CmdInfo::classic(Cmd::Delete, "delete", Op::Delete),
    CmdInfo::classic(Cmd::Incr, "incr", Op::Incr),
    CmdInfo::classic(Cmd::Decr, "decr", Op::Decr),
    CmdInfo::classic(Cmd::Touch, "touch", Op::Touch),
    // One key of a classic `gat`/`gats` line (the line itself is `Command::GetAndTouch`). Sent as
    // itself, never as `mg … T`: an `mg` of a stale item takes its win token from meta clients.
    CmdInfo::one_key_of_a_line(Cmd::Gat, "gat", Op::Get),
    CmdInfo::one_key_of_a_line(Cmd::Gats, "gats", Op::Gets),
    // mcrouter's lease commands, one key each (a `lease-get` line of several keys is
    // `Command::LeaseGet`); sent to servers as `mg … N` and `ms … C` (see `Request::encode`)
    CmdInfo::classic(Cmd::LeaseGet, "lease-get", Op::LeaseGet),
    CmdInfo::classic(Cmd::LeaseSet, "lease-set", Op::LeaseSet),
    CmdInfo::meta(Cmd::MetaGet, "mg", Op::Get),
    CmdInfo::meta(Cmd::MetaSet, "ms", Op::Set),
    CmdInfo::meta(Cmd::MetaDelete, "md", Op::Delete),
    CmdInfo::meta(Cmd::MetaArith, "ma", Op::Incr),
    CmdInfo::meta(Cmd::MetaDebug, "me", Op::Get),
];

// Every `Cmd` is its own row of `COMMANDS` (`Cmd::name` and the stats index rely on it).
const _: () = {
    let mut i = 0;
    while i < COMMANDS.len() {
        assert!(COMMANDS[i].cmd as usize == i, "COMMANDS is not in the order of Cmd");
        i += 1;
    }
};

/// One row of [`COMMANDS`].
#[derive(Clone, Copy, Debug)]
pub struct CmdInfo {
    pub cmd: Cmd,
    /// The name on the wire.
    pub name: &'static str,
    /// The mcrouter operation it counts as (for `ms`/`ma`, without an `M` flag).
    pub op: Op,
    /// A meta command (`mg`, `ms`, ...): not an operation name, not named by `__mcrouter__.route`.
    pub meta: bool,
    /// Parsed by its name as `<name> <key> …` (every command but the keys of a `gat`/`gats` line,
    /// which are parsed as the whole line and, as today, routed as gets).
    pub keyed_line: bool,
}

impl CmdInfo {
    const fn classic(cmd: Cmd, name: &'static str, op: Op) -> CmdInfo {
        CmdInfo {
            cmd,
            name,
            op,
            meta: false,
            keyed_line: true,
        }
    }

    const fn meta(cmd: Cmd, name: &'static str, op: Op) -> CmdInfo {
        CmdInfo {
            cmd,
            name,
            op,
            meta: true,
            keyed_line: true,
        }
    }

    const fn one_key_of_a_line(cmd: Cmd, name: &'static str, op: Op) -> CmdInfo {
        CmdInfo {
            cmd,
            name,
            op,
            meta: false,
            keyed_line: false,
        }
    }
}

impl Cmd {
    /// How many commands there are (rows of [`COMMANDS`]).
    pub const COUNT: usize = Cmd::MetaDebug as usize + 1;

    /// A classic command by its name (`__mcrouter__.route(set,KEY)`); meta commands are not named.
    pub fn from_name(name: &[u8]) -> Option<Cmd> {
        COMMANDS
            .iter()
            .find(|c| !c.meta && c.keyed_line && c.name.as_bytes() == name)
            .map(|c| c.cmd)
    }

    /// Any command, classic or meta, by its name on the wire.
    pub fn from_wire(name: &[u8]) -> Option<Cmd> {
        COMMANDS
            .iter()
            .find(|c| c.keyed_line && c.name.as_bytes() == name)
            .map(|c| c.cmd)
    }

    #[inline]
    pub fn name(self) -> &'static str {
        COMMANDS[self as usize].name
    }

    #[inline]
    pub fn is_meta(self) -> bool {
        COMMANDS[self as usize].meta
    }
}

/// mcrouter's operation names, used by `OperationSelectorRoute`: the names of the classic
/// commands ([`COMMANDS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Get,
    Gets,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
    Delete,
    Incr,
    Decr,
    Touch,
    /// Operations of their own, as in mcrouter: an `operation_policies` entry for `get` does not
    /// take `lease-get`s (nor one for `set` `lease-set`s); their routing groups are get and update.
    LeaseGet,
    LeaseSet,
}

impl Op {
    pub fn from_name(name: &str) -> Option<Op> {
        COMMANDS
            .iter()
            .find(|c| !c.meta && c.keyed_line && c.name == name)
            .map(|c| c.op)
    }
}

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

/// A parsed client command.
#[derive(Debug)]
pub enum Command {
    /// Routed by key.
    Keyed(Request),
    /// Classic `get`/`gets` with one or more keys: split per key, merged in order.
    MultiGet {
        gets: bool,
        keys: Vec<Bytes>,
    },
    /// Classic `gat`/`gats <exptime> <key>*` (get and touch): each key is sent as the meta get that
    /// does the same (`mg <key> v f T<exptime>`, `c` too for `gats`) and answered as a classic
    /// `VALUE` block (`cas` adds the cas), in the order the keys were asked.
    GetAndTouch {
        cas: bool,
        exptime: i64,
        keys: Vec<Bytes>,
        /// The line went on with a key memcached refuses (over 250 bytes): memcached 1.6.18 has
        /// touched the keys before it when it finds it, then answers only this error, so `keys`
        /// are those before it, touched, and this is the answer.
        refused: Option<&'static str>,
    },
    /// mcrouter's `lease-get <key>*`: each key is sent as `Cmd::LeaseGet` and answered as mcrouter
    /// answers it (`VALUE` for a hit, `LVALUE` with a lease token for a miss), then `END`.
    LeaseGet {
        keys: Vec<Bytes>,
    },
    /// Meta no-op: answered after every earlier request of the connection.
    MetaNoop,
    Version,
    /// `stats` without arguments (the router's own stats). A stats group (`stats slabs`,
    /// `stats detail`, ...) is memcached's per-server state, which a router of many servers does not
    /// have: it is answered as memcached answers a group it does not know, `ERROR`.
    Stats,
    /// `stats reset` (anything after `reset` is ignored, `noreply` too, as memcached 1.6.18 does):
    /// sent to every server of the config, and the router's own `stats` counters start again.
    StatsReset,
    Quit,
    /// `verbosity <level> [noreply]`: checked as memcached checks it, then ignored (`OK`).
    Verbosity {
        noreply: bool,
    },
    /// `flush_all [delay] [noreply]`: refused unless the router runs with `--enable-flush-cmd`,
    /// then sent to every server of every pool of the config (see `crate::flush`).
    FlushAll {
        /// The delay in seconds, as memcached reads it (absent: flush now).
        delay: Option<i64>,
        noreply: bool,
    },
    /// A command the router deliberately does not forward (e.g. `shutdown`).
    Unsupported(&'static str),
}

/// Result of trying to parse one command from the front of a buffer.
#[derive(Debug)]
pub enum ParseOutcome {
    /// More bytes needed.
    Incomplete,
    /// A command and how many bytes it used. Only for a too-large `set`/`ms` (`Request::too_large`)
    /// may that exceed the buffer: the rest of the refused value is swallowed as it arrives.
    Done(Command, usize),
    /// A malformed command: answer `reply`, skip `consume` bytes (may exceed the buffer: the rest of
    /// a refused value is swallowed as it arrives); `close` ends the connection after the reply.
    Error {
        reply: &'static str,
        consume: usize,
        close: bool,
    },
}

const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format\r\n";
const BAD_CHUNK: &str = "CLIENT_ERROR bad data chunk\r\n";
const TOO_LARGE: &str = "SERVER_ERROR object too large for cache\r\n";
const GET_LINE_TOO_LONG: &str = "CLIENT_ERROR line too long (get/gets lines are limited to 1048576 bytes)\r\n";

/// Whether `buf` starts a retrieval command (after any spaces, as memcached allows), whose line may
/// be up to `MAX_GET_LINE_LEN` long.
fn is_retrieval_line(buf: &[u8]) -> bool {
    let buf = &buf[buf.iter().take_while(|&&b| b == b' ').count()..];
    [&b"get "[..], b"gets ", b"gat ", b"gats "]
        .iter()
        .any(|p| buf.starts_with(p))
}
const UNKNOWN: &str = "ERROR\r\n";
const BAD_DELTA: &str = "CLIENT_ERROR invalid numeric delta argument\r\n";
const BAD_FLUSH_DELAY: &str = "CLIENT_ERROR invalid exptime argument\r\n";

fn find_newline(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

/// A key as memcached 1.6.18 takes it (measured): it splits command lines on spaces only and ends a
/// line at its first NUL, so any other byte may be in a key (control bytes, DEL, bytes over 0x7f, a
/// CR inside it or at the end of a line's last token). Such keys are forwarded as they are; the
/// check for space, LF and NUL only guards what could not have come from a parsed line.
pub fn valid_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && !key.iter().any(|&b| matches!(b, b' ' | b'\n' | 0))
}

impl Request {
    fn new(cmd: Cmd, key: Bytes) -> Request {
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

/// Parse one command from the front of `buf` (which must be the start of a command), with the
/// default value size limit.
pub fn parse(buf: &Bytes) -> ParseOutcome {
    parse_with(buf, MAX_VALUE_LEN)
}

/// memcached hides every error of a classic command whose last token is `noreply` (once the command
/// has the right number of tokens): the client reads no reply for it, so none may be sent.
fn hide_if(noreply: bool, reply: &'static str) -> &'static str {
    if noreply { "" } else { reply }
}

/// Whether the last token is `noreply` (memcached looks only there).
fn ends_noreply(tokens: &[Bytes]) -> bool {
    tokens.last().is_some_and(|t| &t[..] == b"noreply")
}

/// Parse one command from the front of `buf`, refusing values longer than `max_value` bytes as
/// memcached refuses items over its `-I` limit.
pub fn parse_with(buf: &Bytes, max_value: usize) -> ParseOutcome {
    let retrieval = is_retrieval_line(buf);
    // A line past its bound closes the connection: a retrieval line with an error (the router's own
    // bound), any other line without a reply, as memcached closes it.
    let too_long = |consume: usize| ParseOutcome::Error {
        reply: if retrieval { GET_LINE_TOO_LONG } else { "" },
        consume,
        close: true,
    };
    let Some(nl) = find_newline(buf) else {
        let limit = if retrieval {
            MAX_GET_LINE_LEN
        } else {
            MAX_PARTIAL_LINE_LEN
        };
        if buf.len() > limit {
            return too_long(buf.len());
        }
        return ParseOutcome::Incomplete;
    };
    let line_end = if nl > 0 && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    let line_len = nl + 1;
    if (retrieval && line_end > MAX_GET_LINE_LEN) || (!retrieval && line_len > MAX_LINE_LEN) {
        return too_long(line_len);
    }
    // memcached reads the line as a C string: it ends at its first NUL, and what follows up to the
    // newline is not read at all (measured on 1.6.18: `set k 0 0 1\0junk` stores k)
    let line_end = buf[..line_end].iter().position(|&b| b == 0).unwrap_or(line_end);
    let line = buf.slice(..line_end);
    let mut tokens: Vec<Bytes> = Vec::with_capacity(8);
    let mut start = None;
    for (i, &b) in line.iter().enumerate() {
        if b == b' ' {
            if let Some(s) = start.take() {
                tokens.push(line.slice(s..i));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        tokens.push(line.slice(s..));
    }
    let err = |reply: &'static str| ParseOutcome::Error {
        reply,
        consume: line_len,
        close: false,
    };
    let Some(name) = tokens.first() else {
        return err(UNKNOWN);
    };
    let done = |c: Command| ParseOutcome::Done(c, line_len);
    // the keyed commands are found by their name in `COMMANDS`; the others are named here
    match (Cmd::from_wire(name), &name[..]) {
        // `bget` is memcached's undocumented alias of `get` ("binary get", kept for old clients): the
        // same code serves it there, so the same parse serves it here; its line is bounded as any
        // command's (memcached exempts only `get `/`gets ` lines from the partial-line bound)
        (Some(Cmd::Get | Cmd::Gets), _) | (None, b"bget") => {
            if tokens.len() < 2 {
                return err(UNKNOWN);
            }
            if !tokens[1..].iter().all(|k| valid_key(k)) {
                return err(BAD_FORMAT);
            }
            let gets = &name[..] == b"gets";
            let mut keys = tokens;
            keys.remove(0); // the keys reuse the token list
            done(Command::MultiGet { gets, keys })
        }
        (None, b"gat" | b"gats") => {
            // gat <exptime> <key>*: memcached 1.6.18 answers `gat 10` (no key) with `END`
            if tokens.len() < 2 {
                return err(UNKNOWN);
            }
            let Some(exptime) = strtol32(&tokens[1]).map(i64::from) else {
                return err("CLIENT_ERROR invalid exptime argument\r\n");
            };
            let cas = &name[..] == b"gats";
            let mut keys = tokens;
            keys.drain(..2);
            let refused = keys.iter().position(|k| !valid_key(k)).map(|bad| {
                keys.truncate(bad);
                BAD_FORMAT
            });
            done(Command::GetAndTouch {
                cas,
                exptime,
                keys,
                refused,
            })
        }
        (Some(cmd @ (Cmd::Set | Cmd::Add | Cmd::Replace | Cmd::Append | Cmd::Prepend | Cmd::Cas)), _) => {
            parse_storage(cmd, buf, &tokens, line_len, max_value)
        }
        (Some(Cmd::Delete), _) => {
            // delete <key> [0] [noreply], read as memcached 1.6.18 reads it: `noreply` counts only as
            // the last token, and hides the error of an invalid line (e.g. `delete k 10 noreply`)
            if tokens.len() < 2 || tokens.len() > 4 {
                return err(UNKNOWN);
            }
            let noreply = tokens.len() > 2 && ends_noreply(&tokens);
            let valid = match &tokens[2..] {
                [] => true,
                [one] => &one[..] == b"0" || noreply,
                [zero, _] => &zero[..] == b"0" && noreply,
                _ => false,
            };
            if !valid {
                return err(hide_if(
                    noreply,
                    "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
                ));
            }
            if !valid_key(&tokens[1]) {
                return err(hide_if(noreply, BAD_FORMAT));
            }
            let mut req = Request::new(Cmd::Delete, tokens[1].clone());
            req.quiet = noreply;
            done(Command::Keyed(req))
        }
        (Some(cmd @ (Cmd::Incr | Cmd::Decr)), _) => {
            // incr <key> <delta> [noreply]: a wrong number of tokens is `ERROR` (memcached's
            // WANT_TOKENS); a fourth token that is not `noreply` is ignored, as memcached ignores it
            if tokens.len() < 3 || tokens.len() > 4 {
                return err(UNKNOWN);
            }
            let noreply = ends_noreply(&tokens); // memcached looks at the last token, whatever it is
            let err = |reply| err(hide_if(noreply, reply));
            if !valid_key(&tokens[1]) {
                return err(BAD_FORMAT);
            }
            let mut req = Request::new(cmd, tokens[1].clone());
            let Some(delta) = strtoull(&tokens[2]) else {
                return err(BAD_DELTA);
            };
            req.delta = delta;
            req.quiet = noreply;
            done(Command::Keyed(req))
        }
        (Some(Cmd::Touch), _) => {
            // touch <key> <exptime> [noreply], the fourth token read as for incr
            if tokens.len() < 3 || tokens.len() > 4 {
                return err(UNKNOWN);
            }
            let noreply = ends_noreply(&tokens); // memcached looks at the last token, whatever it is
            let err = |reply| err(hide_if(noreply, reply));
            if !valid_key(&tokens[1]) {
                return err(BAD_FORMAT);
            }
            let mut req = Request::new(Cmd::Touch, tokens[1].clone());
            let Some(exptime) = strtol32(&tokens[2]) else {
                return err("CLIENT_ERROR invalid exptime argument\r\n");
            };
            req.exptime = i64::from(exptime);
            req.quiet = noreply;
            done(Command::Keyed(req))
        }
        (Some(cmd @ (Cmd::MetaGet | Cmd::MetaDelete | Cmd::MetaArith)), _) => match meta_request(cmd, &tokens) {
            Ok(req) => done(Command::Keyed(req)),
            Err(reply) => err(reply),
        },
        (Some(Cmd::MetaDebug), _) => {
            // memcached's `me` reads only its key and a `b` right after it; everything else on the
            // line goes to the server as sent
            if tokens.len() < 2 || tokens[1].len() > MAX_KEY_LEN {
                return err(BAD_FORMAT);
            }
            let mut req = Request::new(Cmd::MetaDebug, tokens[1].clone());
            req.meta = tokens[2..].to_vec();
            req.base64_key = tokens.get(2).is_some_and(|t| &t[..] == b"b");
            if req.base64_key && meta::decode_key(&req.key).is_none() {
                return err(BAD_FORMAT);
            }
            done(Command::Keyed(req))
        }
        (Some(Cmd::MetaSet), _) => parse_mset(buf, &tokens, line_len, max_value),
        (Some(Cmd::LeaseGet), _) => {
            // lease-get <key>+, as mcrouter reads it: no key is a malformed request
            if tokens.len() < 2 {
                return malformed(line_len);
            }
            if !tokens[1..].iter().all(|k| valid_key(k)) {
                return err(BAD_FORMAT);
            }
            let mut keys = tokens;
            keys.remove(0);
            done(Command::LeaseGet { keys })
        }
        (Some(Cmd::LeaseSet), _) => parse_lease_set(buf, &tokens, line_len, max_value),
        (None, b"mn") => done(Command::MetaNoop),
        (None, b"version") => done(Command::Version),
        (None, b"stats") if tokens.len() == 1 => done(Command::Stats),
        (None, b"stats") if &tokens[1][..] == b"reset" => done(Command::StatsReset),
        (None, b"stats") => err(UNKNOWN),
        (None, b"quit") => done(Command::Quit),
        (None, b"verbosity") => {
            // verbosity <level> [noreply]: memcached wants 2 or 3 tokens and a 32-bit level
            if tokens.len() < 2 || tokens.len() > 3 {
                return err(UNKNOWN);
            }
            let noreply = ends_noreply(&tokens);
            if strtoul32(&tokens[1]).is_none() {
                return err(hide_if(noreply, BAD_FORMAT));
            }
            done(Command::Verbosity { noreply })
        }
        (None, b"flush_all") => {
            // flush_all [delay] [noreply], read as memcached 1.6.18 reads it: `noreply` counts only as
            // the last token; any other last token is ignored, and a delay is read whenever there
            // is a token besides `noreply` (`flush_all 0 x` flushes, `flush_all x y` is a bad delay)
            if tokens.len() > 3 {
                return err(UNKNOWN);
            }
            let noreply = tokens.len() > 1 && ends_noreply(&tokens);
            if tokens.len() == 1 || (tokens.len() == 2 && noreply) {
                return done(Command::FlushAll { delay: None, noreply });
            }
            match strtol32(&tokens[1]) {
                Some(delay) => done(Command::FlushAll {
                    delay: Some(i64::from(delay)),
                    noreply,
                }),
                None => err(hide_if(noreply, BAD_FLUSH_DELAY)),
            }
        }
        (None, b"shutdown") => done(Command::Unsupported("shutdown")),
        // An HTTP request line (`GET / HTTP/1.1`, `POST /x HTTP/1.0`, ...): memcached 1.6.18 closes
        // the connection without a reply when an unknown command's last token starts with `HTTP/`,
        // so a browser's request (cross-protocol scripting) cannot carry commands in its body.
        // (Only where memcached gets that far: a name shorter than 2 bytes, a 2-byte name starting
        // with `m`, and any name starting with one of `gsacidt` are `ERROR` before that check.)
        _ if name.len() >= 2
            && !(name[0] == b'm' && name.len() == 2)
            && !b"gsacidt".contains(&name[0])
            && tokens.last().is_some_and(|t| t.starts_with(b"HTTP/")) =>
        {
            ParseOutcome::Error {
                reply: "",
                consume: line_len,
                close: true,
            }
        }
        _ => err(UNKNOWN),
    }
}

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

/// A meta `mg`/`md`/`ma` line (`tokens` from the command name on), checked as memcached checks it
/// (see `meta`): the request, with `q` stripped and noted, or memcached's error line.
fn meta_request(cmd: Cmd, tokens: &[Bytes]) -> Result<Request, &'static str> {
    if tokens.len() < 2 {
        return Err(UNKNOWN);
    }
    let key = &tokens[1];
    if key.len() > MAX_KEY_LEN {
        return Err(BAD_FORMAT);
    }
    if tokens.len() >= MAX_META_TOKENS {
        return Err(if cmd == Cmd::MetaGet {
            "CLIENT_ERROR options flags are too long\r\n"
        } else {
            "CLIENT_ERROR options flags too long\r\n"
        });
    }
    let flags = meta::preparse(key, &tokens[2..]).map_err(|e| match cmd {
        Cmd::MetaGet => e,
        _ => "CLIENT_ERROR invalid or duplicate flag\r\n",
    })?;
    Ok(meta_with_flags(cmd, key, &tokens[2..], flags))
}

/// The request for a meta line whose flags passed `meta::preparse`: the `q` token is taken out
/// (the router hides what quiet mode hides), the others are forwarded as sent.
fn meta_with_flags(cmd: Cmd, key: &Bytes, flag_tokens: &[Bytes], flags: meta::Flags) -> Request {
    let mut req = Request::new(cmd, key.clone());
    req.quiet = flags.quiet;
    req.base64_key = flags.base64_key;
    req.meta = flag_tokens.iter().filter(|t| t[0] != b'q').cloned().collect();
    req
}

/// `ms <key> <len> <flags>*`, framed as memcached 1.6.18 frames it: a line refused before its
/// length is read (too few tokens, a key over 250 bytes, 20 tokens or more, a length memcached
/// cannot read) swallows nothing; a line refused for its flags swallows its value, as does a value
/// too large.
fn parse_mset(buf: &Bytes, tokens: &[Bytes], line_len: usize, max_value: usize) -> ParseOutcome {
    let err = |reply: &'static str, consume: usize| ParseOutcome::Error {
        reply,
        consume,
        close: false,
    };
    if tokens.len() < 2 {
        return err(UNKNOWN, line_len);
    }
    if tokens[1].len() > MAX_KEY_LEN || tokens.len() == 2 {
        return err(BAD_FORMAT, line_len);
    }
    if tokens.len() >= MAX_META_TOKENS {
        return err("CLIENT_ERROR options flags too long\r\n", line_len);
    }
    let Some(len) = strtol32(&tokens[2]).filter(|l| (0..=MAX_DECLARED_LEN).contains(l)) else {
        return err(BAD_FORMAT, line_len);
    };
    let len = len as usize;
    match meta::check_mset(&tokens[1], &tokens[3..]) {
        Ok(flags) => {
            let req = meta_with_flags(Cmd::MetaSet, &tokens[1], &tokens[3..], flags);
            value_or_refusal(buf, req, line_len, len, max_value)
        }
        Err(reply) => err(reply, line_len + len + 2),
    }
}

/// mcrouter's answer to a request line it cannot parse; it closes the connection after it.
const MALFORMED: &str = "CLIENT_ERROR malformed request\r\n";

fn malformed(line_len: usize) -> ParseOutcome {
    ParseOutcome::Error {
        reply: MALFORMED,
        consume: line_len,
        close: true,
    }
}

/// An unsigned decimal as mcrouter's parser reads one: digits only, no sign, no overflow.
fn mc_uint(t: &[u8]) -> Option<u64> {
    if t.is_empty() || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// `lease-set <key> <token> <flags> <exptime> <bytes> [noreply]`, read as mcrouter reads it: a
/// token, flags or length that is not a plain unsigned number (or overflows), an exptime that is
/// not one with an optional `-`, a missing field or an extra one is a malformed request, which
/// closes the connection. Where mcrouter takes wider numbers than memcached can store (flags over
/// 32 bits, an exptime over 32 bits), the router refuses them the same way. A key over 250 bytes
/// is refused as for `set` (nothing swallowed).
fn parse_lease_set(buf: &Bytes, tokens: &[Bytes], line_len: usize, max_value: usize) -> ParseOutcome {
    let noreply = tokens.len() == 7 && &tokens[6][..] == b"noreply";
    if tokens.len() != 6 && !noreply {
        return malformed(line_len);
    }
    let exptime = match tokens[4].strip_prefix(b"-") {
        Some(abs) => mc_uint(abs).and_then(|v| i32::try_from(v).ok()).map(|v| -i64::from(v)),
        None => mc_uint(&tokens[4]).and_then(|v| i32::try_from(v).ok()).map(i64::from),
    };
    let (Some(token), Some(flags), Some(exptime), Some(len)) = (
        mc_uint(&tokens[2]),
        mc_uint(&tokens[3]).and_then(|f| u32::try_from(f).ok()),
        exptime,
        mc_uint(&tokens[5]).filter(|&l| l <= MAX_DECLARED_LEN as u64),
    ) else {
        return malformed(line_len);
    };
    if !valid_key(&tokens[1]) {
        return ParseOutcome::Error {
            reply: hide_if(noreply, BAD_FORMAT),
            consume: line_len,
            close: false,
        };
    }
    let mut req = Request::new(Cmd::LeaseSet, tokens[1].clone());
    req.cas = token;
    req.client_flags = flags;
    req.exptime = exptime;
    req.quiet = noreply;
    value_or_refusal(buf, req, line_len, len as usize, max_value)
}

/// Why a value could not be taken.
enum ValueError {
    /// Longer than the limit: memcached answers `SERVER_ERROR object too large for cache` and
    /// swallows the value (`len` + CRLF).
    TooLarge,
    /// The `len` bytes are not followed by CRLF.
    BadChunk,
}

/// The `len`-byte payload after a command line, checked for its CRLF (`Ok(None)`: not all here yet).
fn take_value(buf: &Bytes, line_len: usize, len: usize, max_value: usize) -> Result<Option<Bytes>, ValueError> {
    if len > max_value {
        return Err(ValueError::TooLarge);
    }
    if buf.len() < line_len + len + 2 {
        return Ok(None);
    }
    if &buf[line_len + len..line_len + len + 2] != b"\r\n" {
        return Err(ValueError::BadChunk);
    }
    Ok(Some(buf.slice(line_len..line_len + len)))
}

/// A storage request with its value, or the refusal memcached makes. A too-large `set`/`ms` is not an
/// error here: it is routed as an unlink (see `Request::too_large`), its value swallowed.
fn value_or_refusal(buf: &Bytes, mut req: Request, line_len: usize, len: usize, max_value: usize) -> ParseOutcome {
    let consume = line_len + len + 2;
    // classic errors of a noreply command are hidden; meta errors always show
    let hide = req.quiet && !req.cmd.is_meta();
    match take_value(buf, line_len, len, max_value) {
        Ok(Some(v)) => {
            req.value = v;
            ParseOutcome::Done(Command::Keyed(req), consume)
        }
        Ok(None) => ParseOutcome::Incomplete,
        Err(ValueError::TooLarge) if matches!(req.cmd, Cmd::Set | Cmd::MetaSet) => {
            req.too_large = true;
            ParseOutcome::Done(Command::Keyed(req), consume)
        }
        Err(ValueError::TooLarge) => ParseOutcome::Error {
            reply: hide_if(hide, TOO_LARGE),
            consume,
            close: false,
        },
        Err(ValueError::BadChunk) => ParseOutcome::Error {
            reply: hide_if(hide, BAD_CHUNK),
            consume,
            close: false,
        },
    }
}

/// `set|add|replace|append|prepend <key> <flags> <exptime> <len> [noreply]` and
/// `cas <key> <flags> <exptime> <len> <cas> [noreply]`, framed as memcached 1.6.18 frames them: a
/// wrong number of tokens is `ERROR`; a last token past the fixed ones that is not `noreply` is
/// ignored (the value is read and stored as usual — it is data, never a command); numbers are read
/// as memcached reads them (`numbers`); a line memcached refuses (a key over 250 bytes, a number it
/// cannot read, a length over 2^31 - 3) swallows nothing, its value is read as the next command line
/// there and here.
fn parse_storage(cmd: Cmd, buf: &Bytes, tokens: &[Bytes], line_len: usize, max_value: usize) -> ParseOutcome {
    let fixed = if cmd == Cmd::Cas { 6 } else { 5 };
    if tokens.len() < fixed || tokens.len() > fixed + 1 {
        return ParseOutcome::Error {
            reply: UNKNOWN,
            consume: line_len,
            close: false,
        };
    }
    // memcached looks only at the last token (`set k 0 0 noreply` is a quiet bad line)
    let noreply = ends_noreply(tokens);
    let bad = ParseOutcome::Error {
        reply: hide_if(noreply, BAD_FORMAT),
        consume: line_len,
        close: false,
    };
    if !valid_key(&tokens[1]) {
        return bad;
    }
    let (Some(flags), Some(exptime), Some(len)) = (strtoul32(&tokens[2]), strtol32(&tokens[3]), strtol32(&tokens[4]))
    else {
        return bad;
    };
    let cas = if cmd == Cmd::Cas {
        let Some(cas) = strtoull(&tokens[5]) else {
            return bad;
        };
        cas
    } else {
        0
    };
    if !(0..=MAX_DECLARED_LEN).contains(&len) {
        return bad;
    }
    let mut req = Request::new(cmd, tokens[1].clone());
    req.client_flags = flags;
    req.exptime = i64::from(exptime);
    req.cas = cas;
    req.quiet = noreply;
    value_or_refusal(buf, req, line_len, len as usize, max_value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &[u8]) -> ParseOutcome {
        parse(&Bytes::copy_from_slice(s))
    }

    fn keyed(s: &[u8]) -> (Request, usize) {
        match p(s) {
            ParseOutcome::Done(Command::Keyed(r), n) => (r, n),
            other => panic!("{other:?}"),
        }
    }

    fn encoded(r: &Request) -> Vec<u8> {
        let mut b = BytesMut::new();
        r.encode(&mut b);
        b.to_vec()
    }

    #[test]
    fn a_hash_stop_ends_the_routing_key_as_in_mcrouter() {
        let r = Request::simple(Cmd::Get, Bytes::from_static(b"user:1|#|avatar"));
        assert_eq!(&r.routing_key()[..], b"user:1");
        assert!(r.has_hash_stop());
        let r = Request::simple(Cmd::Get, Bytes::from_static(b"a|b#|c"));
        assert_eq!(&r.routing_key()[..], b"a|b#|c");
        assert!(!r.has_hash_stop());
        // a base64 meta key: the stop is looked for in the decoded key
        let (r, _) = keyed(b"mg dXNlcjoxfCN8YXZhdGFy b v\r\n"); // "user:1|#|avatar"
        assert_eq!(&r.routing_key()[..], b"user:1");
        assert!(r.has_hash_stop());
    }

    #[test]
    fn lease_get_takes_keys_as_mcrouter_does_and_goes_down_as_mg_with_a_lease() {
        match p(b"lease-get a bb  c\r\n") {
            ParseOutcome::Done(Command::LeaseGet { keys }, 19) => assert_eq!(keys, [&b"a"[..], b"bb", b"c"]),
            other => panic!("{other:?}"),
        }
        for line in [&b"lease-get\r\n"[..], b"lease-get \r\n"] {
            match p(line) {
                ParseOutcome::Error { reply, close, .. } => {
                    assert_eq!((reply, close), ("CLIENT_ERROR malformed request\r\n", true))
                }
                other => panic!("{other:?}"),
            }
        }
        let long = format!("lease-get {}\r\n", "k".repeat(MAX_KEY_LEN + 1));
        match p(long.as_bytes()) {
            ParseOutcome::Error { reply, close, .. } => assert_eq!((reply, close), (BAD_FORMAT, false)),
            other => panic!("{other:?}"),
        }
        let r = Request::simple(Cmd::LeaseGet, Bytes::from_static(b"user:1"));
        assert_eq!(encoded(&r), b"mg user:1 v f c N10\r\n");
    }

    #[test]
    fn lease_set_is_read_as_mcrouter_reads_it_and_goes_down_as_ms_with_the_token() {
        let (r, n) = keyed(b"lease-set k 12345 7 -1 3\r\nabc\r\n");
        assert_eq!(n, 31);
        assert_eq!(
            (r.cmd, r.cas, r.client_flags, r.exptime, &r.value[..], r.quiet),
            (Cmd::LeaseSet, 12345, 7, -1, &b"abc"[..], false)
        );
        assert_eq!(encoded(&r), b"ms k 3 F7 T-1 C12345\r\nabc\r\n");
        assert!(keyed(b"lease-set k 9 0 0 1 noreply\r\nx\r\n").0.quiet);
        // what mcrouter's grammar refuses closes the connection with its answer, nothing swallowed
        for line in [
            &b"lease-set k abc 0 0 1\r\n"[..],
            b"lease-set k -5 0 0 1\r\n",
            b"lease-set k 18446744073709551616 0 0 1\r\n", // over 64 bits
            b"lease-set k 1 x 0 1\r\n",
            b"lease-set k 1 4294967296 0 1\r\n", // flags memcached cannot keep
            b"lease-set k 1 0 2147483648 1\r\n",
            b"lease-set k 1 0 0 -1\r\n",
            b"lease-set k 1 0 0\r\n",
            b"lease-set k 1 0 0 1 noreply extra\r\n",
            b"lease-set k 1 0 0 1 junk\r\n",
        ] {
            match p(line) {
                ParseOutcome::Error { reply, consume, close } => assert_eq!(
                    (reply, consume, close),
                    ("CLIENT_ERROR malformed request\r\n", line.len(), true),
                    "{line:?}"
                ),
                other => panic!("{line:?}: {other:?}"),
            }
        }
        assert!(matches!(
            p(b"lease-set k 1 0 0 3\r\nabcX\r\n"),
            ParseOutcome::Error { reply: BAD_CHUNK, .. }
        ));
        assert!(matches!(p(b"lease-set k 1 0 0 3\r\nab"), ParseOutcome::Incomplete));
        assert_eq!(
            Request::simple(Cmd::LeaseSet, Bytes::from_static(b"k")).op(),
            Op::LeaseSet
        );
        assert_eq!(Op::from_name("lease-get"), Some(Op::LeaseGet));
        assert_eq!(Op::from_name("get"), Some(Op::Get));
    }

    #[test]
    fn every_command_is_named_once_in_the_table() {
        let mut seen = std::collections::HashSet::new();
        for (i, row) in COMMANDS.iter().enumerate() {
            assert_eq!(row.cmd as usize, i);
            assert!(seen.insert(row.name), "{} twice", row.name);
            assert_eq!(row.cmd.name(), row.name);
            assert_eq!(row.cmd.is_meta(), row.meta);
            if !row.keyed_line {
                // a key of a `gat`/`gats` line: the line parses as a whole (`GetAndTouch`)
                assert_eq!(Cmd::from_wire(row.name.as_bytes()), None);
                assert_eq!(Cmd::from_name(row.name.as_bytes()), None);
                assert_eq!(Op::from_name(row.name), None);
                continue;
            }
            assert_eq!(Cmd::from_wire(row.name.as_bytes()), Some(row.cmd));
            // classic commands name their operation and `__mcrouter__.route(<name>,KEY)`; meta ones do not
            let classic = (!row.meta).then_some(row.cmd);
            assert_eq!(Cmd::from_name(row.name.as_bytes()), classic);
            assert_eq!(Op::from_name(row.name), (!row.meta).then_some(row.op));
            // what parsing reads is the command of that name (the line framed as the command wants it)
            let line = match row.cmd {
                Cmd::Set | Cmd::Add | Cmd::Replace | Cmd::Append | Cmd::Prepend => {
                    format!("{} k 0 0 1\r\nx\r\n", row.name)
                }
                Cmd::Cas => "cas k 0 0 1 7\r\nx\r\n".to_string(),
                Cmd::Incr | Cmd::Decr | Cmd::Touch => format!("{} k 1\r\n", row.name),
                Cmd::MetaSet => "ms k 1\r\nx\r\n".to_string(),
                Cmd::LeaseSet => "lease-set k 5 0 0 1\r\nx\r\n".to_string(),
                _ => format!("{} k\r\n", row.name),
            };
            match p(line.as_bytes()) {
                ParseOutcome::Done(Command::Keyed(r), _) => assert_eq!(r.cmd, row.cmd, "{line:?}"),
                ParseOutcome::Done(Command::LeaseGet { keys }, _) => {
                    assert_eq!((row.cmd, &keys[..]), (Cmd::LeaseGet, &[Bytes::from_static(b"k")][..]))
                }
                ParseOutcome::Done(Command::MultiGet { gets, .. }, _) => {
                    assert_eq!(if gets { Cmd::Gets } else { Cmd::Get }, row.cmd)
                }
                other => panic!("{line:?}: {other:?}"),
            }
        }
        assert_eq!(Cmd::from_wire(b"gat"), None);
        assert_eq!(Op::from_name("mg"), None);
    }

    #[test]
    fn classic_set_roundtrip() {
        let (r, n) = keyed(b"set foo 5 100 3 noreply\r\nbar\r\nget foo\r\n");
        assert_eq!(n, 30);
        assert!(r.quiet);
        assert_eq!(r.exptime(), 100);
        assert_eq!(encoded(&r), b"set foo 5 100 3\r\nbar\r\n");
    }

    #[test]
    fn incomplete_value_waits() {
        assert!(matches!(p(b"set foo 0 0 10\r\nabc"), ParseOutcome::Incomplete));
        assert!(matches!(p(b"get foo"), ParseOutcome::Incomplete));
    }

    #[test]
    fn multiget() {
        match p(b"get a b  c\r\n") {
            ParseOutcome::Done(Command::MultiGet { gets: false, keys }, 12) => {
                assert_eq!(keys.len(), 3)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bget_is_a_get() {
        match p(b"bget a b\r\n") {
            ParseOutcome::Done(Command::MultiGet { gets: false, keys }, 10) => assert_eq!(keys.len(), 2),
            other => panic!("{other:?}"),
        }
        assert!(matches!(p(b"bget\r\n"), ParseOutcome::Error { reply: "ERROR\r\n", .. }));
        // not exempt from the partial-line bound, as on memcached
        let long = Bytes::from(format!("bget {}", "k ".repeat(1100)));
        assert!(matches!(p(&long), ParseOutcome::Error { close: true, .. }));
    }

    #[test]
    fn errors_keep_connection() {
        assert!(matches!(
            p(b"bogus\r\n"),
            ParseOutcome::Error {
                reply: "ERROR\r\n",
                consume: 7,
                close: false
            }
        ));
        let long = format!("get {}\r\n", "a".repeat(251));
        assert!(matches!(
            p(long.as_bytes()),
            ParseOutcome::Error { reply: BAD_FORMAT, .. }
        ));
        // a too-large set is routed (as an unlink), its value swallowed; an add is refused outright
        match p(b"set x 0 0 2000000\r\n") {
            ParseOutcome::Done(Command::Keyed(r), consume) => {
                assert!(r.too_large && r.value.is_empty());
                assert_eq!(consume, 19 + 2_000_002);
                assert_eq!(encoded(&r), b"delete x\r\n");
            }
            other => panic!("{other:?}"),
        }
        match p(b"add x 0 0 2000000\r\n") {
            ParseOutcome::Error {
                reply,
                consume,
                close: false,
            } => {
                assert_eq!(reply, TOO_LARGE);
                assert_eq!(consume, 19 + 2_000_002);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            p(b"set x 0 0 1\r\nab\r\n"),
            ParseOutcome::Error {
                reply: BAD_CHUNK,
                consume: 16,
                ..
            }
        ));
        assert!(matches!(
            p(b"incr x y\r\n"),
            ParseOutcome::Error { reply: BAD_DELTA, .. }
        ));
        assert!(matches!(
            p(b"set x 0 0 -1\r\n"),
            ParseOutcome::Error { reply: BAD_FORMAT, .. }
        ));
    }

    #[test]
    fn client_flags_keep_their_low_32_bits_as_memcached_reads_them() {
        for (flags, want) in [
            ("4294967295", Some(u32::MAX)),
            ("4294967296", Some(0)),
            ("4294967301", Some(5)),
            ("9223372036854775808", Some(0)),
            ("18446744073709551615", Some(u32::MAX)),
            ("18446744073709551616", None),
            ("99999999999999999999", None),
            ("-0", Some(0)),
            ("-1", None),
            ("-9223372036854775808", None),
            ("-9223372036854775809", Some(u32::MAX)),
            ("-18446744073709551615", Some(1)),
            ("-18446744073709551616", None),
            ("+5", Some(5)),
            ("0000000000000000000000000007", Some(7)),
            ("\t+5", Some(5)),
            ("\t-5", None),
            ("5\tx", Some(5)),
            ("\r5", Some(5)),
            ("\t", None),
            ("+", None),
            ("--5", None),
            ("0x10", None),
            ("5\x01", None),
        ] {
            assert_eq!(strtoul32(flags.as_bytes()), want, "{flags:?}");
        }
        let (r, _) = keyed(b"set k 4294967297 0 1\r\nv\r\n");
        assert_eq!(encoded(&r), b"set k 1 0 1\r\nv\r\n");
        assert_eq!(refusal(b"cas k -1 0 1 5 noreply\r\n").0, "");
    }

    #[test]
    fn keys_take_every_byte_memcached_takes_and_a_nul_ends_the_line() {
        // memcached 1.6.18 splits on spaces only: control bytes, DEL, high bytes, a CR inside a key
        let (r, _) = keyed(b"set a\x01\x7f\x80\rz 0 0 1\r\nv\r\n");
        assert_eq!(&r.key[..], b"a\x01\x7f\x80\rz");
        assert_eq!(encoded(&r), b"set a\x01\x7f\x80\rz 0 0 1\r\nv\r\n");
        let (r, _) = keyed(b"mg \x1b\t v k\r\n");
        assert_eq!(encoded(&r), b"mg \x1b\t v k\r\n");
        for line in [
            &b"delete \x01\r\n"[..],
            b"incr \x02 1\r\n",
            b"touch \x03 0\r\n",
            b"md \x04\r\n",
        ] {
            assert_eq!(keyed(line).0.key.len(), 1);
        }
        // only the CR before the LF ends the line: a last token may end with one
        match p(b"get a\x01 k\r\r\n") {
            ParseOutcome::Done(Command::MultiGet { keys, .. }, 11) => assert_eq!(keys[1], &b"k\r"[..]),
            other => panic!("{other:?}"),
        }
        // the line ends at its first NUL; the rest up to the newline is not read
        match p(b"set k 0 0 1\0junk\r\nv\r\n") {
            ParseOutcome::Done(Command::Keyed(r), 21) => assert_eq!(encoded(&r), b"set k 0 0 1\r\nv\r\n"),
            other => panic!("{other:?}"),
        }
        assert_eq!(refusal(b"set x\0y 0 0 1\r\n"), (UNKNOWN, 15));
        assert!(
            matches!(p(b"get a\0 b\r\n"), ParseOutcome::Done(Command::MultiGet { keys, .. }, 10) if keys.len() == 1)
        );
        assert_eq!(refusal(b"\0get a\r\n"), (UNKNOWN, 8));
        assert!(!valid_key(b"a b") && !valid_key(b"a\n") && !valid_key(b"a\0") && !valid_key(b""));
    }

    #[test]
    fn wrong_token_counts_are_error_as_memcached_answers_them() {
        // memcached 1.6.18's WANT_TOKENS: a command with too few or too many tokens is `ERROR`
        for line in [
            &b"cas\r\n"[..],
            b"cas k 0 0 1\r\n",
            b"set k\r\n",
            b"add k 0 0\r\n",
            b"set k 0 0 1 noreply x\r\n",
            b"incr k\r\n",
            b"decr\r\n",
            b"touch k\r\n",
            b"verbosity\r\n",
            b"verbosity 1 2 3\r\n",
            b"gat\r\n",
            b"stats slabs\r\n",
            b"stats RESET\r\n",
        ] {
            assert_eq!(refusal(line).0, UNKNOWN, "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn verbosity_checks_its_level() {
        assert_eq!(refusal(b"verbosity invalid\r\n").0, BAD_FORMAT);
        assert_eq!(refusal(b"verbosity x noreply\r\n").0, "");
        assert!(matches!(
            p(b"verbosity 1\r\n"),
            ParseOutcome::Done(Command::Verbosity { noreply: false }, _)
        ));
        assert!(matches!(
            p(b"verbosity 1 noreply\r\n"),
            ParseOutcome::Done(Command::Verbosity { noreply: true }, _)
        ));
        assert!(matches!(p(b"stats\r\n"), ParseOutcome::Done(Command::Stats, _)));
        for line in [
            &b"stats reset\r\n"[..],
            b"stats reset noreply\r\n",
            b"stats  reset x y\r\n",
        ] {
            assert!(matches!(p(line), ParseOutcome::Done(Command::StatsReset, n) if n == line.len()));
        }
    }

    #[test]
    fn gat_and_gats_parse_exptime_and_keys() {
        match p(b"gats 10 foo1 foo2\r\n") {
            ParseOutcome::Done(
                Command::GetAndTouch {
                    cas,
                    exptime,
                    keys,
                    refused: None,
                },
                19,
            ) => {
                assert!(cas);
                assert_eq!(exptime, 10);
                assert_eq!(keys, vec![Bytes::from_static(b"foo1"), Bytes::from_static(b"foo2")]);
            }
            other => panic!("{other:?}"),
        }
        match p(b"gat -1 k\r\n") {
            ParseOutcome::Done(
                Command::GetAndTouch {
                    cas: false,
                    exptime: -1,
                    keys,
                    refused: None,
                },
                _,
            ) => assert_eq!(keys.len(), 1),
            other => panic!("{other:?}"),
        }
        // memcached answers `gat 10` (no key) with END: an empty key list
        assert!(
            matches!(p(b"gat 10\r\n"), ParseOutcome::Done(Command::GetAndTouch { ref keys, .. }, _) if keys.is_empty())
        );
        assert_eq!(refusal(b"gat x k\r\n").0, "CLIENT_ERROR invalid exptime argument\r\n");
        // a key over 250 bytes: the keys before it are still touched (as memcached does), then the error
        let line = [&b"gats 100 a b "[..], &[b'x'; 251], b" c\r\n"].concat();
        match p(&line) {
            ParseOutcome::Done(
                Command::GetAndTouch {
                    keys,
                    refused: Some(reply),
                    ..
                },
                n,
            ) => {
                assert_eq!(keys, vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
                assert_eq!((reply, n), (BAD_FORMAT, line.len()));
            }
            other => panic!("{other:?}"),
        }
    }

    fn refusal(s: &[u8]) -> (&'static str, usize) {
        match p(s) {
            ParseOutcome::Error {
                reply,
                consume,
                close: false,
            } => (reply, consume),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(s)),
        }
    }

    #[test]
    fn noreply_hides_the_errors_memcached_hides() {
        // as memcached 1.6.18 answers them (measured against it): nothing for a noreply command
        for line in [
            &b"delete k 10 noreply\r\n"[..],
            b"incr k x noreply\r\n",
            b"touch k x noreply\r\n",
            b"set k x 0 1 noreply\r\n",
            b"set k 0 0 -1 noreply\r\n",
            b"cas k 0 0 1 x noreply\r\n",
            b"flush_all x noreply\r\n",
            b"set k 0 0 1 noreply\r\nvv\r\n",
            b"add k 0 0 2000000 noreply\r\n",
        ] {
            assert_eq!(refusal(line).0, "", "{}", String::from_utf8_lossy(line));
        }
        let long = [&b"delete "[..], &[b'k'; 251], b" noreply\r\n"].concat();
        assert_eq!(refusal(&long).0, "");
        // `noreply` counts only as the last token, and only once the line has a valid length
        assert!(
            refusal(b"delete k noreply 0\r\n")
                .0
                .starts_with("CLIENT_ERROR bad command line format.")
        );
        assert_eq!(refusal(b"delete\r\n").0, UNKNOWN);
        assert_eq!(refusal(b"delete a b c noreply\r\n").0, UNKNOWN);
        // memcached looks at the last token whatever the count: these are quiet bad lines there
        assert_eq!(refusal(b"set k 0 0 noreply\r\n").0, "");
        assert_eq!(refusal(b"cas k 0 0 1 noreply\r\n").0, "");
        assert_eq!(refusal(b"decr n noreply\r\n").0, "");
        assert_eq!(refusal(b"touch k noreply\r\n").0, "");
        // meta errors always show
        assert_eq!(refusal(b"ms k abc q\r\n").0, BAD_FORMAT);
        // valid forms
        let (d, _) = keyed(b"delete k 0 noreply\r\n");
        assert!(d.quiet);
        let (d, _) = keyed(b"delete k 0\r\n");
        assert!(!d.quiet);
        let (s, _) = keyed(b"set k 0 0 2000000 noreply\r\n");
        assert!(s.too_large && s.quiet);
    }

    #[test]
    fn an_extra_token_is_ignored_so_the_value_stays_data() {
        // issue 26: `set inj 0 0 13 x` + `delete victim` stores 13 bytes on memcached 1.6.18
        let (r, n) = keyed(b"set inj 0 0 13 x\r\ndelete victim\r\n");
        assert_eq!((&r.value[..], n, r.quiet), (&b"delete victim"[..], 33, false));
        let (r, _) = keyed(b"cas inj 0 0 1 7 junk\r\nv\r\n");
        assert_eq!((r.cmd, r.cas, &r.value[..]), (Cmd::Cas, 7, &b"v"[..]));
        for line in [
            &b"append k 0 0 1 x\r\nv\r\n"[..],
            b"prepend k 0 0 1 x\r\nv\r\n",
            b"add k 0 0 1 x\r\nv\r\n",
        ] {
            assert_eq!(keyed(line).1, line.len());
        }
        let (r, _) = keyed(b"incr k 2 x\r\n");
        assert_eq!((r.delta, r.quiet), (2, false));
        let (r, _) = keyed(b"touch k 10 x\r\n");
        assert_eq!((r.exptime, r.quiet), (10, false));
    }

    #[test]
    fn meta_lines_are_refused_as_memcached_refuses_them() {
        assert_eq!(refusal(b"mg\r\n").0, UNKNOWN);
        assert_eq!(refusal(b"ms\r\n").0, UNKNOWN);
        assert_eq!(refusal(b"ms k\r\n"), (BAD_FORMAT, 6));
        assert_eq!(refusal(b"mg k 9\r\n").0, "CLIENT_ERROR invalid flag\r\n");
        assert_eq!(refusal(b"md k 9\r\n").0, "CLIENT_ERROR invalid or duplicate flag\r\n");
        assert_eq!(refusal(b"mg k q q\r\n").0, "CLIENT_ERROR duplicate flag\r\n");
        let many = format!("mg k {}\r\n", ["v"; 18].join(" "));
        assert_eq!(
            refusal(many.as_bytes()).0,
            "CLIENT_ERROR options flags are too long\r\n"
        );
        // an `ms` refused for its flags swallows its value; one refused before its length, not
        assert_eq!(refusal(b"ms k 2 !\r\nab\r\n"), ("CLIENT_ERROR invalid flag\r\n", 14));
        assert_eq!(
            refusal(b"ms k 2 MZ\r\nabXY"),
            ("CLIENT_ERROR invalid mode for ms M token\r\n", 15)
        );
        assert_eq!(refusal(b"ms k x T1\r\nab\r\n"), (BAD_FORMAT, 11));
        // any token starting with q is quiet mode (and is not forwarded)
        let (r, _) = keyed(b"md k qx I\r\n");
        assert!(r.quiet);
        assert_eq!(encoded(&r), b"md k I\r\n");
        // `b` keys decode as memcached decodes them (bytes outside the alphabet skipped)
        let (r, _) = keyed(b"mg Zm!9v b v\r\n");
        assert_eq!(&r.routing_key()[..], b"foo");
    }

    #[test]
    fn http_lines_close_only_where_memcached_gets_to_that_check() {
        assert!(matches!(
            p(b"GET / HTTP/1.1\r\n"),
            ParseOutcome::Error { close: true, .. }
        ));
        for line in [
            &b"gx / HTTP/1.1\r\n"[..],
            b"x HTTP/1.1\r\n",
            b"mx HTTP/1.1\r\n",
            b"delet HTTP/1.0\r\n",
        ] {
            assert_eq!(refusal(line).0, UNKNOWN, "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn lengths_memcached_cannot_hold_are_bad_lines_not_values_to_swallow() {
        // memcached keeps the low 32 bits of a 64-bit length: these are negative or over 2^31 - 3
        for len in [
            "2147483646",
            "2147483648",
            "4294967295",
            "-1",
            "9223372036854775807",
            "9223372036854775808",
            "99999999999999999999",
        ] {
            let line = format!("set k 0 0 {len}\r\n");
            assert_eq!(refusal(line.as_bytes()), (BAD_FORMAT, line.len()), "{line}");
            let line = format!("ms k {len} T0\r\n");
            assert_eq!(refusal(line.as_bytes()), (BAD_FORMAT, line.len()), "{line}");
        }
        // and these are lengths memcached reads (2^32 + 3, -(2^32) + 3): values, not commands
        for line in [
            &b"set k 0 0 4294967299\r\nabc\r\n"[..],
            b"set k 0 0 -4294967293\r\nabc\r\n",
        ] {
            let (r, n) = keyed(line);
            assert_eq!((&r.value[..], n), (&b"abc"[..], line.len()));
            assert_eq!(encoded(&r), b"set k 0 0 3\r\nabc\r\n");
        }
        let (r, _) = keyed(b"ms k 4294967299 T5\r\nabc\r\n");
        assert_eq!(encoded(&r), b"ms k 3 T5\r\nabc\r\n");
        // the largest memcached reads is refused for its size, and swallowed
        match p(b"set k 0 0 2147483645\r\n") {
            ParseOutcome::Done(Command::Keyed(r), n) => assert!(r.too_large && n == 22 + 2147483647),
            other => panic!("{other:?}"),
        }
        // the limit is a parameter
        let small = Bytes::from_static(b"set k 0 0 5\r\nhello\r\n");
        assert!(matches!(parse_with(&small, 4), ParseOutcome::Done(Command::Keyed(r), _) if r.too_large));
        assert!(matches!(parse_with(&small, 5), ParseOutcome::Done(Command::Keyed(r), _) if !r.too_large));
        let ms = Bytes::from_static(b"ms Zm9v 5 b MA\r\nhello\r\n");
        match parse_with(&ms, 4) {
            ParseOutcome::Done(Command::Keyed(r), 23) => assert_eq!(encoded(&r), b"md Zm9v b\r\n"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn long_multi_get_lines_up_to_a_bound() {
        let keys: Vec<String> = (0..1000).map(|i| format!("some:longish:key:{i:06}")).collect();
        let line = format!("get {}\r\n", keys.join(" "));
        assert!(line.len() > MAX_LINE_LEN);
        match p(line.as_bytes()) {
            ParseOutcome::Done(Command::MultiGet { gets: false, keys: k }, n) => {
                assert_eq!((k.len(), n), (1000, line.len()));
            }
            other => panic!("{other:?}"),
        }
        // still incomplete (not refused) while a long get line is arriving
        assert!(matches!(
            p(&line.as_bytes()[..line.len() - 2]),
            ParseOutcome::Incomplete
        ));
        let gets = format!("gets {}\r\n", keys.join(" "));
        assert!(matches!(
            p(gets.as_bytes()),
            ParseOutcome::Done(Command::MultiGet { gets: true, .. }, _)
        ));
        // other lines are read up to 16 KiB, newline included, as memcached reads them; past that, or
        // past 2 KiB without a newline, the connection is closed without a reply
        let set = |n: usize| format!("set k 0 0 1{}\r\nx\r\n", " ".repeat(n - 13));
        assert!(
            matches!(p(set(MAX_LINE_LEN).as_bytes()), ParseOutcome::Done(Command::Keyed(_), n) if n == MAX_LINE_LEN + 3)
        );
        let closed = |s: &str| {
            matches!(
                p(s.as_bytes()),
                ParseOutcome::Error {
                    reply: "",
                    close: true,
                    ..
                }
            )
        };
        assert!(closed(&set(MAX_LINE_LEN + 1)));
        assert!(closed(&"mg ".repeat(MAX_LINE_LEN)));
        assert!(closed(&"x".repeat(MAX_PARTIAL_LINE_LEN + 1)));
        assert!(matches!(p(&[b'x'; MAX_PARTIAL_LINE_LEN]), ParseOutcome::Incomplete));
        // a get line may start with spaces
        assert!(matches!(
            p(format!("  get {}", "k ".repeat(2000)).as_bytes()),
            ParseOutcome::Incomplete
        ));
        // a key memcached refuses does not swallow the value: it is the next command line
        let long_key = format!("set {} 0 0 1\r\nv\r\n", "k".repeat(251));
        assert_eq!(refusal(long_key.as_bytes()), (BAD_FORMAT, long_key.len() - 3));
        let long_key = format!("ms {} 1\r\nv\r\n", "k".repeat(251));
        assert_eq!(refusal(long_key.as_bytes()), (BAD_FORMAT, long_key.len() - 3));
        // past the get bound: refused with a clear error, with or without the newline yet
        let huge = format!("get {}", "k ".repeat(MAX_GET_LINE_LEN / 2 + 1));
        for buf in [huge.clone(), format!("{huge}\r\n")] {
            match p(buf.as_bytes()) {
                ParseOutcome::Error { reply, close: true, .. } => assert_eq!(reply, GET_LINE_TOO_LONG),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn meta_flags_pass_through_without_q() {
        let (r, _) = keyed(b"mg foo N30 v c t q O123 k\r\n");
        assert!(r.quiet);
        assert_eq!(r.op(), Op::Get);
        assert_eq!(encoded(&r), b"mg foo N30 v c t O123 k\r\n");
        let (r, n) = keyed(b"ms foo 3 C99 T30 q\r\nbar\r\n");
        assert_eq!(n, 25);
        assert_eq!(encoded(&r), b"ms foo 3 C99 T30\r\nbar\r\n");
        assert_eq!(r.exptime(), 30);
    }

    #[test]
    fn meta_ops_by_mode() {
        assert_eq!(keyed(b"ms k 1 ME\r\nx\r\n").0.op(), Op::Add);
        assert_eq!(keyed(b"ms k 1 MA\r\nx\r\n").0.op(), Op::Append);
        assert_eq!(keyed(b"ms k 1 MR\r\nx\r\n").0.op(), Op::Replace);
        assert_eq!(keyed(b"ms k 1\r\nx\r\n").0.op(), Op::Set);
        assert_eq!(keyed(b"ma k MD\r\n").0.op(), Op::Decr);
        assert_eq!(keyed(b"ma k\r\n").0.op(), Op::Incr);
        assert_eq!(keyed(b"md k q\r\n").0.op(), Op::Delete);
    }

    #[test]
    fn meta_exptime_rewrite() {
        let (mut r, _) = keyed(b"ms k 1 T100 F5\r\nx\r\n");
        r.set_exptime(10);
        assert_eq!(encoded(&r), b"ms k 1 T10 F5\r\nx\r\n");
        let (mut r, _) = keyed(b"ms k 1\r\nx\r\n");
        assert_eq!(r.exptime(), 0);
        r.set_exptime(10);
        assert_eq!(encoded(&r), b"ms k 1 T10\r\nx\r\n");
    }

    #[test]
    fn base64_keys_route_by_decoded_bytes() {
        let (r, _) = keyed(b"mg Zm9v b v\r\n");
        assert_eq!(&r.routing_key()[..], b"foo");
        assert_eq!(encoded(&r), b"mg Zm9v b v\r\n");
        assert!(matches!(p(b"mg !!! b v\r\n"), ParseOutcome::Error { .. }));
    }

    #[test]
    fn flush_all_takes_a_delay_and_noreply() {
        let flush = |s: &[u8]| match p(s) {
            ParseOutcome::Done(Command::FlushAll { delay, noreply }, n) => (delay, noreply, n),
            other => panic!("{other:?}"),
        };
        assert_eq!(flush(b"flush_all\r\n"), (None, false, 11));
        assert_eq!(flush(b"flush_all noreply\r\n"), (None, true, 19));
        assert_eq!(flush(b"flush_all 10\r\n"), (Some(10), false, 14));
        assert_eq!(flush(b"flush_all  0 noreply\r\nmn\r\n"), (Some(0), true, 22));
        assert_eq!(flush(b"flush_all -1\n"), (Some(-1), false, 13));
        // memcached 1.6.18's answers to bad delays and too many tokens (checked against it here)
        let error = |s: &[u8]| match p(s) {
            ParseOutcome::Error {
                reply,
                consume,
                close: false,
            } => (reply, consume),
            other => panic!("{other:?}"),
        };
        assert_eq!(error(b"flush_all x\r\n"), (BAD_FLUSH_DELAY, 13));
        assert_eq!(error(b"flush_all noreply 5\r\n").0, BAD_FLUSH_DELAY);
        assert_eq!(error(b"flush_all 1 2 3\r\n").0, UNKNOWN);
        assert_eq!(error(b"flush_all 1 2 noreply\r\n").0, UNKNOWN);
        // memcached ignores a second argument that is not `noreply`, and so does the router
        assert_eq!(flush(b"flush_all 1 2\r\n"), (Some(1), false, 15));
        assert_eq!(error(b"flush_all x 2\r\n").0, BAD_FLUSH_DELAY);
        assert!(matches!(p(b"flush_all 10"), ParseOutcome::Incomplete));
        assert!(matches!(
            p(b"shutdown\r\n"),
            ParseOutcome::Done(Command::Unsupported("shutdown"), 10)
        ));
    }

    #[test]
    fn http_request_lines_close_without_a_reply() {
        for line in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"POST /x HTTP/1.0\r\n",
            b"PUT /x HTTP/1.1\r\n",
            b"HEAD / HTTP/1.1\r\n",
            b"OPTIONS * HTTP/1.1\r\n",
            b"foo bar HTTP/1.1\r\n",
            b"HTTP/1.1\r\n",
        ] {
            match p(line) {
                ParseOutcome::Error { reply, consume, close } => {
                    assert_eq!((reply, consume, close), ("", line.len(), true), "{line:?}")
                }
                o => panic!("{line:?}: {o:?}"),
            }
        }
        // as on memcached: no `HTTP/` last token, a lowercase one, or a known command go on as usual
        for line in [&b"GET /\r\n"[..], b"GET / http/1.1\r\n"] {
            assert!(
                matches!(
                    p(line),
                    ParseOutcome::Error {
                        reply: UNKNOWN,
                        close: false,
                        ..
                    }
                ),
                "{line:?}"
            );
        }
        assert!(matches!(
            p(b"get / HTTP/1.1\r\n"),
            ParseOutcome::Done(Command::MultiGet { .. }, _)
        ));
        assert!(matches!(
            p(b"delete HTTP/1.1\r\n"),
            ParseOutcome::Done(Command::Keyed(_), _)
        ));
    }

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

    #[test]
    fn quiet_rules_follow_memcached() {
        let (mg, _) = keyed(b"mg k v q\r\n");
        assert!(mg.suppress(&Reply::line(Res::Miss, "EN")));
        assert!(!mg.suppress(&Reply::line(Res::Found, "HD")));
        let (md, _) = keyed(b"md k q\r\n");
        assert!(md.suppress(&Reply::line(Res::Deleted, "HD")));
        assert!(!md.suppress(&Reply::line(Res::NotFound, "NF")));
        let (ms, _) = keyed(b"ms k 1 q\r\nx\r\n");
        assert!(!ms.suppress(&Reply::line(Res::NotStored, "NS")));
        let (del, _) = keyed(b"delete k noreply\r\n");
        assert!(del.suppress(&Reply::line(Res::NotFound, "NOT_FOUND")));
    }
}
