//! Loading configs: the top level, routing prefixes, pools, handles, warnings and errors.

use super::*;
use crate::options::Options;
use crate::protocol::{Cmd, Res};
use crate::testing::{req, run};

fn ctx() -> Arc<Context> {
    Context::new(Options::default(), None)
}

#[test]
fn a_server_on_port_0_loads_warned_as_one_nothing_can_answer() {
    // mcrouter's test_probe_timeout reloads to this config (mcrouter takes any 16-bit port)
    run(async {
        let cfg = load(
            &ctx(),
            r#"{"pools": {"foo": {"servers": ["localhost:0"]}}, "route": "PoolRoute|foo"}"#,
            None,
        )
        .unwrap();
        assert_eq!(
            cfg.warnings,
            ["pool `foo`: server `localhost:0` has port 0, where no server listens: every request to it fails"]
        );
    });
}

#[test]
fn every_registered_handle_loads() {
    run(async {
        let c = ctx();
        let text = r#"{
          "pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "server_timeout": 200},
                    "b": {"servers": ["127.0.0.1:3"]}},
          "named_handles": [{"name": "gutter", "type": "PoolRoute", "pool": "b"}],
          "route": {"type": "PrefixSelectorRoute", "policies": {
              "h:": {"type": "HashRoute", "children": "Pool|a", "hash_func": "Crc32", "salt": "x"},
              "s:": {"type": "AllSyncRoute", "children": "Pool|a"},
              "as:": {"type": "AllAsyncRoute", "children": ["PoolRoute|a", "gutter"]},
              "ai:": {"type": "AllInitialRoute", "children": "Pool|a"},
              "am:": {"type": "AllMajorityRoute", "children": "Pool|a"},
              "f:": {"type": "FailoverRoute", "children": ["PoolRoute|a", "gutter"]},
              "mf:": {"type": "MissFailoverRoute", "children": ["PoolRoute|a", "PoolRoute|b"]},
              "w:": {"type": "WarmUpRoute", "cold": "PoolRoute|a", "warm": "PoolRoute|b", "exptime": 30},
              "o:": {"type": "OperationSelectorRoute", "operation_policies": {"delete": "NullRoute"},
                     "default_policy": {"type": "PoolRoute", "pool": {"name": "inl", "servers": ["127.0.0.1:4"]}}},
              "m:": {"type": "ModifyExptimeRoute", "target": "PoolRoute|a", "exptime": 10, "action": "min"},
              "tl:": {"type": "TransparentLeaseRoute", "target": "PoolRoute|a", "lease_ttl": 5},
              "e:": "ErrorRoute|fenced",
              "n:": "NullRoute",
              "af:": "AllFastestRoute|Pool|a",
              "r:": {"type": "RandomRoute", "children": ["Pool|a", "gutter"]},
              "la:": {"type": "LatestRoute", "children": "Pool|a", "failover_count": 2},
              "lb:": {"type": "LoadBalancerRoute", "children": "Pool|a", "salt": "s"},
              "sf:": "SaltedFailoverRoute|a",
              "sh:": {"type": "AllSyncRoute", "children": [
                  {"type": "ShadowRoute", "children": "Pool|a",
                   "shadows": [{"target": "PoolRoute|b", "index_range": [0, 0], "key_fraction_range": [0, 0.5]}]}]},
              "sh1:": {"type": "ShadowRoute", "children": ["PoolRoute|a"], "shadows": [{"target": "gutter"}]},
              "mi:": {"type": "MigrateRoute", "from": "PoolRoute|a", "to": "PoolRoute|b", "start_time": 1700000000},
              "l1:": {"type": "L1L2CacheRoute", "l1": "PoolRoute|b", "l2": "PoolRoute|a", "upgradingL1Exptime": 10},
              "li:": {"type": "LatencyInjectionRoute", "child": "PoolRoute|a", "before_latency_ms": 1},
              "mk:": {"type": "ModifyKeyRoute", "target": "PoolRoute|a", "ensure_key_prefix": "p:"},
              "dn:": "DevNullRoute",
              "bh:": {"type": "BlackholeRoute", "default": "PoolRoute|a", "policies": {}},
              "ss:": {"type": "ShardSelectionRoute", "pool": "a", "shards": [[1], "2,3"]},
              "es:": {"type": "EagerShardSelectionRoute", "children_type": "LatestRoute", "children_settings": {},
                      "pools": [{"pool": "a", "shards": [[1], [2]]}]},
              "ess:": {"type": "EagerShardSelectionShadowRoute", "children_type": "LoadBalancerRoute",
                       "children_settings": {}, "shadow_children_type": "LatestRoute", "shadow_children_settings": {},
                       "pools": [{"pool": "a", "shards": [[1], [2]], "shadow_shards": [[2], [1]]}]},
              "di:": {"type": "DistributionRoute", "child": "PoolRoute|a"},
              "ls:": {"type": "L1L2SizeSplitRoute", "l1": "PoolRoute|b", "l2": "PoolRoute|a", "threshold": 100},
              "hs:": {"type": "HashStopAllowListRoute", "target": "PoolRoute|a", "prefixes": ["hs:"]},
              "mb:": {"type": "McBucketRoute", "total_buckets": 10, "bucketization_keyspace": "k",
                      "target": {"type": "PoolRoute", "pool": "a", "useBucketHashSelector": true}},
              "rg:": {"type": "RoutingGroupRoute", "routing_group_policies": {"delete_like": "PoolRoute|a"}},
              "pp:": {"type": "PrefixPolicyRoute", "default_policy": "PoolRoute|a"},
              "hi:": "HostIdRoute|Pool|a"},
            "wildcard": {"type": "FailoverWithExptimeRoute", "normal": "PoolRoute|a",
                         "failover": ["gutter"], "failover_exptime": 10}}
        }"#;
        let cfg = load(&c, text, None).unwrap();
        let expected: std::collections::BTreeSet<&str> = crate::registry::HANDLES.iter().map(|h| h.name).collect();
        let used: std::collections::BTreeSet<&str> = cfg.types_used.iter().copied().collect();
        assert_eq!(used, expected);
        // Servers are shared by address: 4 distinct, live once the config serves.
        assert_eq!(cfg.servers.len(), 4);
        assert!(c.all_servers().is_empty());
        c.install(&cfg.servers);
        assert_eq!(c.all_servers().len(), 4);
    });
}

