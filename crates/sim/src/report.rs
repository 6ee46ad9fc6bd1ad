//! The comparison report: per-policy figures, the oracle bound, the pods no
//! server can host, and the series behind the plots. Serialises to the
//! documented JSON and renders as a terminal table.

use crate::config::{Scoring, SimConfig};
use crate::engine::{FailureCount, RunStats};
use crate::oracle::OracleBound;
use crate::sample::PeakDemand;
use ironclaim_core::Seconds;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    pub workload: WorkloadSummary,
    pub settings: SimConfig,
    pub oracle: OracleSummary,
    pub policies: Vec<PolicyReport>,
    /// The ironclaim policy under both scheduler scoring strategies.
    pub scoring: Option<ScoringComparison>,
    pub unplaceable: Vec<UnplaceableGroup>,
    pub timeline: TimelineReport,
    /// The ironclaim policy over `--sweep`'s settings, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<crate::pareto::Sweep>,
    /// Each server's state over the ironclaim policy's run (else the first
    /// policy's), when the settings record them
    /// (`SimConfig::record_states`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<Replay>,
}

/// The rack over a run, for the report's replay: at each of the
/// timeline's samples, a character per server (`0` off, `1` booting, `2`
/// idle, `3` running pods, `4` draining; `crate::engine::ServerState`).
#[derive(Clone, Debug, Serialize)]
pub struct Replay {
    pub policy: &'static str,
    pub servers: Vec<String>,
    /// Each server's hardware class, by which the replay groups them.
    pub classes: Vec<String>,
    pub states: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct WorkloadSummary {
    pub name: String,
    pub servers: usize,
    pub hardware_classes: usize,
    pub pods: usize,
    pub pods_unplaceable: usize,
    pub duration_s: Seconds,
    pub peak: PeakDemand,
}

impl WorkloadSummary {
    /// `8 servers in 3 hardware classes, 1 pod (0 no server can host), 1d 00h simulated`
    pub fn describe(&self) -> String {
        format!(
            "{} in {}, {} ({} no server can host), {} simulated",
            count(self.servers as u64, "server", "servers"),
            count(self.hardware_classes as u64, "hardware class", "hardware classes"),
            count(self.pods as u64, "pod", "pods"),
            self.pods_unplaceable,
            human_s(self.duration_s)
        )
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct OracleSummary {
    pub energy_kwh: f64,
    pub servers_mean: f64,
    pub segments: u64,
    pub fallbacks: u64,
    /// Segments where the bound that keeps load on powered servers was the
    /// higher.
    pub coupled: u64,
}

impl From<&OracleBound> for OracleSummary {
    fn from(o: &OracleBound) -> Self {
        OracleSummary { energy_kwh: o.energy_kwh, servers_mean: o.servers_mean, segments: o.segments, fallbacks: o.fallbacks, coupled: o.coupled }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: Seconds,
    pub p95: Seconds,
    pub p99: Seconds,
    pub max: Seconds,
    pub mean: f64,
}

/// Nearest-rank percentiles.
pub fn percentiles(values: &[Seconds]) -> Percentiles {
    if values.is_empty() {
        return Percentiles::default();
    }
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Percentiles {
        p50: rank(0.50),
        p95: rank(0.95),
        p99: rank(0.99),
        max: v[v.len() - 1],
        mean: v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64,
    }
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct MeanPeak {
    pub mean: f64,
    pub peak: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Claims {
    pub for_pods: u64,
    pub spares: u64,
    pub ready: u64,
    pub failed: u64,
    pub in_flight_at_end: u64,
    pub failures: Vec<FailureCount>,
    /// The first failed claims one by one (server, stage, reason, times).
    pub failed_claims: Vec<crate::engine::FailedClaim>,
    /// Time from claim to Ready of the claims that got there.
    pub to_ready_s: Percentiles,
}

#[derive(Clone, Debug, Serialize)]
pub struct Waiting {
    pub reason: String,
    pub pods: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PolicyReport {
    pub policy: &'static str,
    pub scoring: Scoring,
    pub energy_kwh: f64,
    /// Of which drawn above idle by utilisation; the rest is servers being
    /// on (idle), booting, stopping or off.
    pub dynamic_kwh: f64,
    /// Share of always-on's energy saved (0.45 = 45 % less); None when
    /// always-on was not run.
    pub saved_vs_always_on: Option<f64>,
    pub oracle_energy_kwh: f64,
    pub oracle_ratio: f64,
    pub powered_servers: MeanPeak,
    /// Pending time of placeable pods (see docs/simulate.md).
    pub pending_s: Percentiles,
    pub pods_placed: u64,
    pub pods_unplaceable: u64,
    pub pods_withdrawn: u64,
    pub pods_pending_at_end: u64,
    pub deadline_misses: u64,
    /// The misses by the pods' workload.
    pub deadline_misses_by_workload: std::collections::BTreeMap<String, u64>,
    /// Pending time by the pods' workload.
    pub pending_by_workload_s: std::collections::BTreeMap<String, Percentiles>,
    pub power_on_cycles: u64,
    pub power_on_cycles_per_server: MeanPeak,
    /// The most times one server was powered off within 24 hours.
    #[serde(default)]
    pub peak_power_offs_per_day: u32,
    pub claims: Claims,
    /// Power-offs the rack's fresh checks refused.
    pub power_offs_refused: u64,
    pub drains_done: u64,
    /// Workload pods evicted by drains; each waited again as a new pod.
    #[serde(default)]
    pub pods_evicted: u64,
    /// In-place resizes asked, applied where the pod ran, and pods made
    /// again at their new size.
    #[serde(default)]
    pub resizes: crate::engine::Resizes,
    pub provision_calls: u64,
    pub scale_down_passes: u64,
    pub quarantined_servers: u64,
    pub waiting_at_end: Vec<Waiting>,
    pub violations: Vec<crate::check::Violation>,
    /// The first policy of the run that is no worse on energy, deadline
    /// misses and p99 pending and better on one; None: on the frontier.
    pub dominated_by: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScoringComparison {
    pub policy: &'static str,
    pub least_allocated_kwh: f64,
    pub most_allocated_kwh: f64,
    /// Energy other than utilisation (idle, boot, off): what packing saves.
    pub least_allocated_base_kwh: f64,
    pub most_allocated_base_kwh: f64,
    pub least_allocated_powered_mean: f64,
    pub most_allocated_powered_mean: f64,
    /// Energy MostAllocated saves against LeastAllocated (fraction).
    pub most_allocated_saves: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct UnplaceableGroup {
    pub reason: String,
    pub pods: usize,
    pub examples: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PolicySeries {
    pub policy: &'static str,
    pub powered: Vec<u32>,
    pub watts: Vec<f64>,
    pub pending: Vec<u32>,
    /// Pending-time distribution: (upper bound in seconds, share of pods
    /// pending at most that long).
    pub pending_cdf: Vec<(Seconds, f64)>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TimelineReport {
    pub at_s: Vec<Seconds>,
    /// Servers the oracle needs at each sample.
    pub demand_servers: Vec<u32>,
    pub policies: Vec<PolicySeries>,
}

/// Bucket bounds of the pending-time distribution.
pub const CDF_BOUNDS_S: [Seconds; 14] = [0, 1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 86_400];

pub fn pending_cdf(values: &[Seconds]) -> Vec<(Seconds, f64)> {
    let n = values.len().max(1) as f64;
    CDF_BOUNDS_S.iter().map(|&b| (b, values.iter().filter(|&&v| v <= b).count() as f64 / n)).collect()
}

impl PolicyReport {
    pub fn from_stats(s: &RunStats, oracle_kwh: f64, unplaceable: u64) -> Self {
        let cycles: u64 = s.power_on_cycles.iter().map(|&c| u64::from(c)).sum();
        let servers = s.power_on_cycles.len().max(1) as f64;
        let failed: u64 = s.failures.iter().map(|f| f.count).sum();
        PolicyReport {
            policy: s.policy.name(),
            scoring: s.scoring,
            energy_kwh: s.energy_kwh,
            dynamic_kwh: s.dynamic_kwh,
            saved_vs_always_on: None,
            oracle_energy_kwh: oracle_kwh,
            oracle_ratio: if oracle_kwh > 0.0 { s.energy_kwh / oracle_kwh } else { 0.0 },
            powered_servers: MeanPeak { mean: s.powered_mean, peak: s.powered_peak as f64 },
            pending_s: percentiles(&s.pending_s),
            pods_placed: s.pods_placed,
            pods_unplaceable: unplaceable,
            pods_withdrawn: s.pods_withdrawn,
            pods_pending_at_end: s.pods_pending_at_end,
            deadline_misses: s.deadline_misses,
            deadline_misses_by_workload: s.deadline_misses_by_workload.clone(),
            pending_by_workload_s: s.pending_by_workload_s.iter().map(|(w, v)| (w.clone(), percentiles(v))).collect(),
            power_on_cycles: cycles,
            power_on_cycles_per_server: MeanPeak {
                mean: cycles as f64 / servers,
                peak: f64::from(s.power_on_cycles.iter().copied().max().unwrap_or(0)),
            },
            peak_power_offs_per_day: s.peak_power_offs_per_day,
            claims: Claims {
                for_pods: s.claims_for_pods,
                spares: s.claims_spare,
                ready: s.claims_ready,
                failed,
                in_flight_at_end: s.claims_in_flight_at_end,
                failures: s.failures.clone(),
                failed_claims: s.failed_claims.clone(),
                to_ready_s: percentiles(&s.cold_to_ready_s),
            },
            power_offs_refused: s.power_offs_refused,
            drains_done: s.drains_done,
            pods_evicted: s.pods_evicted,
            resizes: s.resizes,
            scale_down_passes: s.scale_down_passes,
            provision_calls: s.provision_calls,
            quarantined_servers: s.quarantined,
            waiting_at_end: s.waiting_reasons.iter().map(|(r, n)| Waiting { reason: r.clone(), pods: *n }).collect(),
            violations: s.violations.clone(),
            dominated_by: None,
        }
    }

    /// What the run cost, as the Pareto picture weighs it.
    pub fn costs(&self) -> crate::pareto::Costs {
        crate::pareto::Costs { energy_kwh: self.energy_kwh, deadline_misses: self.deadline_misses, pending_p99_s: self.pending_s.p99 }
    }
}

/// A count and its noun in agreement: `count(1, "pod", "pods")` is
/// `1 pod`, `count(0, "pod", "pods")` is `0 pods`.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `1h 05m`, `12m 30s`, `45s`.
pub fn human_s(s: Seconds) -> String {
    if s >= 86_400 {
        format!("{}d {:02}h", s / 86_400, (s % 86_400) / 3600)
    } else if s >= 3600 {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

impl Report {
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The settings line printed at the start of a run.
    pub fn settings_line(&self) -> String {
        let s = &self.settings;
        format!(
            "seed={} quiet_max_s={} batch_idle_s={} batch_max_s={} scoring={} {} quarantine_after_failures={}",
            s.seed, s.quiet_max_s, s.batch_idle_s, s.batch_max_s, s.scoring, s.faults, s.quarantine_after_failures
        )
    }

    /// One row per policy; when that is wider than `width`, one column per
    /// policy instead (four policies fit 100 columns that way, where twelve
    /// figures a row do not), wrapped at spaces to the width.
    fn policy_table(&self, width: Option<u16>) -> comfy_table::Table {
        use comfy_table::{CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
        // Each figure's header in a row per policy, and its label in a column per policy.
        const FIGURES: [(&str, &str); 11] = [
            ("energy kWh", "energy kWh"),
            ("saved", "saved"),
            ("x oracle", "x oracle"),
            ("powered mean/peak", "powered mean/peak"),
            ("pending p50", "pending p50"),
            ("p95", "pending p95"),
            ("p99", "pending p99"),
            ("max", "pending max"),
            ("deadline misses", "deadline misses"),
            ("power-ons", "power-ons"),
            ("claims ok/failed", "claims ok/failed"),
        ];
        let rows: Vec<[String; 11]> = self
            .policies
            .iter()
            .map(|p| {
                [
                    format!("{:.1}", p.energy_kwh),
                    p.saved_vs_always_on.map(|s| format!("{:.1} %", s * 100.0)).unwrap_or_else(|| "-".into()),
                    format!("{:.2}", p.oracle_ratio),
                    format!("{:.1} / {:.0}", p.powered_servers.mean, p.powered_servers.peak),
                    human_s(p.pending_s.p50),
                    human_s(p.pending_s.p95),
                    human_s(p.pending_s.p99),
                    human_s(p.pending_s.max),
                    p.deadline_misses.to_string(),
                    format!("{} ({:.1}/server, ≤{} off/day)", p.power_on_cycles, p.power_on_cycles_per_server.mean, p.peak_power_offs_per_day),
                    format!("{}/{}", p.claims.ready, p.claims.failed),
                ]
            })
            .collect();
        let table = |header: Vec<String>, body: Vec<Vec<String>>| {
            let mut t = Table::new();
            t.load_preset(UTF8_FULL_CONDENSED).set_header(header);
            for row in body {
                t.add_row(row);
            }
            for i in 1..t.column_count() {
                if let Some(col) = t.column_mut(i) {
                    col.set_cell_alignment(CellAlignment::Right);
                }
            }
            t
        };
        let mut header = vec!["policy".to_string()];
        header.extend(FIGURES.iter().map(|(f, _)| f.to_string()));
        let wide = table(
            header,
            self.policies
                .iter()
                .zip(&rows)
                .map(|(p, figures)| std::iter::once(p.policy.to_string()).chain(figures.iter().cloned()).collect())
                .collect(),
        );
        let Some(width) = width else { return wide };
        let wide_width = wide.to_string().lines().next().map_or(0, |l| l.chars().count());
        if wide_width <= usize::from(width) {
            return wide;
        }
        let mut header = vec![String::new()];
        header.extend(self.policies.iter().map(|p| p.policy.to_string()));
        let mut tall = table(
            header,
            FIGURES.iter().enumerate().map(|(i, (_, f))| std::iter::once(f.to_string()).chain(rows.iter().map(|r| r[i].clone())).collect()).collect(),
        );
        tall.set_content_arrangement(ContentArrangement::Dynamic).set_width(width);
        tall
    }

    /// The comparison as text: a summary, the table of policies and what
    /// went wrong. The table is fitted to `width` columns when given (the
    /// terminal's), else laid out at its natural width.
    pub fn to_table(&self, width: Option<u16>) -> String {
        let mut out = String::new();
        let w = &self.workload;
        out.push_str(&format!("workload {}: {}\n", w.name, w.describe()));
        out.push_str(&format!("oracle lower bound: {:.1} kWh, {:.1} servers on average\n", self.oracle.energy_kwh, self.oracle.servers_mean));
        out.push_str(&self.policy_table(width).to_string());
        out.push('\n');
        for p in &self.policies {
            if p.pending_by_workload_s.len() > 1 {
                let parts: Vec<String> = p.pending_by_workload_s.iter().map(|(w, q)| format!("{w} {}/{}", human_s(q.p95), human_s(q.p99))).collect();
                out.push_str(&format!("{} pending p95/p99 by workload: {}\n", p.policy, parts.join(", ")));
            }
            if !p.deadline_misses_by_workload.is_empty() {
                let parts: Vec<String> = p.deadline_misses_by_workload.iter().map(|(w, n)| format!("{w} {n}")).collect();
                out.push_str(&format!("{} deadline misses by workload: {}\n", p.policy, parts.join(", ")));
            }
            if !p.claims.failures.is_empty() {
                let parts: Vec<String> = p.claims.failures.iter().map(|f| format!("{} at {}: {}", f.reason, f.stage, f.count)).collect();
                out.push_str(&format!("{} claim failures: {}\n", p.policy, parts.join(", ")));
            }
            if p.pods_evicted > 0 {
                out.push_str(&format!("{} drains: {}, moving {} pods (each waited again as a new pod)\n", p.policy, p.drains_done, p.pods_evicted));
            }
            if p.resizes.asked > 0 {
                let r = &p.resizes;
                out.push_str(&format!(
                    "{} in-place resizes: {} asked, {} applied where the pod ran, {} made again at the new size\n",
                    p.policy, r.asked, r.in_place, r.recreated
                ));
            }
            if !p.violations.is_empty() {
                out.push_str(&format!("{} CHECKER VIOLATIONS: {}\n", p.policy, p.violations.len()));
                for v in p.violations.iter().take(5) {
                    out.push_str(&format!("  at {}s [{}] {}\n", v.at_s, v.checker, v.message));
                }
            }
        }
        out.push_str(&self.frontier_line());
        if let Some(sweep) = &self.sweep {
            out.push_str(&sweep_table(sweep, width));
            out.push('\n');
        }
        if let Some(s) = &self.scoring {
            out.push_str(&format!(
                "scheduler scoring ({}): least-allocated {:.1} kWh ({:.1} servers on), most-allocated {:.1} kWh ({:.1} on): packing saves {:.1} % ({:.1} % of the energy beyond utilisation)\n",
                s.policy,
                s.least_allocated_kwh,
                s.least_allocated_powered_mean,
                s.most_allocated_kwh,
                s.most_allocated_powered_mean,
                s.most_allocated_saves * 100.0,
                if s.least_allocated_base_kwh > 0.0 { (1.0 - s.most_allocated_base_kwh / s.least_allocated_base_kwh) * 100.0 } else { 0.0 }
            ));
        }
        if !self.unplaceable.is_empty() {
            out.push_str("pods no server can host:\n");
            for g in &self.unplaceable {
                out.push_str(&format!("  {}: {} (e.g. {})\n", count(g.pods as u64, "pod", "pods"), g.reason, g.examples.join(", ")));
            }
        }
        out
    }
}

impl Report {
    /// Which policies are on the frontier of energy against deadline misses
    /// and p99 pending, and what dominates the others.
    pub fn frontier_line(&self) -> String {
        let on: Vec<&str> = self.policies.iter().filter(|p| p.dominated_by.is_none()).map(|p| p.policy).collect();
        let mut line = format!("frontier of energy, deadline misses and p99 pending: {}", on.join(", "));
        for p in &self.policies {
            if let Some(by) = p.dominated_by {
                line.push_str(&format!("; {} is dominated by {by}", p.policy));
            }
        }
        line.push('\n');
        line
    }
}

/// The sweep's runs, fewest kWh first, its frontier marked.
fn sweep_table(sweep: &crate::pareto::Sweep, width: Option<u16>) -> String {
    use comfy_table::{CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header(["ironclaim", "energy kWh", "deadline misses", "pending p99", "frontier"]);
    let mut points: Vec<&crate::pareto::SweepPoint> = sweep.points.iter().collect();
    points.sort_by(|a, b| a.costs.energy_kwh.total_cmp(&b.costs.energy_kwh).then(a.costs.deadline_misses.cmp(&b.costs.deadline_misses)));
    for p in points {
        t.add_row([
            p.label(),
            format!("{:.1}", p.costs.energy_kwh),
            p.costs.deadline_misses.to_string(),
            human_s(p.costs.pending_p99_s),
            if p.frontier { "yes".into() } else { String::new() },
        ]);
    }
    for i in 1..t.column_count() {
        if let Some(col) = t.column_mut(i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    if let Some(width) = width {
        t.set_content_arrangement(ContentArrangement::Dynamic).set_width(width);
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Seconds> = (1..=100).collect();
        let p = percentiles(&v);
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50, 95, 99, 100));
        assert_eq!(percentiles(&[7]).p99, 7);
        assert_eq!(percentiles(&[]).max, 0);
    }

    #[test]
    fn counts_of_one_are_singular() {
        assert_eq!(count(1, "pod", "pods"), "1 pod");
        assert_eq!(count(0, "pod", "pods"), "0 pods");
        let w = WorkloadSummary {
            name: "one".into(),
            servers: 1,
            hardware_classes: 1,
            pods: 1,
            pods_unplaceable: 0,
            duration_s: 60,
            peak: PeakDemand::default(),
        };
        assert_eq!(w.describe(), "1 server in 1 hardware class, 1 pod (0 no server can host), 1m 00s simulated");
        let w = WorkloadSummary { servers: 2, hardware_classes: 2, pods: 0, ..w };
        assert_eq!(w.describe(), "2 servers in 2 hardware classes, 0 pods (0 no server can host), 1m 00s simulated");
    }

    #[test]
    fn the_table_fits_the_width_it_is_given() {
        let doc = "servers:\n  - {name: r1, cpu_milli: 32000, memory_mib: 131072}\n\
                   pods:\n  - {name: web, cpu_milli: 1000, memory_mib: 2048, arrival_s: 10, departure_s: 70}\n";
        let d = crate::trace::parse_user_yaml(std::path::Path::new("u.yaml"), doc).unwrap();
        let w = crate::trace::workload_from_rows("u", &d.servers, &d.pods);
        let report = crate::compare::compare(&w, &SimConfig::default(), &crate::PolicyKind::ALL, &|_, _| {});
        let table_lines = |text: &str| -> Vec<usize> {
            text.lines().filter(|l| l.starts_with(['┌', '│', '╞', '├', '└'])).map(|l| l.chars().count()).collect()
        };
        let natural = table_lines(&report.to_table(None));
        assert!(natural.iter().all(|&n| n > 120), "{natural:?}");
        for width in [80, 100] {
            let fitted = table_lines(&report.to_table(Some(width)));
            assert!(!fitted.is_empty() && fitted.iter().all(|&n| n <= usize::from(width)), "{width}: {fitted:?}");
        }
    }

    #[test]
    fn durations_read_like_a_person_wrote_them() {
        assert_eq!(human_s(45), "45s");
        assert_eq!(human_s(750), "12m 30s");
        assert_eq!(human_s(3900), "1h 05m");
    }
}
