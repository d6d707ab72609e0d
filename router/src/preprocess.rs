//! mcrouter's config preprocessor: `macros` (`macroDef`, `constDef`), `%param%` substitution,
//! string calls like `"@int(5)"`, object calls like `{"type": "merge", "params": [...]}`, `vars`,
//! `@import`, and the built-ins (`transform`, `process`, `foreach`, `if`, `select`, arithmetic,
//! …). It runs on the parsed JSON before any route is built; its output is plain JSON.
//!
//! The semantics follow mcrouter's documented behaviour (docs/router.md, "Config preprocessor"):
//! - A string starting with `@` is a call: `@name` or `@name(arg,arg,...)`; arguments split on
//!   commas outside brackets, `\` escapes a character. Any other string has each `%name%`
//!   replaced: when the whole string is one `%name%` the value keeps its type (a list stays a
//!   list), otherwise it must be a string and is spliced in.
//! - An object whose `type` names a macro or built-in is a call with its other fields as named
//!   arguments. `vars` on any object adds locals (they may refer to each other) for that object.
//! - A macro's body sees only its own parameters and the constants: not its caller's locals.
//! - Arguments are expanded before the call, except for the built-ins that decide what to expand
//!   (`if`, `and`, `or`, `select`, `shuffle`, `import`): those expand them in the caller's scope
//!   only when needed, so `@if(cond, ok, @fail(...))` fails only when the condition is false.

use serde_json::{Map, Number, Value};
use std::cell::{Cell, RefCell};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::rc::Rc;

/// What a failed expansion says: a chain of places from the outside in, then the reason.
pub type Result<T> = std::result::Result<T, String>;

/// Nested macros and objects allowed before we call it a cycle (mcrouter's limit).
const NESTED_LIMIT: usize = 250;

/// Where `@import(path)` reads from: returns the text of the imported JSON (comments allowed).
pub type Importer<'a> = dyn Fn(&str) -> Result<String> + 'a;

/// Expand every macro in `config` (a parsed config object). `globals` are constants every macro can
/// read as `%name%` (mcrouter's `default-route`, `hostid`, ... and `--config-params`).
pub fn expand_config(config: Value, globals: Vec<(String, Value)>, import: &Importer<'_>) -> Result<Value> {
    let Value::Object(mut top) = config else {
        return Err("config must be a JSON object".into());
    };
    let pre = Preprocessor::new(globals, import);
    if let Some(macros) = top.remove("macros") {
        let macros = pre
            .expand(macros, &Scope::base(None))
            .map_err(|e| format!("macros: {e}"))?;
        pre.define_all(macros).map_err(|e| format!("macros: {e}"))?;
    }
    pre.expand(Value::Object(top), &Scope::base(None))
}

/// Parse a config file's text and expand its macros: `@import(path)` reads `path` relative to
/// `dir` (`@import(file:path)` reads `path` as given), `default_prefix` (the router's `--route-prefix`) sets `%default-route%`,
/// `%default-region%` and `%default-cluster%`, and `params` are more constants (mcrouter's
/// `--config-params name:value,...`). Like mcrouter, every config goes through it.
pub fn expand_file(
    text: &str,
    default_prefix: Option<&str>,
    dir: Option<&std::path::Path>,
    params: &[(String, String)],
) -> Result<Value> {
    let v = crate::jsonc::parse_jsonc(text)?;
    let import = |path: &str| -> Result<String> {
        // mcrouter's ConfigApi: a `file:` resource is its path as given; a bare path is relative
        // to the config's directory
        let full = match path.strip_prefix("file:") {
            Some(given) => std::path::PathBuf::from(given),
            None => dir.map_or_else(|| std::path::PathBuf::from(path), |d| d.join(path)),
        };
        std::fs::read_to_string(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))
    };
    let mut constants = globals(default_prefix);
    constants.extend(params.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))));
    expand_config(v, constants, &import).map_err(|e| format!("preprocessor: {e}"))
}

/// The constants every macro can read, by mcrouter's names: the default route with its region and
/// cluster, and the router's identity (values a single squeal-router has; `hostid` is 0).
pub fn globals(default_prefix: Option<&str>) -> Vec<(String, Value)> {
    let route = default_prefix.unwrap_or_default();
    let mut parts = route.trim_matches('/').splitn(2, '/');
    let (region, cluster) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let s = |v: &str| Value::String(v.to_string());
    vec![
        ("default-route".into(), s(route)),
        ("default-region".into(), s(region)),
        ("default-cluster".into(), s(cluster.trim_end_matches('/'))),
        ("router-name".into(), s("default")),
        ("service-name".into(), s("squeal-router")),
        ("router-info-name".into(), s("Memcache")),
        ("service-router-capable".into(), int(0)),
        ("num-proxies".into(), int(1)),
        ("hostid".into(), int(0)),
    ]
}

