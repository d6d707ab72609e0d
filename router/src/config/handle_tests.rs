//! Route handles as a config builds them: tests that load a whole config to check one handle.
//! They sit here, above the registry, rather than in the handle's file: loading a config names every
//! handle, and a handle's file naming `config` back would make the import circle issue 36 took apart.

mod eager_shard_selection {
    use crate::protocol::{Cmd, Request};
    use crate::testing::{req, run};

    /// The servers `key` may reach (admin's traverse), as addresses.
    fn reach(cfg: &crate::config::RouterConfig, key: &str) -> Vec<String> {
        let mut r: Request = req(Cmd::Get, key);
        let root = cfg.select(&mut r).ok().unwrap().0.clone();
        let mut out = Vec::new();
        fn walk(route: &crate::routes::RouteRef, r: &Request, out: &mut Vec<String>) {
            if route.route_name().starts_with("host|") {
                out.push(
                    route
                        .route_name()
                        .split("|ap=")
                        .nth(1)
                        .unwrap()
                        .split(':')
                        .take(2)
                        .collect::<Vec<_>>()
                        .join(":"),
                );
            }
            route.traverse(r, &mut |child, r| walk(child, r, out));
        }
        walk(&root, &r, &mut out);
        out.sort();
        out
    }

    #[test]
    fn each_shard_gets_a_route_over_its_servers_in_every_pool() {
        run(async {
            let c = crate::context::Context::new(crate::options::Options::default(), None);
            let text = r#"{"pools": {"t2": {"servers": ["127.0.0.1:21", "127.0.0.1:22"], "shards": ["1,2,3", "3"]}},
              "route": {"type": "EagerShardSelectionRoute", "children_type": "AllSyncRoute", "children_settings": {},
                "pools": [{"pool": {"type": "Pool", "name": "t1", "servers": ["127.0.0.1:11", "127.0.0.1:12"]},
                           "shards": [[1, 2], [3, 5]]},
                          {"pool": "t2"}]}}"#;
            let cfg = crate::config::load(&c, text, None).unwrap();
            assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
            assert_eq!(reach(&cfg, "k:1:x"), ["127.0.0.1:11", "127.0.0.1:21"]);
            assert_eq!(reach(&cfg, "k:3:x"), ["127.0.0.1:12", "127.0.0.1:21", "127.0.0.1:22"]);
            assert_eq!(reach(&cfg, "k:5:x"), ["127.0.0.1:12"]);
            assert!(reach(&cfg, "k:4:x").is_empty()); // out of range: an ErrorRoute
            // LoadBalancerRoute / LatestRoute children take their settings; CustomJsonmRoute is a
            // handle of its own with "$children_list$"
            for (ty, settings) in [
                ("LoadBalancerRoute", r#"{"load_ttl_ms": 100}"#),
                ("LatestRoute", r#"{"failover_count": 1}"#),
                (
                    "CustomJsonmRoute",
                    r#"{"type": "FailoverRoute", "children": "$children_list$"}"#,
                ),
            ] {
                let text = format!(
                    r#"{{"route": {{"type": "EagerShardSelectionRoute", "children_type": "{ty}", "children_settings": {settings},
                        "pools": [{{"pool": {{"servers": ["127.0.0.1:1", "127.0.0.1:2"]}}, "shards": [[1], [1]]}}]}}}}"#
                );
                let cfg = crate::config::load(&c, &text, None).unwrap_or_else(|e| panic!("{ty}: {e}"));
                let n = reach(&cfg, "k:1:x").len();
                // a one-server LatestRoute reaches one of them; a failover both, and so does a
                // LoadBalancerRoute (the key's two candidates: either may be the less loaded)
                assert_eq!(n, if ty == "LatestRoute" { 1 } else { 2 }, "{ty}");
                assert!(cfg.warnings.is_empty(), "{ty}: {:?}", cfg.warnings);
            }
            let bad = [
                (r#""children_settings": {}, "pools": []"#, "`children_type` not found"),
                (
                    r#""children_type": "LatestRoute", "pools": []"#,
                    "`children_settings` not found",
                ),
                (
                    r#""children_type": "WarmUpRoute", "children_settings": {}, "pools": [{"pool": {"servers": ["127.0.0.1:1"]}, "shards": [[1]]}]"#,
                    "`children_type` WarmUpRoute is not supported",
                ),
                (
                    r#""children_type": "LatestRoute", "children_settings": {}, "pools": [{"pool": {"servers": ["127.0.0.1:1"]}, "shards": [[1], [3]]}]"#,
                    "pools[0]: `shards` must have the same number of entries as servers in `pool`. Servers size: 1. Shards size: 2.",
                ),
                (
                    r#""children_type": "LatestRoute", "children_settings": {}, "pools": [{"pool": {"servers": ["127.0.0.1:1"]}}]"#,
                    "needs `shards`",
                ),
            ];
            for (fields, want) in bad {
                let text = format!(r#"{{"route": {{"type": "EagerShardSelectionRoute", {fields}}}}}"#);
                let err = crate::config::load(&c, &text, None)
                    .err()
                    .unwrap_or_else(|| panic!("{text} loaded"));
                assert!(err.contains(want), "{want} not in {err}");
            }
        });
    }
}

