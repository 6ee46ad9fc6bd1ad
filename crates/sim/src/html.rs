//! The HTML report: one self-contained page (inline SVG and CSS, no
//! network; one inline script, for the replay) with the comparison table
//! and six plots: demand
//! against powered servers, fleet watts, pending pods over time, the
//! pending-time distribution per policy, on a log time axis (seconds to a
//! day: on a linear one everything but the slowest pods sits in a corner),
//! and energy against deadline misses and against p99 pending, the Pareto
//! picture, with the ironclaim policy's sweep when there is one; and,
//! when the run recorded each server's state, a replay of the rack with a
//! time slider.
//!
//! Axis labels never overlap: a tick whose label would touch the one
//! before is left out, and the y-axis title sits above the axis, clear of
//! the tick labels however wide they are.

use crate::pareto::Costs;
use crate::report::{CDF_BOUNDS_S, Report, count, human_s};
use ironclaim_core::Seconds;
use std::fmt::Write;

const COLOURS: [&str; 6] = ["#7f7f7f", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"];
const W: f64 = 860.0;
const H: f64 = 260.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 30.0;
const TOP: f64 = 24.0;
const RIGHT: f64 = 14.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

struct Series<'a> {
    name: &'a str,
    colour: &'a str,
    values: Vec<f64>,
    dashed: bool,
}

/// How wide a label of the 11 px axis font is, at most.
fn label_width(text: &str) -> f64 {
    7.0 * text.chars().count() as f64
}

/// The x-axis labels to draw, `(x, text)` in order, with any label that
/// would come within 8 px of the one before left out. The last label marks
/// the end of the axis (drawn right-aligned): the labels it would touch go
/// instead, down to the first.
fn spaced_labels(labels: Vec<(f64, String)>) -> Vec<(f64, String)> {
    const GAP: f64 = 8.0;
    let n = labels.len();
    let mut kept: Vec<(usize, f64)> = Vec::new();
    for (i, (x, text)) in labels.iter().enumerate() {
        let w = label_width(text);
        let (left, right) = if i + 1 == n { (x - w, *x) } else { (x - w / 2.0, x + w / 2.0) };
        if i + 1 == n {
            while kept.len() > 1 && kept.last().is_some_and(|&(_, previous)| left < previous + GAP) {
                kept.pop();
            }
        }
        if kept.last().is_none_or(|&(_, previous)| left >= previous + GAP) {
            kept.push((i, right));
        }
    }
    kept.into_iter().map(|(i, _)| labels[i].clone()).collect()
}

/// Writes x-axis labels at the bottom of a chart; the last one ends at its x.
fn x_labels(out: &mut String, labels: Vec<(f64, String)>) {
    let labels = spaced_labels(labels);
    let n = labels.len();
    for (i, (x, text)) in labels.into_iter().enumerate() {
        let anchor = if i + 1 == n { " style=\"text-anchor:end\"" } else { "" };
        let _ = write!(out, "<text x=\"{x:.1}\" y=\"{}\" class=\"xl\"{anchor}>{}</text>", H - 8.0, esc(&text));
    }
}

/// The y-axis title, above the axis: never in the way of the tick labels.
fn y_title(out: &mut String, title: &str) {
    let _ = write!(out, "<text x=\"6\" y=\"{:.1}\" class=\"yt\">{}</text>", TOP - 10.0, esc(title));
}

fn axis_time_label(t: u64, span: u64) -> String {
    if span > 3 * 86_400 { format!("day {}", t / 86_400) } else { format!("{:02}:{:02}", (t / 3600) % 24 + 24 * (t / 86_400), (t % 3600) / 60) }
}

/// Six horizontal grid lines from 0 to `ymax`, from the left edge of the
/// plot to `right`, each with its value on the y axis.
fn y_grid(out: &mut String, ymax: f64, right: f64, y: impl Fn(f64) -> f64) {
    for k in 0..=5 {
        let v = ymax * k as f64 / 5.0;
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{right:.1}\" y1=\"{yv:.1}\" y2=\"{yv:.1}\" class=\"grid\"/><text x=\"{}\" y=\"{:.1}\" class=\"yl\">{}</text>",
            LEFT - 6.0,
            y(v) + 4.0,
            if ymax >= 20.0 { format!("{v:.0}") } else { format!("{v:.1}") },
            yv = y(v)
        );
    }
}

