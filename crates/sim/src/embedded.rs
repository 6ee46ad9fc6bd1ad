//! The embedded default: one day on a rack of 40 servers.
//!
//! - 24 general servers (32 vCPU, 128 GiB), 10 high-memory servers
//!   (64 vCPU, 512 GiB) and 6 GPU hosts (64 vCPU, 512 GiB, 4 A100), in
//!   three racks; GPU hosts sit in a tainted `gpu` ServerPool and take longer
//!   to become Ready (driver validation).
//! - A node-exporter DaemonSet on every node.
//! - `platform`: 6 small pods that run all day.
//! - `web`: replicas follow a diurnal request-rate curve as KEDA would scale
//!   them (polled every 30 s, 50 requests/s per replica, scale-down after a
//!   5-minute stabilisation window), down to zero at night. Deadline 2 min.
//! - `batch`: a nightly job of 30 pods at 01:00 and 6 high-memory pods at
//!   02:00, each running 30 to 120 minutes. Deadline 1 and 2 hours.
//! - `inference`: bursts of GPU pods during the day. Deadline 15 minutes.
//!
//! On weekend days (of several days in a row, `days`; the first is a
//! Thursday, as the Unix epoch was) the web service sees
//! [`WEEKEND_WEB_SHARE`] of its weekday traffic and the inference bursts
//! come a third as often.
//!
//! Everything random is drawn from the run's seed.

use crate::rng::{standard_normal, stream};
use crate::workload::{HARDWARE_LABEL, TracePod, Workload, hardware_server, pod_requests};
use ironclaim_core::labels::{TaintEffect, TolerationOperator, ZONE};
use ironclaim_core::resources::GPU;
use ironclaim_core::{DaemonSet, Operator, Pod, PowerProfile, Requirement, Seconds, Server, ServerPool, StageDurations, Taint, Toleration};
use rand::RngExt;

pub const DAY_S: Seconds = 86_400;

fn server(name: &str, class: &str, rack: u32, cpu: i64, mem_gib: i64, gpus: i64) -> Server {
    let mut s = hardware_server(name, cpu * 1000, mem_gib * 1024, gpus, if gpus > 0 { "A100" } else { "" });
    s.labels.insert(HARDWARE_LABEL.to_string(), class.to_string());
    s.labels.insert(ZONE.to_string(), format!("rack-{rack}"));
    if gpus > 0 {
        s.labels.insert("accelerator".to_string(), "nvidia-a100".to_string());
        s.power = PowerProfile::new(480.0, 2400.0, 650.0, 15.0);
        s.durations = StageDurations { power_on_s: 45, boot_s: 360, join_s: 60, ready_s: 300, tail_percent: 170 };
    } else if mem_gib >= 512 {
        s.power = PowerProfile::new(210.0, 620.0, 300.0, 10.0);
        s.durations = StageDurations { power_on_s: 45, boot_s: 300, join_s: 60, ready_s: 45, tail_percent: 160 };
    } else {
        s.power = PowerProfile::new(150.0, 380.0, 230.0, 8.0);
        s.durations = StageDurations { power_on_s: 45, boot_s: 240, join_s: 60, ready_s: 45, tail_percent: 160 };
    }
    s
}

fn rack_servers() -> Vec<Server> {
    let mut v = Vec::new();
    for i in 0..24 {
        v.push(server(&format!("gen-{:02}", i + 1), "general-32", 1 + i / 12, 32, 128, 0));
    }
    for i in 0..10 {
        v.push(server(&format!("mem-{:02}", i + 1), "highmem-64", 3, 64, 512, 0));
    }
    for i in 0..6 {
        v.push(server(&format!("gpu-{:02}", i + 1), "a100x4", 3, 64, 512, 4));
    }
    v
}

fn pools() -> Vec<ServerPool> {
    let mut general = ServerPool::new("general");
    general.requirements = vec![Requirement::new(HARDWARE_LABEL, Operator::In, &["general-32", "highmem-64"])];
    general.deadline_s = Some(1800);
    let mut gpu = ServerPool::new("gpu");
    gpu.weight = 10;
    gpu.requirements = vec![Requirement::new("accelerator", Operator::Exists, &[])];
    gpu.taints = vec![Taint::new(GPU, "true", TaintEffect::NoSchedule)];
    gpu.deadline_s = Some(1800);
    vec![general, gpu]
}

fn daemonsets() -> Vec<DaemonSet> {
    let mut t = Pod::new("monitoring", "node-exporter", pod_requests(100, 128, 0, 0));
    t.tolerations.push(Toleration { operator: TolerationOperator::Exists, ..Default::default() });
    vec![DaemonSet { namespace: "monitoring".into(), name: "node-exporter".into(), template: t }]
}

