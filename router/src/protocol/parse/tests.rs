//! Tests of `parse`: commands framed, read and refused as memcached 1.6.18 frames, reads and refuses them.

use super::*;
use bytes::BytesMut;

use crate::protocol::cmd::{COMMANDS, Op};
use crate::protocol::reply::{Reply, Res};

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
    assert!(matches!(p(b"get a\0 b\r\n"), ParseOutcome::Done(Command::MultiGet { keys, .. }, 10) if keys.len() == 1));
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