/// mcrouter's `--config-params` syntax: `name:value` pairs separated by commas.
pub fn parse_params(text: &str) -> Result<Vec<(String, String)>> {
    text.split(',')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once(':') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("`{pair}` is not name:value")),
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// Scopes

/// A variable's state: `Raw` arguments are expanded in the caller's scope when first used;
/// `Lazy` locals (`vars`) are expanded in their own scope when first used.
#[derive(Clone)]
enum Var {
    Ready(Value),
    Raw(Value),
    Lazy(Value),
}

/// The names visible at one point: own variables, then (unless this is a macro's own scope, a
/// "base") the enclosing scope's.
struct Scope<'s> {
    vars: RefCell<HashMap<String, Var>>,
    outer: Option<&'s Scope<'s>>,
    base: bool,
}

impl<'s> Scope<'s> {
    fn base(outer: Option<&'s Scope<'s>>) -> Self {
        Scope {
            vars: RefCell::default(),
            outer,
            base: true,
        }
    }

    fn extend(outer: &'s Scope<'s>) -> Self {
        Scope {
            vars: RefCell::default(),
            outer: Some(outer),
            base: false,
        }
    }

    fn set(&self, name: &str, var: Var) {
        self.vars.borrow_mut().insert(name.to_string(), var);
    }

    fn add(&self, name: &str, var: Var) -> Result<()> {
        let mut vars = self.vars.borrow_mut();
        if vars.contains_key(name) {
            return Err(format!("'{name}' already exists in local scope"));
        }
        vars.insert(name.to_string(), var);
        Ok(())
    }

