//! Plans recorded whole: the full outcome of `provision` on the benchmark
//! shapes and on random snapshots, hashed, against the hash recorded when
//! the plans were last known good. Work on the speed of the decision must
//! leave every plan as it was; a change of behaviour that is meant updates
//! the recorded hash in the same commit, saying why.

mod support;

use ironclaim_core::{Provisioning, provision, shapes};

/// FNV-1a over the plan as JSON: every pod's outcome and every claim, in
/// order, with names, servers, paths, ETAs and reasons.
fn fingerprint(plans: impl IntoIterator<Item = Provisioning>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for plan in plans {
        for b in serde_json::to_vec(&plan).expect("a plan serializes") {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[test]
fn bare_metal_plans_are_unchanged() {
    let plans = [200, 5000, 50000].map(|pods| provision(&shapes::bare_metal(pods), 0));
    assert!(plans[2].claims.len() > 1000, "the shape opens claims");
    assert_eq!(fingerprint(plans), 9_783_561_798_968_646_347, "bare-metal plans changed");
}

#[test]
fn reference_plans_are_unchanged() {
    let plans = [100, 1000].map(|pods| provision(&shapes::reference(pods), 0));
    assert_eq!(fingerprint(plans), 17_394_925_955_686_227_804, "reference plans changed");
}

#[test]
fn random_plans_are_unchanged() {
    // As recorded before pods could wait for a resize: without one, a plan
    // is what it was.
    let without_resizes = |seed| {
        let mut snap = support::random_snapshot(seed);
        for p in snap.pods.iter_mut() {
            p.resize = None;
        }
        snap
    };
    let plans = (0..400u64).map(|seed| provision(&without_resizes(seed), 50));
    assert_eq!(fingerprint(plans), 7_973_673_992_370_181_064, "plans on random snapshots changed");
}

#[test]
fn random_plans_with_resizes_are_unchanged() {
    let plans = (0..400u64).map(|seed| provision(&support::random_snapshot(seed), 50));
    assert_eq!(fingerprint(plans), 6_641_651_164_497_116_511, "plans on random snapshots with resizes changed");
}
