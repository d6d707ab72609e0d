//! The preprocessor's built-in macros, as mcrouter documents them (docs/router.md lists them).

use serde_json::{Map, Value};

use super::engine::{Args, Builtin, Builtins, Preprocessor, Result, Scope, Var};
use super::values::{as_bool, as_double, as_int, compare, equal, int, is_int, type_name};

/// Every built-in, given to the preprocessor by `expand_config`.
pub(super) static BUILTINS: Builtins = Builtins {
    table: TABLE,
    objects: &[("transform", transform), ("process", process), ("foreach", foreach)],
};

/// (name, parameters — `?` marks an optional one, whether arguments are expanded before the call, body)
pub(super) const TABLE: &[(&str, &[&str], Builtin, bool)] = &[
    ("import", &["path", "default?"], import, false),
    (
        "int",
        &["value"],
        |p, a| cast(p, a, "an integer", |v| as_int(v).map(int)),
        true,
    ),
    (
        "double",
        &["value"],
        |p, a| {
            cast(p, a, "a double", |v| {
                as_double(v).and_then(serde_json::Number::from_f64).map(Value::Number)
            })
        },
        true,
    ),
    ("str", &["value"], |p, a| cast(p, a, "a string", to_str), true),
    (
        "bool",
        &["value"],
        |p, a| cast(p, a, "a boolean", |v| as_bool(v).map(Value::Bool)),
        true,
    ),
    (
        "keys",
        &["dictionary"],
        |p, a| Ok(Value::Array(object(p, a)?.keys().cloned().map(Value::String).collect())),
        true,
    ),
    (
        "values",
        &["dictionary"],
        |p, a| Ok(Value::Array(object(p, a)?.values().cloned().collect())),
        true,
    ),
    ("merge", &["params"], merge, true),
    ("select", &["dictionary", "key", "default?"], select, false),
    ("shuffle", &["dictionary", "seed?"], shuffle, false),
    ("slice", &["dictionary", "from", "to"], slice, true),
    ("split", &["dictionary", "delim"], split, true),
    ("range", &["from", "to"], range, true),
    ("contains", &["dictionary", "key"], contains, true),
    ("empty", &["dictionary"], |p, a| Ok(Value::Bool(size(p, a)? == 0)), true),
    ("size", &["dictionary"], |p, a| Ok(int(size(p, a)? as i64)), true),
    (
        "equals",
        &["A", "B"],
        |p, a| Ok(Value::Bool(equal(&a.get(p, "A")?, &a.get(p, "B")?))),
        true,
    ),
    (
        "isArray",
        &["value"],
        |p, a| Ok(Value::Bool(a.get(p, "value")?.is_array())),
        true,
    ),
    (
        "isBool",
        &["value"],
        |p, a| Ok(Value::Bool(a.get(p, "value")?.is_boolean())),
        true,
    ),
    (
        "isInt",
        &["value"],
        |p, a| Ok(Value::Bool(is_int(&a.get(p, "value")?))),
        true,
    ),
    (
        "isDouble",
        &["value"],
        |p, a| Ok(Value::Bool(a.get(p, "value")?.is_f64())),
        true,
    ),
    (
        "isObject",
        &["value"],
        |p, a| Ok(Value::Bool(a.get(p, "value")?.is_object())),
        true,
    ),
    (
        "isString",
        &["value"],
        |p, a| Ok(Value::Bool(a.get(p, "value")?.is_string())),
        true,
    ),
    (
        "less",
        &["A", "B"],
        |p, a| Ok(Value::Bool(compare(&a.get(p, "A")?, &a.get(p, "B")?)?.is_lt())),
        true,
    ),
    ("add", &["A", "B"], |p, a| arith(p, a, "add", i64::checked_add), true),
    ("sub", &["A", "B"], |p, a| arith(p, a, "sub", i64::checked_sub), true),
    ("mul", &["A", "B"], |p, a| arith(p, a, "mul", i64::checked_mul), true),
    ("div", &["A", "B"], |p, a| arith(p, a, "div", i64::checked_div), true),
    ("mod", &["A", "B"], |p, a| arith(p, a, "mod", i64::checked_rem), true),
    (
        "bitwiseAnd",
        &["A", "B"],
        |p, a| arith(p, a, "bitwiseAnd", |x, y| Some(x & y)),
        true,
    ),
    (
        "bitwiseOr",
        &["A", "B"],
        |p, a| arith(p, a, "bitwiseOr", |x, y| Some(x | y)),
        true,
    ),
    (
        "bitwiseXor",
        &["A", "B"],
        |p, a| arith(p, a, "bitwiseXor", |x, y| Some(x ^ y)),
        true,
    ),
    (
        "bitwiseLeftShift",
        &["A", "B"],
        |p, a| {
            arith(p, a, "bitwiseLeftShift", |x, y| {
                u32::try_from(y)
                    .ok()
                    .and_then(|y| (x as u64).checked_shl(y))
                    .map(|v| v as i64)
            })
        },
        true,
    ),
    (
        "bitwiseRightShift",
        &["A", "B"],
        |p, a| {
            arith(p, a, "bitwiseRightShift", |x, y| {
                u32::try_from(y)
                    .ok()
                    .and_then(|y| (x as u64).checked_shr(y))
                    .map(|v| v as i64)
            })
        },
        true,
    ),
    (
        "bitwiseNot",
        &["A"],
        |p, a| Ok(int(!integer(&a.get(p, "A")?, "A")?)),
        true,
    ),
    (
        "and",
        &["A", "B"],
        |p, a| Ok(Value::Bool(boolean(p, a, "A")? && boolean(p, a, "B")?)),
        false,
    ),
    (
        "or",
        &["A", "B"],
        |p, a| Ok(Value::Bool(boolean(p, a, "A")? || boolean(p, a, "B")?)),
        false,
    ),
    ("not", &["A"], |p, a| Ok(Value::Bool(!boolean(p, a, "A")?)), true),
    (
        "fail",
        &["msg"],
        |p, a| {
            Err(match a.get(p, "msg")? {
                Value::String(s) => s,
                other => other.to_string(),
            })
        },
        true,
    ),
    ("sort", &["dictionary"], sort, true),
    ("set", &["dictionary", "key", "value"], set, true),
    ("if", &["condition", "is_true", "is_false"], if_, false),
    ("define", &["result"], |p, a| a.get(p, "result"), true),
    ("defined", &["name"], defined, true),
    ("isLocalIp", &["ip"], is_local_ip, true),
    ("hash", &["value"], |_, _| Err(unsupported("hash")), true),
    (
        "weightedHash",
        &["dictionary", "key"],
        |_, _| Err(unsupported("weightedHash")),
        true,
    ),
];