fn line_chart(out: &mut String, title: &str, y_label: &str, at: &[u64], series: &[Series<'_>], step: bool) {
    let span = at.last().copied().unwrap_or(1).max(1);
    let ymax = nice_max(series.iter().flat_map(|s| s.values.iter().copied()).fold(0.0, f64::max));
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |t: u64| LEFT + pw * t as f64 / span as f64;
    let y = |v: f64| TOP + ph * (1.0 - v / ymax);
    let _ = write!(out, "<h2>{}</h2><svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\">", esc(title));
    y_grid(out, ymax, W - RIGHT, y);
    x_labels(
        out,
        (0..=6)
            .map(|k| {
                let t = span * k / 6;
                (x(t), axis_time_label(t, span))
            })
            .collect(),
    );
    y_title(out, y_label);
    for s in series {
        let mut d = String::new();
        let mut prev: Option<f64> = None;
        for (i, (&t, &v)) in at.iter().zip(&s.values).enumerate() {
            if i == 0 {
                let _ = write!(d, "M{:.1},{:.1}", x(t), y(v));
            } else {
                if step && let Some(p) = prev {
                    let _ = write!(d, "L{:.1},{:.1}", x(t), y(p));
                }
                let _ = write!(d, "L{:.1},{:.1}", x(t), y(v));
            }
            prev = Some(v);
        }
        let dash = if s.dashed { " stroke-dasharray=\"5 3\"" } else { "" };
        let _ = write!(out, "<path d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.4\"{dash}><title>{}</title></path>", s.colour, esc(s.name));
    }
    out.push_str("</svg>");
    legend(out, series.iter().map(|s| (s.name, s.colour, s.dashed)));
}

fn legend<'a>(out: &mut String, items: impl Iterator<Item = (&'a str, &'a str, bool)>) {
    out.push_str("<div class=\"legend\">");
    for (name, colour, dashed) in items {
        let style = if dashed { "border-top:2px dashed" } else { "border-top:3px solid" };
        let _ = write!(out, "<span><i style=\"{style} {colour}\"></i>{}</span>", esc(name));
    }
    out.push_str("</div>");
}

/// Where a pending time sits on the distribution's log axis: 0 at the
/// left, a day at the right, each factor of ten the same distance.
fn log_time_x(t: Seconds) -> f64 {
    let last = CDF_BOUNDS_S[CDF_BOUNDS_S.len() - 1];
    LEFT + (W - LEFT - RIGHT) * (1.0 + t as f64).log10() / (1.0 + last as f64).log10()
}

/// The distribution's time ticks: `0`, then seconds, minutes, hours, a day.
const CDF_TICKS: [(Seconds, &str); 9] =
    [(0, "0"), (1, "1s"), (10, "10s"), (60, "1m"), (600, "10m"), (1800, "30m"), (3600, "1h"), (6 * 3600, "6h"), (86_400, "1d")];

fn cdf_chart(out: &mut String, report: &Report) {
    let ph = H - TOP - BOTTOM;
    let y = |v: f64| TOP + ph * (1.0 - v);
    let _ = write!(out, "<h2>Pending time: share of pods placed within</h2><svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\">");
    for k in 0..=4 {
        let v = k as f64 / 4.0;
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{yv:.1}\" y2=\"{yv:.1}\" class=\"grid\"/><text x=\"{}\" y=\"{:.1}\" class=\"yl\">{:.0} %</text>",
            W - RIGHT,
            LEFT - 6.0,
            y(v) + 4.0,
            v * 100.0,
            yv = y(v)
        );
    }
    for &(t, _) in &CDF_TICKS {
        let x = log_time_x(t);
        let _ = write!(out, "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" class=\"grid\"/>", TOP + ph);
    }
    x_labels(out, CDF_TICKS.iter().map(|&(t, text)| (log_time_x(t), text.to_string())).collect());
    y_title(out, "share of pods (time on a log scale)");
    let mut items = Vec::new();
    for (k, p) in report.timeline.policies.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let mut d = String::new();
        for (i, &(bound, share)) in p.pending_cdf.iter().enumerate() {
            let _ = write!(d, "{}{:.1},{:.1}", if i == 0 { "M" } else { "L" }, log_time_x(bound), y(share));
        }
        let _ = write!(out, "<path d=\"{d}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.6\"><title>{}</title></path>", esc(p.policy));
        for &(bound, share) in &p.pending_cdf {
            let _ = write!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{colour}\"><title>{}: {:.0} % within {}</title></circle>",
                log_time_x(bound),
                y(share),
                esc(p.policy),
                share * 100.0,
                human_s(bound)
            );
        }
        items.push((p.policy, colour, false));
    }
    out.push_str("</svg>");
    legend(out, items.into_iter());
}