mod eager_shard_selection_shadow {
    use crate::protocol::Cmd;
    use crate::testing::{req, run};

    #[test]
    fn builds_from_config_and_without_shadow_shards_is_a_plain_selection() {
        run(async {
            let c = crate::context::Context::new(crate::options::Options::default(), None);
            let route = |shadow: &str| {
                format!(
                    r#"{{"route": {{"type": "EagerShardSelectionShadowRoute", "children_type": "LatestRoute",
                    "children_settings": {{"failover_count": 2}}, "shadow_children_type": "LoadBalancerRoute",
                    "shadow_children_settings": {{}}, "shadow_weights": 0.5,
                    "pools": [{{"pool": {{"servers": ["127.0.0.1:1", "127.0.0.1:2"]}}, "shards": [[1], [2]] {shadow}}}]}}}}"#
                )
            };
            let cfg = crate::config::load(&c, &route(r#", "shadow_shards": [[2], [1, 3]]"#), None).unwrap();
            let mut r = req(Cmd::Get, "k:1:x");
            let root = cfg.select(&mut r).ok().unwrap().0.clone();
            assert_eq!(root.route_name(), "selection|key-shard-id|shadow_enabled");
            let plain = crate::config::load(&c, &route(""), None).unwrap();
            let root = plain.select(&mut r).ok().unwrap().0.clone();
            assert_eq!(root.route_name(), "selection|key-shard-id");
            let bad = route(r#", "shadow_shards": [[2], [1, 3]]"#)
                .replace(r#""shadow_children_type": "LoadBalancerRoute","#, "");
            let err = crate::config::load(&c, &bad, None).err().unwrap();
            assert!(err.contains("`shadow_children_type` not found"), "{err}");
            let bad = route("").replace("LoadBalancerRoute", "CustomJsonmRoute");
            let err = crate::config::load(&c, &bad, None).err().unwrap();
            assert!(err.contains("CustomJsonmRoute is not supported"), "{err}");
        });
    }
}

mod hash {
    use crate::protocol::Cmd;
    use crate::testing::{req, run};