fn unsupported(name: &str) -> String {
    format!("@{name} is not supported by squeal-router (it needs mcrouter's exact hash functions; docs/router.md)")
}

fn cast(p: &Preprocessor<'_>, a: &Args<'_, '_>, to: &str, f: impl Fn(&Value) -> Option<Value>) -> Result<Value> {
    let v = a.get(p, "value")?;
    f(&v).ok_or_else(|| format!("cannot make {} ({}) {to}", type_name(&v), short(&v)))
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 40 {
        format!("{}...", &s[..s.floor_char_boundary(40)])
    } else {
        s
    }
}

fn to_str(v: &Value) -> Option<Value> {
    Some(Value::String(match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) => f.to_string(),
            _ => n.to_string(),
        },
        Value::Bool(b) => if *b { "1" } else { "0" }.to_string(),
        _ => return None,
    }))
}

fn integer(v: &Value, name: &str) -> Result<i64> {
    match v {
        Value::Number(n) if !n.is_f64() => n.as_i64().ok_or_else(|| format!("{name} is out of range")),
        other => Err(format!("{name} is {}, not an integer", type_name(other))),
    }
}

fn arith(p: &Preprocessor<'_>, a: &Args<'_, '_>, what: &str, f: fn(i64, i64) -> Option<i64>) -> Result<Value> {
    let (x, y) = (integer(&a.get(p, "A")?, "A")?, integer(&a.get(p, "B")?, "B")?);
    f(x, y)
        .map(int)
        .ok_or_else(|| format!("{what}({x}, {y}) overflows or divides by zero"))
}