/// A cost of a run on the Pareto charts' y axis.
#[derive(Clone, Copy)]
enum Waiting {
    Misses,
    P99,
}

impl Waiting {
    fn of(self, c: &Costs) -> f64 {
        match self {
            Waiting::Misses => c.deadline_misses as f64,
            Waiting::P99 => c.pending_p99_s as f64 / 60.0,
        }
    }
}

/// Energy (x) against one kind of waiting (y), a labelled dot per policy
/// and, with a sweep, a small ring per setting of the ironclaim policy and
/// a line through the sweep's frontier.
fn pareto_chart(out: &mut String, report: &Report, title: &str, y_label: &str, waiting: Waiting) {
    let policies: Vec<(&str, Costs)> = report.policies.iter().map(|p| (p.policy, p.costs())).collect();
    let swept: Vec<&crate::pareto::SweepPoint> = report.sweep.iter().flat_map(|s| &s.points).collect();
    let all: Vec<Costs> = policies.iter().map(|(_, c)| *c).chain(swept.iter().map(|p| p.costs)).collect();
    // A run far above the rest (always-on, as a rule) would squeeze them
    // into a corner: it is drawn at the right edge, its energy in its label.
    let rest = |i: usize| all.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, c)| c.energy_kwh).fold(0.0, f64::max);
    let off_scale: Vec<bool> = all.iter().enumerate().map(|(i, c)| all.len() > 2 && c.energy_kwh > 1.5 * rest(i)).collect();
    let shown = || all.iter().zip(&off_scale).filter(|(_, off)| !**off).map(|(c, _)| c.energy_kwh);
    let lo = shown().fold(f64::INFINITY, f64::min);
    let hi = shown().fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (0.0, hi.max(1.0)) };
    let pad = (hi - lo) * 0.06;
    let (x0, x1) = ((lo - pad).max(0.0), hi + pad);
    let ymax = nice_max(all.iter().map(|c| waiting.of(c)).fold(0.0, f64::max));
    let pw = W - LEFT - RIGHT - 90.0;
    let ph = H - TOP - BOTTOM;
    let x = |e: f64| LEFT + pw * (e.min(x1) - x0) / (x1 - x0);
    let y = |v: f64| TOP + ph * (1.0 - v / ymax);
    let _ = write!(out, "<h2>{}</h2><svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\">", esc(title));
    y_grid(out, ymax, LEFT + pw, y);
    x_labels(out, (0..=5).map(|k| x0 + (x1 - x0) * k as f64 / 5.0).map(|e| (x(e), format!("{e:.1} kWh"))).collect());
    y_title(out, y_label);
    let mut frontier: Vec<&crate::pareto::SweepPoint> = swept.iter().copied().filter(|p| p.frontier).collect();
    frontier.sort_by(|a, b| a.costs.energy_kwh.total_cmp(&b.costs.energy_kwh));
    if frontier.len() > 1 {
        let d: Vec<String> = frontier
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}{:.1},{:.1}", if i == 0 { "M" } else { "L" }, x(p.costs.energy_kwh), y(waiting.of(&p.costs))))
            .collect();
        let _ = write!(out, "<path d=\"{}\" fill=\"none\" stroke=\"{SWEEP}\" stroke-width=\"1.2\" stroke-dasharray=\"4 3\"/>", d.join(""));
    }
    for p in &swept {
        let _ = write!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"none\" stroke=\"{SWEEP}\"><title>ironclaim {}: {:.1} kWh, {} misses, p99 {}</title></circle>",
            x(p.costs.energy_kwh),
            y(waiting.of(&p.costs)),
            esc(&p.label()),
            p.costs.energy_kwh,
            p.costs.deadline_misses,
            human_s(p.costs.pending_p99_s)
        );
    }
    for (k, (name, c)) in policies.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let (cx, cy) = (x(c.energy_kwh), y(waiting.of(c)));
        let label = if off_scale[k] { format!("{name} ({:.1} kWh, off the scale)", c.energy_kwh) } else { name.to_string() };
        let (lx, anchor) = if off_scale[k] { (cx - 8.0, " style=\"text-anchor:end\"") } else { (cx + 8.0, "") };
        let _ = write!(
            out,
            "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"5\" fill=\"{colour}\"><title>{}: {:.1} kWh, {} misses, p99 {}</title></circle><text x=\"{lx:.1}\" y=\"{:.1}\" class=\"pl\"{anchor}>{}</text>",
            esc(name),
            c.energy_kwh,
            c.deadline_misses,
            human_s(c.pending_p99_s),
            cy - 6.0,
            esc(&label)
        );
    }
    out.push_str("</svg>");
    let mut items: Vec<(&str, &str, bool)> = policies.iter().enumerate().map(|(k, (name, _))| (*name, COLOURS[k % COLOURS.len()], false)).collect();
    if !swept.is_empty() {
        items.push(("ironclaim over --sweep (frontier dashed)", SWEEP, true));
    }
    legend(out, items.into_iter());
}

