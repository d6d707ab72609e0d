//! A rule's filters on one changed row, exactly as `squeal.keys.rules.RowFilter` decides in Python:
//! * `watched` (`when_changed` plus the templated columns): an UPDATE passes only if one of them differs
//!   between its before and after image (compared as the binlog's value bytes; NULL differs from a value);
//! * `where` (`router_config.predicate`, handed over as postfix `steps`): at least one image must match,
//!   under SQL's three-valued logic (a comparison with NULL is unknown).
//!
//! A column the table map lacks (dropped after start-up) lets the row pass: a filter never costs an
//! invalidation because the schema moved.

use std::cmp::Ordering;

/// One row image's values the plan keeps: `text` for templated and `where` columns (key text, None for
/// NULL), `raw` for watched columns (the value's binlog bytes, None for NULL).
#[derive(Debug, Default, Clone)]
pub struct Image {
    pub text: Vec<Option<Vec<u8>>>,
    pub raw: Vec<Option<Vec<u8>>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "=" => Op::Eq,
            "!=" => Op::Ne,
            "<" => Op::Lt,
            "<=" => Op::Le,
            ">" => Op::Gt,
            ">=" => Op::Ge,
            _ => return None,
        })
    }

    fn holds(self, o: Ordering) -> bool {
        match self {
            Op::Eq => o == Ordering::Equal,
            Op::Ne => o != Ordering::Equal,
            Op::Lt => o == Ordering::Less,
            Op::Le => o != Ordering::Greater,
            Op::Gt => o == Ordering::Greater,
            Op::Ge => o != Ordering::Less,
        }
    }
}

/// A column: its slot in `Image::text`, or Err(name) when the table map lacks it.
pub type Slot = Result<usize, String>;

#[derive(Debug, Clone)]
pub enum Step {
    Compare {
        column: Slot,
        op: Op,
        literal: Vec<u8>,
        number: bool,
    },
    IsNull(Slot),
    Not,
    And,
    Or,
}

impl Step {
    /// One postfix step as Python gives it (`Predicate.steps`), its column resolved by `slot`.
    pub fn parse(
        op: &str,
        column: &str,
        literal: &str,
        slot: impl Fn(&str) -> Slot,
    ) -> Result<Step, String> {
        Ok(match op {
            "not" => Step::Not,
            "and" => Step::And,
            "or" => Step::Or,
            "null" => Step::IsNull(slot(column)),
            _ => {
                let (number, cmp) = match op.split_at_checked(1) {
                    Some(("n", rest)) => (true, rest),
                    Some(("s", rest)) => (false, rest),
                    _ => return Err(format!("unknown filter step {op:?}")),
                };
                let op = Op::parse(cmp).ok_or_else(|| format!("unknown comparison {cmp:?}"))?;
                if number && parse_number(literal.as_bytes()).is_none() {
                    return Err(format!("{literal:?} is not a number"));
                }
                Step::Compare {
                    column: slot(column),
                    op,
                    literal: literal.as_bytes().to_vec(),
                    number,
                }
            }
        })
    }
}

#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Slots in `Image::raw`; empty: no `when_changed`.
    pub watched: Vec<Slot>,
    /// Empty: no `where`.
    pub steps: Vec<Step>,
}

/// Why a row sends nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Skip {
    WhenChanged,
    Where,
}

impl Skip {
    pub fn label(self) -> &'static str {
        match self {
            Skip::WhenChanged => "when_changed",
            Skip::Where => "where",
        }
    }
}

/// What deciding one row found.
#[derive(Debug, PartialEq)]
pub enum Decision<'a> {
    Send,
    Skip(Skip),
    /// The row passes because the filter names a column the table map lacks.
    Missing(&'a str),
}

impl Filter {
    /// `images`: the row's images (1, or 2 for an UPDATE: before, after).
    pub fn decide<'a>(&'a self, update: bool, images: &[Image]) -> Decision<'a> {
        if !self.watched.is_empty() && update && images.len() == 2 {
            let mut changed = false;
            for slot in &self.watched {
                match slot {
                    Err(name) => return Decision::Missing(name),
                    Ok(i) => {
                        if images[0].raw[*i] != images[1].raw[*i] {
                            changed = true;
                            break;
                        }
                    }
                }
            }
            if !changed {
                return Decision::Skip(Skip::WhenChanged);
            }
        }
        if self.steps.is_empty() {
            return Decision::Send;
        }
        for image in images {
            match eval(&self.steps, image) {
                Ok(Some(true)) => return Decision::Send,
                Ok(_) => {}
                Err(name) => return Decision::Missing(name),
            }
        }
        Decision::Skip(Skip::Where)
    }
}

/// The predicate's value on one image: Some(bool), None for unknown; Err(column) for a missing column.
fn eval<'a>(steps: &'a [Step], image: &Image) -> Result<Option<bool>, &'a str> {
    let mut stack: Vec<Option<bool>> = Vec::with_capacity(8);
    for step in steps {
        let value = match step {
            Step::Compare {
                column,
                op,
                literal,
                number,
            } => {
                let slot = column.as_ref().map_err(String::as_str)?;
                match &image.text[*slot] {
                    None => None,
                    Some(v) if *number => compare_numbers(v, literal).map(|o| op.holds(o)),
                    Some(v) => Some(op.holds(v.as_slice().cmp(literal.as_slice()))),
                }
            }
            Step::IsNull(column) => {
                let slot = column.as_ref().map_err(String::as_str)?;
                Some(image.text[*slot].is_none())
            }
            Step::Not => stack.pop().flatten().map(|b| !b),
            Step::And | Step::Or => {
                let b = stack.pop().flatten();
                let a = stack.pop().flatten();
                // Kleene: True decides an OR, False an AND; otherwise unknown wins over the other value
                let decisive = matches!(step, Step::Or);
                if a == Some(decisive) || b == Some(decisive) {
                    Some(decisive)
                } else if a.is_none() || b.is_none() {
                    None
                } else {
                    Some(!decisive)
                }
            }
        };
        stack.push(value);
    }
    Ok(stack.pop().flatten())
}

