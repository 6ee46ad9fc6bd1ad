//! The metrics as the registry exports them, checked against everything
//! that names them outside the code: the reference in `docs/metrics.md`,
//! the Grafana dashboard and the alerts in `deploy/monitoring/`.
//!
//! The registry is read through its own encoding, as Prometheus reads it:
//! a family is its `# TYPE` line (a family with no children prints only
//! that and its `# HELP`), its labels are those its samples carry.

use std::collections::{BTreeMap, BTreeSet};

use super::Metrics;

const DOC: &str = include_str!("../../../../docs/metrics.md");
const DASHBOARD: &str = include_str!("../../../../deploy/monitoring/grafana-dashboard.json");
const RULES: &str = include_str!("../../../../deploy/monitoring/prometheusrule.yaml");

/// Labels Prometheus adds to every series it scrapes: a query may group
/// by them on any metric.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// One metric family of an exposition.
#[derive(Debug, Default)]
struct Family {
    /// `counter`, `gauge`, `histogram`, ...
    kind: String,
    /// The labels its samples carry, `le` of histogram buckets aside.
    labels: BTreeSet<String>,
    samples: usize,
}

/// The families of an OpenMetrics text exposition, by the name its
/// `# TYPE` line gives them.
fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_string()).or_default().kind = kind.to_string();
        }
    }
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let series = &line[..end];
        let Some(name) = family_of_sample(series, &out) else { panic!("sample {series} belongs to no # TYPE line:\n{text}") };
        let labels = if line[end..].starts_with('{') { sample_labels(&line[end..]) } else { Vec::new() };
        let family = out.get_mut(&name).expect("found above");
        family.samples += 1;
        family.labels.extend(labels.into_iter().filter(|l| !(family.kind == "histogram" && l == "le")));
    }
    out
}

fn family_of_sample(series: &str, families: &BTreeMap<String, Family>) -> Option<String> {
    if families.contains_key(series) {
        return Some(series.to_string());
    }
    ["_total", "_bucket", "_sum", "_count", "_created"]
        .iter()
        .filter_map(|suffix| series.strip_suffix(suffix))
        .find(|base| families.contains_key(*base))
        .map(str::to_string)
}

/// The label names of `{a="x",b="y\"z"} 1`.
fn sample_labels(braced: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = braced.chars().skip(1).peekable();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if name.is_empty() || name.starts_with('}') {
            return names;
        }
        names.push(name.trim_start_matches(',').to_string());
        assert_eq!(chars.next(), Some('"'), "a label value is quoted: {braced}");
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => break,
                _ => {}
            }
        }
        if chars.peek() == Some(&'}') {
            return names;
        }
    }
}

/// The name a query uses for a family: counters carry `_total`.
fn query_name(family: &str, kind: &str) -> String {
    if kind == "counter" { format!("{family}_total") } else { family.to_string() }
}

/// The controller's metrics with one child in each family, through the
/// same methods the controller calls, so every family shows its labels.
fn every_metric_with_a_sample() -> Metrics {
    let api = crate::api::ApiRequests::default();
    let m = Metrics::counting(&api);
    api.requests.get_or_create(&vec![("verb".into(), "list".into()), ("resource".into(), "pods".into())]).inc();
    m.watch_lag.get_or_create(&vec![("kind".into(), "Pod".into())]).observe(0.3);
    m.observe_stage("booting", "default", "succeeded", 90.0);
    m.claim_ended("failed", "bmc_unreachable");
    m.set_servers_by_power_state([("on", 3), ("off", 2)]);
    m.set_pending_pods(&BTreeMap::from([("new_claim", 1)]));
    m.decision_latency.observe(0.02);
    m.error("read_failed");
    m.power_failure("unreachable");
    m.dry_run_action("power_on");
    m.set_servers_held("unadopted", 1);
    m.set_ledger_bytes([("ironclaim-claim-locks-00".to_string(), 1200)]);
    m.scaledown.action("drain", "empty", "done");
    m.scaledown.eviction("evicted");
    m.scaledown.set_stranded(["server_on_unused"]);
    m
}