    #[test]
    fn latest_and_load_balancer_as_hash_funcs_and_empty_pools_as_mcrouter_builds_them() {
        run(async {
            let c = crate::context::Context::new(crate::options::Options::default(), None);
            let text = r#"{"pools": {"p": {"servers": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]},
                                   "none": {"servers": []}, "quiet": {"servers": [], "error_on_empty": false}},
              "route": {"type": "PrefixSelectorRoute", "policies": {
                "l:": {"type": "PoolRoute", "pool": "p", "hash": {"hash_func": "Latest", "failover_count": 2}},
                "b:": {"type": "PoolRoute", "pool": "p", "hash": "LoadBalancer"},
                "h:": {"type": "HashRoute", "children": "Pool|p", "hash_func": "Latest"},
                "e:": "PoolRoute|none", "q:": "PoolRoute|quiet", "eh:": "HashRoute|Pool|none"},
                "wildcard": "NullRoute"}}"#;
            let cfg = crate::config::load(&c, text, None).unwrap();
            let root = |key: &str| {
                let mut r = req(Cmd::Get, key);
                let route = cfg.select(&mut r).ok().unwrap().0.clone();
                let mut names = Vec::new();
                route.traverse(&r, &mut |child, _| names.push(child.route_name()));
                names
            };
            assert_eq!(root("l:k")[0], "failover");
            assert_eq!(root("h:k")[0], "failover");
            assert_eq!(root("b:k")[0], "loadbalancer|weighted-hashing"); // LoadBalancerRoute, by measured load
            assert_eq!(root("e:k")[0], "error|HashRoute with empty children, name: none");
            assert_eq!(root("eh:k")[0], "error|HashRoute with empty children, name: ");
            assert_eq!(root("q:k")[0], "null");
            let w = cfg.warnings.join("\n");
            assert!(
                w.contains("PoolRoute: `none` has no servers: every request gets an error"),
                "{w}"
            );
            assert!(
                w.contains("`quiet` has no servers: every request gets NullRoute's answer"),
                "{w}"
            );
        });
    }
}

mod host_id {
    use crate::protocol::Cmd;
    use crate::testing::{req, run};

    #[test]
    fn one_child_per_router_host_and_none_is_a_null_route() {
        run(async {
            let c = crate::context::Context::new(crate::options::Options::default(), None);
            let text = r#"{"pools": {"p": {"servers": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]}, "e": {"servers": []}},
                "route": {"type": "PrefixSelectorRoute", "policies": {"e:": "HostIdRoute|Pool|e"},
                          "wildcard": {"type": "HostIdRoute", "children": "Pool|p", "salt": "x"}}}"#;
            let cfg = crate::config::load(&c, text, None).unwrap();
            let host = format!("{}x", crate::routes::latest::host_id());
            let want = crate::hash::latest_order(host.as_bytes(), 3, 1)[0];
            for key in ["a", "b", "c", "d"] {
                let r = req(Cmd::Get, key);
                let route = cfg.select(&mut r.clone()).ok().unwrap().0.clone();
                let target = route.first_get_target(&r).unwrap();
                assert_eq!(target.index, want, "{key}");
            }
            let mut r = req(Cmd::Get, "e:k");
            let route = cfg.select(&mut r).ok().unwrap().0.clone();
            assert_eq!(route.route(&r).await.res, crate::protocol::Res::Miss);
            assert!(
                cfg.warnings.iter().any(|w| w.starts_with("HostIdRoute: no children")),
                "{:?}",
                cfg.warnings
            );
        });
    }
}

mod l1l2_size_split {

    #[test]
    fn config_fields_are_checked() {
        crate::routes::testing::run(async {
            let c = crate::context::Context::new(crate::options::Options::default(), None);
            let ok = r#"{"route": {"type": "L1L2SizeSplitRoute", "l1": "NullRoute", "l2": "NullRoute", "threshold": 8,
                         "ttl_threshold": 5, "failure_ttl": 10, "both_full_set": true, "retries": 3}}"#;
            let cfg = crate::config::load(&c, ok, None).unwrap();
            assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
            for (fields, want) in [
                (r#""l1": "NullRoute", "l2": "NullRoute""#, "no threshold"),
                (
                    r#""l1": "NullRoute", "l2": "NullRoute", "threshold": 8, "retries": 100"#,
                    "`retries` must be from 1 to 10",
                ),
                (
                    r#""l1": "NullRoute", "l2": "NullRoute", "threshold": 8, "failure_ttl": 0"#,
                    "`failure_ttl` must not be zero",
                ),
                (r#""l1": "NullRoute", "threshold": 8"#, "missing `l2`"),
            ] {
                let text = format!(r#"{{"route": {{"type": "L1L2SizeSplitRoute", {fields}}}}}"#);
                let err = crate::config::load(&c, &text, None)
                    .err()
                    .unwrap_or_else(|| panic!("{text} loaded"));
                assert!(err.contains(want), "{want} not in {err}");
            }
        });
    }
}

mod latency_injection {
    use crate::testing::run;

