//! mcrouter's JSON dialect: JSON plus `//` and `/* */` comments and trailing commas.
//!
//! Shared by the preprocessor (every file it reads or imports) and nothing else needs to know the
//! dialect; a parse error names its line and column in the file as written.

use serde_json::Value;

/// Parse mcrouter's JSON dialect: JSON plus `//` and `/* */` comments and trailing commas.
///
/// `json-strip-comments` blanks comments and trailing commas with spaces in place (string
/// literals and their escapes are left alone), so every byte keeps its line and column and
/// serde_json's error positions point into the file as written. (It also takes `#` line
/// comments, which mcrouter does not; a `#` outside a string is invalid JSON anyway.)
pub fn parse_jsonc(text: &str) -> Result<Value, String> {
    let mut buf = text.to_string();
    if json_strip_comments::strip(&mut buf).is_err() {
        // the stripper fails on a `/` outside a string that starts no comment: find where
        let at = first_bad_slash(text);
        let (line, col) = line_col(text, at);
        return Err(format!(
            "invalid JSON at line {line} column {col}: `/` outside a string starts no comment (use // or /* */)"
        ));
    }
    serde_json::from_str(&buf).map_err(|e| {
        let what = e.to_string();
        let what = what.split(" at line ").next().unwrap_or(&what).to_string();
        format!("invalid JSON at line {} column {}: {what}", e.line(), e.column())
    })
}

/// The byte offset where the stripper first fails: the shortest failing prefix (its state
/// machine fails at the offending byte, so failure is monotone in the prefix length).
fn first_bad_slash(text: &str) -> usize {
    let bytes = text.as_bytes();
    let fails = |n: usize| json_strip_comments::strip_slice(&mut bytes[..n].to_vec()).is_err();
    let (mut lo, mut hi) = (0, bytes.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fails(mid + 1) { hi = mid } else { lo = mid + 1 }
    }
    lo.saturating_sub(1)
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..text.floor_char_boundary(at)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_trailing_commas_as_mcrouter_users_write_them() {
        let text = r#"{
          // pools
          "pools": {"a": {"servers": ["127.0.0.1:1",],},}, /* block
             over lines, with "quotes" and // inside */
          "route": "PoolRoute|a", // trailing
        }"#;
        let v = parse_jsonc(text).unwrap();
        assert_eq!(v["route"], "PoolRoute|a");
        assert_eq!(v["pools"]["a"]["servers"][0], "127.0.0.1:1");
        // comment markers and commas inside strings are data
        let v = parse_jsonc(r#"{"k": "a // b /* c */ ,]", "e": "q\"//x",}"#).unwrap();
        assert_eq!(v["k"], "a // b /* c */ ,]");
        assert_eq!(v["e"], "q\"//x");
    }

    #[test]
    fn parse_errors_name_line_and_column() {
        let err = parse_jsonc("{\n  // fine\n  \"route\": @\n}").unwrap_err();
        assert!(
            err.starts_with("invalid JSON at line 3 column 12: expected value"),
            "{err}"
        );
        // a comment before the error does not shift the position
        let err = parse_jsonc("{ /* x */ \"a\": 1,\n \"b\" 2}").unwrap_err();
        assert!(err.contains("line 2 column 6"), "{err}");
        let err = parse_jsonc("{\n  \"a\": 1 / 2\n}").unwrap_err();
        assert!(err.starts_with("invalid JSON at line 2 column 10: `/`"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn the_dialect_parser_never_panics(s in "[{}\\[\\]\",:/*\\\\ a1\n]{0,64}") {
            let _ = parse_jsonc(&s);
        }

        #[test]
        fn the_dialect_parser_never_panics_on_any_text(s in "\\PC{0,64}") {
            let _ = parse_jsonc(&s);
        }
    }
}