/// The exported families, each with at least one sample.
fn exported() -> BTreeMap<String, Family> {
    let exported = families(&every_metric_with_a_sample().render());
    let silent: Vec<&String> = exported.iter().filter(|(_, f)| f.samples == 0).map(|(name, _)| name).collect();
    assert!(silent.is_empty(), "families with no sample, whose labels cannot be read: give each one in every_metric_with_a_sample(): {silent:?}");
    exported
}

/// The backticked words of a Markdown table cell.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The rows of the table under `## {heading}` in the doc, cells trimmed.
fn table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc.find(&format!("\n## {heading}\n")).unwrap_or_else(|| panic!("docs/metrics.md has no section ## {heading}"));
    let section = &doc[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |end| end + 3)];
    section.lines().filter(|l| l.starts_with("| `")).map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect()).collect()
}

/// Documented metrics: the query name, its type and its labels.
fn documented() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut out = BTreeMap::new();
    for row in table(DOC, "Every metric") {
        let [name, kind, labels, ..] = row.as_slice() else { panic!("a row of ## Every metric has four cells: {row:?}") };
        let name = backticked(name).concat();
        let previous = out.insert(name.clone(), (kind.clone(), backticked(labels).into_iter().collect()));
        assert!(previous.is_none(), "docs/metrics.md lists {name} twice");
    }
    out
}

#[test]
fn docs_name_every_exported_metric_with_its_type_and_labels() {
    // As the controller starts: families with no child print only their
    // # HELP and # TYPE lines, and still count.
    let bare: BTreeSet<String> =
        families(&Metrics::new().render()).iter().map(|(name, f)| format!("{} ({})", query_name(name, &f.kind), f.kind)).collect();
    let docs = documented();
    let listed: BTreeSet<String> = docs.iter().map(|(name, (kind, _))| format!("{name} ({kind})")).collect();
    let missing: Vec<&String> = bare.difference(&listed).collect();
    let extra: Vec<&String> = listed.difference(&bare).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/metrics.md (## Every metric) and the registry differ:\n  exported, missing from the table: {missing:?}\n  in the table, not exported: {extra:?}"
    );
    let mut wrong = Vec::new();
    for (name, family) in exported() {
        let name = query_name(&name, &family.kind);
        let (_, labels) = &docs[&name];
        if *labels != family.labels {
            wrong.push(format!("{name}: exported {:?}, documented {labels:?}", family.labels));
        }
    }
    assert!(wrong.is_empty(), "labels in docs/metrics.md differ from the registry's:\n  {}", wrong.join("\n  "));
}

/// The values of `label` of `metric` in the doc's `## Label values` table.
fn documented_values(label: &str, metric: &str) -> Option<Vec<String>> {
    table(DOC, "Label values")
        .into_iter()
        .find(|row| backticked(&row[0]).concat() == label && backticked(&row[1]).concat() == metric)
        .map(|row| backticked(&row[2]))
}

#[test]
fn docs_list_the_drivers_stages_and_failure_reasons_as_label_values() {
    let stages: Vec<String> = ironclaim_driver::Stage::ALL.iter().map(|s| s.label().to_string()).collect();
    assert_eq!(documented_values("stage", "ironclaim_stage_duration_seconds"), Some(stages));
    let reasons: Vec<String> = ironclaim_driver::FailureReason::ALL.iter().map(|r| r.label().to_string()).collect();
    assert_eq!(documented_values("reason", "ironclaim_claims_total"), Some(reasons));
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    /// A name: metric, function, keyword, label.
    Ident(String),
    /// A quoted string, unescaped as written.
    Str(String),
    /// A number or a duration outside brackets.
    Number,
    /// `=`, `!=`, `=~`, `!~` and the arithmetic and comparison operators.
    Op(String),
    Open(char),
    Close(char),
    Comma,
}

