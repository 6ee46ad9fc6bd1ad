//! ServerPool status: what each pool holds against its limits, as the core
//! counts it when it enforces them, so `kubectl get serverpools` and a
//! `pool_limit` decision never disagree.

use std::collections::BTreeMap;

use ironclaim_core::model::Seconds;
use ironclaim_core::provision::PoolUsage;
use ironclaim_k8s::api::serverpool::{ArrivalRecord, ServerPoolStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::timeline;

/// The condition on a ServerPool that says whether a limit is used up.
pub const LIMIT_REACHED_CONDITION: &str = "LimitReached";

/// The status `usage` gives a pool whose status is `current`; conditions
/// keep their transition times when they do not change.
pub fn status_of(usage: &PoolUsage, current: Option<&ServerPoolStatus>, generation: Option<i64>, now_s: Seconds) -> ServerPoolStatus {
    let mut resources = BTreeMap::new();
    if usage.servers > 0 {
        resources.insert("cpu".to_string(), Quantity(cpu(usage.cpu_milli)));
        resources.insert("memory".to_string(), Quantity(bytes(usage.memory_bytes)));
        if usage.gpus > 0 {
            resources.insert(ironclaim_core::GPU.to_string(), Quantity(usage.gpus.to_string()));
        }
    }
    let mut conditions = current.map(|c| c.conditions.clone()).unwrap_or_default();
    match &usage.limit_reached {
        Some(limit) => timeline::set_condition(
            &mut conditions,
            LIMIT_REACHED_CONDITION,
            true,
            "LimitReached",
            &format!("{limit}: new claims wait"),
            now_s,
            generation,
        ),
        None => timeline::set_condition(&mut conditions, LIMIT_REACHED_CONDITION, false, "WithinLimits", "every limit has room", now_s, generation),
    }
    let arrivals = current.map(|c| c.arrivals.clone()).unwrap_or_default();
    ServerPoolStatus { servers: usage.servers, resources, watts: Some(usage.watts.round() as i64), conditions, arrivals }
}

/// How long a pool keeps the arrivals of its status when its floor says
/// nothing longer ([`ironclaim_core::AdaptiveFloor::history_s`]): the
/// default daily profile's week and a day.
pub const ARRIVAL_HISTORY_S: Seconds = 8 * 86_400;

/// How long the pool `pool` keeps its arrivals.
pub fn arrival_history_s(pool: Option<&ironclaim_core::ServerPool>) -> Seconds {
    pool.and_then(|p| p.warm.adaptive.as_ref()).map_or(ARRIVAL_HISTORY_S, |a| a.history_s().max(ARRIVAL_HISTORY_S))
}

/// At most this many arrivals are kept on a pool, the newest.
pub const MAX_ARRIVALS: usize = 5000;

/// The arrivals a pool's status keeps: those it had and those of its live
/// claims (`live`), each once, none older than `keep_s` (see
/// [`arrival_history_s`]) or from the future, oldest first, at most
/// [`MAX_ARRIVALS`].
pub fn merge_arrivals(kept: &[ArrivalRecord], live: &[ironclaim_core::Arrival], now_s: Seconds, keep_s: Seconds) -> Vec<ArrivalRecord> {
    let now = i64::try_from(now_s).unwrap_or(i64::MAX);
    let oldest = now.saturating_sub(i64::try_from(keep_s).unwrap_or(i64::MAX));
    let mut all: Vec<ArrivalRecord> = kept
        .iter()
        .cloned()
        .chain(live.iter().map(|a| ArrivalRecord {
            at: i64::try_from(a.at_s).unwrap_or(i64::MAX),
            server: a.server.clone(),
            deadline_seconds: a.deadline_s.and_then(|d| i64::try_from(d).ok()),
        }))
        .filter(|a| a.at >= oldest && a.at <= now)
        .collect();
    all.sort();
    all.dedup_by(|a, b| a.at == b.at && a.server == b.server);
    let excess = all.len().saturating_sub(MAX_ARRIVALS);
    all.drain(..excess);
    all
}

/// The merge patch that writes `status`: an empty arrivals list, left out
/// of the status, is written as null, or the arrivals it had would stay.
pub fn status_patch(status: &ServerPoolStatus) -> serde_json::Value {
    let mut patch = serde_json::json!({"status": status});
    if status.arrivals.is_empty() {
        patch["status"]["arrivals"] = serde_json::Value::Null;
    }
    patch
}

/// The arrivals a pool's status keeps, as the core takes them.
pub fn arrivals_of(status: Option<&ServerPoolStatus>) -> impl Iterator<Item = ironclaim_core::Arrival> + '_ {
    status.into_iter().flat_map(|s| &s.arrivals).filter_map(|a| {
        Some(ironclaim_core::Arrival {
            at_s: Seconds::try_from(a.at).ok()?,
            server: a.server.clone(),
            deadline_s: a.deadline_seconds.and_then(|d| Seconds::try_from(d).ok()),
        })
    })
}

