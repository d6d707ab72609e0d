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

use serde_json::Value;

mod builtins;
mod engine;
mod values;

pub use engine::{Importer, Result};
use engine::{Preprocessor, Scope};
use values::int;

/// Expand every macro in `config` (a parsed config object). `globals` are constants every macro can
/// read as `%name%` (mcrouter's `default-route`, `hostid`, ... and `--config-params`).
pub fn expand_config(config: Value, globals: Vec<(String, Value)>, import: &Importer<'_>) -> Result<Value> {
    let Value::Object(mut top) = config else {
        return Err("config must be a JSON object".into());
    };
    let pre = Preprocessor::new(&builtins::BUILTINS, globals, import);
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
}