    /// The value of `name`, expanding a lazy local on first use.
    fn find(&self, pre: &Preprocessor<'_>, name: &str) -> Result<Option<Value>> {
        let var = self.vars.borrow().get(name).cloned();
        match var {
            Some(Var::Ready(v)) => Ok(Some(v)),
            Some(Var::Lazy(raw)) => {
                let v = pre.expand(raw, self).map_err(|e| format!("variable '{name}': {e}"))?;
                self.set(name, Var::Ready(v.clone()));
                Ok(Some(v))
            }
            Some(Var::Raw(_)) => Err(format!("internal: argument '{name}' read before expansion")),
            None => match self.outer {
                Some(outer) if !self.base => outer.find(pre, name),
                _ => Ok(None),
            },
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.vars.borrow().contains_key(name) || matches!(self.outer, Some(outer) if !self.base && outer.contains(name))
    }
}

// ------------------------------------------------------------------------------------------
// Macros

struct Param {
    name: String,
    default: Option<Value>,
    required: bool,
}

/// How a macro computes its result from its arguments (in a base scope whose outer scope is the
/// caller's).
enum Body {
    /// A `macroDef`: its `result`, expanded in the arguments' scope.
    Defined(Value),
    Builtin(fn(&Preprocessor<'_>, &Args<'_, '_>) -> Result<Value>),
}

struct Macro {
    params: Vec<Param>,
    body: Body,
    /// false: arguments stay raw until the body asks for them (`if`, `and`, `select`, ...).
    expand_args: bool,
}

impl Macro {
    fn new(name: &str, params: Vec<Param>, body: Body, expand_args: bool) -> Result<Self> {
        let mut seen_optional = false;
        for (i, p) in params.iter().enumerate() {
            if params[..i].iter().any(|q| q.name == p.name) {
                return Err(format!("macro '{name}': parameter '{}' is listed twice", p.name));
            }
            if p.required && seen_optional {
                return Err(format!(
                    "macro '{name}': parameter '{}' follows an optional one and has no default",
                    p.name
                ));
            }
            seen_optional |= !p.required;
        }
        Ok(Macro {
            params,
            body,
            expand_args,
        })
    }

    fn min_args(&self) -> usize {
        self.params.iter().filter(|p| p.required).count()
    }
}

/// A built-in's view of its arguments.
struct Args<'a, 's> {
    scope: &'a Scope<'s>,
    caller: &'a Scope<'s>,
}

impl Args<'_, '_> {
    /// An expanded argument (the macro expands its arguments before the call).
    fn get(&self, pre: &Preprocessor<'_>, name: &str) -> Result<Value> {
        self.scope.find(pre, name)?.ok_or_else(|| format!("'{name}' not given"))
    }

    /// A raw argument, expanded now in the caller's scope; None when it was not given.
    fn expand(&self, pre: &Preprocessor<'_>, name: &str) -> Result<Option<Value>> {
        let raw = match self.scope.vars.borrow().get(name) {
            Some(Var::Raw(v)) => v.clone(),
            Some(Var::Ready(v)) => return Ok(Some(v.clone())),
            _ => return Ok(None),
        };
        pre.expand(raw, self.caller).map(Some)
    }

    fn expand_required(&self, pre: &Preprocessor<'_>, name: &str) -> Result<Value> {
        self.expand(pre, name)?.ok_or_else(|| format!("'{name}' not given"))
    }
}

// ------------------------------------------------------------------------------------------
// The preprocessor

struct Preprocessor<'i> {
    macros: RefCell<HashMap<String, Rc<Macro>>>,
    consts: RefCell<HashMap<String, Var>>,
    import: &'i Importer<'i>,
    imported: RefCell<HashMap<String, Value>>,
    depth: Cell<usize>,
}

/// A built-in that takes the whole object (`transform`, `process`, `foreach`) or leaves a
/// definition alone (`macroDef`, `constDef` outside `macros`).
type ObjectBuiltin = fn(&Preprocessor<'_>, Map<String, Value>, &Scope<'_>) -> Result<Value>;

fn object_builtin(name: &str) -> Option<ObjectBuiltin> {
    Some(match name {
        "macroDef" | "constDef" => |_, obj, _| Ok(Value::Object(obj)),
        "transform" => builtins::transform,
        "process" => builtins::process,
        "foreach" => builtins::foreach,
        _ => return None,
    })
}

/// A macroDef parameter: `"name"`, or `{"name": ..., "default": ...}` / `{"name": ..., "optional": true}`.
fn param(p: Value) -> Result<Param> {
    match p {
        Value::String(name) => Ok(Param {
            name,
            default: None,
            required: true,
        }),
        Value::Object(mut o) => {
            let name = match o.remove("name") {
                Some(Value::String(n)) => n,
                _ => return Err("a parameter object needs a string 'name'".into()),
            };
            let optional = match o.get("optional") {
                None => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(_) => return Err(format!("parameter '{name}': 'optional' must be true or false")),
            };
            match (o.remove("default"), optional) {
                (Some(_), Some(false)) => Err(format!(
                    "parameter '{name}' has a default but is marked \"optional\": false"
                )),
                (Some(d), _) => Ok(Param {
                    name,
                    default: Some(d),
                    required: false,
                }),
                (None, Some(true)) => Ok(Param {
                    name,
                    default: None,
                    required: false,
                }),
                (None, _) => Ok(Param {
                    name,
                    default: None,
                    required: true,
                }),
            }
        }
        other => Err(format!(
            "a parameter must be a string or an object, not {}",
            type_name(&other)
        )),
    }
}

/// Counts nesting depth for the duration of one expansion step.
struct Depth<'a>(&'a Cell<usize>);

impl<'a> Depth<'a> {
    fn enter(cell: &'a Cell<usize>) -> Result<Self> {
        if cell.get() >= NESTED_LIMIT {
            return Err("too many nested macros: check for cycles".into());
        }
        cell.set(cell.get() + 1);
        Ok(Depth(cell))
    }
}

impl Drop for Depth<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl<'i> Preprocessor<'i> {
    fn new(globals: Vec<(String, Value)>, import: &'i Importer<'i>) -> Self {
        let mut macros = HashMap::new();
        for (name, params, f, expand_args) in builtins::TABLE {
            let params = params
                .iter()
                .map(|p| match p.strip_suffix('?') {
                    Some(name) => Param {
                        name: name.into(),
                        default: None,
                        required: false,
                    },
                    None => Param {
                        name: (*p).into(),
                        default: None,
                        required: true,
                    },
                })
                .collect();
            let m = Macro::new(name, params, Body::Builtin(*f), *expand_args).expect("the built-in table is valid");
            macros.insert((*name).to_string(), Rc::new(m));
        }
        Preprocessor {
            macros: RefCell::new(macros),
            consts: RefCell::new(globals.into_iter().map(|(k, v)| (k, Var::Ready(v))).collect()),
            import,
            imported: RefCell::default(),
            depth: Cell::new(0),
        }
    }

