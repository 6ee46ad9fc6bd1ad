//! The HTML report: one self-contained page (inline SVG and CSS, no
//! scripts, no network) with the comparison table and four plots: demand
//! against powered servers, fleet watts, pending pods over time, and the
//! pending-time distribution per policy.

use crate::report::{CDF_BOUNDS_S, Report, count, human_s};
use std::fmt::Write;

const COLOURS: [&str; 6] = ["#7f7f7f", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"];
const W: f64 = 860.0;
const H: f64 = 260.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 30.0;
const TOP: f64 = 14.0;
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

fn axis_time_label(t: u64, span: u64) -> String {
    if span > 3 * 86_400 { format!("day {}", t / 86_400) } else { format!("{:02}:{:02}", (t / 3600) % 24 + 24 * (t / 86_400), (t % 3600) / 60) }
}

fn line_chart(out: &mut String, title: &str, y_label: &str, at: &[u64], series: &[Series<'_>], step: bool) {
    let span = at.last().copied().unwrap_or(1).max(1);
    let ymax = nice_max(series.iter().flat_map(|s| s.values.iter().copied()).fold(0.0, f64::max));
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |t: u64| LEFT + pw * t as f64 / span as f64;
    let y = |v: f64| TOP + ph * (1.0 - v / ymax);
    let _ = write!(out, "<h2>{}</h2><svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\">", esc(title));
    for k in 0..=5 {
        let v = ymax * k as f64 / 5.0;
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" class=\"grid\"/><text x=\"{}\" y=\"{:.1}\" class=\"yl\">{}</text>",
            W - RIGHT,
            LEFT - 6.0,
            y(v) + 4.0,
            if ymax >= 20.0 { format!("{v:.0}") } else { format!("{v:.1}") },
            y = y(v)
        );
    }
    for k in 0..=6 {
        let t = span * k / 6;
        let anchor = if k == 6 { " style=\"text-anchor:end\"" } else { "" };
        let _ = write!(out, "<text x=\"{:.1}\" y=\"{}\" class=\"xl\"{anchor}>{}</text>", x(t), H - 8.0, axis_time_label(t, span));
    }
    let _ = write!(
        out,
        "<text x=\"12\" y=\"{:.1}\" class=\"yt\" transform=\"rotate(-90 12 {:.1})\">{}</text>",
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
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

fn cdf_chart(out: &mut String, report: &Report) {
    let n = CDF_BOUNDS_S.len();
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |i: usize| LEFT + pw * i as f64 / (n - 1) as f64;
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
    for (i, &b) in CDF_BOUNDS_S.iter().enumerate() {
        let anchor = if i + 1 == n { " style=\"text-anchor:end\"" } else { "" };
        let _ = write!(out, "<text x=\"{:.1}\" y=\"{}\" class=\"xl\"{anchor}>{}</text>", x(i), H - 8.0, human_s(b));
    }
    let mut items = Vec::new();
    for (k, p) in report.timeline.policies.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let mut d = String::new();
        for (i, &(_, share)) in p.pending_cdf.iter().enumerate() {
            let _ = write!(d, "{}{:.1},{:.1}", if i == 0 { "M" } else { "L" }, x(i), y(share));
        }
        let _ = write!(out, "<path d=\"{d}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.6\"/>");
        items.push((p.policy, colour, false));
    }
    out.push_str("</svg>");
    legend(out, items.into_iter());
}

/// Renders the report as one HTML page.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    out.push_str("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>ironclaim simulate</title><style>");
    out.push_str(
        "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:940px}\
         table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}\
         th{background:#f3f3f3}td:first-child{text-align:left}\
         .grid{stroke:#e4e4e4}.yl{font-size:11px;text-anchor:end;fill:#555}.xl{font-size:11px;text-anchor:middle;fill:#555}\
         .yt{font-size:11px;text-anchor:middle;fill:#555}.legend span{margin-right:16px;font-size:13px}\
         .legend i{display:inline-block;width:22px;margin-right:5px;vertical-align:middle}\
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