    fn load(config: &str) -> Result<crate::config::RouterConfig, String> {
        run(async {
            let ctx = crate::context::Context::new(crate::options::Options::default(), None);
            crate::config::load(&ctx, config, None)
        })
    }

    fn with_percentiles(steps: &str) -> String {
        format!(
            r#"{{"route": {{"type": "LatencyInjectionRoute", "child": "NullRoute", "total_latency_percentile_ms": {steps}}}}}"#
        )
    }

    #[test]
    fn total_latency_percentile_ms_loads_and_is_checked_as_mcrouter_checks_it() {
        // mcrouter's LatencyInjectionRouteTest: [[50, 500], [90, 1000], [99, 2000]]
        let cfg = load(&with_percentiles("[[50, 500], [90, 1000], [99, 2000]]")).unwrap();
        assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
        for (steps, why) in [
            ("[[50, 5], [50, 10]]", "strictly increasing"),
            ("[[0, 5]]", "percentile must be in (0, 100]"),
            ("[[101, 5]]", "percentile must be in (0, 100]"),
            ("[[50, -1]]", "must not be negative"),
            ("[[50]]", "[percentile, latency_ms]"),
            ("{}", "must be a list"),
        ] {
            let err = load(&with_percentiles(steps)).err().unwrap_or_default();
            assert!(err.contains(why), "{steps}: {err}");
        }
    }
}

mod load_balancer {
    use crate::hash::HashFunc;
    use crate::protocol::{Cmd, Request};
    use crate::testing::{req, run};

    #[test]
    fn a_slow_or_busy_server_loses_the_key_to_its_second_choice() {
        run(async {
            for busy in [false, true] {
                let c = crate::context::Context::new(crate::options::Options::default(), None);
                // a measurement trusted for the whole test, however long the scheduler keeps it waiting
                let text = r#"{"pools": {"p": {"servers": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]}},
                               "route": {"type": "LoadBalancerRoute", "children": "Pool|p", "load_ttl_ms": 600000}}"#;
                let cfg = crate::config::load(&c, text, None).unwrap();
                let mut q = req(Cmd::Get, "some-key");
                let route = cfg.select(&mut q).ok().unwrap().0.clone();
                let chosen = |q: &Request| route.first_server(q).unwrap().addr.clone();
                let server = |addr: &str| cfg.servers.iter().find(|s| s.addr == addr).unwrap().clone();
                // nothing measured: the key's own server (Ch3, as mcrouter's weighted hashing without load)
                let home = chosen(&q);
                assert_eq!(
                    home,
                    format!("127.0.0.1:{}", HashFunc::Ch3.pick(b"some-key", b"", 3) + 1)
                );
                let now = std::time::Instant::now();
                for s in &cfg.servers {
                    s.load.record(100); // all equally fast (exact: not timed by the scheduler)
                }
                assert_eq!(chosen(&q), home, "even loads keep the key home");
                let home_server = server(&home);
                let _queued: Vec<_>;
                if busy {
                    // requests pile up on the home server
                    _queued = (0..8).map(|_| home_server.load.start(now)).collect();
                } else {
                    // the home server answers slowly
                    home_server.load.record(50_000);
                }
                let second = chosen(&q);
                assert_ne!(second, home, "busy: {busy}");
                assert_eq!(chosen(&q), second, "always the key's one second choice");
            }
        });
    }
}

mod mc_bucket {
    use crate::hash::furc_hash;
    use crate::protocol::{Cmd, Request};
    use crate::routes::RouteRef;
    use crate::testing::{req, run};