/// Requests per second the web service receives at second `t` of the day:
/// nothing from 23:30 to 06:00, a morning ramp, a daytime plateau and an
/// evening peak.
pub fn web_request_rate(t: Seconds) -> f64 {
    let h = (t % DAY_S) as f64 / 3600.0;
    let bell = |centre: f64, width: f64| (-((h - centre) / width).powi(2)).exp();
    if !(6.0..=23.5).contains(&h) {
        return 0.0;
    }
    1600.0 * bell(13.0, 4.0) + 2400.0 * bell(20.0, 1.6)
}

/// The share of a weekday's web traffic a weekend day sees.
pub const WEEKEND_WEB_SHARE: f64 = 0.4;

/// The embedded day, drawn from `seed`: a weekday.
pub fn default_day(seed: u64) -> Workload {
    day(seed, false)
}

/// One day of the embedded workload, a weekday's or a weekend day's.
fn day(seed: u64, weekend: bool) -> Workload {
    let (web_share, burst_gap_s) = if weekend { (WEEKEND_WEB_SHARE, 3.0 * 7200.0) } else { (1.0, 7200.0) };
    let mut rng = stream(seed, "embedded-day", 0);
    let mut pods: Vec<TracePod> = Vec::new();
    let push = |pods: &mut Vec<TracePod>, mut pod: Pod, workload: &str, deadline: Seconds, from: Seconds, to: Option<Seconds>| {
        pod.workload = Some(workload.to_string());
        pod.deadline_s = Some(deadline);
        pod.created_s = from;
        pod = pod.with_labels(&[("app", workload)]);
        pods.push(TracePod { pod, arrival_s: from, departure_s: to, resize: None });
    };
    for i in 0..6 {
        let pod = Pod::new("platform", &format!("platform-{i}"), pod_requests(2000, 8 * 1024, 0, 0));
        push(&mut pods, pod, "platform", 600, 0, None);
    }

    // web: KEDA polling every 30 s, 50 rps per replica, 5-minute scale-down window.
    let per_replica = 50.0;
    let mut live: Vec<(usize, Seconds)> = Vec::new();
    let mut serial = 0;
    let mut wanted_history: Vec<(Seconds, usize)> = Vec::new();
    let mut t = 0;
    while t < DAY_S {
        let noise = 1.0 + 0.08 * standard_normal(&mut rng);
        let rate = (web_request_rate(t) * web_share * noise).max(0.0);
        let wanted = (rate / per_replica).ceil() as usize;
        wanted_history.push((t, wanted));
        wanted_history.retain(|&(at, _)| at + 300 > t);
        let stabilised = wanted_history.iter().map(|&(_, w)| w).max().unwrap_or(0);
        if wanted > live.len() {
            for _ in live.len()..wanted {
                live.push((serial, t));
                serial += 1;
            }
        } else if stabilised < live.len() {
            while live.len() > stabilised {
                if let Some((id, from)) = live.pop() {
                    let pod = Pod::new("shop", &format!("web-{id}"), pod_requests(2000, 4 * 1024, 0, 0));
                    push(&mut pods, pod, "web", 120, from, Some(t));
                }
            }
        }
        t += 30;
    }
    for (id, from) in live {
        let pod = Pod::new("shop", &format!("web-{id}"), pod_requests(2000, 4 * 1024, 0, 0));
        push(&mut pods, pod, "web", 120, from, Some(DAY_S));
    }

    // batch: nightly.
    for i in 0..30 {
        let start = 3600 + rng.random_range(0..120);
        let run = rng.random_range(30 * 60..90 * 60);
        let pod = Pod::new("analytics", &format!("etl-{i}"), pod_requests(8000, 32 * 1024, 0, 0));
        push(&mut pods, pod, "batch", 3600, start, Some(start + run));
    }
    for i in 0..6 {
        let start = 2 * 3600 + rng.random_range(0..120);
        let run = rng.random_range(60 * 60..120 * 60);
        let pod = Pod::new("analytics", &format!("join-{i}"), pod_requests(48_000, 384 * 1024, 0, 0));
        push(&mut pods, pod, "batch-highmem", 7200, start, Some(start + run));
    }

    // inference: bursts between 08:00 and 20:00, about one every two hours.
    let mut at: f64 = 8.0 * 3600.0;
    let mut burst = 0;
    loop {
        let u: f64 = rng.random::<f64>().max(1e-12);
        at += -u.ln() * burst_gap_s;
        if at >= 20.0 * 3600.0 {
            break;
        }
        let n = rng.random_range(2..=8);
        let run = rng.random_range(20 * 60..60 * 60);
        for k in 0..n {
            let mut pod = Pod::new("ml", &format!("infer-{burst}-{k}"), pod_requests(8000, 64 * 1024, 1, 1000))
                .with_node_selector(&[("accelerator", "nvidia-a100")]);
            pod.tolerations.push(Toleration {
                key: GPU.into(),
                operator: TolerationOperator::Exists,
                effect: Some(TaintEffect::NoSchedule),
                ..Default::default()
            });
            let start = at as Seconds + k as Seconds;
            push(&mut pods, pod, "inference", 900, start, Some(start + run));
        }
        burst += 1;
    }
    pods.sort_by(|a, b| a.arrival_s.cmp(&b.arrival_s).then(a.pod.name.cmp(&b.pod.name)));
    Workload { name: "embedded day".into(), servers: rack_servers(), pools: pools(), daemonsets: daemonsets(), pods, end_s: DAY_S }
}

