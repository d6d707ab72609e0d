//! The registry: every route handle type a config may name, and mcrouter's handles this router
//! does not have. It names every handle module, so it sits above them all; `config` gives it to the
//! `Builder` (which the handles' `build`s use and so cannot name it). Adding a handle means one new
//! file under `routes/` (its `build` and, beside it, its `Handle` entry) and one line in `HANDLES`.

use crate::build::{Handle, Registry};
use crate::routes::{
    all_async, all_fastest, all_initial, all_majority, all_sync, dev_null, distribution, eager_shard_selection,
    eager_shard_selection_shadow, error, failover, failover_with_exptime, hash, hash_stop_allow_list, host_id,
    l1l2_cache, l1l2_size_split, latency_injection, latest, load_balancer, mc_bucket, migrate, miss_failover,
    modify_exptime, modify_key, null, operation_selector, pool, prefix_selector, random, routing_group,
    salted_failover, shadow, shard_selection, transparent_lease, warm_up,
};

/// The handles, by config `type` name.
pub const HANDLES: &[Handle] = &[
    pool::POOL_ROUTE,
    hash::HASH_ROUTE,
    all_sync::ALL_SYNC_ROUTE,
    all_async::ALL_ASYNC_ROUTE,
    all_initial::ALL_INITIAL_ROUTE,
    all_majority::ALL_MAJORITY_ROUTE,
    failover::FAILOVER_ROUTE,
    failover_with_exptime::FAILOVER_WITH_EXPTIME_ROUTE,
    miss_failover::MISS_FAILOVER_ROUTE,
    warm_up::WARM_UP_ROUTE,
    operation_selector::OPERATION_SELECTOR_ROUTE,
    operation_selector::PREFIX_POLICY_ROUTE,
    prefix_selector::PREFIX_SELECTOR_ROUTE,
    transparent_lease::TRANSPARENT_LEASE_ROUTE,
    modify_exptime::MODIFY_EXPTIME_ROUTE,
    null::NULL_ROUTE,
    error::ERROR_ROUTE,
    all_fastest::ALL_FASTEST_ROUTE,
    random::RANDOM_ROUTE,
    latest::LATEST_ROUTE,
    load_balancer::LOAD_BALANCER_ROUTE,
    salted_failover::SALTED_FAILOVER_ROUTE,
    shadow::SHADOW_ROUTE,
    migrate::MIGRATE_ROUTE,
    l1l2_cache::L1L2_CACHE_ROUTE,
    latency_injection::LATENCY_INJECTION_ROUTE,
    modify_key::MODIFY_KEY_ROUTE,
    dev_null::DEV_NULL_ROUTE,
    dev_null::BLACKHOLE_ROUTE,
    shard_selection::SHARD_SELECTION_ROUTE,
    eager_shard_selection::EAGER_SHARD_SELECTION_ROUTE,
    eager_shard_selection_shadow::EAGER_SHARD_SELECTION_SHADOW_ROUTE,
    distribution::DISTRIBUTION_ROUTE,
    l1l2_size_split::L1L2_SIZE_SPLIT_ROUTE,
    hash_stop_allow_list::HASH_STOP_ALLOW_LIST_ROUTE,
    mc_bucket::MC_BUCKET_ROUTE,
    host_id::HOST_ID_ROUTE,
    routing_group::ROUTING_GROUP_ROUTE,
];

/// What the `Builder` is given: the handles, and the one that stands for a list of routes where
/// `children` are listed (a ShadowRoute there is one route per child).
pub static REGISTRY: Registry = Registry {
    handles: HANDLES,
    lists: &[("ShadowRoute", shadow::build_list)],
    unknown: unknown_type,
};

/// mcrouter's route handles this router does not have (its registry and the routes its tests
/// build): a config naming one is refused saying so, not as a typo.
pub const NOT_SUPPORTED: &[(&str, &str)] = &[
    ("BigValueRoute", "values are not split into chunks"),
    ("CarbonLookasideRoute", "it caches Carbon (Thrift) replies"),
    (
        "KeyParseRoute",
        "it chooses the part of the key a McBucketRoute below hashes; not implemented",
    ),
    (
        "KeySplitRoute",
        "it spreads a hot key over replicas by a key suffix; not implemented",
    ),
    (
        "LoggingRoute",
        "it logs requests to mcrouter's own logger; not implemented",
    ),
    (
        "OriginalClientHashRoute",
        "it hashes the client's address, which mcrouter takes from Thrift",
    ),
    (
        "RateLimitRoute",
        "token-bucket rate limits per operation; not implemented",
    ),
    (
        "SetDistributionTargetRoute",
        "there is no distribution layer (see DistributionRoute)",
    ),
    ("StagingRoute", "not implemented"),
    ("SRRoute", "it is Meta's service-router lookup"),
    ("AxonLogRoute", "it writes to Meta's Axon"),
    ("McRefillRoute", "it is Meta's refill service"),
    ("DistributionLoadTestRoute", "it writes to Meta's distribution layer"),
    ("ShardFilterRoute", "its shard filter is the embedding router's own"),
    ("ShardSplitRoute", "not implemented (PoolRoute `shard_splits`)"),
    ("ClientCompatibilityCheckerRoute", "it reads Carbon client versions"),
    ("OutstandingLimitRoute", "not implemented"),
    ("SlowWarmUpRoute", "not implemented"),
];

/// The load error for a handle type the registry does not have.
pub fn unknown_type(ty: &str) -> String {
    match NOT_SUPPORTED.iter().find(|(name, _)| *name == ty) {
        Some((_, why)) => {
            format!("mcrouter's route handle `{ty}` is not supported by squeal-router ({why}; docs/router.md)")
        }
        None => format!(
            "unknown route handle type `{ty}`: not supported by squeal-router (docs/router.md lists the handles it supports)"
        ),
    }
}
