//! Gangs: pods that are useful only together (the pods of one
//! ProvisioningRequest of class `best-effort-atomic-scale-up`, a multi-node
//! training job). A plan powers servers on for all of a gang's pending pods
//! or for none of them.
//!
//! [`all_or_nothing`] runs after the scheduler: taking pods out of a
//! feasible packing leaves it feasible, so dropping a gang that cannot be
//! placed whole keeps every other decision valid.

use std::collections::{BTreeMap, HashSet};

use crate::model::Pod;
use crate::outcome::{Outcome, Provisioning, Unschedulable};

/// Makes every gang of `pods` with a pending member that the plan could
/// not place unschedulable as a whole: its members' decisions become
/// [`Unschedulable::Gang`] and the new claims lose them; a claim left with
/// no pod is dropped, so no server is powered on for part of a gang.
pub fn all_or_nothing(plan: &mut Provisioning, pods: &[Pod]) {
    let mut gangs: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for p in pods.iter().filter(|p| p.is_demand()) {
        if let Some(g) = p.gang.as_deref() {
            gangs.entry(g).or_default().push(p.key());
        }
    }
    if gangs.is_empty() {
        return;
    }
    let mut dropped: HashSet<String> = HashSet::new();
    for (gang, members) in gangs {
        let of = members.len();
        let unplaced: Vec<&Unschedulable> = plan
            .pods
            .iter()
            .filter(|d| members.contains(&d.pod))
            .filter_map(|d| if let Outcome::Unschedulable { reason } = &d.outcome { Some(reason) } else { None })
            .collect();
        if unplaced.is_empty() {
            continue;
        }
        let reason = Unschedulable::Gang { gang: gang.to_string(), unplaced: unplaced.len(), of, why: unplaced[0].to_string() };
        for d in plan.pods.iter_mut().filter(|d| members.contains(&d.pod)) {
            d.outcome = Outcome::Unschedulable { reason: reason.clone() };
        }
        dropped.extend(members);
    }
    for claim in &mut plan.claims {
        claim.pods.retain(|p| !dropped.contains(p));
    }
    plan.claims.retain(|c| !c.pods.is_empty());
}
