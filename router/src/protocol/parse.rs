//! Parsing client commands, classic and meta, as memcached 1.6.18 frames them: where one command
//! ends and the next begins, what a bad line answers and how much of it is swallowed (strictly: a bad
//! line becomes an error reply and the connection survives).

use bytes::Bytes;

use super::cmd::Cmd;
use super::meta::{self, MAX_META_TOKENS};
use super::numbers::{strtol32, strtoul32, strtoull};
use super::request::Request;

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

/// The start of `<cmd> <key> <argument> [noreply]` (incr, decr, touch): the request for the key,
/// quiet under `noreply`, and whether it is; the caller reads the argument (`tokens[2]`). A wrong
/// number of tokens is `ERROR` (memcached's WANT_TOKENS); a fourth token that is not `noreply` is
/// ignored, as memcached ignores it. `Err` is the reply, hidden already where `noreply` hides it.
fn key_and_argument(cmd: Cmd, tokens: &[Bytes]) -> Result<(Request, bool), &'static str> {
    if tokens.len() < 3 || tokens.len() > 4 {
        return Err(UNKNOWN);
    }
    let noreply = ends_noreply(tokens); // memcached looks at the last token, whatever it is
    if !valid_key(&tokens[1]) {
        return Err(hide_if(noreply, BAD_FORMAT));
    }
    let mut req = Request::new(cmd, tokens[1].clone());
    req.quiet = noreply;
    Ok((req, noreply))
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
            // incr <key> <delta> [noreply]
            let (mut req, noreply) = match key_and_argument(cmd, &tokens) {
                Ok(parsed) => parsed,
                Err(reply) => return err(reply),
            };
            let Some(delta) = strtoull(&tokens[2]) else {
                return err(hide_if(noreply, BAD_DELTA));
            };
            req.delta = delta;
            done(Command::Keyed(req))
        }
        (Some(Cmd::Touch), _) => {
            // touch <key> <exptime> [noreply], the fourth token read as for incr
            let (mut req, noreply) = match key_and_argument(Cmd::Touch, &tokens) {
                Ok(parsed) => parsed,
                Err(reply) => return err(reply),
            };
            let Some(exptime) = strtol32(&tokens[2]) else {
                return err(hide_if(noreply, "CLIENT_ERROR invalid exptime argument\r\n"));
            };
            req.exptime = i64::from(exptime);
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
mod tests;
