//! Gangs: pods that are useful only together (the pods of one
//! ProvisioningRequest of class `best-effort-atomic-scale-up`, a multi-node
//! training job). A plan powers servers on for all of a gang's pending pods
//! or for none of them, and a gang that cannot be placed whole takes no
//! room from the other pods: [`crate::provision`] plans again without it.

use std::collections::BTreeMap;

use crate::model::Pods;
use crate::outcome::{Outcome, PodDecision, Provisioning, Unschedulable};

/// The gangs of `pods` with a pending member `plan` could not place, each
/// with why ([`Unschedulable::Gang`]).
pub fn unplaced(plan: &Provisioning, pods: &Pods) -> BTreeMap<String, Unschedulable> {
    let mut gangs: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for p in pods.iter().filter(|p| p.is_demand()) {
        if let Some(g) = p.gang.as_deref() {
            gangs.entry(g).or_default().push(p.key());
        }
    }
    let mut out = BTreeMap::new();
    for (gang, members) in gangs {
        let unplaced: Vec<&Unschedulable> = plan
            .pods
            .iter()
            .filter(|d| members.contains(&d.pod))
            .filter_map(|d| if let Outcome::Unschedulable { reason } = &d.outcome { Some(reason) } else { None })
            .collect();
        if let Some(first) = unplaced.first() {
            let why = first.to_string();
            out.insert(gang.to_string(), Unschedulable::Gang { gang: gang.to_string(), unplaced: unplaced.len(), of: members.len(), why });
        }
    }
    out
}

/// Adds the decision for every pending member of the `refused` gangs, which
/// `plan` was made without: unschedulable, for the gang's reason.
pub fn refuse(plan: &mut Provisioning, pods: &Pods, refused: &BTreeMap<String, Unschedulable>) {
    for p in pods.iter().filter(|p| p.is_demand()) {
        if let Some(reason) = p.gang.as_ref().and_then(|g| refused.get(g)) {
            plan.pods.retain(|d| d.pod != p.key());
            plan.pods.push(PodDecision {
                pod: p.key(),
                workload: p.workload.clone(),
                outcome: Outcome::Unschedulable { reason: reason.clone() },
                resize: None,
            });
        }
    }
}