/// The colour of the sweep's points.
const SWEEP: &str = "#8c564b";

/// Renders the report as one HTML page.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    out.push_str("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>ironclaim simulate</title><style>");
    out.push_str(
        "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:940px}\
         table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}\
         th{background:#f3f3f3}td:first-child{text-align:left}\
         .grid{stroke:#e4e4e4}.yl{font-size:11px;text-anchor:end;fill:#555}.xl{font-size:11px;text-anchor:middle;fill:#555}\
         .yt{font-size:11px;text-anchor:start;fill:#555}.legend span{margin-right:16px;font-size:13px}\
         .pl{font-size:12px;fill:#333}.legend i{display:inline-block;width:22px;margin-right:5px;vertical-align:middle}\
         code{background:#f3f3f3;padding:1px 4px}h2{font-size:16px;margin-top:28px}",
    );
    out.push_str("</style></head><body>");
    let w = &report.workload;
    let _ = write!(
        out,
        "<h1>ironclaim simulate: {}</h1><p>{}. Oracle lower bound {:.1} kWh.</p><p><code>{}</code></p>",
        esc(&w.name),
        esc(&w.describe()),
        report.oracle.energy_kwh,
        esc(&report.settings_line())
    );
    out.push_str(
        "<table><tr><th>policy</th><th>energy kWh</th><th>saved</th><th>× oracle</th><th>powered mean / peak</th>\
                  <th>pending p50</th><th>p95</th><th>p99</th><th>max</th><th>deadline misses</th><th>power-ons</th><th>claims ok / failed</th></tr>",
    );
    for p in &report.policies {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{:.1}</td><td>{}</td><td>{:.2}</td><td>{:.1} / {:.0}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td></tr>",
            p.policy,
            p.energy_kwh,
            p.saved_vs_always_on.map(|s| format!("{:.1} %", s * 100.0)).unwrap_or_else(|| "-".into()),
            p.oracle_ratio,
            p.powered_servers.mean,
            p.powered_servers.peak,
            human_s(p.pending_s.p50),
            human_s(p.pending_s.p95),
            human_s(p.pending_s.p99),
            human_s(p.pending_s.max),
            p.deadline_misses,
            p.power_on_cycles,
            p.claims.ready,
            p.claims.failed
        );
    }
    out.push_str("</table>");
    if let Some(s) = &report.scoring {
        let _ = write!(
            out,
            "<p>Scheduler scoring, {} policy: LeastAllocated {:.1} kWh ({:.1} servers on average), MostAllocated {:.1} kWh ({:.1}): packing saves {:.1} %.</p>",
            s.policy,
            s.least_allocated_kwh,
            s.least_allocated_powered_mean,
            s.most_allocated_kwh,
            s.most_allocated_powered_mean,
            s.most_allocated_saves * 100.0
        );
    }
    let t = &report.timeline;
    let mut powered = vec![Series {
        name: "demand (oracle servers)",
        colour: "#000",
        values: t.demand_servers.iter().map(|&v| f64::from(v)).collect(),
        dashed: true,
    }];
    for (k, p) in t.policies.iter().enumerate() {
        powered.push(Series {
            name: p.policy,
            colour: COLOURS[k % COLOURS.len()],
            values: p.powered.iter().map(|&v| f64::from(v)).collect(),
            dashed: false,
        });
    }
    line_chart(&mut out, "Demand against powered servers", "servers", &t.at_s, &powered, true);
    let watts: Vec<Series<'_>> = t
        .policies
        .iter()
        .enumerate()
        .map(|(k, p)| Series {
            name: p.policy,
            colour: COLOURS[k % COLOURS.len()],
            values: p.watts.iter().map(|&v| v / 1000.0).collect(),
            dashed: false,
        })
        .collect();
    line_chart(&mut out, "Fleet power", "kW", &t.at_s, &watts, false);
    let pending: Vec<Series<'_>> = t
        .policies
        .iter()
        .enumerate()
        .map(|(k, p)| Series {
            name: p.policy,
            colour: COLOURS[k % COLOURS.len()],
            values: p.pending.iter().map(|&v| f64::from(v)).collect(),
            dashed: false,
        })
        .collect();
    line_chart(&mut out, "Pending pods", "pods", &t.at_s, &pending, true);
    cdf_chart(&mut out, report);
    pareto_chart(&mut out, report, "Energy against deadline misses", "deadline misses", Waiting::Misses);
    pareto_chart(&mut out, report, "Energy against p99 pending", "p99 pending, minutes", Waiting::P99);
    if let Some(sweep) = &report.sweep {
        out.push_str("<h2>The ironclaim policy over its knobs</h2><table><tr><th>setting</th><th>energy kWh</th><th>deadline misses</th><th>pending p99</th><th>frontier</th></tr>");
        for p in &sweep.points {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&p.label()),
                p.costs.energy_kwh,
                p.costs.deadline_misses,
                human_s(p.costs.pending_p99_s),
                if p.frontier { "yes" } else { "" }
            );
        }
        out.push_str("</table>");
    }
    let failures: Vec<String> = report
        .policies
        .iter()
        .filter(|p| !p.claims.failures.is_empty())
        .map(|p| {
            let parts: Vec<String> = p.claims.failures.iter().map(|f| format!("{} at {}: {}", f.reason, f.stage, f.count)).collect();
            format!("<li>{}: {}</li>", p.policy, esc(&parts.join(", ")))
        })
        .collect();
    if !failures.is_empty() {
        let _ = write!(out, "<h2>Claim failures by reason and stage</h2><ul>{}</ul>", failures.join(""));
    }
    if let Some(replay) = &report.replay {
        replay_section(&mut out, replay, &report.timeline.at_s);
    }
    if !report.unplaceable.is_empty() {
        out.push_str("<h2>Pods no server can host</h2><ul>");
        for g in &report.unplaceable {
            let _ = write!(out, "<li>{}: {} (e.g. {})</li>", count(g.pods as u64, "pod", "pods"), esc(&g.reason), esc(&g.examples.join(", ")));
        }
        out.push_str("</ul>");
    }
    out.push_str("</body></html>\n");
    out
}