#[test]
fn errors_say_why() {
    run(async {
        let c = ctx();
        let cases = [
            ("{", "invalid JSON"),
            (r#"{"pools": {}}"#, "neither"),
            (r#"{"route": "PoolRoute|nope"}"#, "unknown pool `nope`"),
            (
                r#"{"route": {"type": "BogusRoute"}}"#,
                "unknown route handle type `BogusRoute`: not supported by squeal-router (docs/router.md lists the handles it supports)",
            ),
            (
                r#"{"route": {"type": "KeyParseRoute", "target": "NullRoute"}}"#,
                "mcrouter's route handle `KeyParseRoute` is not supported by squeal-router (it chooses the part of the key a McBucketRoute below hashes",
            ),
            (
                r#"{"route": {"type": "FailoverRoute", "children": ["SRRoute|x"]}}"#,
                "mcrouter's route handle `SRRoute` is not supported by squeal-router (it is Meta's service-router lookup; docs/router.md) in `SRRoute|x`",
            ),
            (
                r#"{"pools": {"a": {"servers": ["nohost"]}}, "route": "PoolRoute|a"}"#,
                "bad server address",
            ),
            (r#"{"route": "NullRoute", "routes": []}"#, "both"),
            (
                r#"{"route": {"type": "OperationSelectorRoute", "operation_policies": {"frob": "NullRoute"}}}"#,
                "unknown operation",
            ),
            (
                r#"{"route": {"type": "L1L2CacheRoute", "l1": "NullRoute", "l2": "NullRoute"}}"#,
                "L1L2CacheRoute: missing `upgradingL1Exptime`",
            ),
            (
                r#"{"route": {"type": "LatencyInjectionRoute", "child": "NullRoute"}}"#,
                "LatencyInjectionRoute: give one of before_latency_ms",
            ),
            (
                r#"{"route": {"type": "ModifyKeyRoute", "target": "NullRoute", "replace_key_prefix": "a", "modify_inplace": true}}"#,
                "ModifyKeyRoute: `replace_key_prefix` and `modify_inplace` cannot be used together",
            ),
            (
                r#"{"route": {"type": "ShadowRoute", "children": ["NullRoute", "NullRoute"], "shadows": []}}"#,
                "ShadowRoute: 2 children where one route is expected",
            ),
            (
                r#"{"route": {"type": "ShadowRoute", "children": ["NullRoute"], "shadows": [], "shadow_policy": "x"}}"#,
                "ShadowRoute: shadow_policy \"x\" is not supported",
            ),
            (
                r#"{"route": {"type": "MigrateRoute", "from": "NullRoute", "to": "NullRoute"}}"#,
                "MigrateRoute: missing `start_time`",
            ),
            (
                r#"{"route": {"type": "LatestRoute", "children": ["NullRoute"], "failover_count": 0}}"#,
                "LatestRoute: `failover_count` must be at least 1",
            ),
            (
                r#"{"route": {"type": "BlackholeRoute", "default": "NullRoute"}}"#,
                "BlackholeRoute: missing `policies`",
            ),
        ];
        for (text, want) in cases {
            let err = load(&c, text, None).err().unwrap_or_else(|| panic!("{text} loaded"));
            assert!(err.contains(want), "{text}: {err}");
        }
    });
}

#[test]
fn routing_prefix_aliases_strip() {
    run(async {
        let c = ctx();
        let text = r#"{"routes": [{"aliases": ["/east/a/"], "route": "NullRoute"},
                                  {"aliases": ["/west/b/"], "route": "ErrorRoute|west"}]}"#;
        let cfg = load(&c, text, None).unwrap();
        let mut r = req(Cmd::Get, "/west/b/user:1");
        let route = cfg.select(&mut r).ok().unwrap().0;
        assert_eq!(&r.key[..], b"user:1");
        assert_eq!(route.route(&r).await.res, Res::LocalError);
        let mut r = req(Cmd::Get, "user:1");
        assert_eq!(cfg.select(&mut r).ok().unwrap().0.route(&r).await.res, Res::Miss);
        let mut r = req(Cmd::Get, "/north/x/k");
        assert!(cfg.select(&mut r).is_err());
        assert_eq!(routing_prefix(b"/a/b/c"), Some(5));
        assert_eq!(routing_prefix(b"/ab"), None);
        assert_eq!(routing_prefix(b"//b/c"), None);
    });
}

#[test]
fn requests_count_on_their_route_across_reloads() {
    run(async {
        let c = ctx();
        let text = r#"{"routes": [{"aliases": ["/east/a/"], "route": "NullRoute"},
                                  {"aliases": ["/west/b/"], "route": "NullRoute"}]}"#;
        let cfg = load(&c, text, None).unwrap();
        for key in ["/west/b/k", "/west/b/k2", "k", "/east/a/k"] {
            cfg.select(&mut req(Cmd::Get, key)).ok().unwrap();
        }
        cfg.select(&mut req(Cmd::Delete, "/west/b/k")).ok().unwrap();
        assert!(cfg.select(&mut req(Cmd::Get, "/north/x/k")).is_err()); // counted as route `none`
        // a config that fails to load leaves no route behind, not even its valid first alias
        let bad = r#"{"routes": [{"aliases": ["/north/x/"], "route": "NullRoute"},
                                 {"aliases": ["nope"], "route": "NullRoute"}]}"#;
        assert!(load(&c, bad, None).is_err());
        let again = load(&c, text, None).unwrap(); // a reload keeps the counts
        again.select(&mut req(Cmd::Get, "/west/b/k")).ok().unwrap();
        let text = c.stats.memcached_text(0);
        for line in [
            "route:/west/b/:cmd_get 3",
            "route:/west/b/:cmd_delete 1",
            "route:/east/a/:cmd_get 2",
            "route:none:cmd_get 1",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        assert!(text.contains("STAT cmd_get 6\r\n"), "{text}");
        assert!(!c.stats.prometheus_text(0).contains("/north/x/"));
    });
}

