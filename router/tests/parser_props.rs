//! Property tests: the parsers never panic, whatever bytes arrive, and consume sensibly.

use bytes::Bytes;
use proptest::prelude::*;
use squeal_router::protocol::parse::parse;
use squeal_router::protocol::reply::parse_reply;
use squeal_router::protocol::{ParseOutcome, ReplyKind};

fn command_like() -> impl Strategy<Value = Vec<u8>> {
    let words = prop::sample::select(vec![
        "get",
        "gets",
        "set",
        "add",
        "cas",
        "delete",
        "incr",
        "touch",
        "mg",
        "ms",
        "md",
        "ma",
        "mn",
        "me",
        "noreply",
        "q",
        "b",
        "k",
        "v",
        "T30",
        "N30",
        "C",
        "O1",
        "MS",
        "ME",
        "0",
        "1",
        "5",
        "-1",
        "99999999999999999999",
        "\r\n",
        "\n",
        " ",
        "key",
        "Zm9v",
        "\r",
    ]);
    prop::collection::vec(
        prop_oneof![words.prop_map(|w| w.as_bytes().to_vec()), any::<Vec<u8>>()],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn request_parser_never_panics(data in prop_oneof![any::<Vec<u8>>(), command_like()]) {
        let mut buf = Bytes::from(data);
        // parse a whole pipeline the way a connection does
        for _ in 0..64 {
            match parse(&buf) {
                ParseOutcome::Incomplete => break,
                ParseOutcome::Done(_, used) => {
                    prop_assert!(used > 0 && used <= buf.len());
                    buf = buf.slice(used..);
                }
                ParseOutcome::Error { consume, .. } => {
                    prop_assert!(consume > 0);
                    if consume >= buf.len() { break; }
                    buf = buf.slice(consume..);
                }
            }
        }
    }

    #[test]
    fn reply_parser_never_panics(data in any::<Vec<u8>>(), kind in 0u8..3) {
        let kind = [ReplyKind::Values, ReplyKind::Line, ReplyKind::Meta][kind as usize];
        if let Ok(Some((_, consumed, keep))) = parse_reply(&data, kind) {
            prop_assert!(keep <= consumed && consumed <= data.len());
        }
    }
}