    /// `macros`: an object of definitions, or a list of such objects (or lists).
    fn define_all(&self, macros: Value) -> Result<()> {
        match macros {
            Value::Object(defs) => {
                for (name, def) in defs {
                    self.define(&name, def).map_err(|e| format!("{name}: {e}"))?;
                }
                Ok(())
            }
            Value::Array(items) => items.into_iter().try_for_each(|m| self.define_all(m)),
            other => Err(format!("must be an object or a list, not {}", type_name(&other))),
        }
    }

    fn define(&self, name: &str, def: Value) -> Result<()> {
        let Value::Object(mut def) = def else {
            return Err("a macro definition must be an object".into());
        };
        let kind = def.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
        let result = def.remove("result").ok_or("definition has no 'result'")?;
        match kind.as_str() {
            "constDef" => {
                self.consts.borrow_mut().insert(name.to_string(), Var::Lazy(result));
            }
            "macroDef" => {
                let params = match def.remove("params") {
                    None => Vec::new(),
                    Some(Value::Array(ps)) => ps.into_iter().map(param).collect::<Result<_>>()?,
                    Some(_) => return Err("macroDef 'params' must be a list".into()),
                };
                let m = Macro::new(name, params, Body::Defined(result), true)?;
                self.macros.borrow_mut().insert(name.to_string(), Rc::new(m));
            }
            other => return Err(format!("unknown definition type '{other}' (knows macroDef, constDef)")),
        }
        Ok(())
    }

    fn find_macro(&self, name: &str) -> Option<Rc<Macro>> {
        self.macros.borrow().get(name).cloned()
    }

    /// `%name%` outside any scope: a constant (expanded once, on first use, in an empty scope).
    fn constant(&self, name: &str) -> Result<Option<Value>> {
        let var = self.consts.borrow().get(name).cloned();
        match var {
            Some(Var::Lazy(raw)) | Some(Var::Raw(raw)) => {
                let v = self
                    .expand(raw, &Scope::base(None))
                    .map_err(|e| format!("constant '{name}': {e}"))?;
                self.consts.borrow_mut().insert(name.to_string(), Var::Ready(v.clone()));
                Ok(Some(v))
            }
            Some(Var::Ready(v)) => Ok(Some(v)),
            None => Ok(None),
        }
    }

    fn lookup(&self, scope: &Scope<'_>, name: &str) -> Result<Value> {
        if let Some(v) = scope.find(self, name)? {
            return Ok(v);
        }
        self.constant(name)?
            .ok_or_else(|| format!("'%{name}%': no such parameter, variable or constant"))
    }

    /// Expand every macro in `v`.
    fn expand(&self, v: Value, scope: &Scope<'_>) -> Result<Value> {
        let _depth = Depth::enter(&self.depth)?;
        match v {
            Value::String(s) => self.expand_string(&s, scope),
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| self.expand(item, scope).map_err(|e| format!("[{i}]: {e}")))
                .collect::<Result<Vec<_>>>()
                .map(Value::Array),
            Value::Object(obj) => self.expand_object(obj, scope),
            other => Ok(other),
        }
    }

    fn expand_object(&self, mut obj: Map<String, Value>, scope: &Scope<'_>) -> Result<Value> {
        let with_vars;
        let scope = match obj.remove("vars") {
            None => scope,
            Some(Value::Object(vars)) => {
                with_vars = Scope::extend(scope);
                for (name, raw) in &vars {
                    with_vars.add(name, Var::Lazy(raw.clone()))?;
                }
                for name in vars.keys() {
                    with_vars.find(self, name)?;
                }
                &with_vars
            }
            Some(other) => return Err(format!("vars must be an object, not {}", type_name(&other))),
        };
        if let Some(ty) = obj.get("type").cloned()
            && let Value::String(ty) = self.expand(ty, scope).map_err(|e| format!("type: {e}"))?
        {
            if let Some(f) = object_builtin(&ty) {
                return f(self, obj, scope).map_err(|e| format!("{ty}: {e}"));
            }
            if let Some(m) = self.find_macro(&ty) {
                return self.call_with_object(&m, obj, scope).map_err(|e| format!("{ty}: {e}"));
            }
        }
        let mut out = Map::new();
        for (key, value) in obj {
            let new_key = match self.expand_string(&key, scope).map_err(|e| format!("{key}: {e}"))? {
                Value::String(k) => k,
                other => return Err(format!("{key}: a key expands to {}, not a string", type_name(&other))),
            };
            let value = self.expand(value, scope).map_err(|e| format!("{key}: {e}"))?;
            out.insert(new_key, value);
        }
        Ok(Value::Object(out))
    }

