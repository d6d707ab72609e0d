//! The preprocessor itself: scopes, macros and their parameters, and the expansion of strings,
//! lists and objects (calls, `vars`, `%name%`). The built-ins are given to it (`Builtins`), so that
//! `builtins.rs`, which uses the engine, is not named by it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use serde_json::{Map, Value};

use super::values::type_name;

/// What a failed expansion says: a chain of places from the outside in, then the reason.
pub type Result<T> = std::result::Result<T, String>;

/// Nested macros and objects allowed before we call it a cycle (mcrouter's limit).
pub(super) const NESTED_LIMIT: usize = 250;

/// Where `@import(path)` reads from: returns the text of the imported JSON (comments allowed).
pub type Importer<'a> = dyn Fn(&str) -> Result<String> + 'a;

// ------------------------------------------------------------------------------------------
// Scopes

/// A variable's state: `Raw` arguments are expanded in the caller's scope when first used;
/// `Lazy` locals (`vars`) are expanded in their own scope when first used.
#[derive(Clone)]
pub(super) enum Var {
    Ready(Value),
    Raw(Value),
    Lazy(Value),
}

/// The names visible at one point: own variables, then (unless this is a macro's own scope, a
/// "base") the enclosing scope's.
pub(super) struct Scope<'s> {
    pub(super) vars: RefCell<HashMap<String, Var>>,
    pub(super) outer: Option<&'s Scope<'s>>,
    pub(super) base: bool,
}

impl<'s> Scope<'s> {
    pub(super) fn base(outer: Option<&'s Scope<'s>>) -> Self {
        Scope {
            vars: RefCell::default(),
            outer,
            base: true,
        }
    }

    pub(super) fn extend(outer: &'s Scope<'s>) -> Self {
        Scope {
            vars: RefCell::default(),
            outer: Some(outer),
            base: false,
        }
    }

    pub(super) fn set(&self, name: &str, var: Var) {
        self.vars.borrow_mut().insert(name.to_string(), var);
    }

    pub(super) fn add(&self, name: &str, var: Var) -> Result<()> {
        let mut vars = self.vars.borrow_mut();
        if vars.contains_key(name) {
            return Err(format!("'{name}' already exists in local scope"));
        }
        vars.insert(name.to_string(), var);
        Ok(())
    }

    /// The value of `name`, expanding a lazy local on first use.
    pub(super) fn find(&self, pre: &Preprocessor<'_>, name: &str) -> Result<Option<Value>> {
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

    pub(super) fn contains(&self, name: &str) -> bool {
        self.vars.borrow().contains_key(name) || matches!(self.outer, Some(outer) if !self.base && outer.contains(name))
    }
}

// ------------------------------------------------------------------------------------------
// Macros

pub(super) struct Param {
    pub(super) name: String,
    pub(super) default: Option<Value>,
    pub(super) required: bool,
}

/// How a macro computes its result from its arguments (in a base scope whose outer scope is the
/// caller's).
pub(super) enum Body {
    /// A `macroDef`: its `result`, expanded in the arguments' scope.
    Defined(Value),
    Builtin(fn(&Preprocessor<'_>, &Args<'_, '_>) -> Result<Value>),
}

pub(super) struct Macro {
    pub(super) params: Vec<Param>,
    pub(super) body: Body,
    /// false: arguments stay raw until the body asks for them (`if`, `and`, `select`, ...).
    pub(super) expand_args: bool,
}

impl Macro {
    pub(super) fn new(name: &str, params: Vec<Param>, body: Body, expand_args: bool) -> Result<Self> {
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

    pub(super) fn min_args(&self) -> usize {
        self.params.iter().filter(|p| p.required).count()
    }
}

/// A built-in's view of its arguments.
pub(super) struct Args<'a, 's> {
    pub(super) scope: &'a Scope<'s>,
    pub(super) caller: &'a Scope<'s>,
}

impl Args<'_, '_> {
    /// An expanded argument (the macro expands its arguments before the call).
    pub(super) fn get(&self, pre: &Preprocessor<'_>, name: &str) -> Result<Value> {
        self.scope.find(pre, name)?.ok_or_else(|| format!("'{name}' not given"))
    }

    /// A raw argument, expanded now in the caller's scope; None when it was not given.
    pub(super) fn expand(&self, pre: &Preprocessor<'_>, name: &str) -> Result<Option<Value>> {
        let raw = match self.scope.vars.borrow().get(name) {
            Some(Var::Raw(v)) => v.clone(),
            Some(Var::Ready(v)) => return Ok(Some(v.clone())),
            _ => return Ok(None),
        };
        pre.expand(raw, self.caller).map(Some)
    }

    pub(super) fn expand_required(&self, pre: &Preprocessor<'_>, name: &str) -> Result<Value> {
        self.expand(pre, name)?.ok_or_else(|| format!("'{name}' not given"))
    }
}

// ------------------------------------------------------------------------------------------
// The preprocessor

pub(super) struct Preprocessor<'i> {
    pub(super) builtins: &'static Builtins,
    pub(super) macros: RefCell<HashMap<String, Rc<Macro>>>,
    pub(super) consts: RefCell<HashMap<String, Var>>,
    pub(super) import: &'i Importer<'i>,
    pub(super) imported: RefCell<HashMap<String, Value>>,
    pub(super) depth: Cell<usize>,
}

/// A built-in that takes the whole object (`transform`, `process`, `foreach`) or leaves a
/// definition alone (`macroDef`, `constDef` outside `macros`).
pub(super) type ObjectBuiltin = fn(&Preprocessor<'_>, Map<String, Value>, &Scope<'_>) -> Result<Value>;

/// A built-in called like a macro, with its arguments.
pub(super) type Builtin = fn(&Preprocessor<'_>, &Args<'_, '_>) -> Result<Value>;

/// The built-ins the preprocessor is given (`builtins::BUILTINS`).
pub(super) struct Builtins {
    /// Called like macros: name, parameters (`name?` optional), function, and whether the
    /// arguments are expanded before the call (else the built-in expands what it needs).
    pub(super) table: &'static [(&'static str, &'static [&'static str], Builtin, bool)],
    /// Called with the whole object (`transform`, `process`, `foreach`).
    pub(super) objects: &'static [(&'static str, ObjectBuiltin)],
}

