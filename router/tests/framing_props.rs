//! Property tests for framing (issue 26): where a command ends is decided as memcached 1.6.18
//! decides it, so a value is never read as a command, and it does not depend on how the bytes
//! were cut into reads.

use bytes::Bytes;
use proptest::prelude::*;
use squeal_router::protocol::parse::parse_with;
use squeal_router::protocol::{Cmd, Command, ParseOutcome};

const MAX_VALUE: usize = 64;

/// What one parse step decided: a command or an error, and how many bytes it took.
#[derive(Debug, PartialEq)]
enum Step {
    Done(String, usize),
    Error(&'static str, usize, bool),
}

fn step(buf: &Bytes) -> Option<Step> {
    match parse_with(buf, MAX_VALUE) {
        ParseOutcome::Incomplete => None,
        ParseOutcome::Done(cmd, used) => Some(Step::Done(format!("{cmd:?}"), used)),
        ParseOutcome::Error { reply, consume, close } => Some(Step::Error(reply, consume, close)),
    }
}

/// Parse a whole stream, fed `piece` bytes at a time, as a connection does: a step that needs
/// more bytes waits for them, a step that consumes more than is buffered swallows the rest as it
/// arrives. Returns the steps, ending where the stream ran out or the connection would close.
fn frames(stream: &[u8], piece: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    let (mut buffered, mut fed, mut swallow) = (Vec::new(), 0, 0usize);
    loop {
        if fed < stream.len() {
            let end = (fed + piece).min(stream.len());
            let incoming = &stream[fed..end];
            fed = end;
            let skip = swallow.min(incoming.len());
            swallow -= skip;
            buffered.extend_from_slice(&incoming[skip..]);
        }
        loop {
            let buf = Bytes::from(buffered.clone());
            let Some(s) = step(&buf) else { break };
            let (used, close) = match &s {
                Step::Done(_, used) => (*used, false),
                Step::Error(_, consume, close) => (*consume, *close),
            };
            steps.push(s);
            if close {
                return steps;
            }
            if used >= buffered.len() {
                swallow = used - buffered.len();
                buffered.clear();
            } else {
                buffered.drain(..used);
            }
        }
        if fed == stream.len() {
            return steps;
        }
    }
}

fn junk_token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x".to_string()),
        Just("0".to_string()),
        Just("NOREPLY".to_string()),
        "[a-z0-9]{1,6}".prop_filter("not noreply", |t| t != "noreply"),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    // any bytes, command lines included: they must stay data
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..MAX_VALUE),
        Just(b"delete victim".to_vec()),
        Just(b"set k 0 0 1\r\nv".to_vec()),
    ]
}

fn storage_name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["set", "add", "replace", "append", "prepend", "cas"])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// A storage line with one extra token that is not `noreply` is a storage command, as on
    /// memcached: it takes exactly its line and its value, and the value is the bytes sent.
    #[test]
    fn an_extra_token_never_turns_a_value_into_commands(
        name in storage_name(), junk in junk_token(), value in value(), next in "(get k|mn|delete v)",
    ) {
        let cas = if name == "cas" { " 7" } else { "" };
        let line = format!("{name} k 0 0 {}{cas} {junk}\r\n", value.len());
        let stream = [line.as_bytes(), &value, b"\r\n", next.as_bytes(), b"\r\n"].concat();
        match parse_with(&Bytes::from(stream), MAX_VALUE) {
            ParseOutcome::Done(Command::Keyed(r), used) => {
                prop_assert_eq!(used, line.len() + value.len() + 2);
                prop_assert_eq!(&r.value[..], &value[..]);
                prop_assert!(!r.quiet);
                prop_assert_eq!(r.cmd == Cmd::Cas, name == "cas");
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    /// A refused storage line takes what memcached takes: an `ms` refused for its flags, and a
    /// value over the size limit, take line and value; a line refused before its length is read
    /// (a bad number, a key over 250 bytes) takes the line alone.
    #[test]
    fn a_refused_storage_line_consumes_exactly_what_memcached_consumes(
        value in prop::collection::vec(any::<u8>(), 0..MAX_VALUE),
        bad_flag in prop::sample::select(vec!["9", "!", "Tx", "Mxx", "MZ", "q q", "Cx", "T1 T2"]),
        bad_number in prop::sample::select(vec!["x", "-1", "-5", "1x", "18446744073709551616"]),
        which in 0usize..3,
    ) {
        let len = value.len();
        let (line, swallows) = match which {
            0 => (format!("ms k {len} {bad_flag}\r\n"), true),
            1 => (format!("set k {bad_number} 0 {len}\r\n"), false),
            _ => (format!("set {} 0 0 {len}\r\n", "k".repeat(251)), false),
        };
        let stream = [line.as_bytes(), &value, b"\r\n"].concat();
        match parse_with(&Bytes::from(stream), MAX_VALUE) {
            ParseOutcome::Error { consume, close: false, .. } => {
                let want = if swallows { line.len() + len + 2 } else { line.len() };
                prop_assert_eq!(consume, want);
            }
            other => prop_assert!(false, "{:?}", other),
        }
        let big = format!("add k 0 0 {}\r\n", MAX_VALUE + 1 + len);
        match parse_with(&Bytes::from(big.clone()), MAX_VALUE) {
            ParseOutcome::Error { consume, .. } => prop_assert_eq!(consume, big.len() + MAX_VALUE + 1 + len + 2),
            other => prop_assert!(false, "{:?}", other),
        }
    }

    /// Where commands end does not depend on how the stream was cut into reads (for streams under
    /// memcached's 2 KiB partial-line bound, past which memcached itself decides by the cut).
    #[test]
    fn framing_does_not_depend_on_the_reads(
        parts in prop::collection::vec(prop_oneof![
            (storage_name(), value(), prop::option::of(junk_token())).prop_map(|(n, v, j)| {
                let cas = if n == "cas" { " 1" } else { "" };
                let j = j.map(|j| format!(" {j}")).unwrap_or_default();
                [format!("{n} k 0 0 {}{cas}{j}\r\n", v.len()).into_bytes(), v, b"\r\n".to_vec()].concat()
            }),
            value().prop_map(|v| [b"ms k ".to_vec(), v.len().to_string().into_bytes(), b" T1 !\r\n".to_vec(), v, b"\r\n".to_vec()].concat()),
            prop::sample::select(vec![
                "get k\r\n", "incr k 1 x\r\n", "mg k v q\r\n", "md k q q\r\n", "flush_all 0 x\r\n",
                "set k 0 0 99\r\n", "set k 0 0 -1\r\n", "ms k 70 T1\r\n", "\r\n",
            ]).prop_map(|s| s.as_bytes().to_vec()),
            prop::collection::vec(any::<u8>(), 0..20),
        ], 1..8),
        piece in 1usize..40,
    ) {
        let stream = parts.concat();
        prop_assume!(stream.len() < 2048);
        prop_assert_eq!(frames(&stream, piece), frames(&stream, stream.len()));
    }
}