    /// A string: a call when it starts with `@`, otherwise `%param%` substitution.
    fn expand_string(&self, s: &str, scope: &Scope<'_>) -> Result<Value> {
        let _depth = Depth::enter(&self.depth)?;
        let Some(call) = s.strip_prefix('@') else {
            return self.substitute(s, scope);
        };
        let (name, args) = match find_unescaped(call, '(') {
            Some(open) => {
                if !call.ends_with(')') {
                    return Err(format!("'{s}': no closing bracket"));
                }
                (&call[..open], call_args(&call[open + 1..call.len() - 1])?)
            }
            None => (call, Vec::new()),
        };
        let name = match self.substitute(name, scope)? {
            Value::String(n) => n,
            other => return Err(format!("'{s}': the macro name is {}, not a string", type_name(&other))),
        };
        let m = self
            .find_macro(&name)
            .ok_or_else(|| format!("'@{name}': no such macro"))?;
        self.call_with_strings(&m, args, scope)
            .map_err(|e| format!("@{name}: {e}"))
    }

    /// `%name%` substitution; `\` escapes the next character.
    fn substitute(&self, s: &str, scope: &Scope<'_>) -> Result<Value> {
        if !s.contains('%') && !s.contains('\\') {
            return Ok(Value::String(s.to_string()));
        }
        let mut out = String::new();
        let mut rest = s;
        while let Some(pos) = unescape_until(rest, &mut out, '%') {
            rest = &rest[pos + 1..];
            let mut name = String::new();
            let end = unescape_until(rest, &mut name, '%').ok_or_else(|| format!("odd number of % signs in '{s}'"))?;
            let value = self.lookup(scope, &name)?;
            if out.is_empty() && end == rest.len() - 1 {
                return Ok(value); // the whole string is one parameter: keep its type
            }
            match value {
                Value::String(v) => out.push_str(&v),
                other => {
                    return Err(format!(
                        "'%{name}%' is {}: only a string can be part of '{s}'",
                        type_name(&other)
                    ));
                }
            }
            rest = &rest[end + 1..];
        }
        Ok(Value::String(out))
    }

    fn call_with_strings(&self, m: &Macro, args: Vec<String>, caller: &Scope<'_>) -> Result<Value> {
        if args.len() < m.min_args() || args.len() > m.params.len() {
            return Err(format!(
                "takes {}{} arguments, got {}",
                m.min_args(),
                if m.min_args() == m.params.len() {
                    String::new()
                } else {
                    format!(" to {}", m.params.len())
                },
                args.len()
            ));
        }
        let scope = Scope::base(Some(caller));
        for (p, arg) in m.params.iter().zip(args) {
            let var = if m.expand_args {
                Var::Ready(
                    self.expand_string(&arg, caller)
                        .map_err(|e| format!("{}: {e}", p.name))?,
                )
            } else {
                Var::Raw(Value::String(arg))
            };
            scope.set(&p.name, var);
        }
        self.defaults_and_run(m, scope, caller)
    }

    fn call_with_object(&self, m: &Macro, mut obj: Map<String, Value>, caller: &Scope<'_>) -> Result<Value> {
        let scope = Scope::base(Some(caller));
        for p in &m.params {
            let Some(raw) = obj.remove(&p.name) else {
                if p.required {
                    return Err(format!("parameter '{}' not given", p.name));
                }
                continue;
            };
            let var = if m.expand_args {
                Var::Ready(self.expand(raw, caller).map_err(|e| format!("{}: {e}", p.name))?)
            } else {
                Var::Raw(raw)
            };
            scope.set(&p.name, var);
        }
        self.defaults_and_run(m, scope, caller)
    }

    fn defaults_and_run(&self, m: &Macro, scope: Scope<'_>, caller: &Scope<'_>) -> Result<Value> {
        for p in &m.params {
            let given = scope.vars.borrow().contains_key(&p.name);
            if let (Some(d), false) = (&p.default, given) {
                scope.set(&p.name, Var::Ready(d.clone()));
            }
        }
        match &m.body {
            Body::Defined(result) => self.expand(result.clone(), &scope),
            Body::Builtin(f) => f(self, &Args { scope: &scope, caller }),
        }
    }
}