#[test]
fn unknown_fields_are_reported_not_fatal() {
    run(async {
        let c = ctx();
        let text = r#"{"pools": {"p": {"servers": ["127.0.0.1:1"]}}, "timeouts": 5,
                   "route": {"type": "FailoverRoute", "failover_errors": ["tko"],
                             "children": ["PoolRoute|p", {"type": "PoolRoute", "pool": "p", "hsah": "Ch3"}]}}"#;
        let cfg = load(&c, text, None).unwrap();
        let w = cfg.warnings.join("\n");
        for want in [
            "FailoverRoute: unknown field `failover_errors`",
            "PoolRoute: unknown field `hsah`",
            "`timeouts`",
        ] {
            assert!(w.contains(want), "{want} not in {w}");
        }
        assert_eq!(cfg.warnings.len(), 3, "{w}");
        let clean = load(
            &c,
            r#"{"route": {"type": "ErrorRoute", "response": "x", "name": "e"}}"#,
            None,
        )
        .unwrap();
        assert!(clean.warnings.is_empty(), "{:?}", clean.warnings);
    });
}

#[test]
fn fields_a_handle_cannot_honour_are_warned_about() {
    run(async {
        let c = ctx();
        let text = r#"{"route": {"type": "PrefixSelectorRoute", "policies": {
            "a:": {"type": "L1L2CacheRoute", "l1": "NullRoute", "l2": "NullRoute", "upgradingL1Exptime": 5, "ncacheUpdatePeriod": 3},
            "b:": {"type": "LatencyInjectionRoute", "child": "NullRoute", "request_payload_latency": true},
            "c:": {"type": "ModifyKeyRoute", "target": "NullRoute", "set_routing_prefix": "/a/b/"},
            "d:": {"type": "LoadBalancerRoute", "children": ["NullRoute"], "load_ttl_ms": 5, "default_server_load_percent": 50},
            "e:": {"type": "BlackholeRoute", "default": "NullRoute", "policies": {}},
            "f:": {"type": "LatestRoute", "children": ["NullRoute"], "thresholds": {}}},
            "wildcard": "NullRoute"}}"#;
        let cfg = load(&c, text, None).unwrap();
        let w = cfg.warnings.join("\n");
        for want in [
            "L1L2CacheRoute: `ncacheUpdatePeriod` ignored",
            "LatencyInjectionRoute: `request_payload_latency` ignored",
            "ModifyKeyRoute: `set_routing_prefix` ignored",
            "LoadBalancerRoute: `default_server_load_percent` ignored",
            "BlackholeRoute: `policies` match Carbon request fields",
            "LatestRoute: `thresholds` ignored",
        ] {
            assert!(w.contains(want), "{want} not in {w}");
        }
        assert_eq!(cfg.warnings.len(), 6, "{w}");
    });
}