/// A macroDef parameter: `"name"`, or `{"name": ..., "default": ...}` / `{"name": ..., "optional": true}`.
pub(super) fn param(p: Value) -> Result<Param> {
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
pub(super) struct Depth<'a>(&'a Cell<usize>);

impl<'a> Depth<'a> {
    pub(super) fn enter(cell: &'a Cell<usize>) -> Result<Self> {
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
    /// A built-in that takes the whole object, or leaves a definition alone (`macroDef`, `constDef`
    /// outside `macros`).
    fn object_builtin(&self, name: &str) -> Option<ObjectBuiltin> {
        match name {
            "macroDef" | "constDef" => Some(|_, obj, _| Ok(Value::Object(obj))),
            _ => self.builtins.objects.iter().find(|(n, _)| *n == name).map(|(_, f)| *f),
        }
    }

    pub(super) fn new(builtins: &'static Builtins, globals: Vec<(String, Value)>, import: &'i Importer<'i>) -> Self {
        let mut macros = HashMap::new();
        for (name, params, f, expand_args) in builtins.table {
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
            builtins,
            macros: RefCell::new(macros),
            consts: RefCell::new(globals.into_iter().map(|(k, v)| (k, Var::Ready(v))).collect()),
            import,
            imported: RefCell::default(),
            depth: Cell::new(0),
        }
    }

    /// `macros`: an object of definitions, or a list of such objects (or lists).
    pub(super) fn define_all(&self, macros: Value) -> Result<()> {
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

    pub(super) fn define(&self, name: &str, def: Value) -> Result<()> {
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

    pub(super) fn find_macro(&self, name: &str) -> Option<Rc<Macro>> {
        self.macros.borrow().get(name).cloned()
    }

    /// `%name%` outside any scope: a constant (expanded once, on first use, in an empty scope).
    pub(super) fn constant(&self, name: &str) -> Result<Option<Value>> {
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

    pub(super) fn lookup(&self, scope: &Scope<'_>, name: &str) -> Result<Value> {
        if let Some(v) = scope.find(self, name)? {
            return Ok(v);
        }
        self.constant(name)?
            .ok_or_else(|| format!("'%{name}%': no such parameter, variable or constant"))
    }

    /// Expand every macro in `v`.
    pub(super) fn expand(&self, v: Value, scope: &Scope<'_>) -> Result<Value> {
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

    pub(super) fn expand_object(&self, mut obj: Map<String, Value>, scope: &Scope<'_>) -> Result<Value> {
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
            if let Some(f) = self.object_builtin(&ty) {
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
    pub(super) fn expand_string(&self, s: &str, scope: &Scope<'_>) -> Result<Value> {
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
    pub(super) fn substitute(&self, s: &str, scope: &Scope<'_>) -> Result<Value> {
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

    pub(super) fn call_with_strings(&self, m: &Macro, args: Vec<String>, caller: &Scope<'_>) -> Result<Value> {
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

    pub(super) fn call_with_object(&self, m: &Macro, mut obj: Map<String, Value>, caller: &Scope<'_>) -> Result<Value> {
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

    pub(super) fn defaults_and_run(&self, m: &Macro, scope: Scope<'_>, caller: &Scope<'_>) -> Result<Value> {
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
pub(super) fn find_unescaped(s: &str, c: char) -> Option<usize> {
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
pub(super) fn unescape_until(from: &str, to: &mut String, c: char) -> Option<usize> {
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
pub(super) fn call_args(mut s: &str) -> Result<Vec<String>> {
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

pub(super) fn matching_bracket(s: &str, open: usize) -> Option<usize> {
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
pub(super) fn trim(s: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_arguments_split_on_commas_outside_brackets_with_escapes() {
        assert_eq!(call_args("a, @f(b, c) ,d").unwrap(), vec!["a", "@f(b, c)", "d"]);
        assert_eq!(call_args("x\\, y").unwrap(), vec!["x\\, y"]);
        assert_eq!(call_args("").unwrap(), vec![""]);
        assert_eq!(trim("a\\ "), "a\\ ");
        assert!(call_args("@f(a, b").is_err());
    }
}
