use squeal_model::{check, Config, Invalidation};
use stateright::Checker;
use std::time::Instant;

fn run(name: &str, cfg: Config) {
    let t = Instant::now();
    let c = check(cfg);
    let mut d: Vec<_> = c
        .discoveries()
        .into_iter()
        .map(|(k, p)| (k, p.into_actions().len()))
        .collect();
    d.sort();
    println!(
        "{name}: {} unique / {} states, depth {}, {:.2?}: {:?}",
        c.unique_state_count(),
        c.state_count(),
        c.max_depth(),
        t.elapsed(),
        d
    );
}

fn main() {
    let r2 = Config {
        region1: false,
        region2: true,
        ..Config::default()
    };
    run("region1", Config::default());
    run(
        "region1 leases off",
        Config {
            leases: false,
            ..Config::default()
        },
    );
    run(
        "region1 fencing off",
        Config {
            fencing: false,
            ..Config::default()
        },
    );
    run(
        "region1 stale marks",
        Config {
            invalidation: Invalidation::StaleMark,
            ..Config::default()
        },
    );
    run(
        "region1 no spool",
        Config {
            spool: false,
            ..Config::default()
        },
    );
    run(
        "region2 writes 1",
        Config {
            writes: 1,
            ..r2.clone()
        },
    );
    run("region2 writes 2", r2.clone());
    run(
        "region2 markers off",
        Config {
            remote_markers: false,
            writes: 1,
            ..r2.clone()
        },
    );
    run(
        "region2 leases off",
        Config {
            leases: false,
            writes: 1,
            ..r2.clone()
        },
    );
}