    #[test]
    fn mcrouters_bucketized_pool_test_places_key1_as_mcrouter_does() {
        // mcrouter's test_bucketized_poolroute.py: over five servers, "key1" is on server #3
        // without buckets; with 1000 buckets it "maps to bucketId 808 and server #5" (WeightedCh3,
        // every weight 0.5), which also checks WeightedCh3's SpookyHash step against mcrouter
        assert_eq!(furc_hash(b"key1", 5), 2);
        assert_eq!(furc_hash(b"key1", 1000), 808);
        assert_eq!(crate::hash::weighted_ch3(b"808", &[0.5; 5]), 4);
        run(async {
            let c = crate::context::Context::new(crate::options::Options::default(), None);
            let text = r#"{"pools": {"foo": {"servers": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4",
                             "127.0.0.1:5"], "weights": [0.5, 0.5, 0.5, 0.5, 0.5]}},
                "route": {"type": "PoolRoute", "pool": "foo", "bucketize": true, "total_buckets": 1000,
                          "bucketization_keyspace": "test", "hash": "WeightedCh3"}}"#;
            let cfg = crate::config::load(&c, text, None).unwrap();
            assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
            let r = req(Cmd::Get, "key1");
            let root = cfg.select(&mut r.clone()).ok().unwrap().0.clone();
            assert!(
                root.route_name()
                    .starts_with("bucketize|total_buckets=1000|bucketization_keyspace=test")
            );
            let mut reached = Vec::new();
            fn walk(route: &RouteRef, r: &Request, out: &mut Vec<String>) {
                out.push(route.route_name());
                route.traverse(r, &mut |child, r| walk(child, r, out));
            }
            walk(&root, &r, &mut reached);
            assert!(reached.last().unwrap().contains("|id=4|"), "{reached:?}");
        });
    }
}

mod shadow {
    use crate::protocol::{Cmd, Request};
    use crate::routes::RouteRef;
    use crate::routes::shadow::key_fraction;
    use crate::testing::{req, run};

    /// Every handle `key`'s get traverses in `config` (mcrouter's `route_handles`), with the
    /// load's warnings.
    fn handles(config: &str, key: &str) -> (Vec<String>, Vec<String>) {
        fn walk(route: &RouteRef, req: &Request, out: &mut Vec<String>) {
            out.push(route.route_name());
            route.traverse(req, &mut |child, r| walk(child, r, out));
        }
        run(async {
            let ctx = crate::context::Context::new(crate::options::Options::default(), None);
            let cfg = crate::config::load(&ctx, config, None).unwrap();
            let mut r = req(Cmd::Get, key);
            let root = cfg.route_for(&mut r).ok().unwrap().clone();
            let mut out = Vec::new();
            walk(&root, &r, &mut out);
            (out, cfg.warnings.clone())
        })
    }

    fn reaches(handles: &[String], addr: &str) -> bool {
        handles.iter().any(|h| h.contains(&format!("ap={addr}:")))
    }