#[test]
fn flush_targets_are_every_server_of_every_pool_once() {
    run(async {
        let c = ctx();
        let text = r#"{
          "pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "server_timeout": 200},
                    "b": {"servers": ["127.0.0.1:2"], "server_timeout": 700},
                    "unused": {"servers": ["127.0.0.1:3"]}},
          "route": {"type": "PrefixSelectorRoute",
                    "policies": {"x:": {"type": "PoolRoute", "pool": {"name": "inl", "servers": ["127.0.0.1:4"]}},
                                 "y:": "PoolRoute|b"},
                    "wildcard": "PoolRoute|a"}
        }"#;
        let cfg = load(&c, text, None).unwrap();
        let mut got: Vec<(String, u128)> = cfg
            .flush_targets
            .iter()
            .map(|t| (t.server.addr.clone(), t.timeout.as_millis()))
            .collect();
        got.sort();
        let want = [
            ("127.0.0.1:1", 200),
            ("127.0.0.1:2", 700), // in two pools: the longer timeout
            ("127.0.0.1:3", 1000),
            ("127.0.0.1:4", 1000),
        ];
        assert_eq!(got, want.map(|(a, t)| (a.to_string(), t)));
        assert!(cfg.flush_problems.is_empty() && cfg.warnings.is_empty());
        // a pool no route uses still loads as before if it is broken, but no flush can succeed
        let text = r#"{"pools": {"a": {"servers": ["127.0.0.1:1"]}, "bad": {"servers": ["nohost"]}},
                       "route": "PoolRoute|a"}"#;
        let cfg = load(&c, text, None).unwrap();
        assert_eq!(cfg.flush_targets.len(), 1);
        assert_eq!(
            cfg.flush_problems,
            ["pool `bad`: bad server address `nohost` (not flushed)"]
        );
        assert!(cfg.warnings[0].contains("flush_all will fail"), "{:?}", cfg.warnings);
    });
}

