//! The protocol's properties, each proved under squeal's design and each shown to fail without the
//! mechanism that makes it hold (a checker that cannot fail proves nothing). Bounds: Config::default
//! (2 writes, 2 reads per reader, 1 takeover, 1 failover); region 1 and region 2 are checked apart
//! (their product is ~1.4e8 states, too many for CI).

use squeal_model::{check, Action, Config, Invalidation, Protocol};
use stateright::Checker;
use std::time::Instant;

const CONSISTENT: &str = "quiescent states are consistent";
const NO_STALE_FILL: &str = "no stale fill after an invalidation";
const MARKERS: &str = "markers never move backwards";
const ONE_SENDER: &str = "one sender per epoch";
const RYW: &str = "read your writes in region 2";

fn checked(name: &str, cfg: Config) -> impl Checker<Protocol> {
    let start = Instant::now();
    let c = check(cfg);
    println!(
        "{name}: {} unique states ({} visited), depth {}, {:.2?}",
        c.unique_state_count(),
        c.state_count(),
        c.max_depth(),
        start.elapsed()
    );
    c
}

fn region2() -> Config {
    Config {
        region1: false,
        region2: true,
        writes: 1,
        ..Config::default()
    }
}

#[test]
fn region1_design_holds() {
    checked("region1", Config::default()).assert_properties();
}

#[test]
fn region1_with_stale_marks_holds() {
    let cfg = Config {
        invalidation: Invalidation::StaleMark,
        ..Config::default()
    };
    checked("region1 md I", cfg).assert_properties();
}

#[test]
fn region1_without_spool_holds_by_retry() {
    checked(
        "region1 no spool",
        Config {
            spool: false,
            ..Config::default()
        },
    )
    .assert_properties();
}

#[test]
fn without_leases_the_stale_set_race_is_found() {
    let c = checked(
        "region1 leases off",
        Config {
            leases: false,
            ..Config::default()
        },
    );
    let path = c.assert_any_discovery(CONSISTENT);
    println!("{CONSISTENT} fails: {:?}", path.into_actions());
    c.assert_any_discovery(NO_STALE_FILL);
    // The paper's race (3.2.1), step by step: the reader misses and reads the database, a write
    // commits and squeal's delete lands, then the reader's set stores the old value for good.
    let race = vec![
        Action::ReaderGet(1),
        Action::ReaderLoad(1),
        Action::WriterCommit,
        Action::SquealSend(0),
        Action::SquealDeliver(0),
        Action::ReaderFill(1),
    ];
    c.assert_discovery(CONSISTENT, race.clone());
    c.assert_discovery(NO_STALE_FILL, race);
}

#[test]
fn without_fencing_two_owners_send_and_markers_go_back() {
    let c = checked(
        "region1 fencing off",
        Config {
            fencing: false,
            ..Config::default()
        },
    );
    c.assert_any_discovery(ONE_SENDER);
    c.assert_any_discovery(MARKERS);
    // Deletes are idempotent: two senders cost duplicates, never a stale cache.
    c.assert_no_discovery(CONSISTENT);
    c.assert_no_discovery(NO_STALE_FILL);
}

#[test]
fn region2_design_holds() {
    checked("region2", region2()).assert_properties();
}

#[test]
fn region2_without_remote_markers_reads_miss_own_write() {
    let c = checked(
        "region2 markers off",
        Config {
            remote_markers: false,
            ..region2()
        },
    );
    c.assert_any_discovery(RYW);
    c.assert_no_discovery(CONSISTENT);
}

#[test]
fn region2_second_write_before_replication_loses_its_marker() {
    // The paper's caveat: squeal deletes rmk:k when the replica applies the *first* write, while
    // the second is still unreplicated; a read then goes to the replica. Eventually consistent still.
    let c = checked(
        "region2 2 writes",
        Config {
            writes: 2,
            ..region2()
        },
    );
    c.assert_any_discovery(RYW);
    c.assert_no_discovery(CONSISTENT);
    c.assert_no_discovery(NO_STALE_FILL);
}

#[test]
fn region2_without_leases_the_race_is_found() {
    let c = checked(
        "region2 leases off",
        Config {
            leases: false,
            ..region2()
        },
    );
    c.assert_any_discovery(CONSISTENT);
}