    #[test]
    fn index_range_ends_before_its_second_number_as_in_mcrouter() {
        // mcrouter's ShadowRoute takes child i when start <= i < end (ShadowRoute-inl.h); the
        // wiki's Shadowing setup: `[0, 2]` is the first and second hosts ("non-inclusive")
        let config = r#"{"pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]},
                                   "b": {"servers": ["127.0.0.1:9"]}},
            "route": {"type": "AllSyncRoute", "children": [{"type": "ShadowRoute", "children": "Pool|a",
                "shadows": [{"target": "PoolRoute|b", "index_range": [0, 1], "key_fraction_range": [0, 1]}]}]}}"#;
        let (tree, _) = handles(config, "k");
        let shadowed: Vec<&String> = tree.iter().filter(|h| h.contains("ap=127.0.0.1:9:")).collect();
        assert_eq!(shadowed.len(), 1, "only child 0 is shadowed: {tree:?}");
        let at = tree.iter().position(|h| h == "shadow").unwrap();
        assert!(tree[at + 1].contains("ap=127.0.0.1:1:"), "{tree:?}");
    }

    #[test]
    fn a_pool_routes_shadows_copy_the_requests_of_the_servers_in_their_index_range() {
        // the wiki's Shadowing setup: PoolRoute `shadows`, hosts 0 and 1 of three shadowed
        let config = r#"{"pools": {"production": {"servers": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]},
                                   "test": {"servers": ["127.0.0.1:9"]}},
            "route": {"type": "PoolRoute", "pool": "production",
                      "shadows": [{"target": "PoolRoute|test", "index_range": [0, 2], "key_fraction_range": [0, 1]}]}}"#;
        let mut seen = [0, 0];
        for i in 0..60 {
            let (tree, warnings) = handles(config, &format!("key{i}"));
            assert!(warnings.is_empty(), "{warnings:?}");
            let shadowed = reaches(&tree, "127.0.0.1:9");
            let third = reaches(&tree, "127.0.0.1:3");
            assert_eq!(shadowed, !third, "key{i}: {tree:?}");
            seen[shadowed as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        // without a key fraction range every key is shadowed here, warned (mcrouter's default takes none)
        let everything = config.replace(r#", "key_fraction_range": [0, 1]"#, "");
        let (_, warnings) = handles(&everything, "k");
        assert_eq!(
            warnings,
            ["PoolRoute: shadows[0] has no `key_fraction_range`: here every key is shadowed (mcrouter shadows none)"]
        );
        // a key fraction range that takes no key shadows nothing
        let none = config.replace("[0, 1]", "[0, 0]");
        assert!((0..20).all(|i| !reaches(&handles(&none, &format!("key{i}")).0, "127.0.0.1:9")));
    }

    #[test]
    fn the_keys_mcrouter_shadows_are_the_keys_shadowed_here() {
        // mcrouter's test_shadow.py: the keys whose SpookyHashV2-32 (seed 0) falls in a key fraction range
        let shadowed = |prefix: &str, low: f64, high: f64| -> Vec<usize> {
            (0..100)
                .filter(|i| {
                    let f = key_fraction(format!("{prefix}{i}").as_bytes());
                    low <= f && f <= high
                })
                .collect()
        };
        assert_eq!(
            shadowed("f", 0.0, 0.1),
            [5, 7, 13, 33, 43, 46, 58, 71, 83, 85, 89, 91, 93]
        );
        assert_eq!(shadowed("f", 0.4, 0.5), [9, 10, 20, 26, 32, 34, 42, 47, 54, 63, 64, 98]);
        assert_eq!(shadowed("b_new", 0.0, 0.1), [10, 11, 15, 34, 40, 43, 47, 71, 93]);
    }

    #[test]
    fn a_broken_shadow_is_warned_and_left_out_as_mcrouter_leaves_it_out() {
        // mcrouter's test_shadow.json: makeShadowRoutes logs each of these and goes on without it
        let config = r#"{"pools": {"a": {"servers": ["127.0.0.1:1"]}, "b": {"servers": ["127.0.0.1:9"]}},
            "route": {"type": "PoolRoute", "pool": "a", "shadows": [
                {"target": "PoolRoute|b", "index_range": [0, 1], "key_fraction_range": [0, 1]},
                {"target": "NullRoute", "index_range": [0, 1], "key_fraction_range": [-1, 15]},
                {"target": "do_not_exist", "index_range": [0, 1], "key_fraction_range": [0.0, 1.0]},
                {"target": "NullRoute", "index_range": 1, "key_fraction_range": 2},
                12345, {}, []]}}"#;
        let (tree, warnings) = handles(config, "k");
        assert!(reaches(&tree, "127.0.0.1:9"), "the good shadow stays: {tree:?}");
        assert_eq!(tree.iter().filter(|h| *h == "null").count(), 0, "{tree:?}");
        for (i, why) in [
            (1, "key_fraction_range` must be within [0, 1]"),
            (2, "do_not_exist"),
            (3, "index_range` must be a list of two numbers"),
            (4, "it must be an object"),
            (5, "missing `target`"),
            (6, "it must be an object"),
        ] {
            let found = warnings
                .iter()
                .any(|w| w.contains(&format!("shadows[{i}]")) && w.contains(why) && w.contains("left out"));
            assert!(found, "shadows[{i}]: {why}: {warnings:?}");
        }
    }

    #[test]
    fn keys_to_shadow_shadows_exactly_those_keys_hash_stop_ignored() {
        // mcrouter's test_shadow.py (test_normal_shadow_specific_keys): f101..f106 of f101..f110
        let config = r#"{"pools": {"a": {"servers": ["127.0.0.1:1", "127.0.0.1:2"]}, "b": {"servers": ["127.0.0.1:9"]}},
            "route": {"type": "PoolRoute", "pool": "a", "shadows": [
                {"target": "PoolRoute|b", "keys_to_shadow": ["f101", "f102", "f103", "f104", "f105", "f106"]},
                {"target": "NullRoute", "keys_to_shadow": ["x"], "index_range": [0, 1]}]}}"#;
        for i in 101..111 {
            let (tree, warnings) = handles(config, &format!("f{i}|#|ignored"));
            assert_eq!(reaches(&tree, "127.0.0.1:9"), i <= 106, "f{i}: {tree:?}");
            // mixing keys_to_shadow with a range is refused by mcrouter: that shadow is left out
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            assert!(warnings[0].contains("shadows[1] left out") && warnings[0].contains("keys_to_shadow"));
        }
    }
}