/// The states of a replay, in the order of their codes, with their
/// colours (Okabe-Ito, safe for colour-blind readers, each also named in
/// the legend and counted in words).
const REPLAY_STATES: [(&str, &str); 5] =
    [("off", "#e0e0e0"), ("booting", "#e69f00"), ("idle, warm", "#56b4e9"), ("running pods", "#009e73"), ("draining", "#cc79a7")];

/// The rack over the run: a square per server, grouped by hardware class,
/// coloured by its state at the slider's sample.
fn replay_section(out: &mut String, replay: &crate::report::Replay, at_s: &[Seconds]) {
    let _ = write!(
        out,
        "<h2>Replay: the rack under the {} policy</h2><p>A square per server, grouped by hardware class; drag the slider (or use the arrow keys on it) or press play.</p>",
        esc(replay.policy)
    );
    let side = if replay.servers.len() <= 200 { 16 } else { 9 };
    let _ = write!(out, "<style>#rack i{{display:inline-block;width:{side}px;height:{side}px;margin:1px;border:1px solid #888}}");
    for (code, (_, colour)) in REPLAY_STATES.iter().enumerate() {
        let _ = write!(out, "#rack i.q{code}{{background:{colour}}}");
    }
    out.push_str("#rack h3{font-size:12px;margin:6px 0 2px;color:#555}</style>");
    out.push_str("<p class=\"legend\">");
    for (name, colour) in REPLAY_STATES {
        let _ = write!(out, "<span><i style=\"background:{colour};height:10px\"></i>{name}</span>");
    }
    let last = replay.states.len().saturating_sub(1);
    let _ = write!(
        out,
        "</p><p><button id=\"play\" type=\"button\">play</button> <input id=\"slider\" type=\"range\" min=\"0\" max=\"{last}\" value=\"0\" style=\"width:520px\" aria-label=\"time in the run\"> <b id=\"at\"></b></p><p id=\"counts\" role=\"status\"></p><div id=\"rack\">"
    );
    let mut by_class: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, class) in replay.classes.iter().enumerate() {
        match by_class.iter_mut().find(|(c, _)| *c == class.as_str()) {
            Some((_, members)) => members.push(i),
            None => by_class.push((class, vec![i])),
        }
    }
    for (class, members) in &by_class {
        let _ = write!(out, "<h3>{} ({})</h3><div>", esc(class), members.len());
        for &i in members {
            let _ = write!(out, "<i data-i=\"{i}\" title=\"{}\"></i>", esc(&replay.servers[i]));
        }
        out.push_str("</div>");
    }
    out.push_str("</div><script>\n\"use strict\";\n");
    let states = serde_json::to_string(&replay.states).unwrap_or_else(|_| "[]".into());
    let times = serde_json::to_string(at_s).unwrap_or_else(|_| "[]".into());
    let names = serde_json::to_string(&REPLAY_STATES.iter().map(|(n, _)| *n).collect::<Vec<_>>()).unwrap_or_else(|_| "[]".into());
    let _ = writeln!(out, "const S={states},T={times},N={names};");
    out.push_str(
        "const squares=[...document.querySelectorAll('#rack i')].map(e=>[+e.dataset.i,e]);\n\
         const slider=document.getElementById('slider'),at=document.getElementById('at'),counts=document.getElementById('counts'),play=document.getElementById('play');\n\
         function clock(s){const d=Math.floor(s/86400),h=Math.floor(s%86400/3600),m=Math.floor(s%3600/60);return (d?'day '+d+' ':'')+String(h).padStart(2,'0')+':'+String(m).padStart(2,'0');}\n\
         function show(k){const s=S[k];const n=[0,0,0,0,0];for(const [i,e] of squares){const c=s.charCodeAt(i)-48;e.className='q'+c;n[c]++;}\n\
         at.textContent=clock(T[k]||0);counts.textContent=N.map((name,c)=>n[c]+' '+name).join(', ');document.body.dataset.frame=k;}\n\
         slider.addEventListener('input',()=>show(+slider.value));\n\
         let timer=null;play.addEventListener('click',()=>{if(timer){clearInterval(timer);timer=null;play.textContent='play';return;}\n\
         play.textContent='pause';timer=setInterval(()=>{const k=(+slider.value+1)%S.length;slider.value=k;show(k);},80);});\n\
         const asked=/frame=(\\d+)/.exec(location.hash);const first=asked?Math.min(+asked[1],S.length-1):0;slider.value=first;show(first);\n</script>",
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rendered report of one server and one pod, every policy.
    fn rendered() -> String {
        let doc = "servers:\n  - {name: r1, cpu_milli: 32000, memory_mib: 131072}\n\
                   pods:\n  - {name: web, cpu_milli: 1000, memory_mib: 2048, arrival_s: 10, departure_s: 70}\n";
        let d = crate::trace::parse_user_yaml(std::path::Path::new("u.yaml"), doc).expect("parses");
        let w = crate::trace::workload_from_rows("u", &d.servers, &d.pods);
        render(&crate::compare::compare(&w, &crate::SimConfig::default(), &crate::PolicyKind::ALL, &|_, _| {}))
    }

    /// The x-axis labels of each chart: (left, right) in px, as drawn.
    fn x_label_spans(html: &str) -> Vec<Vec<(f64, f64, String)>> {
        html.split("<svg")
            .skip(1)
            .map(|chart| {
                chart
                    .split("<text ")
                    .skip(1)
                    .filter(|t| t.contains("class=\"xl\""))
                    .map(|t| {
                        let x: f64 = t.split("x=\"").nth(1).and_then(|r| r.split('"').next()).and_then(|v| v.parse().ok()).expect("x");
                        let text = t.split('>').nth(1).and_then(|r| r.split('<').next()).unwrap_or_default().to_string();
                        // The 11 px font: at most about 7 px a character.
                        let w = 7.0 * text.chars().count() as f64;
                        if t.contains("text-anchor:end") { (x - w, x, text) } else { (x - w / 2.0, x + w / 2.0, text) }
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn no_two_axis_labels_of_a_chart_overlap() {
        let charts = x_label_spans(&rendered());
        assert_eq!(charts.len(), 6, "four over time, two of energy against waiting");
        for labels in charts {
            assert!(labels.len() >= 3, "{labels:?}");
            for pair in labels.windows(2) {
                assert!(pair[1].0 >= pair[0].1 + 4.0, "{:?} and {:?} touch", pair[0], pair[1]);
            }
        }
    }

    #[test]
    fn the_pareto_charts_show_each_policy_and_the_sweep_with_its_frontier() {
        let w = crate::embedded::default_day(1);
        let cfg = crate::SimConfig { duration_s: Some(3 * 3600), ..Default::default() };
        let axes = [crate::pareto::Axis { knob: crate::pareto::Knob::Z, values: vec![0.0, 2.0] }];
        let report = crate::compare::compare_sweep(&w, &cfg, &[crate::PolicyKind::Reactive, crate::PolicyKind::Ironclaim], &axes, &|_, _| {});
        let html = render(&report);
        for needle in [
            "Energy against deadline misses",
            "Energy against p99 pending",
            "<title>reactive: ",
            "<title>ironclaim z=2: ",
            "The ironclaim policy over its knobs",
        ] {
            assert!(html.contains(needle), "{needle}");
        }
        let plain = render(&crate::compare::compare(&w, &cfg, &[crate::PolicyKind::Reactive], &|_, _| {}));
        assert!(plain.contains("<title>reactive: ") && !plain.contains("over --sweep"), "no sweep, no rings");
    }

    #[test]
    fn pending_time_is_on_a_log_axis() {
        assert_eq!(log_time_x(0), LEFT);
        assert!((log_time_x(86_400) - (W - RIGHT)).abs() < 1e-9);
        // Past a few seconds, each factor of ten takes the same width.
        let per_decade = (W - LEFT - RIGHT) / 86_401f64.log10();
        let decade = |t: Seconds| log_time_x(t * 10) - log_time_x(t);
        assert!((decade(100) - per_decade).abs() < 1.0 && (decade(1000) - per_decade).abs() < 0.1, "{per_decade}");
        assert!(rendered().contains("time on a log scale"));
    }

    #[test]
    fn the_end_of_the_axis_keeps_its_label_and_crowded_ones_give_way() {
        let crowded: Vec<(f64, String)> = [60.0, 70.0, 200.0, 830.0, 846.0].iter().map(|&x| (x, "2h 00m".to_string())).collect();
        let kept = spaced_labels(crowded);
        let xs: Vec<f64> = kept.iter().map(|(x, _)| *x).collect();
        assert_eq!(xs, [60.0, 200.0, 846.0]);
    }
}