/// `days` embedded days in a row, the first as [`default_day`] draws it
/// and each later one from a seed of its own: the same rhythm with other
/// noise, bursts and batch sizes. The platform pods run throughout; the
/// rest of a day's pods are named with the day (`web-12-d3`).
pub fn days(seed: u64, days: u32) -> Workload {
    let mut w = default_day(seed);
    if days <= 1 {
        return w;
    }
    for d in 1..u64::from(days) {
        let day = day(seed.wrapping_add(d.wrapping_mul(0x9E37_79B9_7F4A_7C15)), ironclaim_core::warm::is_weekend(d * DAY_S));
        for mut tp in day.pods.into_iter().filter(|tp| tp.departure_s.is_some()) {
            tp.pod.name = format!("{}-d{d}", tp.pod.name);
            tp.arrival_s += d * DAY_S;
            tp.pod.created_s += d * DAY_S;
            tp.departure_s = tp.departure_s.map(|t| t + d * DAY_S);
            w.pods.push(tp);
        }
    }
    w.pods.sort_by(|a, b| a.arrival_s.cmp(&b.arrival_s).then(a.pod.name.cmp(&b.pod.name)));
    w.name = format!("embedded days ({days})");
    w.end_s = u64::from(days) * DAY_S;
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_web_scales_to_zero_at_night_and_peaks_in_the_evening() {
        assert_eq!(web_request_rate(3 * 3600), 0.0);
        assert!(web_request_rate(20 * 3600) > web_request_rate(10 * 3600));
    }

    #[test]
    fn days_repeat_the_rhythm_with_names_of_their_own() {
        let one = default_day(4);
        let three = days(4, 3);
        assert_eq!(three.end_s, 3 * DAY_S);
        let first: Vec<_> = three.pods.iter().filter(|p| p.arrival_s < DAY_S).map(|p| (p.pod.name.clone(), p.arrival_s)).collect();
        assert_eq!(first, one.pods.iter().map(|p| (p.pod.name.clone(), p.arrival_s)).collect::<Vec<_>>(), "the first day is the day");
        let mut names: Vec<_> = three.pods.iter().map(|p| (&p.pod.namespace, &p.pod.name)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), three.pods.len(), "every pod has a name of its own");
        let platform = three.pods.iter().filter(|p| p.pod.namespace == "platform").count();
        assert_eq!(platform, 6, "the platform runs throughout, once");
        // Each day has its morning ramp.
        for d in 0..3 {
            let web = three.pods.iter().filter(|p| p.pod.namespace == "shop" && p.arrival_s / DAY_S == d && p.arrival_s % DAY_S < 9 * 3600).count();
            assert!(web > 0, "day {d} has a morning ramp");
        }
        assert!(three.pods.iter().all(|p| p.departure_s.is_none_or(|t| t <= 3 * DAY_S + 3 * 3600)));
    }

    #[test]
    fn weekend_days_are_quieter_and_come_on_the_calendar() {
        let week = days(4, 7);
        let web_on = |d: u64| week.pods.iter().filter(|p| p.pod.workload.as_deref() == Some("web") && p.arrival_s / DAY_S == d).count();
        // Day 0 is a Thursday: days 2 and 3 are Saturday and Sunday.
        for weekend in [2, 3] {
            for weekday in [1, 4] {
                assert!(web_on(weekend) * 2 < web_on(weekday), "day {weekend}: {} against day {weekday}: {}", web_on(weekend), web_on(weekday));
            }
        }
    }

    #[test]
    fn the_day_has_every_workload_and_the_same_seed_gives_the_same_day() {
        let a = default_day(4);
        assert_eq!(a.servers.len(), 40);
        for w in ["platform", "web", "batch", "batch-highmem", "inference"] {
            assert!(a.pods.iter().any(|p| p.pod.workload.as_deref() == Some(w)), "{w}");
        }
        let night_web = a
            .pods
            .iter()
            .filter(|p| p.pod.workload.as_deref() == Some("web"))
            .filter(|p| p.arrival_s <= 3 * 3600 && p.departure_s.is_none_or(|d| d > 3 * 3600))
            .count();
        assert_eq!(night_web, 0);
        assert_eq!(a.pods.len(), default_day(4).pods.len());
        assert_eq!(a.pods[10].arrival_s, default_day(4).pods[10].arrival_s);
    }
}