/// PromQL, as far as the names in it go. A range or subquery in `[...]`
/// is skipped whole (it holds durations and Grafana's `$__rate_interval`).
fn tokenize(query: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = query.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // Names take `:` (recording rules); numbers `.` and a unit.
        let word = |i: usize, dot: bool| {
            let mut end = i;
            while end < chars.len() && (chars[end].is_ascii_alphanumeric() || chars[end] == '_' || chars[end] == ':' || dot && chars[end] == '.') {
                end += 1;
            }
            end
        };
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '[' => match chars[i..].iter().position(|c| *c == ']') {
                Some(n) => i += n + 1,
                None => return Err(format!("unclosed [ in {query}")),
            },
            '"' | '\'' | '`' => {
                let mut text = String::new();
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    text.extend(chars.get(i));
                    i += 1;
                }
                if i >= chars.len() {
                    return Err(format!("unclosed string in {query}"));
                }
                i += 1;
                tokens.push(Token::Str(text));
            }
            '(' | '{' => {
                tokens.push(Token::Open(c));
                i += 1;
            }
            ')' | '}' => {
                tokens.push(Token::Close(c));
                i += 1;
            }
            ',' => {
                tokens.push(Token::Comma);
                i += 1;
            }
            c if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) => {
                i = word(i, true);
                tokens.push(Token::Number);
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let end = word(i, false);
                tokens.push(Token::Ident(chars[i..end].iter().collect()));
                i = end;
            }
            _ => {
                let end = i + chars[i..].iter().take_while(|c| "=!~<>+-*/^%".contains(**c)).count().max(1);
                tokens.push(Token::Op(chars[i..end].iter().collect()));
                i = end;
            }
        }
    }
    Ok(tokens)
}

/// A name in the controller's namespace. Any such name counts, so that
/// a misspelt one (`ironclaim_Servers`) is reported rather than skipped.
fn is_metric(name: &str) -> bool {
    name.starts_with("ironclaim_")
}

/// The family a series a query names belongs to, as the encoding names
/// it: `X_total` of a counter, `X_bucket`, `X_sum`, `X_count` of a
/// histogram, a gauge as it is. Also whether it is a histogram's buckets,
/// which carry `le`.
fn resolve<'f>(series: &str, exported: &'f BTreeMap<String, Family>) -> Result<(&'f str, &'f Family, bool), String> {
    if let Some((name, family)) = exported.get_key_value(series) {
        return match family.kind.as_str() {
            "counter" => Err(format!("{series} is a counter: its series is {series}_total")),
            "histogram" => Err(format!("{series} is a histogram: its series are {series}_bucket, {series}_sum and {series}_count")),
            _ => Ok((name, family, false)),
        };
    }
    for (suffix, kind) in [("_total", "counter"), ("_bucket", "histogram"), ("_sum", "histogram"), ("_count", "histogram")] {
        if let Some((name, family)) = series.strip_suffix(suffix).and_then(|base| exported.get_key_value(base))
            && family.kind == kind
        {
            return Ok((name, family, suffix == "_bucket"));
        }
    }
    Err(format!("{series} is not a metric the controller exports"))
}

/// Indices of each bracket's partner.
fn partners(tokens: &[Token]) -> Result<BTreeMap<usize, usize>, String> {
    let mut open = Vec::new();
    let mut out = BTreeMap::new();
    for (i, t) in tokens.iter().enumerate() {
        match t {
            Token::Open(_) => open.push(i),
            Token::Close(_) => {
                let o = open.pop().ok_or("an unmatched closing bracket")?;
                out.insert(o, i);
                out.insert(i, o);
            }
            _ => {}
        }
    }
    if open.is_empty() { Ok(out) } else { Err("an unclosed bracket".into()) }
}