#[test]
fn pool_lists_inside_children_and_as_a_single_route() {
    run(async {
        let c = ctx();
        let text = r#"{"pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]},
                               "one": {"servers": ["127.0.0.1:3"]}},
                     "route": {"type": "FailoverRoute", "children": ["Pool|a", "Pool|one", "NullRoute"]}}"#;
        assert!(load(&c, text, None).is_ok());
        // one server: usable wherever a route is expected
        let text = r#"{"pools": {"one": {"servers": ["127.0.0.1:3"]}}, "route": "Pool|one"}"#;
        assert_eq!(load(&c, text, None).unwrap().servers.len(), 1);
        let text = r#"{"pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]}},
                     "route": {"type": "ModifyExptimeRoute", "target": "Pool|a", "exptime": 1}}"#;
        let err = load(&c, text, None).err().unwrap();
        assert!(
            err.contains("`Pool|a` is 2 destinations where one route is expected"),
            "{err}"
        );
    });
}

#[test]
fn inline_pool_objects_stand_where_a_pool_name_may() {
    run(async {
        let c = ctx();
        // in a list: every server; where one route is expected: one server; in a PoolRoute
        let text = r#"{"route": {"type": "FailoverRoute", "children": [
            {"type": "Pool", "name": "B1", "servers": ["127.0.0.1:1", "127.0.0.1:2"]},
            {"type": "ModifyExptimeRoute", "exptime": 5, "target": {"type": "Pool", "servers": ["127.0.0.1:3"]}},
            {"type": "PoolRoute", "pool": {"type": "Pool", "name": "C", "servers": ["127.0.0.1:4"]}}]}}"#;
        let cfg = load(&c, text, None).unwrap();
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
        assert_eq!(cfg.servers.len(), 4);
        let mut names = Vec::new();
        let mut r = req(Cmd::Get, "k");
        let root = cfg.select(&mut r).ok().unwrap().0.clone();
        root.traverse(&r, &mut |child, _| names.push(child.route_name()));
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(
            names[0].contains("pool=B1|id=0") && names[1].contains("pool=B1|id=1"),
            "{names:?}"
        );
        let err = load(
            &c,
            r#"{"route": {"type": "Pool", "servers": ["127.0.0.1:1", "127.0.0.1:2"]}}"#,
            None,
        )
        .err()
        .unwrap();
        assert!(
            err.contains("an inline `Pool` is 2 destinations where one route is expected"),
            "{err}"
        );
        let err = load(
            &c,
            r#"{"route": {"type": "PoolRoute", "pool": {"type": "Poo", "servers": []}}}"#,
            None,
        )
        .err()
        .unwrap();
        assert!(err.contains("`type` must be \"Pool\""), "{err}");
    });
}