mod shard_selection {
    use crate::protocol::Cmd;
    use crate::testing::{req, run};

    #[test]
    fn builds_from_config_with_the_map_in_or_beside_the_pool() {
        run(async {
            let c = crate::context::Context::new(crate::options::Options::default(), None);
            let text = r#"{"pools": {"p": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "shards": [[1, 2], "2,3"]}},
              "route": {"type": "PrefixSelectorRoute", "policies": {
                "a": {"type": "ShardSelectionRoute", "pool": "p"},
                "b": {"type": "ShardSelectionRoute", "out_of_range": "NullRoute",
                      "pool": {"type": "Pool", "name": "q", "servers": ["127.0.0.1:3", "127.0.0.1:4"]},
                      "shards": [[7], [8]]}},
                "wildcard": "NullRoute"}}"#;
            let cfg = crate::config::load(&c, text, None).unwrap();
            assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
            let target = |key: &str| {
                let mut r = req(Cmd::Get, key);
                let route = cfg.select(&mut r).ok().unwrap().0.clone();
                route.first_get_target(&r).map(|d| d.server.addr.clone())
            };
            assert_eq!(target("a:1:k").as_deref(), Some("127.0.0.1:1"));
            assert_eq!(target("a:2:k").as_deref(), Some("127.0.0.1:1")); // listed twice: the first
            assert_eq!(target("a:3:k").as_deref(), Some("127.0.0.1:2"));
            assert_eq!(target("b:8:k").as_deref(), Some("127.0.0.1:4"));
            assert_eq!(target("b:9:k"), None); // NullRoute
            let bad = [
                (
                    r#"{"route": {"type": "ShardSelectionRoute", "pool": {"servers": ["127.0.0.1:1"]}}}"#,
                    "`shards` not found",
                ),
                (
                    r#"{"route": {"type": "ShardSelectionRoute", "pool": {"servers": ["127.0.0.1:1"]}, "shards": [[1], [2]]}}"#,
                    "Servers size: 1. Shards size: 2.",
                ),
                (
                    r#"{"route": {"type": "ShardSelectionRoute", "pool": {"servers": ["127.0.0.1:1"]}, "shards": [[1.5]]}}"#,
                    "ShardSelectionRoute: `shards[0]`: 1.5 is not a shard id",
                ),
            ];
            for (text, want) in bad {
                let err = crate::config::load(&c, text, None)
                    .err()
                    .unwrap_or_else(|| panic!("{text} loaded"));
                assert!(err.contains(want), "{want} not in {err}");
            }
            let empty = r#"{"route": {"type": "ShardSelectionRoute", "pool": {"servers": []}, "shards": []}}"#;
            let cfg = crate::config::load(&c, empty, None).unwrap();
            assert!(cfg.warnings[0].contains("no servers"), "{:?}", cfg.warnings);
        });
    }
}