/// Every problem with the names in one query: a series that is no
/// exported metric's, a label a matcher or a grouping names that the
/// metric does not have, a value of a closed label (`## Label values` of
/// the doc) that it never takes.
///
/// # Assumptions
/// `by`/`without` apply to every metric of their aggregation's argument,
/// before or after them; `on`/`ignoring`/`group_*` labels must be held by
/// some metric of the query. `label_values(metric, label)` is Grafana's.
fn check_query(query: &str, exported: &BTreeMap<String, Family>) -> Vec<String> {
    let tokens = match tokenize(query) {
        Ok(t) => t,
        Err(e) => return vec![e],
    };
    let partner = match partners(&tokens) {
        Ok(p) => p,
        Err(e) => return vec![format!("{e} in {query}")],
    };
    let mut problems = Vec::new();
    let has =
        |family: &Family, bucket: bool, label: &str| family.labels.contains(label) || (bucket && label == "le") || TARGET_LABELS.contains(&label);
    // Series named outside matchers and grouping lists, by token index.
    let mut label_position = BTreeSet::new();
    for (i, t) in tokens.iter().enumerate() {
        let grouping = matches!(t, Token::Ident(k) if ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&k.as_str()));
        if (*t == Token::Open('{') || grouping && tokens.get(i + 1) == Some(&Token::Open('(')))
            && let Some(&close) = partner.get(&(i + usize::from(grouping)))
        {
            label_position.extend(i..close);
        }
    }
    let mut series = BTreeMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if let Token::Ident(name) = t
            && is_metric(name)
            && !label_position.contains(&i)
        {
            match resolve(name, exported) {
                Ok(found) => {
                    series.insert(i, found);
                }
                Err(e) => problems.push(e),
            }
        }
    }
    let metrics_in = |from: usize, to: usize| series.range(from..to).map(|(_, found)| *found).collect::<Vec<_>>();
    for (&i, &(name, family, bucket)) in &series {
        if tokens.get(i + 1) != Some(&Token::Open('{')) {
            continue;
        }
        let close = partner[&(i + 1)];
        let mut j = i + 2;
        while j < close {
            if let (Token::Ident(label), Some(Token::Op(op)), Some(Token::Str(value))) = (&tokens[j], tokens.get(j + 1), tokens.get(j + 2)) {
                if !has(family, bucket, label) {
                    problems.push(format!("{name} has no label {label} (it has {:?})", family.labels));
                } else if let Some(allowed) = documented_values(label, &query_name(name, &family.kind)) {
                    let values: Vec<&str> = if op.contains('~') {
                        if value.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '|') {
                            value.split('|').collect()
                        } else {
                            vec![]
                        }
                    } else {
                        vec![value.as_str()]
                    };
                    for v in values.into_iter().filter(|v| !allowed.iter().any(|a| a == v)) {
                        problems.push(format!("{name}'s label {label} never reads {v:?} (docs/metrics.md: {allowed:?})"));
                    }
                }
                j += 3;
            } else {
                j += 1;
            }
        }
    }
    for (i, t) in tokens.iter().enumerate() {
        let Token::Ident(keyword) = t else { continue };
        if tokens.get(i + 1) != Some(&Token::Open('(')) {
            continue;
        }
        let close = partner[&(i + 1)];
        let labels: Vec<&String> = tokens[i + 2..close].iter().filter_map(|t| if let Token::Ident(l) = t { Some(l) } else { None }).collect();
        match keyword.as_str() {
            "by" | "without" => {
                let argument = if tokens.get(close + 1) == Some(&Token::Open('(')) {
                    Some((close + 1, partner[&(close + 1)]))
                } else if i > 0 && tokens[i - 1] == Token::Close(')') {
                    Some((partner[&(i - 1)], i - 1))
                } else {
                    None
                };
                let Some((from, to)) = argument else {
                    problems.push(format!("{keyword} ({labels:?}) has no argument in {query}"));
                    continue;
                };
                for (name, family, bucket) in metrics_in(from, to) {
                    for label in labels.iter().filter(|l| !has(family, bucket, l)) {
                        problems.push(format!("{keyword} ({label}) on {name}, which has no label {label} (it has {:?})", family.labels));
                    }
                }
            }
            "on" | "ignoring" | "group_left" | "group_right" => {
                let all = metrics_in(0, tokens.len());
                for label in labels.iter().filter(|l| !all.iter().any(|(_, family, bucket)| has(family, *bucket, l))) {
                    problems.push(format!("{keyword} ({label}): no metric of the query has label {label}"));
                }
            }
            "label_values" => {
                let Some((name, family, bucket)) = metrics_in(i + 2, close).first().copied() else { continue };
                if let Some(Token::Ident(label)) = tokens[..close].last()
                    && tokens[close - 2] == Token::Comma
                    && !has(family, bucket, label)
                {
                    problems.push(format!("label_values of {name}: no label {label} (it has {:?})", family.labels));
                }
            }
            _ => {}
        }
    }
    problems
}

