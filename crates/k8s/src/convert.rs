//! The ironclaim.dev resources as the core sees them.

use crate::api::server::{DEFAULT_GPU_RESOURCE, MeasuredStage, PowerState, Server};
use crate::api::serverclaim::{ServerClaim, Stage};
use crate::api::serverpool::{Disruption, DisruptionReason, NodeAfterPowerOff, ServerPool, WarmSpares};
use crate::api::{NodeRequirement, NodeTaint, RequirementOperator, TaintEffect};
use crate::duration::parse_duration_s;
use crate::error::{ConvertError, Result};
use crate::resources::{Amounts, MAX_AMOUNT, quantity};
use ironclaim_core::model::{self as core, Health, Seconds};
use ironclaim_core::schedule::{Cron, Window};
use ironclaim_core::{Operator, Requirement};
use std::collections::BTreeMap;

/// The label that carries a server's GPU model, as NVIDIA GPU feature
/// discovery names it.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

fn duration(text: &str, path: impl Fn() -> String) -> Result<Seconds> {
    parse_duration_s(text).map_err(|why| ConvertError::Duration { path: path(), text: text.to_string(), why })
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Result<String> {
    meta.name.clone().ok_or(ConvertError::Missing { path: "metadata.name".into() })
}

/// Converts a Server.
///
/// # Guarantees
/// - `capacity` is the hardware: cpu, memory, ephemeral storage, pod slots,
///   GPUs summed by resource name, and the other extended resources.
/// - Labels are the spec's, plus `nvidia.com/gpu.product` with the first
///   GPU model when the spec does not set it.
/// - Each stage duration is the measured median when the status has
///   samples, else the spec's, else the core's default; the tail ratio is
///   the measured p90 over p50 of the whole path when measured.
/// - Health: maintenance, else quarantined, else healthy (a failed
///   attempt's backoff is the controller's to judge).
///
/// # Errors
/// The first field that cannot be read, with its path.
pub fn server_to_core(server: &Server) -> Result<core::Server> {
    let name = name_of(&server.metadata)?;
    let spec = &server.spec;
    let hw = &spec.hardware;
    let mut amounts = Amounts::parse(Some(&hw.extended_resources), "spec.hardware.extendedResources")?;
    amounts.set("cpu", quantity(&hw.cpu, 1000, || "spec.hardware.cpu".into())?);
    amounts.set("memory", quantity(&hw.memory, 1, || "spec.hardware.memory".into())?);
    if let Some(q) = &hw.ephemeral_storage {
        amounts.set("ephemeral-storage", quantity(q, 1, || "spec.hardware.ephemeralStorage".into())?);
    }
    if !(1..=MAX_AMOUNT).contains(&hw.pods) {
        return Err(ConvertError::invalid("spec.hardware.pods".into(), format!("must be at least 1, found {}", hw.pods)));
    }
    amounts.set("pods", hw.pods);
    for (i, gpu) in hw.gpus.iter().enumerate() {
        let resource = gpu.resource_name.as_deref().unwrap_or(DEFAULT_GPU_RESOURCE);
        if gpu.count < 1 || gpu.count > 1 << 20 {
            return Err(ConvertError::invalid(format!("spec.hardware.gpus[{i}].count"), format!("must be at least 1, found {}", gpu.count)));
        }
        let mut one = Amounts::default();
        one.set(resource, gpu.count);
        amounts.add(&one, &format!("spec.hardware.gpus[{i}]"))?;
    }
    let mut labels = spec.labels.clone();
    if let Some(gpu) = hw.gpus.first() {
        labels.entry(GPU_PRODUCT_LABEL.to_string()).or_insert_with(|| gpu.model.clone());
    }
    let power = match &spec.power {
        None => core::PowerProfile::default(),
        Some(p) => {
            let watts = |v: i64, at: &str| {
                if (0..=1_000_000).contains(&v) {
                    Ok(v as f64)
                } else {
                    Err(ConvertError::invalid(format!("spec.power.{at}"), format!("must be between 0 and 1000000, found {v}")))
                }
            };
            let idle = watts(p.idle_watts, "idleWatts")?;
            core::PowerProfile {
                idle_watts: idle,
                peak_watts: watts(p.peak_watts, "peakWatts")?,
                boot_watts: p.boot_watts.map(|w| watts(w, "bootWatts")).transpose()?.unwrap_or(idle),
                off_watts: p.off_watts.map(|w| watts(w, "offWatts")).transpose()?.unwrap_or(0.0),
                gpu_watts: p.gpu_watts.map(|w| watts(w, "gpuWatts")).transpose()?,
            }
        }
    };
    let status = server.status.clone().unwrap_or_default();
    let durations = stage_durations(server)?;
    let health = if spec.maintenance {
        Health::Maintenance
    } else if status.misconfigured().is_some() {
        Health::Misconfigured
    } else if status.quarantined {
        Health::Quarantined
    } else {
        Health::Healthy
    };
    Ok(core::Server {
        name,
        labels: labels.into(),
        capacity: amounts.to_resources(true),
        power,
        durations,
        power_state: match status.power_state {
            Some(PowerState::On | PowerState::PoweringOn) => core::PowerState::On,
            _ => core::PowerState::Off,
        },
        health,
        failures: u32::try_from(status.failures.max(0)).unwrap_or(u32::MAX),
        claim: status.claim.filter(|c| !c.is_empty()),
        node: status.node.filter(|n| !n.is_empty()),
        idle_since_s: None,
        powering_on: matches!(status.power_state, Some(PowerState::PoweringOn)),
        unlimited: false,
        power_changes: status.power_changes.iter().map(|c| c.to_core()).collect(),
    })
}

/// The server's stage durations as [`server_to_core`] reads them, without
/// converting the rest of it.
pub fn stage_durations(server: &Server) -> Result<core::StageDurations> {
    let defaults = core::StageDurations::default();
    let spec = server.spec.stage_durations.as_ref();
    let measured = server.status.as_ref().and_then(|s| s.measured_durations.as_ref());
    let one = |measured: Option<&MeasuredStage>, configured: Option<&String>, name: &str, default: Seconds| -> Result<Seconds> {
        if let Some(m) = measured.filter(|m| m.samples > 0 && m.p50_seconds >= 0) {
            return Ok(m.p50_seconds as Seconds);
        }
        match configured {
            Some(text) => duration(text, || format!("spec.stageDurations.{name}")),
            None => Ok(default),
        }
    };
    let mut d = core::StageDurations {
        power_on_s: one(measured.and_then(|m| m.power_on.as_ref()), spec.and_then(|s| s.power_on.as_ref()), "powerOn", defaults.power_on_s)?,
        boot_s: one(measured.and_then(|m| m.boot.as_ref()), spec.and_then(|s| s.boot.as_ref()), "boot", defaults.boot_s)?,
        join_s: one(measured.and_then(|m| m.join.as_ref()), spec.and_then(|s| s.join.as_ref()), "join", defaults.join_s)?,
        ready_s: one(measured.and_then(|m| m.ready.as_ref()), spec.and_then(|s| s.ready.as_ref()), "ready", defaults.ready_s)?,
        tail_percent: spec.and_then(|s| s.tail_percent).unwrap_or(defaults.tail_percent),
    };
    if let Some(m) = measured {
        let stages = [&m.power_on, &m.boot, &m.join, &m.ready];
        let sampled = stages.iter().filter_map(|s| s.as_ref()).filter(|s| s.samples > 0 && s.p50_seconds >= 0 && s.p90_seconds >= 0);
        let (p50, p90) = sampled.fold((0i64, 0i64), |(a, b), s| (a.saturating_add(s.p50_seconds), b.saturating_add(s.p90_seconds)));
        if p50 > 0 {
            let ratio = (i128::from(p90) * 100 / i128::from(p50)).clamp(100, 1000);
            d.tail_percent = ratio as u32;
        }
    }
    Ok(d)
}

fn operator(op: RequirementOperator) -> Operator {
    match op {
        RequirementOperator::In => Operator::In,
        RequirementOperator::NotIn => Operator::NotIn,
        RequirementOperator::Exists => Operator::Exists,
        RequirementOperator::DoesNotExist => Operator::DoesNotExist,
        RequirementOperator::Gt => Operator::Gt,
        RequirementOperator::Lt => Operator::Lt,
    }
}

fn requirement(r: &NodeRequirement, path: &str) -> Result<Requirement> {
    let op = operator(r.operator);
    let values = &r.values;
    let bad = |message: &str| Err(ConvertError::invalid(format!("{path}.values"), message.to_string()));
    match op {
        Operator::In | Operator::NotIn if values.is_empty() => return bad("In and NotIn need at least one value"),
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => return bad("Exists and DoesNotExist take no values"),
        Operator::Gt | Operator::Lt if values.len() != 1 || values[0].parse::<i64>().is_err() => {
            return bad("Gt and Lt take exactly one integer value");
        }
        _ => {}
    }
    Ok(Requirement { key: r.key.clone(), operator: op, values: values.clone() })
}

fn taints(list: &[NodeTaint]) -> Vec<ironclaim_core::Taint> {
    list.iter()
        .map(|t| ironclaim_core::Taint {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: match t.effect {
                TaintEffect::NoSchedule => ironclaim_core::TaintEffect::NoSchedule,
                TaintEffect::PreferNoSchedule => ironclaim_core::TaintEffect::PreferNoSchedule,
                TaintEffect::NoExecute => ironclaim_core::TaintEffect::NoExecute,
            },
        })
        .collect()
}

/// Converts a ServerPool: requirements, template, limits, weight, default
/// deadline, warm-spare floors and headroom, and disruption policy.
/// Readiness gates are read by the controller from the ServerPool itself.
///
/// # Errors
/// The first field that cannot be read, with its path.
pub fn serverpool_to_core(pool: &ServerPool) -> Result<core::ServerPool> {
    let name = name_of(&pool.metadata)?;
    let spec = &pool.spec;
    let requirements =
        spec.requirements.iter().enumerate().map(|(i, r)| requirement(r, &format!("spec.requirements[{i}]"))).collect::<Result<_>>()?;
    let template = spec.template.clone().unwrap_or_default();
    let limits = match &spec.limits {
        None => core::Limits::default(),
        Some(l) => {
            let non_negative = |v: Option<i64>, at: &str| match v {
                Some(v) if v < 0 => Err(ConvertError::invalid(format!("spec.limits.{at}"), format!("must not be negative, found {v}"))),
                other => Ok(other),
            };
            core::Limits {
                cpu_milli: l.cpu.as_ref().map(|q| quantity(q, 1000, || "spec.limits.cpu".into())).transpose()?,
                memory_bytes: l.memory.as_ref().map(|q| quantity(q, 1, || "spec.limits.memory".into())).transpose()?,
                gpus: non_negative(l.gpus, "gpus")?,
                servers: non_negative(l.servers, "servers")?,
                watts: non_negative(l.watts, "watts")?.map(|w| w as f64),
            }
        }
    };
    let deadline_s = spec.default_deadline.as_ref().map(|d| duration(d, || "spec.defaultDeadline".into())).transpose()?;
    Ok(core::ServerPool {
        name,
        weight: spec.weight,
        requirements,
        labels: template.labels.clone().into(),
        taints: taints(&template.taints),
        startup_taints: taints(&template.startup_taints),
        limits,
        deadline_s,
        warm: spec.warm_spares.as_ref().map(warm_policy).transpose()?.unwrap_or_default(),
        disruption: spec.disruption.as_ref().map(disruption_policy).transpose()?.unwrap_or_default(),
    })
}

/// A cron schedule and its duration, which go together.
fn window(schedule: Option<&String>, length: Option<&String>, path: &str) -> Result<Option<Window>> {
    let (schedule, length) = match (schedule, length) {
        (None, None) => return Ok(None),
        (Some(s), Some(l)) => (s, l),
        _ => return Err(ConvertError::invalid(path.to_string(), "schedule and duration go together")),
    };
    let at = || format!("{path}.schedule");
    // A step larger than any cron field is a typo; refusing it here also
    // keeps the parser's arithmetic small.
    let huge_step = schedule.split_whitespace().flat_map(|f| f.split(',')).any(|part| part.split_once('/').is_some_and(|(_, step)| step.len() > 2));
    if huge_step {
        return Err(ConvertError::invalid(at(), format!("a step in {schedule:?} is larger than any cron field")));
    }
    let cron = Cron::parse(schedule).map_err(|e| ConvertError::invalid(at(), e.to_string()))?;
    let duration_s = duration(length, || format!("{path}.duration"))?;
    Ok(Some(Window { cron, duration_s }))
}

fn warm_policy(w: &WarmSpares) -> Result<core::WarmPolicy> {
    let mut floor = BTreeMap::new();
    for (i, f) in w.floor.iter().enumerate() {
        let count = u32::try_from(f.count)
            .map_err(|_| ConvertError::invalid(format!("spec.warmSpares.floor[{i}].count"), format!("must not be negative, found {}", f.count)))?;
        if floor.insert(f.class.clone(), count).is_some() {
            return Err(ConvertError::invalid(format!("spec.warmSpares.floor[{i}].class"), format!("class {:?} is listed twice", f.class)));
        }
    }
    let headroom = match &w.headroom {
        None => None,
        Some(h) => {
            let mut r = ironclaim_core::Resources::default();
            if let Some(q) = &h.cpu {
                r.cpu_milli = quantity(q, 1000, || "spec.warmSpares.headroom.cpu".into())?;
            }
            if let Some(q) = &h.memory {
                r.memory_bytes = quantity(q, 1, || "spec.warmSpares.headroom.memory".into())?;
            }
            if let Some(g) = h.gpus {
                if g < 0 {
                    return Err(ConvertError::invalid("spec.warmSpares.headroom.gpus".into(), format!("must not be negative, found {g}")));
                }
                r.set_extended(ironclaim_core::GPU, g);
            }
            Some(r)
        }
    };
    let adaptive = match &w.adaptive {
        None => None,
        Some(a) => {
            let window_s = match &a.window {
                None => DEFAULT_ADAPTIVE_WINDOW_S,
                Some(text) => duration(text, || "spec.warmSpares.adaptive.window".into())?,
            };
            if !(MIN_ADAPTIVE_WINDOW_S..=MAX_ADAPTIVE_WINDOW_S).contains(&window_s) {
                return Err(ConvertError::invalid(
                    "spec.warmSpares.adaptive.window".into(),
                    format!("must be between 1m and 168h, found {window_s}s"),
                ));
            }
            let mut floor = core::AdaptiveFloor::new(window_s);
            if let Some(days) = a.history_days {
                floor.history_days = u32::try_from(days).ok().filter(|d| *d <= 28).ok_or_else(|| {
                    ConvertError::invalid("spec.warmSpares.adaptive.historyDays".into(), format!("must be between 0 and 28, found {days}"))
                })?;
            }
            if let Some(days) = a.min_days_seen {
                floor.min_days_seen = u32::try_from(days).ok().filter(|d| (1..=28).contains(d)).ok_or_else(|| {
                    ConvertError::invalid("spec.warmSpares.adaptive.minDaysSeen".into(), format!("must be between 1 and 28, found {days}"))
                })?;
            }
            floor.weekly = a.weekly.unwrap_or(false);
            Some(floor)
        }
    };
    Ok(core::WarmPolicy {
        class_label: w.class_label.clone(),
        floor,
        headroom,
        window: window(w.schedule.as_ref(), w.duration.as_ref(), "spec.warmSpares")?,
        adaptive,
    })
}

/// The adaptive floor's look-back window when the ServerPool names none.
pub const DEFAULT_ADAPTIVE_WINDOW_S: Seconds = ironclaim_core::AdaptiveFloor::DEFAULT_WINDOW_S;
/// Shorter windows measure noise; longer ones remember a load long gone.
pub const MIN_ADAPTIVE_WINDOW_S: Seconds = 60;
pub const MAX_ADAPTIVE_WINDOW_S: Seconds = 168 * 3600;

fn disruption_policy(d: &Disruption) -> Result<core::DisruptionPolicy> {
    let (consolidate_after_s, never) = match d.consolidate_after.as_deref() {
        None => (None, false),
        Some("Never") => (None, true),
        Some(text) => (Some(duration(text, || "spec.disruption.consolidateAfter".into())?), false),
    };
    let budgets = d
        .budgets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let at = format!("spec.disruption.budgets[{i}]");
            let bad = || ConvertError::invalid(format!("{at}.nodes"), format!("expected a count or a percentage up to 100%, found {:?}", b.nodes));
            let nodes = match b.nodes.strip_suffix('%') {
                Some(p) => core::BudgetNodes::Percent(p.parse::<u32>().ok().filter(|p| *p <= 100).ok_or_else(bad)?),
                None => core::BudgetNodes::Count(b.nodes.parse::<u32>().map_err(|_| bad())?),
            };
            let reasons = b
                .reasons
                .iter()
                .map(|r| match r {
                    DisruptionReason::Empty => core::DisruptionReason::Empty,
                    DisruptionReason::Underutilized => core::DisruptionReason::Underutilized,
                    DisruptionReason::Drifted => core::DisruptionReason::Drifted,
                })
                .collect();
            Ok(core::Budget { nodes, window: window(b.schedule.as_ref(), b.duration.as_ref(), &at)?, reasons })
        })
        .collect::<Result<_>>()?;
    Ok(core::DisruptionPolicy {
        consolidate_after_s,
        never,
        budgets,
        drain_timeout_s: d.drain_timeout.as_ref().map(|t| duration(t, || "spec.disruption.drainTimeout".into())).transpose()?,
        node_after_power_off: match d.node_after_power_off {
            None | Some(NodeAfterPowerOff::Delete) => core::NodeAfterPowerOff::Delete,
            Some(NodeAfterPowerOff::Park) => core::NodeAfterPowerOff::Park,
        },
        empty_by_attrition: d.empty_by_attrition.unwrap_or(true),
    })
}