// ------------------------------------------------------------------------------------------
// String-call syntax

/// Byte index of the first `c` not escaped by `\`.
fn find_unescaped(s: &str, c: char) -> Option<usize> {
    let mut chars = s.char_indices();
    while let Some((i, ch)) = chars.next() {
        if ch == '\\' {
            chars.next();
        } else if ch == c {
            return Some(i);
        }
    }
    None
}

/// Copy `from` into `to`, unescaping, up to the first unescaped `c`; its byte index in `from`.
fn unescape_until(from: &str, to: &mut String, c: char) -> Option<usize> {
    let mut chars = from.char_indices();
    while let Some((i, ch)) = chars.next() {
        if ch == '\\' {
            to.push(chars.next()?.1);
        } else if ch == c {
            return Some(i);
        } else {
            to.push(ch);
        }
    }
    None
}

/// The arguments of `@name(...)`: split on commas outside brackets, each trimmed. Like mcrouter,
/// `@name()` has one empty argument.
fn call_args(mut s: &str) -> Result<Vec<String>> {
    let mut args = Vec::new();
    loop {
        let Some(mut comma) = find_unescaped(s, ',') else {
            args.push(trim(s));
            return Ok(args);
        };
        if let Some(open) = find_unescaped(&s[..comma], '(') {
            let close = matching_bracket(s, open).ok_or_else(|| format!("brackets do not match in '{s}'"))?;
            if close == s.len() - 1 {
                args.push(trim(s));
                return Ok(args);
            }
            comma = close
                + 1
                + s[close + 1..]
                    .find(',')
                    .ok_or_else(|| format!("no comma after ')' in '{s}'"))?;
        }
        args.push(trim(&s[..comma]));
        s = &s[comma + 1..];
    }
}