/// Every PromQL expression of the dashboard (targets and template
/// variables) and of the rules, each with where it is.
fn queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    fn targets(panel: &serde_json::Value, out: &mut Vec<(String, String)>) {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push((format!("grafana-dashboard.json, panel {title:?}"), expr.to_string()));
            }
        }
        for inner in panel["panels"].as_array().into_iter().flatten() {
            targets(inner, out);
        }
    }
    for panel in dashboard["panels"].as_array().expect("the dashboard has panels") {
        targets(panel, &mut out);
    }
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten().filter(|v| v["type"] == "query") {
        let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).expect("a query variable has a query");
        out.push((format!("grafana-dashboard.json, variable {}", variable["name"]), query.to_string()));
    }
    for (_, group, rule) in rules() {
        let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap_or("?").to_string();
        out.push((format!("prometheusrule.yaml, group {group}, {name}"), rule["expr"].as_str().expect("a rule has an expr").to_string()));
    }
    out
}

/// The rules of the PrometheusRule: (its kind, the group's name, the rule).
fn rules() -> Vec<(String, String, serde_json::Value)> {
    let rule: serde_json::Value = serde_saphyr::from_str(RULES).expect("the PrometheusRule is YAML");
    let kind = format!("{}/{}", rule["apiVersion"].as_str().unwrap_or("?"), rule["kind"].as_str().unwrap_or("?"));
    let groups = rule["spec"]["groups"].as_array().expect("the PrometheusRule has spec.groups").clone();
    groups
        .into_iter()
        .flat_map(|g| {
            let name = g["name"].as_str().unwrap_or("?").to_string();
            let kind = kind.clone();
            g["rules"].as_array().cloned().unwrap_or_default().into_iter().map(move |r| (kind.clone(), name.clone(), r))
        })
        .collect()
}

#[test]
fn dashboard_and_alerts_query_only_metrics_and_labels_that_exist() {
    let exported = exported();
    let queries = queries();
    let mut named = BTreeSet::new();
    let mut problems = Vec::new();
    for (place, query) in &queries {
        named.extend(
            tokenize(query).unwrap_or_default().into_iter().filter_map(|t| if let Token::Ident(n) = t { is_metric(&n).then_some(n) } else { None }),
        );
        problems.extend(check_query(query, &exported).into_iter().map(|p| format!("deploy/monitoring/{place}: {p}")));
    }
    assert!(problems.is_empty(), "queries name what the controller does not export:\n  {}", problems.join("\n  "));
    assert!(queries.iter().any(|(place, _)| place.starts_with("grafana")) && queries.iter().any(|(place, _)| place.starts_with("prometheusrule")));
    assert!(named.len() >= 10, "the dashboard and alerts name only {named:?}");
}