enum Number {
    Int(i128),
    Float(f64),
}

/// Python's `_numbers`: an integer of at most 38 digits is an i128, anything else an f64.
fn parse_number(text: &[u8]) -> Option<Number> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    if !digits.is_empty() && digits.len() <= 38 && digits.iter().all(u8::is_ascii_digit) {
        return std::str::from_utf8(text)
            .ok()?
            .parse()
            .ok()
            .map(Number::Int);
    }
    std::str::from_utf8(text)
        .ok()?
        .parse()
        .ok()
        .map(Number::Float)
}

/// Ints compare as ints when both are, else both as floats; None (unknown) if a value is no number or NaN.
fn compare_numbers(a: &[u8], b: &[u8]) -> Option<Ordering> {
    match (parse_number(a)?, parse_number(b)?) {
        (Number::Int(x), Number::Int(y)) => Some(x.cmp(&y)),
        (x, y) => {
            let f = |n: Number| match n {
                Number::Int(i) => i as f64,
                Number::Float(f) => f,
            };
            f(x).partial_cmp(&f(y))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(spec: &[(&str, &str, &str)]) -> Vec<Step> {
        spec.iter()
            .map(|(op, c, l)| {
                Step::parse(op, c, l, |c| match c {
                    "status" => Ok(0),
                    "n" => Ok(1),
                    other => Err(other.to_string()),
                })
                .unwrap()
            })
            .collect()
    }

    fn image(status: Option<&str>, n: Option<&str>) -> Image {
        Image {
            text: vec![
                status.map(|s| s.as_bytes().to_vec()),
                n.map(|s| s.as_bytes().to_vec()),
            ],
            raw: vec![
                status.map(|s| s.as_bytes().to_vec()),
                n.map(|s| s.as_bytes().to_vec()),
            ],
        }
    }

    #[test]
    fn three_valued_logic_like_sql() {
        // status != 'draft' OR n > 10
        let s = steps(&[
            ("s!=", "status", "draft"),
            ("n>", "n", "10"),
            ("or", "", ""),
        ]);
        assert_eq!(eval(&s, &image(Some("live"), None)), Ok(Some(true)));
        assert_eq!(eval(&s, &image(Some("draft"), None)), Ok(None));
        assert_eq!(eval(&s, &image(Some("draft"), Some("9"))), Ok(Some(false)));
        assert_eq!(eval(&s, &image(None, Some("11"))), Ok(Some(true)));
        // NOT (status = 'draft'): NULL stays unknown
        let s = steps(&[("s=", "status", "draft"), ("not", "", "")]);
        assert_eq!(eval(&s, &image(None, None)), Ok(None));
        assert_eq!(eval(&s, &image(Some("x"), None)), Ok(Some(true)));
        // AND with a false side is false even when the other is unknown
        let s = steps(&[("s=", "status", "x"), ("n=", "n", "1"), ("and", "", "")]);
        assert_eq!(eval(&s, &image(None, Some("2"))), Ok(Some(false)));
        assert_eq!(eval(&s, &image(None, Some("1"))), Ok(None));
    }

    #[test]
    fn numbers_compare_as_numbers_and_strings_as_bytes() {
        let s = steps(&[("n<", "n", "10")]);
        assert_eq!(eval(&s, &image(None, Some("9"))), Ok(Some(true))); // "9" > "10" as bytes
        assert_eq!(eval(&s, &image(None, Some("9.99"))), Ok(Some(true)));
        assert_eq!(eval(&s, &image(None, Some("1E+1"))), Ok(Some(false)));
        let s = steps(&[("s<", "status", "b")]);
        assert_eq!(eval(&s, &image(Some("B"), None)), Ok(Some(true))); // case sensitive
        let big = "170141183460469231731687303715884105727"; // 39 digits: compared as floats
        let s = steps(&[("n=", "n", big)]);
        assert_eq!(eval(&s, &image(None, Some(big))), Ok(Some(true)));
    }

    #[test]
    fn when_changed_and_where_decide_rows() {
        let f = Filter {
            watched: vec![Ok(1)],
            steps: steps(&[("s!=", "status", "draft")]),
        };
        let (a, b) = (
            image(Some("live"), Some("1")),
            image(Some("live"), Some("2")),
        );
        assert_eq!(f.decide(true, &[a.clone(), b.clone()]), Decision::Send);
        assert_eq!(
            f.decide(true, &[a.clone(), a.clone()]),
            Decision::Skip(Skip::WhenChanged)
        );
        // an insert has nothing to compare: only `where` decides
        assert_eq!(f.decide(false, std::slice::from_ref(&a)), Decision::Send);
        let d = image(Some("draft"), Some("1"));
        assert_eq!(
            f.decide(false, std::slice::from_ref(&d)),
            Decision::Skip(Skip::Where)
        );
        // leaving the filtered set still sends: one image matches
        assert_eq!(
            f.decide(true, &[a, image(Some("draft"), Some("3"))]),
            Decision::Send
        );
        let missing = Filter {
            watched: vec![Err("gone".into())],
            steps: vec![],
        };
        assert_eq!(
            missing.decide(true, &[d.clone(), d]),
            Decision::Missing("gone")
        );
    }
}