/// The condition on a ServerPool that says whether its spec could be read.
pub const VALID_CONDITION: &str = "Valid";

/// Sets `Valid` on a pool's status: False with the error (which names the
/// field) when its spec could not be read.
pub fn set_valid(status: &mut ServerPoolStatus, invalid: Option<&str>, generation: Option<i64>, now_s: Seconds) {
    match invalid {
        Some(error) => timeline::set_condition(
            &mut status.conditions,
            VALID_CONDITION,
            false,
            "InvalidSpec",
            &format!("{error}; no server is claimed for this pool until it is fixed"),
            now_s,
            generation,
        ),
        None => timeline::set_condition(&mut status.conditions, VALID_CONDITION, true, "Valid", "the spec was read", now_s, generation),
    }
}

/// Exact CPU: whole cores, else millicores.
fn cpu(milli: i64) -> String {
    if milli % 1000 == 0 { (milli / 1000).to_string() } else { format!("{milli}m") }
}

/// Exact memory in the largest binary unit that divides it.
fn bytes(b: i64) -> String {
    const UNITS: [(i64, &str); 3] = [(1 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi")];
    UNITS.iter().find(|(u, _)| b != 0 && b % u == 0).map_or_else(|| b.to_string(), |(u, s)| format!("{}{s}", b / u))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(servers: i64, limit: Option<&str>) -> PoolUsage {
        PoolUsage {
            pool: "gpu".into(),
            servers,
            cpu_milli: 64_500,
            memory_bytes: 512 << 30,
            gpus: 8,
            watts: 2399.6,
            limit_reached: limit.map(str::to_string),
        }
    }

    #[test]
    fn usage_becomes_exact_quantities_and_a_limit_condition() {
        let s = status_of(&usage(1, Some("gpus 8 of 8")), None, Some(3), 100);
        assert_eq!(s.servers, 1);
        assert_eq!(s.watts, Some(2400));
        assert_eq!(s.resources["cpu"].0, "64500m");
        assert_eq!(s.resources["memory"].0, "512Gi");
        assert_eq!(s.resources[ironclaim_core::GPU].0, "8");
        let c = s.conditions.iter().find(|c| c.type_ == LIMIT_REACHED_CONDITION).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "LimitReached"));
        assert!(c.message.starts_with("gpus 8 of 8"), "{}", c.message);
        assert_eq!(c.observed_generation, Some(3));
    }

    #[test]
    fn an_unchanged_condition_keeps_its_transition_time_and_an_empty_pool_lists_no_resources() {
        let first = status_of(&usage(0, None), None, None, 100);
        assert!(first.resources.is_empty());
        let again = status_of(&usage(0, None), Some(&first), None, 500);
        assert_eq!(first, again, "nothing changed, nothing to write");
        let reached = status_of(&usage(0, Some("servers 0 of 0")), Some(&first), None, 500);
        let c = reached.conditions.iter().find(|c| c.type_ == LIMIT_REACHED_CONDITION).unwrap();
        assert_eq!(c.last_transition_time, timeline::time(500));
    }

    #[test]
    fn memory_and_cpu_are_exact() {
        assert_eq!(bytes(0), "0");
        assert_eq!(bytes(3 << 20), "3Mi");
        assert_eq!(bytes((1 << 30) + 1), ((1i64 << 30) + 1).to_string());
        assert_eq!(bytes(2 << 40), "2Ti");
        assert_eq!(cpu(32_000), "32");
        assert_eq!(cpu(500), "500m");
    }

    #[test]
    fn a_pool_with_a_malformed_cron_schedule_says_so_on_its_status_naming_the_field() {
        let pool: ironclaim_k8s::api::ServerPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
            "metadata": {"name": "batch", "generation": 3},
            "spec": {"disruption": {"budgets": [{"nodes": "1", "schedule": "61 * * * *", "duration": "1h"}]}}
        }))
        .expect("a pool the CRD admits");
        let mut index = crate::index::Index::default();
        index.apply(pool);
        let (snapshot, problems) = index.snapshot(1_000, crate::index::FailureBackoff { base_s: 60, max_s: 600 });
        assert!(snapshot.pools.is_empty(), "not planned with a schedule it cannot read");
        let error = &problems.iter().find(|p| p.object == "ServerPool batch").expect("reported").error;
        let mut status = ServerPoolStatus::default();
        set_valid(&mut status, Some(error), Some(3), 1_000);
        let c = status.conditions.iter().find(|c| c.type_ == VALID_CONDITION).expect("Valid");
        assert_eq!((c.status.as_str(), c.reason.as_str(), c.observed_generation), ("False", "InvalidSpec", Some(3)));
        assert!(c.message.contains("spec.disruption.budgets[0].schedule"), "{}", c.message);
        set_valid(&mut status, None, Some(4), 1_060);
        assert_eq!(status.conditions.iter().find(|c| c.type_ == VALID_CONDITION).map(|c| c.status.as_str()), Some("True"));
    }

    #[test]
    fn a_pool_keeps_eight_days_of_arrivals_each_once_oldest_first() {
        let day: u64 = 86_400;
        let now = 20 * day;
        let arrival = |at_s: u64, server: &str| ironclaim_core::Arrival { at_s, server: server.into(), deadline_s: Some(120) };
        let record = |at: u64, server: &str| ArrivalRecord { at: at as i64, server: server.into(), deadline_seconds: Some(120) };
        let kept = vec![record(11 * day, "too-old"), record(15 * day, "s1"), record(19 * day, "s2")];
        let live = vec![arrival(19 * day, "s2"), arrival(now - 10, "s3"), arrival(now + 10, "future")];
        let merged = merge_arrivals(&kept, &live, now, ARRIVAL_HISTORY_S);
        assert_eq!(merged, vec![record(15 * day, "s1"), record(19 * day, "s2"), record(now - 10, "s3")]);
        let back: Vec<_> = arrivals_of(Some(&ServerPoolStatus { arrivals: merged, ..Default::default() })).collect();
        assert_eq!(back[2], arrival(now - 10, "s3"));
        let many: Vec<_> = (0..MAX_ARRIVALS as u64 + 10).map(|i| arrival(now - 1000 - i, "s")).collect();
        let capped = merge_arrivals(&[], &many, now, ARRIVAL_HISTORY_S);
        assert_eq!(capped.len(), MAX_ARRIVALS);
        assert_eq!(capped.last().map(|a| a.at), Some((now - 1000) as i64), "the newest are kept");
    }

    #[test]
    fn a_pool_whose_profile_looks_back_longer_keeps_its_arrivals_longer() {
        let mut pool = ironclaim_core::ServerPool::new("p");
        assert_eq!(arrival_history_s(Some(&pool)), ARRIVAL_HISTORY_S, "no adaptive floor: the default");
        pool.warm.adaptive = Some(ironclaim_core::AdaptiveFloor { history_days: 14, ..ironclaim_core::AdaptiveFloor::new(3600) });
        assert_eq!(arrival_history_s(Some(&pool)), 15 * 86_400, "a fortnight's weekends and a day");
        pool.warm.adaptive = Some(ironclaim_core::AdaptiveFloor { history_days: 2, ..ironclaim_core::AdaptiveFloor::new(3600) });
        assert_eq!(arrival_history_s(Some(&pool)), ARRIVAL_HISTORY_S, "never less than a week and a day");
        let day: u64 = 86_400;
        let record = |at: u64| ArrivalRecord { at: at as i64, server: "s".into(), deadline_seconds: Some(120) };
        let kept = vec![record(day), record(5 * day)];
        assert_eq!(merge_arrivals(&kept, &[], 12 * day, 15 * day), kept);
        assert_eq!(merge_arrivals(&kept, &[], 12 * day, 8 * day), vec![record(5 * day)]);
    }

    #[test]
    fn a_pool_whose_arrivals_all_aged_out_has_them_removed_by_its_patch() {
        let empty = ServerPoolStatus::default();
        assert_eq!(status_patch(&empty)["status"]["arrivals"], serde_json::Value::Null);
        assert!(status_patch(&empty)["status"].as_object().is_some_and(|s| s.contains_key("arrivals")), "said, not left out");
        let one = ServerPoolStatus { arrivals: vec![ArrivalRecord { at: 1, server: "s".into(), deadline_seconds: None }], ..Default::default() };
        assert_eq!(status_patch(&one)["status"]["arrivals"][0]["server"], "s");
    }
}