#[test]
fn every_alert_has_a_severity_a_summary_and_a_runbook_in_the_docs() {
    let headings: BTreeSet<String> = DOC
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.to_lowercase().chars().filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_').collect())
        .collect();
    let rules = rules();
    assert!(!rules.is_empty());
    for (kind, group, rule) in rules {
        assert_eq!(kind, "monitoring.coreos.com/v1/PrometheusRule");
        let alert = rule["alert"].as_str().unwrap_or_else(|| panic!("group {group}: every rule is an alert: {rule}"));
        let severity = rule["labels"]["severity"].as_str().unwrap_or("");
        assert!(["critical", "warning", "info"].contains(&severity), "{alert}: severity {severity:?}");
        for annotation in ["summary", "description"] {
            assert!(rule["annotations"][annotation].as_str().is_some_and(|s| !s.is_empty()), "{alert}: no {annotation}");
        }
        let runbook = rule["annotations"]["runbook_url"].as_str().unwrap_or("");
        let anchor =
            runbook.strip_prefix("docs/metrics.md#").unwrap_or_else(|| panic!("{alert}: runbook_url {runbook:?} is not docs/metrics.md#..."));
        assert_eq!(anchor, alert.to_lowercase(), "{alert}: the runbook is the alert's own section");
        assert!(headings.contains(anchor), "{alert}: docs/metrics.md has no section ### {alert}");
    }
}

#[test]
fn the_query_check_names_a_missing_metric_a_missing_label_and_an_unknown_value() {
    let exported = exported();
    let ok = [
        "sum by (stage, serverpool) (increase(ironclaim_stage_duration_seconds_count{outcome=\"timedout\"}[30m])) > 0",
        "histogram_quantile(0.95, sum by (le) (rate(ironclaim_decision_latency_seconds_bucket[$__rate_interval])))",
        "sum(rate(ironclaim_errors_total[5m])) by (error)",
        "max by (instance) (ironclaim_leader) or absent(ironclaim_leader)",
        "label_values(ironclaim_stage_duration_seconds_count, serverpool)",
        "sum(ironclaim_claims_total{reason=~\"bmc_unreachable|node_lost\", outcome!=\"ready\"})",
    ];
    for query in ok {
        assert_eq!(check_query(query, &exported), Vec::<String>::new(), "{query}");
    }
    let wrong = [
        ("rate(ironclaim_claim_total[5m])", "ironclaim_claim_total is not a metric the controller exports"),
        ("rate(ironclaim_claims[5m])", "ironclaim_claims is a counter: its series is ironclaim_claims_total"),
        ("ironclaim_stage_duration_seconds", "is a histogram"),
        ("sum by (pool) (ironclaim_servers)", "by (pool) on ironclaim_servers, which has no label pool"),
        ("sum(ironclaim_servers) without (state)", "without (state) on ironclaim_servers"),
        ("ironclaim_servers{powerstate=\"on\"}", "ironclaim_servers has no label powerstate"),
        ("sum by (le) (rate(ironclaim_decision_latency_seconds_count[5m]))", "which has no label le"),
        ("ironclaim_claims_total{reason=\"bmc_unreachabel\"}", "never reads \"bmc_unreachabel\""),
        ("ironclaim_stage_duration_seconds_count{stage=~\"booting|pxe\"}", "never reads \"pxe\""),
        ("label_values(ironclaim_servers, pool)", "label_values of ironclaim_servers: no label pool"),
        ("sum(rate(ironclaim_errors_total[5m]) by (error)", "unclosed bracket"),
    ];
    for (query, expected) in wrong {
        let problems = check_query(query, &exported);
        assert!(problems.iter().any(|p| p.contains(expected)), "{query}: expected {expected:?}, got {problems:?}");
    }
}

#[test]
fn the_exposition_reader_finds_types_labels_and_escaped_values() {
    let text = "# HELP a_things Things.\n# TYPE a_things counter\na_things_total{x=\"1\",y=\"q\\\"uo,te\"} 2\n# TYPE a_h histogram\na_h_bucket{le=\"0.5\"} 1\na_h_count 1\n# TYPE a_empty gauge\n# EOF\n";
    let f = families(text);
    assert_eq!(f["a_things"].kind, "counter");
    assert_eq!(f["a_things"].labels, BTreeSet::from(["x".to_string(), "y".to_string()]));
    assert_eq!((f["a_h"].samples, f["a_h"].labels.len()), (2, 0));
    assert_eq!((f["a_empty"].kind.as_str(), f["a_empty"].samples), ("gauge", 0));
}
