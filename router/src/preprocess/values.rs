//! JSON values as the preprocessor's built-ins read them: type names for errors, numbers and
//! booleans as mcrouter converts them, equality and order.

use std::cmp::Ordering;

use serde_json::{Number, Value};

pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a double",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

pub(super) fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::Bool(b) => Some(i64::from(*b)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn as_double(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => n.as_f64().map(|f| f != 0.0),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "y" | "on" => Some(true),
            "false" | "0" | "no" | "n" | "off" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

pub(super) fn int(i: i64) -> Value {
    Value::Number(Number::from(i))
}

pub(super) fn is_int(v: &Value) -> bool {
    matches!(v, Value::Number(n) if !n.is_f64())
}

/// Equality as mcrouter's JSON values compare: an integer equals the double of the same value.
pub(super) fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
        }
        _ => a == b,
    }
}

/// Order of values of one kind (numbers, strings, booleans, lists); objects do not compare.
pub(super) fn compare(a: &Value, b: &Value) -> Result<Ordering, String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => Ok(x.as_f64().partial_cmp(&y.as_f64()).unwrap_or(Ordering::Equal)),
        (Value::String(x), Value::String(y)) => Ok(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Ok(x.cmp(y)),
        (Value::Null, Value::Null) => Ok(Ordering::Equal),
        (Value::Array(x), Value::Array(y)) => {
            for (a, b) in x.iter().zip(y) {
                match compare(a, b)? {
                    Ordering::Equal => {}
                    other => return Ok(other),
                }
            }
            Ok(x.len().cmp(&y.len()))
        }
        (Value::Object(_), _) | (_, Value::Object(_)) => {
            Err(format!("cannot compare {} with {}", type_name(a), type_name(b)))
        }
        // values of different kinds order by kind, as mcrouter's: null, list, boolean, number, string
        _ => Ok(kind_rank(a).cmp(&kind_rank(b))),
    }
}

pub(super) fn kind_rank(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Array(_) => 1,
        Value::Bool(_) => 2,
        Value::Number(_) => 3,
        Value::Object(_) => 4,
        Value::String(_) => 5,
    }
}