/// The claim as the core sees it while the server is on its way to Ready:
/// `None` once it is Ready or further along, or failed.
///
/// # Guarantees
/// The stage started when the last stage record began, else when the
/// claim was created (zero when neither is known).
///
/// # Errors
/// A claim without a name.
pub fn serverclaim_in_flight(claim: &ServerClaim) -> Result<Option<core::ClaimInFlight>> {
    let name = name_of(&claim.metadata)?;
    let status = claim.status.clone().unwrap_or_default();
    if status.failure_reason.is_some() {
        return Ok(None);
    }
    let stage = match status.stage.unwrap_or(Stage::Selected) {
        Stage::Selected => core::Stage::Selected,
        Stage::PoweringOn => core::Stage::PoweringOn,
        Stage::Booting => core::Stage::Booting,
        Stage::Joined => core::Stage::Joined,
        Stage::Ready | Stage::Serving => return Ok(None),
    };
    let started =
        status.stages.last().map(|r| &r.start_time).or(claim.metadata.creation_timestamp.as_ref()).map_or(0, |t| t.0.as_second().max(0) as Seconds);
    Ok(Some(core::ClaimInFlight {
        name,
        server: claim.spec.server.clone(),
        pool: claim.spec.pool.clone(),
        stage,
        stage_started_s: started,
        pods: claim.spec.pods.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect(),
    }))
}