fn matching_bracket(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0i32;
    let mut chars = s[open..].char_indices();
    while let Some((i, ch)) = chars.next() {
        match ch {
            '\\' => {
                chars.next();
            }
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whitespace trimmed from both ends, but a trailing space escaped with `\` is kept.
fn trim(s: &str) -> String {
    let start = s.trim_start();
    let mut end = start.trim_end().len();
    if end < start.len() {
        let slashes = start[..end].chars().rev().take_while(|&c| c == '\\').count();
        if slashes % 2 == 1 {
            end += start[end..].chars().next().map_or(0, char::len_utf8);
        }
    }
    start[..end].to_string()
}

// ------------------------------------------------------------------------------------------
// Values

fn type_name(v: &Value) -> &'static str {
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

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::Bool(b) => Some(i64::from(*b)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn as_double(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn as_bool(v: &Value) -> Option<bool> {
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

fn int(i: i64) -> Value {
    Value::Number(Number::from(i))
}

fn is_int(v: &Value) -> bool {
    matches!(v, Value::Number(n) if !n.is_f64())
}

/// Equality as mcrouter's JSON values compare: an integer equals the double of the same value.
fn equal(a: &Value, b: &Value) -> bool {
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
fn compare(a: &Value, b: &Value) -> Result<Ordering> {
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

fn kind_rank(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Array(_) => 1,
        Value::Bool(_) => 2,
        Value::Number(_) => 3,
        Value::Object(_) => 4,
        Value::String(_) => 5,
    }
}

mod builtins;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn no_import(path: &str) -> Result<String> {
        Err(format!("no file {path}"))
    }

    fn expand(config: Value) -> Result<Value> {
        expand_config(config, vec![("region".into(), json!("east"))], &no_import)
    }

    /// Expand `v` as the value of a config's `x` field, with `macros` defined.
    fn x(macros: Value, v: Value) -> Result<Value> {
        expand(json!({"macros": macros, "x": v})).map(|mut c| c["x"].take())
    }

    #[test]
    fn macro_definitions_parameters_defaults_and_constants() {
        let macros = json!({
            "pool": {"type": "macroDef", "params": ["name", {"name": "port", "default": "11211"}],
                     "result": {"servers": ["%name%:%port%"]}},
            "cluster": {"type": "constDef", "result": "%region%-main"},
        });
        assert_eq!(
            x(macros.clone(), json!("@pool(mc1)")).unwrap(),
            json!({"servers": ["mc1:11211"]})
        );
        assert_eq!(
            x(macros.clone(), json!("@pool(mc1, 7)")).unwrap(),
            json!({"servers": ["mc1:7"]})
        );
        assert_eq!(
            x(macros.clone(), json!({"type": "pool", "name": "mc2", "port": "9"})).unwrap(),
            json!({"servers": ["mc2:9"]})
        );
        assert_eq!(x(macros.clone(), json!("%cluster%")).unwrap(), json!("east-main"));
        let err = x(macros, json!("@pool")).unwrap_err(); // (`@pool()` passes one empty argument, as in mcrouter)
        assert!(err.contains("pool"), "{err}");
    }

    #[test]
    fn a_whole_string_parameter_keeps_its_type_a_spliced_one_must_be_a_string() {
        let macros = json!({"m": {"type": "macroDef", "params": ["l"], "result": {"all": "%l%", "one": "p-%l%"}}});
        let err = x(macros.clone(), json!({"type": "m", "l": [1, 2]})).unwrap_err();
        assert!(err.contains("only a string can be part of"), "{err}");
        let macros = json!({"m": {"type": "macroDef", "params": ["l"], "result": "%l%"}});
        assert_eq!(x(macros, json!({"type": "m", "l": [1, 2]})).unwrap(), json!([1, 2]));
    }

    #[test]
    fn vars_may_refer_to_each_other_and_a_macro_does_not_see_its_callers_locals() {
        let v = json!({"vars": {"a": "1", "b": "%a%-2"}, "out": "%b%"});
        assert_eq!(x(json!({}), v).unwrap(), json!({"out": "1-2"}));
        let macros = json!({"peek": {"type": "macroDef", "result": "%secret%"}});
        let err = x(macros, json!({"vars": {"secret": "s"}, "out": "@peek"})).unwrap_err();
        assert!(err.contains("'%secret%': no such parameter"), "{err}");
    }

    #[test]
    fn if_and_or_expand_only_the_branch_they_take() {
        let ok = |v: Value| x(json!({}), v).unwrap();
        assert_eq!(ok(json!("@if(@bool(true), yes, @fail(not this one))")), json!("yes"));
        assert_eq!(ok(json!("@and(@bool(false), @fail(never))")), json!(false));
        assert_eq!(ok(json!("@or(@bool(true), @fail(never))")), json!(true));
        let err = x(json!({}), json!("@if(@bool(false), yes, @fail(the reason))")).unwrap_err();
        assert!(err.contains("the reason"), "{err}");
    }

    #[test]
    fn transform_process_and_foreach() {
        let ok = |v: Value| x(json!({}), v).unwrap();
        let t = json!({"type": "transform", "dictionary": {"a": "1", "b": "2"},
                       "keyTransform": "k-%key%", "itemTransform": "@int(%item%)"});
        assert_eq!(ok(t), json!({"k-a": 1, "k-b": 2}));
        let p = json!({"type": "process", "dictionary": [1, 2, 3], "initialValue": 0,
                       "transform": "@add(%value%, %item%)"});
        assert_eq!(ok(p), json!(6));
        let f = json!({"type": "foreach", "from": {"a": 1, "b": 2, "c": 3}, "where": "@less(%item%, @int(3))",
                       "use": ["%key%"], "top": 5});
        assert_eq!(ok(f), json!(["a", "b"]));
        let none = json!({"type": "foreach", "from": [1], "where": "@bool(false)", "noMatchResult": "none"});
        assert_eq!(ok(none), json!("none"));
    }

    #[test]
    fn builtins_compute_and_refuse_bad_input_with_the_reason() {
        let ok = |s: &str| x(json!({}), json!(s)).unwrap();
        assert_eq!(ok("@range(@int(1), @int(3))"), json!([1, 2, 3]));
        assert_eq!(ok("@split(a.b, .)"), json!(["a", "b"]));
        assert_eq!(ok("@mod(@int(7), @int(3))"), json!(1));
        assert_eq!(ok("@equals(@int(1), @double(1))"), json!(true));
        assert_eq!(ok("@str(@int(5))"), json!("5"));
        assert_eq!(ok("@sub(@int(1), @int(3))"), json!(-2));
        assert_eq!(ok("@select(@split(a.b.c, .), @int(-1))"), json!("c"));
        assert_eq!(
            x(json!({}), json!({"type": "merge", "params": [[1], [2]]})).unwrap(),
            json!([1, 2])
        );
        assert_eq!(
            x(
                json!({}),
                json!({"type": "select", "dictionary": {}, "key": "k", "default": 0})
            )
            .unwrap(),
            json!(0)
        );
        for (bad, why) in [
            ("@int(abc)", "cannot make a string"),
            ("@div(@int(1), @int(0))", "divides by zero"),
            ("@nosuch(1)", "no such macro"),
            ("@add(1, 2)", "A is a string, not an integer"),
            ("%nosuch%", "no such parameter"),
            ("50% off", "odd number of % signs"),
        ] {
            let err = x(json!({}), json!(bad)).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn errors_say_where_in_the_config() {
        let err = expand(json!({"route": {"type": "PrefixSelectorRoute", "policies": {"a:": ["ok", "@int(x)"]}}}))
            .unwrap_err();
        assert!(err.starts_with("route: policies: a:: [1]: @int"), "{err}");
    }

    #[test]
    fn bad_definitions_and_cycles_are_refused() {
        let dup = json!({"m": {"type": "macroDef", "params": ["p", "p"], "result": "%p%"}});
        assert!(x(dup, json!(1)).unwrap_err().contains("listed twice"));
        let order = json!({"m": {"type": "macroDef", "params": [{"name": "a", "default": 1}, "b"], "result": 1}});
        assert!(x(order, json!(1)).unwrap_err().contains("follows an optional one"));
        let cycle = json!({"m": {"type": "macroDef", "result": "@m"}});
        assert!(x(cycle, json!("@m")).unwrap_err().contains("too many nested macros"));
        assert!(
            x(json!({"m": {"type": "nope", "result": 1}}), json!(1))
                .unwrap_err()
                .contains("unknown definition type")
        );
    }

    #[test]
    fn import_reads_relative_to_the_config_and_falls_back_to_its_default() {
        let dir = std::env::temp_dir().join(format!("squeal-preprocess-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("pools.json"),
            r#"// shared pools
            {"main": {"servers": ["%default-region%-mc:11211"]}}"#,
        )
        .unwrap();
        let config = r#"{"pools": "@import(pools.json)", "route": "@import(missing.json, PoolRoute|main)"}"#;
        let v = expand_file(config, Some("/east/c1/"), Some(&dir), &[]).unwrap();
        assert_eq!(v["pools"], json!({"main": {"servers": ["east-mc:11211"]}}));
        assert_eq!(v["route"], json!("PoolRoute|main"));
        let err = expand_file(r#"{"p": "@import(missing.json)"}"#, None, Some(&dir), &[]).unwrap_err();
        assert!(err.contains("missing.json") && err.contains("cannot read"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn import_reads_a_file_resource_by_its_path_as_mcrouter_does() {
        // the wiki's JSONM page: `@import(file:citiesByCountry.json)`; mcrouter's ConfigApi strips
        // `file:` and reads the path as given (not relative to the config)
        let dir = std::env::temp_dir().join(format!("squeal-preprocess-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cities = dir.join("citiesByCountry.json");
        std::fs::write(&cities, r#"{"ukraine": ["Kyiv", "Lviv"], "usa": ["Menlo Park"]}"#).unwrap();
        let config = format!(r#"{{"cities": "@merge(@values(@import(file:{})))"}}"#, cities.display());
        let elsewhere = std::env::temp_dir();
        let v = expand_file(&config, None, Some(&elsewhere), &[]).unwrap();
        let mut got: Vec<&str> = v["cities"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        got.sort();
        assert_eq!(got, ["Kyiv", "Lviv", "Menlo Park"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn config_params_are_constants_and_their_syntax_is_checked() {
        let params = parse_params("a:1,b:x").unwrap();
        let v = expand_file(r#"{"v": "%a%-%b%"}"#, None, None, &params).unwrap();
        assert_eq!(v["v"], json!("1-x"));
        assert!(parse_params("nocolon").unwrap_err().contains("name:value"));
    }

    #[test]
    fn call_arguments_split_on_commas_outside_brackets_with_escapes() {
        assert_eq!(call_args("a, @f(b, c) ,d").unwrap(), vec!["a", "@f(b, c)", "d"]);
        assert_eq!(call_args("x\\, y").unwrap(), vec!["x\\, y"]);
        assert_eq!(call_args("").unwrap(), vec![""]);
        assert_eq!(trim("a\\ "), "a\\ ");
        assert!(call_args("@f(a, b").is_err());
    }
}