#[test]
fn a_pool_server_may_be_a_route_handle_as_in_mcrouter() {
    run(async {
        let c = ctx();
        let text = r#"{"route": {"type": "ShardSelectionRoute", "shards": [[1], [2]],
            "pool": {"type": "Pool", "servers": [{"type": "ErrorRoute", "response": "one"}, "127.0.0.1:5"]}}}"#;
        let cfg = load(&c, text, None).unwrap();
        let mut r = req(Cmd::Get, "k:1:x");
        let reply = cfg.select(&mut r).ok().unwrap().0.route(&r).await;
        assert_eq!(&reply.wire[..], b"SERVER_ERROR one\r\n");
        assert_eq!(cfg.servers.len(), 1);
        let err = load(
            &c,
            r#"{"pools": {"p": {"servers": [5]}}, "route": "PoolRoute|p"}"#,
            None,
        )
        .err()
        .unwrap();
        assert!(
            err.contains("pool `p`: servers[0] must be \"host:port\" or a route handle object, not 5"),
            "{err}"
        );
    });
}

#[test]
fn caret_and_thrift_are_refused_as_out_of_scope_in_the_pool_or_a_server() {
    run(async {
        let c = ctx();
        for (text, want) in [
            (
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1:caret"]}}, "route": "PoolRoute|p"}"#,
                r#"pool `p`: protocol "caret" (server `127.0.0.1:1:caret`) is not supported"#,
            ),
            (
                r#"{"pools": {"p": {"servers": ["[::1]:1:thrift:ssl"]}}, "route": "PoolRoute|p"}"#,
                r#"protocol "thrift" (server `[::1]:1:thrift:ssl`)"#,
            ),
            (
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1"], "protocol": "thrift"}}, "route": "PoolRoute|p"}"#,
                "caret and thrift are out of scope",
            ),
        ] {
            let err = load(&c, text, None).err().unwrap_or_else(|| panic!("{text} loaded"));
            assert!(err.contains(want), "{want} not in {err}");
        }
        let ascii = r#"{"pools": {"p": {"servers": ["127.0.0.1:1:ascii:plain"]}}, "route": "PoolRoute|p"}"#;
        assert!(load(&c, ascii, None).is_ok());
    });
}

#[test]
fn config_params_reach_the_macros() {
    run(async {
        let c = ctx();
        let text = r#"{"pools": {"A": {"servers": ["127.0.0.1:%PORT%"]}}, "route": "PoolRoute|%POOL%"}"#;
        let params = [
            ("PORT".to_string(), "7".to_string()),
            ("POOL".to_string(), "A".to_string()),
        ];
        let cfg = load_from(&c, text, None, None, &params).unwrap();
        assert_eq!(cfg.servers[0].addr, "127.0.0.1:7");
        let err = load(&c, text, None).err().unwrap();
        assert!(err.contains("'%PORT%': no such parameter"), "{err}");
    });
}