/// A raw boolean argument, expanded only now (so `and`/`or` short-circuit).
fn boolean(p: &Preprocessor<'_>, a: &Args<'_, '_>, name: &str) -> Result<bool> {
    match a.expand_required(p, name)? {
        Value::Bool(b) => Ok(b),
        other => Err(format!("{name} is {}, not a boolean", type_name(&other))),
    }
}

fn object(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Map<String, Value>> {
    match a.get(p, "dictionary")? {
        Value::Object(o) => Ok(o),
        other => Err(format!("dictionary is {}, not an object", type_name(&other))),
    }
}

fn size(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<usize> {
    match a.get(p, "dictionary")? {
        Value::Object(o) => Ok(o.len()),
        Value::Array(l) => Ok(l.len()),
        Value::String(s) => Ok(s.len()),
        other => Err(format!(
            "dictionary is {}, not an object, list or string",
            type_name(&other)
        )),
    }
}

fn import(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let path = match a.expand_required(p, "path")? {
        Value::String(s) => s,
        other => return Err(format!("path is {}, not a string", type_name(&other))),
    };
    if let Some(v) = p.imported.borrow().get(&path) {
        return Ok(v.clone());
    }
    let loaded = (p.import)(&path)
        .and_then(|text| crate::jsonc::parse_jsonc(&text))
        .and_then(|v| p.expand(v, &Scope::base(None)));
    // the default is expanded only when the import failed (it may be a `@fail(...)`)
    let v = match loaded {
        Ok(v) => v,
        Err(e) => a.expand(p, "default")?.ok_or_else(|| format!("'{path}': {e}"))?,
    };
    p.imported.borrow_mut().insert(path, v.clone());
    Ok(v)
}

fn merge(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let Value::Array(params) = a.get(p, "params")? else {
        return Err("params must be a list".into());
    };
    let mut params = params.into_iter().enumerate();
    let (_, mut out) = params.next().ok_or("params is empty")?;
    for (i, next) in params {
        match (&mut out, next) {
            (Value::Array(acc), Value::Array(more)) => acc.extend(more),
            (Value::Object(acc), Value::Object(more)) => acc.extend(more),
            (Value::String(acc), Value::String(more)) => acc.push_str(&more),
            (Value::Array(_) | Value::Object(_) | Value::String(_), other) => {
                return Err(format!("params[{i}] is {}, unlike params[0]", type_name(&other)));
            }
            (first, _) => {
                return Err(format!(
                    "params[0] is {}, not a list, object or string",
                    type_name(first)
                ));
            }
        }
    }
    Ok(out)
}

fn select(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let dict = a.expand_required(p, "dictionary")?;
    let key = a.expand_required(p, "key")?;
    let found = match (&dict, &key) {
        (Value::Object(o), Value::String(k)) => o.get(k).cloned(),
        (Value::Array(l), Value::Number(_)) => {
            let i = integer(&key, "key")?;
            let i = if i < 0 { i + l.len() as i64 } else { i };
            usize::try_from(i).ok().and_then(|i| l.get(i)).cloned()
        }
        (Value::Object(_), _) => return Err(format!("dictionary is an object but key is {}", type_name(&key))),
        (Value::Array(_), _) => return Err(format!("dictionary is a list but key is {}", type_name(&key))),
        _ => return Err(format!("dictionary is {}, not an object or a list", type_name(&dict))),
    };
    match found {
        Some(v) => Ok(v),
        None => a
            .expand(p, "default")?
            .ok_or_else(|| format!("{} not found and no default", short(&key))),
    }
}

/// A permutation of the list. With a seed it is always the same one (but not mcrouter's: its
/// order comes from its C++ library's generator).
fn shuffle(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let Value::Array(mut list) = a.expand_required(p, "dictionary")? else {
        return Err("dictionary must be a list".into());
    };
    let mut state: u64 = match a.expand(p, "seed")? {
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or_default(),
        Some(_) => return Err("seed must be a non-negative integer".into()),
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    };
    for i in (1..list.len()).rev() {
        // splitmix64: a small, well-mixed generator; the order only needs to be arbitrary
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        list.swap(i, (z % (i as u64 + 1)) as usize);
    }
    Ok(Value::Array(list))
}

/// Inclusive `from..=to` of a list or string (by index) or of an object (keys between).
fn slice(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let (from, to) = (a.get(p, "from")?, a.get(p, "to")?);
    let bounds = |len: usize| -> Result<std::ops::Range<usize>> {
        let (f, t) = (integer(&from, "from")?, integer(&to, "to")?);
        let start = f.max(0) as usize;
        let end = (t.saturating_add(1)).clamp(0, len as i64) as usize;
        Ok(start.min(end)..end)
    };
    match a.get(p, "dictionary")? {
        Value::Array(l) => Ok(Value::Array(l[bounds(l.len())?].to_vec())),
        Value::String(s) => {
            let r = bounds(s.len())?;
            Ok(Value::String(String::from_utf8_lossy(&s.as_bytes()[r]).into_owned()))
        }
        Value::Object(o) => {
            let (Value::String(f), Value::String(t)) = (&from, &to) else {
                return Err("slicing an object takes string bounds".into());
            };
            Ok(Value::Object(o.into_iter().filter(|(k, _)| f <= k && k <= t).collect()))
        }
        other => Err(format!(
            "dictionary is {}, not a list, object or string",
            type_name(&other)
        )),
    }
}

fn split(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    match (a.get(p, "dictionary")?, a.get(p, "delim")?) {
        // an empty delimiter leaves the string whole
        (Value::String(s), Value::String(d)) if d.is_empty() => Ok(Value::Array(vec![Value::String(s)])),
        (Value::String(s), Value::String(d)) => Ok(Value::Array(
            s.split(d.as_str()).map(|x| Value::String(x.into())).collect(),
        )),
        (s, d) => Err(format!(
            "split takes two strings, not {} and {}",
            type_name(&s),
            type_name(&d)
        )),
    }
}

fn range(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let (from, to) = (integer(&a.get(p, "from")?, "from")?, integer(&a.get(p, "to")?, "to")?);
    if to.saturating_sub(from) > 1_000_000 {
        return Err(format!("range {from}..{to} is too long"));
    }
    Ok(Value::Array((from..=to).map(int).collect()))
}

fn contains(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let key = a.get(p, "key")?;
    Ok(Value::Bool(match (a.get(p, "dictionary")?, &key) {
        (Value::Object(o), Value::String(k)) => o.contains_key(k),
        (Value::Array(l), _) => l.iter().any(|v| equal(v, &key)),
        (Value::String(s), Value::String(k)) => s.contains(k.as_str()),
        (d, _) => return Err(format!("cannot look for {} in {}", type_name(&key), type_name(&d))),
    }))
}

fn sort(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let Value::Array(mut l) = a.get(p, "dictionary")? else {
        return Err("dictionary must be a list".into());
    };
    let mut error = None;
    l.sort_by(|x, y| {
        compare(x, y).unwrap_or_else(|e| {
            error.get_or_insert(e);
            std::cmp::Ordering::Equal
        })
    });
    match error {
        Some(e) => Err(e),
        None => Ok(Value::Array(l)),
    }
}

fn set(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let (key, value) = (a.get(p, "key")?, a.get(p, "value")?);
    match (a.get(p, "dictionary")?, key) {
        (Value::Object(mut o), Value::String(k)) => {
            o.insert(k, value);
            Ok(Value::Object(o))
        }
        (Value::Array(mut l), k @ Value::Number(_)) => {
            let i = integer(&k, "key")?;
            let len = l.len();
            let slot = usize::try_from(i)
                .ok()
                .and_then(|i| l.get_mut(i))
                .ok_or_else(|| format!("key {i} is out of range [0, {len})"))?;
            *slot = value;
            Ok(Value::Array(l))
        }
        (d, k) => Err(format!("cannot set {} in {}", type_name(&k), type_name(&d))),
    }
}

fn if_(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let branch = if boolean(p, a, "condition")? {
        "is_true"
    } else {
        "is_false"
    };
    a.expand_required(p, branch).map_err(|e| format!("{branch}: {e}"))
}

/// True when `name` is a variable of the caller or a constant.
fn defined(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let Value::String(name) = a.get(p, "name")? else {
        return Err("name must be a string".into());
    };
    Ok(Value::Bool(
        a.caller.contains(&name) || p.consts.borrow().contains_key(&name),
    ))
}

/// True when `ip` is an address of this host: binding a socket to it succeeds only then.
fn is_local_ip(p: &Preprocessor<'_>, a: &Args<'_, '_>) -> Result<Value> {
    let Value::String(ip) = a.get(p, "ip")? else {
        return Err("ip must be a string".into());
    };
    Ok(Value::Bool(
        match ip.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
            Ok(addr) => std::net::UdpSocket::bind((addr, 0)).is_ok(),
            Err(_) => false,
        },
    ))
}

// ---- built-ins that take the whole object

/// The name an iteration calls its key/item/value by (`keyName`, `itemName`, ...), or the default.
fn name_field(obj: &Map<String, Value>, field: &str, default: &str) -> Result<String> {
    match obj.get(field) {
        None => Ok(default.to_string()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("{field} is {}, not a string", type_name(other))),
    }
}

fn entries(v: Value) -> Result<(bool, Vec<(Value, Value)>)> {
    match v {
        Value::Object(o) => Ok((true, o.into_iter().map(|(k, v)| (Value::String(k), v)).collect())),
        Value::Array(l) => Ok((
            false,
            l.into_iter().enumerate().map(|(i, v)| (int(i as i64), v)).collect(),
        )),
        other => Err(format!("dictionary is {}, not an object or a list", type_name(&other))),
    }
}

/// `transform`: a new key (`keyTransform`, objects only; a list of keys repeats the item, an
/// empty list drops it) and a new item (`itemTransform`) for every entry.
pub(super) fn transform(p: &Preprocessor<'_>, mut obj: Map<String, Value>, scope: &Scope<'_>) -> Result<Value> {
    let dict = obj.remove("dictionary").ok_or("'dictionary' not given")?;
    let dict = p.expand(dict, scope).map_err(|e| format!("dictionary: {e}"))?;
    let (key_name, item_name) = (
        name_field(&obj, "keyName", "key")?,
        name_field(&obj, "itemName", "item")?,
    );
    let (is_object, entries) = entries(dict)?;
    let item_t = obj.get("itemTransform");
    let key_t = obj.get("keyTransform");
    if !is_object && item_t.is_none() {
        return Err("itemTransform is required for a list".into());
    }
    let each = Scope::extend(scope);
    let mut out_obj = Map::new();
    let mut out_list = Vec::new();
    for (key, item) in entries {
        each.set(&key_name, Var::Ready(key.clone()));
        each.set(&item_name, Var::Ready(item.clone()));
        let new_item = match item_t {
            Some(t) => p.expand(t.clone(), &each).map_err(|e| format!("itemTransform: {e}"))?,
            None => item,
        };
        if !is_object {
            out_list.push(new_item);
            continue;
        }
        let new_key = match key_t {
            Some(t) => p.expand(t.clone(), &each).map_err(|e| format!("keyTransform: {e}"))?,
            None => key,
        };
        match new_key {
            Value::String(k) => {
                out_obj.insert(k, new_item);
            }
            Value::Array(keys) => {
                for k in keys {
                    let Value::String(k) = k else {
                        return Err("a transformed key list holds a non-string".into());
                    };
                    out_obj.insert(k, new_item.clone());
                }
            }
            other => {
                return Err(format!(
                    "a transformed key is {}, not a string or list",
                    type_name(&other)
                ));
            }
        }
    }
    Ok(if is_object {
        Value::Object(out_obj)
    } else {
        Value::Array(out_list)
    })
}

/// `process`: a fold — `value` starts as `initialValue` and becomes `transform` of each entry.
pub(super) fn process(p: &Preprocessor<'_>, mut obj: Map<String, Value>, scope: &Scope<'_>) -> Result<Value> {
    let dict = p.expand(obj.remove("dictionary").ok_or("'dictionary' not given")?, scope)?;
    let mut value = p.expand(obj.remove("initialValue").ok_or("'initialValue' not given")?, scope)?;
    let t = obj.get("transform").ok_or("'transform' not given")?;
    let names = (
        name_field(&obj, "keyName", "key")?,
        name_field(&obj, "itemName", "item")?,
        name_field(&obj, "valueName", "value")?,
    );
    let each = Scope::extend(scope);
    for (key, item) in entries(dict)?.1 {
        each.set(&names.0, Var::Ready(key));
        each.set(&names.1, Var::Ready(item));
        each.set(&names.2, Var::Ready(value));
        value = p.expand(t.clone(), &each).map_err(|e| format!("transform: {e}"))?;
    }
    Ok(value)
}

/// `foreach`: the entries of `from` that satisfy `where`, each turned into `use` (merged into one
/// list or object), at most `top` of them; `noMatchResult` when none matched.
pub(super) fn foreach(p: &Preprocessor<'_>, mut obj: Map<String, Value>, scope: &Scope<'_>) -> Result<Value> {
    let from = p
        .expand(obj.remove("from").ok_or("'from' not given")?, scope)
        .map_err(|e| format!("from: {e}"))?;
    let (key_name, item_name) = (name_field(&obj, "key", "key")?, name_field(&obj, "item", "item")?);
    let (is_object, entries) = entries(from)?;
    let mut top = match obj.remove("top") {
        None => usize::MAX,
        Some(t) => match p.expand(t, scope)? {
            Value::Number(n) if n.as_u64().is_some() => n.as_u64().unwrap_or_default() as usize,
            _ => return Err("top must be a non-negative integer".into()),
        },
    };
    let each = Scope::extend(scope);
    let mut result: Option<Value> = None;
    for (key, item) in entries {
        if top == 0 {
            break;
        }
        each.set(&key_name, Var::Ready(key.clone()));
        each.set(&item_name, Var::Ready(item.clone()));
        if let Some(cond) = obj.get("where") {
            match p.expand(cond.clone(), &each).map_err(|e| format!("where: {e}"))? {
                Value::Bool(true) => {}
                Value::Bool(false) => continue,
                other => return Err(format!("where is {}, not a boolean", type_name(&other))),
            }
        }
        let piece = match obj.get("use") {
            Some(u) => p.expand(u.clone(), &each).map_err(|e| format!("use: {e}"))?,
            None if is_object => {
                let Value::String(k) = key else {
                    unreachable!("object keys are strings")
                };
                Value::Object(Map::from_iter([(k, item)]))
            }
            None => Value::Array(vec![item]),
        };
        result = Some(match (result, piece) {
            (None, piece @ (Value::Array(_) | Value::Object(_))) => piece,
            (None, other) => return Err(format!("use is {}, not a list or an object", type_name(&other))),
            (Some(Value::Array(mut acc)), Value::Array(more)) => {
                acc.extend(more);
                Value::Array(acc)
            }
            (Some(Value::Object(mut acc)), Value::Object(more)) => {
                acc.extend(more);
                Value::Object(acc)
            }
            (Some(acc), other) => return Err(format!("use gave {} after {}", type_name(&other), type_name(&acc))),
        });
        top -= 1;
    }
    match (result, obj.remove("noMatchResult")) {
        (Some(r), _) => Ok(r),
        (None, Some(no_match)) => p.expand(no_match, scope),
        (None, None) => Ok(if is_object {
            Value::Object(Map::new())
        } else {
            Value::Array(Vec::new())
        }),
    }
}