#[test]
fn routes_may_be_a_single_entry_object() {
    run(async {
        let c = ctx();
        let text = r#"{"routes": {"aliases": ["/east/a/", "/east/b/"], "route": "ErrorRoute|x"}}"#;
        let cfg = load(&c, text, None).unwrap();
        let mut r = req(Cmd::Get, "/east/b/k");
        assert_eq!(cfg.select(&mut r).ok().unwrap().0.route(&r).await.res, Res::LocalError);
        assert_eq!(&r.key[..], b"k");
        let err = load(&c, r#"{"routes": 5}"#, None).err().unwrap();
        assert!(err.contains("`routes` must be"), "{err}");
    });
}

#[test]
fn routes_may_map_each_alias_to_its_route_as_mcrouter_reads_them() {
    run(async {
        let c = ctx();
        let text = r#"{"routes": {"/east/a/": "ErrorRoute|a", "/east/b/": "NullRoute"}}"#;
        let cfg = load(&c, text, Some("/east/b/")).unwrap();
        let mut r = req(Cmd::Get, "/east/a/k");
        assert_eq!(cfg.select(&mut r).ok().unwrap().0.route(&r).await.res, Res::LocalError);
        let mut r = req(Cmd::Get, "k");
        assert_ne!(cfg.select(&mut r).ok().unwrap().0.route(&r).await.res, Res::LocalError);
    });
}

#[test]
fn pool_fields_are_honoured_warned_or_rejected() {
    run(async {
        let c = ctx();
        // weights feed a WeightedCh3 PoolRoute: a zero-weight server gets nothing
        let text = r#"{"pools": {"w": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "weights": [1.0, 0.0]},
                               "k": {"servers": ["127.0.0.1:3"], "keep_routing_prefix": true,
                                     "connect_timeout": 5, "protocol": "ascii", "frob": 1},
                               "unused_w": {"servers": ["127.0.0.1:4"], "weights": [1]}},
                     "route": {"type": "PrefixSelectorRoute", "policies": {"k:": "PoolRoute|k"},
                               "wildcard": {"type": "PoolRoute", "pool": "w", "hash": {"hash_func": "WeightedCh3"}}}}"#;
        let cfg = load(&c, text, None).unwrap();
        let w = cfg.warnings.join("\n");
        for want in [
            "pool `k`: `keep_routing_prefix: true` is not supported",
            "pool `k`: `connect_timeout` ignored",
            "pool `k`: unknown field `frob` ignored",
            "pool `unused_w`: `weights` ignored",
        ] {
            assert!(w.contains(want), "{want} not in {w}");
        }
        assert!(!w.contains("pool `w`"), "{w}");
        let mut hit_second = 0;
        for i in 0..200 {
            let r = req(Cmd::Get, &format!("key{i}"));
            let route = cfg.select(&mut r.clone()).ok().unwrap().0.clone();
            if let Some(dest) = route.first_get_target(&r) {
                hit_second += usize::from(dest.server.addr.ends_with(":2"));
            }
        }
        assert_eq!(hit_second, 0);
        // fewer weights than servers: padded with 0.5 and said so
        let text = r#"{"pools": {"w": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "weights": [1.0]}},
                     "route": {"type": "PoolRoute", "pool": "w", "hash_func": "WeightedCh3"}}"#;
        let cfg = load(&c, text, None).unwrap();
        assert!(
            cfg.warnings.join("\n").contains("missing ones count as 0.5"),
            "{:?}",
            cfg.warnings
        );
        let bad = [
            (
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1"], "protocol": "caret"}}, "route": "PoolRoute|p"}"#,
                "pool `p`: protocol \"caret\" is not supported",
            ),
            (
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1"]}}, "route": {"type": "PoolRoute", "pool": "p", "hash_func": "WeightedCh3"}}"#,
                "PoolRoute: hash_func WeightedCh3 needs `weights`",
            ),
            (
                r#"{"pools": {"p": {"servers": ["127.0.0.1:1"], "weights": [2]}}, "route": {"type": "PoolRoute", "pool": "p", "hash_func": "WeightedCh3"}}"#,
                "every weight must be a number from 0.0 to 1.0",
            ),
        ];
        for (text, want) in bad {
            let err = load(&c, text, None).err().unwrap_or_else(|| panic!("{text} loaded"));
            assert!(err.contains(want), "{want} not in {err}");
        }
    });
}

#[test]
fn port_override_sets_every_servers_port() {
    run(async {
        let c = ctx();
        let text = r#"{"pools": {"p": {"servers": ["127.0.0.1", "127.0.0.2:5"], "port_override": 11311}}, "route": "PoolRoute|p"}"#;
        let cfg = load(&c, text, None).unwrap();
        let mut addrs: Vec<_> = cfg.servers.iter().map(|s| s.addr.clone()).collect();
        addrs.sort();
        assert_eq!(addrs, ["127.0.0.1:11311", "127.0.0.2:11311"]);
        let bad = r#"{"pools": {"p": {"servers": ["h"], "port_override": 0}}, "route": "PoolRoute|p"}"#;
        assert!(
            load(&c, bad, None)
                .err()
                .unwrap()
                .contains("`port_override` must be from 1 to 65535")
        );
    });
}
