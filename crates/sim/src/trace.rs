//! Trace readers: the openb production trace (Alibaba
//! cluster-trace-gpu-v2023) and the user format, which is the same CSV with
//! optional extra columns, or the same rows in one YAML document.
//!
//! # Pods
//! Columns, by header name (aliases after `|`):
//! `name`, `cpu_milli`, `memory_mib`, `num_gpu`, `gpu_milli`, `gpu_spec`
//! (allowed GPU models, `|`-separated), `qos`, `creation_time|arrival_s`,
//! `deletion_time|departure_s` (empty: runs to the end), `deadline_s`,
//! and an in-place resize while it runs: `resize_s` (when, as the arrival
//! is given), `resize_cpu_milli`, `resize_memory_mib` (the new size; a
//! column left out keeps its size).
//! Without either time column the list is static ([`PodList::timed`]);
//! with one, every row needs its arrival time.
//! Other columns (`pod_phase`, `scheduled_time`) are ignored.
//!
//! # Servers
//! `sn|name`, `cpu_milli`, `memory_mib`, `gpu`, `model`, and optionally
//! `idle_watts`, `peak_watts`, `boot_watts`, `off_watts`, `gpu_watts` (of
//! peak minus idle, what the GPUs add at full use), `power_on_s`,
//! `boot_s`, `join_s`, `ready_s`, `tail_percent`; what is missing is
//! estimated from the hardware (see [`crate::workload::estimated_power`]).
//!
//! A CSV with a column only the other format has (`creation_time`, `qos`,
//! ... for pods; `sn`, `model`, the watts and stages for servers) is
//! refused, naming the column: the shared columns would otherwise let a pod
//! list pass for a server list.

use crate::workload::{GPU_MODEL_LABEL, TracePod, Workload, estimated_power, hardware_server, pod_requests};
use ironclaim_core::{NodeSelectorTerm, Operator, Pod, PowerProfile, Requirement, Seconds, Server, ServerPool};
use serde::Deserialize;
use std::path::Path;

pub type Result<T, E = TraceError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    BadField { path: String, line: u64, column: usize, message: String },
    #[error("{path}:{line}: {message}")]
    BadRow { path: String, line: u64, message: String },
    #[error("{path}: missing column `{column}` (header: {header})")]
    MissingColumn { path: String, column: String, header: String },
    #[error("{path}: {message}")]
    BadDocument { path: String, message: String },
    #[error("{path}: no {what} in the file")]
    Empty { path: String, what: String },
    /// A pod list read as servers, or a server list read as pods.
    #[error("{path}: the column `{column}` is a {found} column: this is a {found} list, not a {wanted} list")]
    WrongList { path: String, column: String, wanted: &'static str, found: &'static str },
}

impl TraceError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            TraceError::Read { .. } => "read",
            TraceError::BadField { .. } => "bad_field",
            TraceError::BadRow { .. } => "bad_row",
            TraceError::MissingColumn { .. } => "missing_column",
            TraceError::BadDocument { .. } => "bad_document",
            TraceError::Empty { .. } => "empty",
            TraceError::WrongList { .. } => "wrong_list",
        }
    }
}

/// One pod row, as in the CSV and the YAML document.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PodRow {
    pub name: String,
    /// Expands the row into this many pods (`name-0`, `name-1`, ...).
    #[serde(default)]
    pub count: Option<u32>,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    #[serde(default)]
    pub num_gpu: i64,
    #[serde(default)]
    pub gpu_milli: Option<i64>,
    #[serde(default)]
    pub gpu_spec: String,
    #[serde(default)]
    pub qos: String,
    pub arrival_s: Seconds,
    #[serde(default)]
    pub departure_s: Option<Seconds>,
    #[serde(default)]
    pub deadline_s: Option<Seconds>,
    /// An in-place resize asked while it runs: when, and the new cpu and
    /// memory (None keeps the size).
    #[serde(default)]
    pub resize_s: Option<Seconds>,
    #[serde(default)]
    pub resize_cpu_milli: Option<i64>,
    #[serde(default)]
    pub resize_memory_mib: Option<i64>,
}

/// One server row, as in the CSV and the YAML document.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerRow {
    pub name: String,
    #[serde(default)]
    pub count: Option<u32>,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    #[serde(default)]
    pub gpu: i64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub idle_watts: Option<f64>,
    #[serde(default)]
    pub peak_watts: Option<f64>,
    #[serde(default)]
    pub boot_watts: Option<f64>,
    #[serde(default)]
    pub off_watts: Option<f64>,
    #[serde(default)]
    pub gpu_watts: Option<f64>,
    #[serde(default)]
    pub power_on_s: Option<Seconds>,
    #[serde(default)]
    pub boot_s: Option<Seconds>,
    #[serde(default)]
    pub join_s: Option<Seconds>,
    #[serde(default)]
    pub ready_s: Option<Seconds>,
    #[serde(default)]
    pub tail_percent: Option<u32>,
}

/// The YAML user format: servers and pods in one document.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserDocument {
    #[serde(default)]
    pub servers: Vec<ServerRow>,
    #[serde(default)]
    pub pods: Vec<PodRow>,
}

/// Largest integer any field may hold (keeps sums far from overflow).
const MAX_FIELD: i64 = 1 << 40;

/// Longest stage duration a row may state.
const MAX_STAGE_S: i64 = 7 * 86_400;

/// Deadline by quality-of-service class when a row states none:
/// latency-sensitive pods 5 minutes, best-effort 30, others 10.
pub fn deadline_for_qos(qos: &str) -> Seconds {
    match qos {
        "LS" | "Guaranteed" | "Burstable" => 300,
        "BE" => 1800,
        _ => 600,
    }
}

/// Columns only the pod format has: a file with one is a pod list.
const POD_COLUMNS: [&str; 12] = [
    "creation_time",
    "arrival_s",
    "deletion_time",
    "departure_s",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "deadline_s",
    "pod_phase",
    "resize_s",
    "resize_cpu_milli",
    "resize_memory_mib",
];

/// Columns only the server format has: a file with one is a server list.
const SERVER_COLUMNS: [&str; 13] = [
    "sn",
    "model",
    "gpu_model",
    "idle_watts",
    "peak_watts",
    "boot_watts",
    "off_watts",
    "gpu_watts",
    "power_on_s",
    "boot_s",
    "join_s",
    "ready_s",
    "tail_percent",
];

struct Columns {
    header: Vec<String>,
}

impl Columns {
    /// Refuses a file whose header has a column of the other list: the
    /// shared columns (`name`, `cpu_milli`, `memory_mib`) would let a pod
    /// list pass for a server list, one server per pod.
    fn refuse_other_list(&self, path: &str, wanted: &'static str) -> Result<()> {
        let (others, found) = if wanted == "server" { (&POD_COLUMNS[..], "pod") } else { (&SERVER_COLUMNS[..], "server") };
        match self.header.iter().map(|h| h.trim()).find(|h| others.iter().any(|c| h.eq_ignore_ascii_case(c))) {
            Some(column) => Err(TraceError::WrongList { path: path.to_string(), column: column.to_string(), wanted, found }),
            None => Ok(()),
        }
    }
    fn find(&self, names: &[&str]) -> Option<usize> {
        names.iter().find_map(|n| self.header.iter().position(|h| h.trim().eq_ignore_ascii_case(n)))
    }
    fn require(&self, path: &str, names: &[&str]) -> Result<usize> {
        self.find(names).ok_or_else(|| TraceError::MissingColumn { path: path.to_string(), column: names.join("|"), header: self.header.join(",") })
    }
}

struct Row<'a> {
    path: &'a str,
    line: u64,
    record: &'a csv::StringRecord,
}

impl Row<'_> {
    fn text(&self, col: Option<usize>) -> &str {
        col.and_then(|c| self.record.get(c)).map(str::trim).unwrap_or("")
    }
    fn bad(&self, col: usize, message: String) -> TraceError {
        TraceError::BadField { path: self.path.to_string(), line: self.line, column: col + 1, message }
    }
    fn int(&self, col: usize, what: &str) -> Result<i64> {
        let t = self.text(Some(col));
        let v: i64 = t.parse().map_err(|_| self.bad(col, format!("{what}: `{t}` is not an integer")))?;
        if v < 0 {
            return Err(self.bad(col, format!("{what}: {v} is negative")));
        }
        if v > MAX_FIELD {
            return Err(self.bad(col, format!("{what}: {v} is implausibly large")));
        }
        Ok(v)
    }
    fn opt_int(&self, col: Option<usize>, what: &str) -> Result<Option<i64>> {
        match col {
            Some(c) if !self.text(Some(c)).is_empty() => self.int(c, what).map(Some),
            _ => Ok(None),
        }
    }
    fn opt_float(&self, col: Option<usize>, what: &str) -> Result<Option<f64>> {
        let Some(c) = col else { return Ok(None) };
        let t = self.text(Some(c));
        if t.is_empty() {
            return Ok(None);
        }
        let v: f64 = t.parse().map_err(|_| self.bad(c, format!("{what}: `{t}` is not a number")))?;
        if !v.is_finite() || v < 0.0 {
            return Err(self.bad(c, format!("{what}: {t} is not a non-negative number")));
        }
        Ok(Some(v))
    }
}

fn open_csv<'d>(path: &Path, data: &'d str) -> Result<(csv::Reader<&'d [u8]>, Columns)> {
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(data.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| TraceError::BadDocument { path: path.display().to_string(), message: e.to_string() })?
        .iter()
        .map(|h| h.trim_start_matches('\u{feff}').to_string())
        .collect();
    Ok((reader, Columns { header }))
}

/// Reads the next row that is not blank into `record` and returns its line,
/// or None at the end.
fn next_record(reader: &mut csv::Reader<&[u8]>, record: &mut csv::StringRecord, path: &str) -> Result<Option<u64>> {
    loop {
        match reader.read_record(record) {
            Ok(false) => return Ok(None),
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map(|pos| pos.line()).unwrap_or(0);
                return Err(TraceError::BadRow { path: path.to_string(), line, message: e.to_string() });
            }
        }
        if !record.iter().all(|f| f.trim().is_empty()) {
            return Ok(Some(record.position().map(|pos| pos.line()).unwrap_or(0)));
        }
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| TraceError::Read { path: path.display().to_string(), source })
}

/// Pod rows, and whether they carry times.
#[derive(Clone, Debug, PartialEq)]
pub struct PodList {
    pub rows: Vec<PodRow>,
    /// False for a static trace: no creation or deletion times, the pods
    /// arrive in the file's order and stay (every `arrival_s` is 0).
    pub timed: bool,
}

/// Reads pod rows with times from CSV text (openb or the user format).
///
/// # Errors
/// A static trace (no time column) is refused, naming the missing column:
/// it is replayed by [`crate::packing`], not on a clock.
pub fn parse_pods_csv(path: &Path, data: &str) -> Result<Vec<PodRow>> {
    let list = parse_pod_list_csv(path, data)?;
    if !list.timed {
        let (_, cols) = open_csv(path, data)?;
        return Err(TraceError::MissingColumn {
            path: path.display().to_string(),
            column: "creation_time|arrival_s".into(),
            header: cols.header.join(","),
        });
    }
    Ok(list.rows)
}

/// Reads pod rows from CSV text: with times (`creation_time|arrival_s`,
/// optionally `deletion_time|departure_s`), or static (neither column).
///
/// # Errors
/// A departure column without an arrival column, and an empty arrival
/// time on any row, are refused with the file, line and column: a trace
/// either times every pod or none.
pub fn parse_pod_list_csv(path: &Path, data: &str) -> Result<PodList> {
    let p = path.display().to_string();
    let (mut reader, cols) = open_csv(path, data)?;
    cols.refuse_other_list(&p, "pod")?;
    let name = cols.find(&["name"]);
    let count = cols.find(&["count"]);
    let cpu = cols.require(&p, &["cpu_milli"])?;
    let mem = cols.require(&p, &["memory_mib"])?;
    let num_gpu = cols.find(&["num_gpu", "gpu"]);
    let gpu_milli = cols.find(&["gpu_milli"]);
    let gpu_spec = cols.find(&["gpu_spec"]);
    let qos = cols.find(&["qos"]);
    let arrival = cols.find(&["creation_time", "arrival_s"]);
    let departure = cols.find(&["deletion_time", "departure_s"]);
    if let (None, Some(d)) = (arrival, departure) {
        return Err(TraceError::BadDocument {
            path: p,
            message: format!(
                "column {} `{}` has no arrival column beside it (creation_time|arrival_s): a trace times every pod or none",
                d + 1,
                cols.header[d].trim()
            ),
        });
    }
    let deadline = cols.find(&["deadline_s"]);
    let (resize, resize_cpu, resize_mem) = (cols.find(&["resize_s"]), cols.find(&["resize_cpu_milli"]), cols.find(&["resize_memory_mib"]));
    let mut rows = Vec::new();
    let mut record = csv::StringRecord::new();
    while let Some(line) = next_record(&mut reader, &mut record, &p)? {
        let row = Row { path: &p, line, record: &record };
        let arrival_s = match arrival {
            Some(col) if row.text(Some(col)).is_empty() => {
                let name = cols.header[col].trim();
                return Err(
                    row.bad(col, format!("{name} is empty: a trace with a {name} column needs it on every row (a static trace has no time columns)"))
                );
            }
            Some(col) => row.int(col, "arrival time")? as Seconds,
            None => 0,
        };
        let departure_s = row.opt_int(departure, "departure time")?.map(|d| d as Seconds);
        if let (Some(d), Some(col)) = (departure_s, departure)
            && d < arrival_s
        {
            return Err(row.bad(col, format!("departure time {d} is before the arrival time {arrival_s}")));
        }
        let num = row.opt_int(num_gpu, "num_gpu")?.unwrap_or(0);
        let milli = row.opt_int(gpu_milli, "gpu_milli")?;
        if let (Some(m), Some(col)) = (milli, gpu_milli)
            && m > 1000
        {
            return Err(row.bad(col, format!("gpu_milli {m} is more than one GPU (1000)")));
        }
        let cpu_milli = row.int(cpu, "cpu_milli")?;
        let memory_mib = row.int(mem, "memory_mib")?;
        let n = row.opt_int(count, "count")?.unwrap_or(1);
        if n > 1_000_000 {
            return Err(row.bad(count.unwrap_or(0), format!("count {n} is more than 1000000")));
        }
        rows.push(PodRow {
            name: {
                let t = row.text(name);
                if t.is_empty() { format!("pod-{line}") } else { t.to_string() }
            },
            count: if count.is_some() { Some(n as u32) } else { None },
            cpu_milli,
            memory_mib,
            num_gpu: num,
            gpu_milli: milli,
            gpu_spec: row.text(gpu_spec).to_string(),
            qos: row.text(qos).to_string(),
            arrival_s,
            departure_s,
            deadline_s: row.opt_int(deadline, "deadline_s")?.map(|d| d as Seconds),
            resize_s: row.opt_int(resize, "resize_s")?.map(|d| d as Seconds),
            resize_cpu_milli: row.opt_int(resize_cpu, "resize_cpu_milli")?,
            resize_memory_mib: row.opt_int(resize_mem, "resize_memory_mib")?,
        });
        let last = rows.last().expect("just pushed");
        if let Err(message) = check_resize(last) {
            let col = [resize, resize_cpu, resize_mem].into_iter().flatten().next().unwrap_or(0);
            return Err(row.bad(col, message));
        }
    }
    if rows.is_empty() {
        return Err(TraceError::Empty { path: p, what: "pods".into() });
    }
    Ok(PodList { rows, timed: arrival.is_some() })
}

/// Reads server rows from CSV text (openb or the user format).
pub fn parse_servers_csv(path: &Path, data: &str) -> Result<Vec<ServerRow>> {
    let p = path.display().to_string();
    let (mut reader, cols) = open_csv(path, data)?;
    cols.refuse_other_list(&p, "server")?;
    let name = cols.require(&p, &["sn", "name"])?;
    let count = cols.find(&["count"]);
    let cpu = cols.require(&p, &["cpu_milli"])?;
    let mem = cols.require(&p, &["memory_mib"])?;
    let gpu = cols.find(&["gpu", "num_gpu"]);
    let model = cols.find(&["model", "gpu_model"]);
    let f = |n: &str| cols.find(&[n]);
    let (idle, peak, boot_w, off, gpu_w) = (f("idle_watts"), f("peak_watts"), f("boot_watts"), f("off_watts"), f("gpu_watts"));
    let (pon, boot, join, ready, tail) = (f("power_on_s"), f("boot_s"), f("join_s"), f("ready_s"), f("tail_percent"));
    let mut rows = Vec::new();
    let mut record = csv::StringRecord::new();
    while let Some(line) = next_record(&mut reader, &mut record, &p)? {
        let row = Row { path: &p, line, record: &record };
        let server_name = row.text(Some(name));
        if server_name.is_empty() {
            return Err(row.bad(name, "empty server name".into()));
        }
        let cpu_milli = row.int(cpu, "cpu_milli")?;
        if cpu_milli == 0 {
            return Err(row.bad(cpu, "a server needs some cpu_milli".into()));
        }
        let u = |c: Option<usize>, what: &str| -> Result<Option<Seconds>> {
            let v = row.opt_int(c, what)?;
            if let (Some(v), Some(col)) = (v, c)
                && v > MAX_STAGE_S
            {
                return Err(row.bad(col, format!("{what}: {v} s is more than a week")));
            }
            Ok(v.map(|v| v as Seconds))
        };
        rows.push(ServerRow {
            name: server_name.to_string(),
            count: match row.opt_int(count, "count")? {
                Some(c) if c > 100_000 => return Err(row.bad(count.unwrap_or(0), format!("count {c} is more than 100000"))),
                c => c.map(|c| c as u32),
            },
            cpu_milli,
            memory_mib: row.int(mem, "memory_mib")?,
            gpu: row.opt_int(gpu, "gpu")?.unwrap_or(0),
            model: row.text(model).to_string(),
            idle_watts: row.opt_float(idle, "idle_watts")?,
            peak_watts: row.opt_float(peak, "peak_watts")?,
            boot_watts: row.opt_float(boot_w, "boot_watts")?,
            off_watts: row.opt_float(off, "off_watts")?,
            gpu_watts: row.opt_float(gpu_w, "gpu_watts")?,
            power_on_s: u(pon, "power_on_s")?,
            boot_s: u(boot, "boot_s")?,
            join_s: u(join, "join_s")?,
            ready_s: u(ready, "ready_s")?,
            tail_percent: match row.opt_int(tail, "tail_percent")? {
                Some(t) if !(100..=1000).contains(&t) => {
                    return Err(row.bad(tail.unwrap_or(0), format!("tail_percent: {t} is not between 100 and 1000")));
                }
                t => t.map(|t| t as u32),
            },
        });
        if let Some(problem) = rows.last().and_then(ServerRow::gpu_watts_problem) {
            return Err(row.bad(gpu_w.unwrap_or(0), problem));
        }
    }
    if rows.is_empty() {
        return Err(TraceError::Empty { path: p, what: "servers".into() });
    }
    Ok(rows)
}

/// Parses the YAML user document.
pub fn parse_user_yaml(path: &Path, data: &str) -> Result<UserDocument> {
    let doc = serde_saphyr::from_str::<UserDocument>(data)
        .map_err(|e| TraceError::BadDocument { path: path.display().to_string(), message: e.to_string() })?;
    for (i, r) in doc.pods.iter().enumerate() {
        check_resize(r)
            .map_err(|why| TraceError::BadDocument { path: path.display().to_string(), message: format!("pods[{i}] ({}): {why}", r.name) })?;
    }
    Ok(doc)
}

/// Whether a trace file is read as the YAML user document (`.yaml`,
/// `.yml`), which can hold servers and pods; else it is CSV.
pub fn is_yaml(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml") | Some("yml"))
}

/// Reads pods with times from a CSV or YAML file.
pub fn read_pods(path: &Path) -> Result<Vec<PodRow>> {
    let list = read_pod_list(path)?;
    if !list.timed {
        return parse_pods_csv(path, &read_text(path)?);
    }
    Ok(list.rows)
}

/// Reads pods from a CSV or YAML file, timed or static (a CSV without
/// time columns; the YAML document always has `arrival_s`).
pub fn read_pod_list(path: &Path) -> Result<PodList> {
    let text = read_text(path)?;
    if is_yaml(path) {
        let doc = parse_user_yaml(path, &text)?;
        if doc.pods.is_empty() {
            return Err(TraceError::Empty { path: path.display().to_string(), what: "pods".into() });
        }
        check_yaml_pods(path, &doc.pods)?;
        return Ok(PodList { rows: doc.pods, timed: true });
    }
    parse_pod_list_csv(path, &text)
}

/// Checks what the CSV reader checks per field on rows read from YAML.
fn check_yaml_servers(path: &Path, rows: &[ServerRow]) -> Result<()> {
    for (i, r) in rows.iter().enumerate() {
        let bad =
            |message: String| TraceError::BadDocument { path: path.display().to_string(), message: format!("servers[{i}] ({}): {message}", r.name) };
        if r.name.is_empty() || r.cpu_milli <= 0 || r.memory_mib < 0 || r.gpu < 0 {
            return Err(bad("needs a name, cpu_milli > 0, memory_mib and gpu >= 0".into()));
        }
        if [r.cpu_milli, r.memory_mib, r.gpu].iter().any(|&v| v > MAX_FIELD) || r.count.is_some_and(|c| c > 100_000) {
            return Err(bad("implausibly large cpu_milli, memory_mib, gpu or count".into()));
        }
        for (what, v) in [("power_on_s", r.power_on_s), ("boot_s", r.boot_s), ("join_s", r.join_s), ("ready_s", r.ready_s)] {
            if v.is_some_and(|v| v > MAX_STAGE_S as Seconds) {
                return Err(bad(format!("{what} is more than a week")));
            }
        }
        for (what, v) in [
            ("idle_watts", r.idle_watts),
            ("peak_watts", r.peak_watts),
            ("boot_watts", r.boot_watts),
            ("off_watts", r.off_watts),
            ("gpu_watts", r.gpu_watts),
        ] {
            if v.is_some_and(|w| !w.is_finite() || !(0.0..=1e6).contains(&w)) {
                return Err(bad(format!("{what} is not between 0 and 1000000")));
            }
        }
        if r.tail_percent.is_some_and(|t| !(100..=1000).contains(&t)) {
            return Err(bad("tail_percent is not between 100 and 1000".into()));
        }
        if let Some(problem) = r.gpu_watts_problem() {
            return Err(bad(problem));
        }
    }
    Ok(())
}

fn check_yaml_pods(path: &Path, rows: &[PodRow]) -> Result<()> {
    for (i, r) in rows.iter().enumerate() {
        let bad =
            |message: String| TraceError::BadDocument { path: path.display().to_string(), message: format!("pods[{i}] ({}): {message}", r.name) };
        if r.cpu_milli < 0 || r.memory_mib < 0 || r.num_gpu < 0 || r.gpu_milli.is_some_and(|m| !(0..=1000).contains(&m)) {
            return Err(bad("requests must be non-negative and gpu_milli at most 1000".into()));
        }
        if [r.cpu_milli, r.memory_mib, r.num_gpu].iter().any(|&v| v > MAX_FIELD)
            || r.arrival_s > MAX_FIELD as Seconds
            || r.departure_s.is_some_and(|d| d > MAX_FIELD as Seconds)
        {
            return Err(bad("implausibly large request or time".into()));
        }
        if r.departure_s.is_some_and(|d| d < r.arrival_s) {
            return Err(bad("departure_s is before arrival_s".into()));
        }
        if r.count.is_some_and(|c| c > 1_000_000) {
            return Err(bad("count is more than 1000000".into()));
        }
    }
    Ok(())
}

/// Reads servers from a CSV or YAML file.
pub fn read_servers(path: &Path) -> Result<Vec<ServerRow>> {
    let text = read_text(path)?;
    if is_yaml(path) {
        let doc = parse_user_yaml(path, &text)?;
        if doc.servers.is_empty() {
            return Err(TraceError::Empty { path: path.display().to_string(), what: "servers".into() });
        }
        check_yaml_servers(path, &doc.servers)?;
        return Ok(doc.servers);
    }
    parse_servers_csv(path, &text)
}

impl ServerRow {
    /// What the row says the server draws, the rest as `estimated` from its
    /// hardware. Stated idle and peak watts keep the estimated GPUs' share
    /// of the range between them, unless the GPUs' watts are stated too.
    fn power_over(&self, estimated: PowerProfile) -> PowerProfile {
        let mut p = estimated;
        let range = |p: &PowerProfile| (p.peak_watts - p.idle_watts).max(0.0);
        let gpu_share = p.gpu_watts.map(|g| if range(&p) > 0.0 { g / range(&p) } else { 0.0 });
        if let Some(w) = self.idle_watts {
            p.idle_watts = w;
        }
        if let Some(w) = self.peak_watts {
            p.peak_watts = w.max(p.idle_watts);
        }
        p.gpu_watts = self.gpu_watts.or(gpu_share.map(|share| share * range(&p)));
        if let Some(w) = self.boot_watts {
            p.boot_watts = w;
        }
        if let Some(w) = self.off_watts {
            p.off_watts = w;
        }
        p
    }

    /// Why the row's `gpu_watts` cannot be, if it cannot.
    fn gpu_watts_problem(&self) -> Option<String> {
        let w = self.gpu_watts?;
        let p = self.power_over(estimated_power(self.cpu_milli, self.memory_mib.saturating_mul(1 << 20), self.gpu, &self.model));
        let range = (p.peak_watts - p.idle_watts).max(0.0);
        (w > range).then(|| format!("gpu_watts {w} is more than peak_watts - idle_watts ({range})"))
    }
}

/// Turns server rows into inventory servers, expanding counts.
pub fn servers_from_rows(rows: &[ServerRow]) -> Vec<Server> {
    let mut out = Vec::new();
    for r in rows {
        let n = r.count.unwrap_or(1);
        for k in 0..n {
            let name = if r.count.is_some() { format!("{}-{k}", r.name) } else { r.name.clone() };
            let mut s = hardware_server(&name, r.cpu_milli, r.memory_mib, r.gpu, &r.model);
            s.power = r.power_over(s.power);
            let d = &mut s.durations;
            d.power_on_s = r.power_on_s.unwrap_or(d.power_on_s);
            d.boot_s = r.boot_s.unwrap_or(d.boot_s);
            d.join_s = r.join_s.unwrap_or(d.join_s);
            d.ready_s = r.ready_s.unwrap_or(d.ready_s);
            d.tail_percent = r.tail_percent.unwrap_or(d.tail_percent);
            out.push(s);
        }
    }
    out
}

/// A row's resize, if it has one, must run while the pod does and say
/// what it grows to.
fn check_resize(r: &PodRow) -> std::result::Result<(), String> {
    let sized = r.resize_cpu_milli.is_some() || r.resize_memory_mib.is_some();
    match r.resize_s {
        None if sized => Err("resize_cpu_milli or resize_memory_mib without resize_s: when is the resize asked?".into()),
        None => Ok(()),
        Some(_) if !sized => Err("resize_s without resize_cpu_milli or resize_memory_mib: what does the pod resize to?".into()),
        Some(at) if at < r.arrival_s => Err(format!("resize_s {at} is before the arrival time {}", r.arrival_s)),
        Some(at) if r.departure_s.is_some_and(|d| at >= d) => {
            Err(format!("resize_s {at} is not before the departure time {}", r.departure_s.unwrap_or_default()))
        }
        Some(_) if r.resize_cpu_milli.is_some_and(|c| c <= 0) || r.resize_memory_mib.is_some_and(|m| m <= 0) => {
            Err("a resize to zero or less".into())
        }
        Some(_) => Ok(()),
    }
}

/// Turns pod rows into trace pods, expanding counts. A gpu_spec becomes
/// required node affinity on the GPU model label.
pub fn pods_from_rows(rows: &[PodRow]) -> Vec<TracePod> {
    let mut out = Vec::new();
    for r in rows {
        let n = r.count.unwrap_or(1);
        for k in 0..n {
            let name = if r.count.is_some() { format!("{}-{k}", r.name) } else { r.name.clone() };
            let milli = r.gpu_milli.unwrap_or(if r.num_gpu > 0 { 1000 } else { 0 });
            let mut pod = Pod::new("trace", &name, pod_requests(r.cpu_milli, r.memory_mib, r.num_gpu, milli));
            let models: Vec<&str> = r.gpu_spec.split('|').map(str::trim).filter(|m| !m.is_empty()).collect();
            if !models.is_empty() {
                pod.node_affinity.push(NodeSelectorTerm {
                    match_expressions: vec![Requirement::new(GPU_MODEL_LABEL, Operator::In, &models)],
                    match_fields: Vec::new(),
                });
            }
            pod.deadline_s = Some(r.deadline_s.unwrap_or_else(|| deadline_for_qos(&r.qos)));
            pod.created_s = r.arrival_s;
            pod.workload = Some(if r.qos.is_empty() { "trace".to_string() } else { r.qos.clone() });
            let resize = r.resize_s.map(|at_s| {
                let mut to = pod.requests.clone();
                to.cpu_milli = r.resize_cpu_milli.unwrap_or(to.cpu_milli);
                to.memory_bytes = r.resize_memory_mib.map_or(to.memory_bytes, |m| m * 1024 * 1024);
                crate::workload::TraceResize { at_s, to }
            });
            out.push(TracePod { pod, arrival_s: r.arrival_s, departure_s: r.departure_s, resize });
        }
    }
    out
}

/// A workload from server and pod rows, with one ServerPool for every server.
pub fn workload_from_rows(name: &str, servers: &[ServerRow], pods: &[PodRow]) -> Workload {
    let mut w = Workload {
        name: name.to_string(),
        servers: servers_from_rows(servers),
        pools: vec![ServerPool::new("default")],
        daemonsets: Vec::new(),
        pods: pods_from_rows(pods),
        end_s: 0,
    };
    w.end_s = w.last_event_s();
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENB_PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
        openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n\
        openb-pod-0001,6000,12288,1,460,V100M16|V100M32,BE,Running,427061,12902960,427061\n\
        openb-pod-0002,88000,327680,0,0,,LS,Pending,5,,\n";

    #[test]
    fn openb_pod_rows_parse_with_shares_specs_and_open_ends() {
        let rows = parse_pods_csv(Path::new("pods.csv"), OPENB_PODS).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].gpu_milli, Some(460));
        assert_eq!(rows[2].departure_s, None);
        let pods = pods_from_rows(&rows);
        assert_eq!(pods[1].pod.node_affinity[0].match_expressions[0].values, vec!["V100M16", "V100M32"]);
        assert_eq!(pods[0].pod.deadline_s, Some(300));
        assert_eq!(pods[1].pod.deadline_s, Some(1800));
    }

    #[test]
    fn a_bad_field_names_file_line_and_column() {
        let bad = "name,cpu_milli,memory_mib,creation_time\nok,1000,1024,0\nbad,lots,1024,5\n";
        let err = parse_pods_csv(Path::new("p.csv"), bad).unwrap_err();
        assert_eq!(err.to_string(), "p.csv:3:2: cpu_milli: `lots` is not an integer");
    }

    #[test]
    fn a_departure_before_arrival_is_refused() {
        let bad = "name,cpu_milli,memory_mib,creation_time,deletion_time\nx,1000,1024,50,10\n";
        let err = parse_pods_csv(Path::new("p.csv"), bad).unwrap_err();
        assert!(matches!(err, TraceError::BadField { line: 2, column: 5, .. }), "{err}");
    }

    #[test]
    fn a_missing_column_is_named() {
        let err = parse_pods_csv(Path::new("p.csv"), "name,cpu_milli\nx,1\n").unwrap_err();
        assert!(err.to_string().contains("memory_mib"), "{err}");
    }

    #[test]
    fn openb_server_rows_parse_and_gpu_servers_offer_milli_gpus() {
        let text = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,96000,393216,8,G2\n";
        let rows = parse_servers_csv(Path::new("n.csv"), text).unwrap();
        let servers = servers_from_rows(&rows);
        assert_eq!(servers[1].capacity.extended(ironclaim_core::GPU_MILLI), 8000);
        assert_eq!(servers[1].labels.get(GPU_MODEL_LABEL).map(String::as_str), Some("G2"));
        assert!(servers[0].capacity.extended.is_empty());
    }

    #[test]
    fn the_yaml_user_format_expands_counts_and_keeps_stated_watts() {
        let doc = "servers:\n  - name: rack1\n    count: 3\n    cpu_milli: 32000\n    memory_mib: 131072\n    idle_watts: 150\n\
                   pods:\n  - name: web\n    count: 2\n    cpu_milli: 1000\n    memory_mib: 2048\n    arrival_s: 10\n    departure_s: 70\n";
        let d = parse_user_yaml(Path::new("u.yaml"), doc).unwrap();
        let w = workload_from_rows("u", &d.servers, &d.pods);
        assert_eq!(w.servers.len(), 3);
        assert_eq!(w.servers[2].name, "rack1-2");
        assert_eq!(w.servers[0].power.idle_watts, 150.0);
        assert_eq!(w.pods.len(), 2);
        assert_eq!(w.end_s, 70);
    }

    #[test]
    fn absurd_stage_durations_and_tails_are_refused() {
        let text = "sn,cpu_milli,memory_mib,boot_s\nn0,32000,1024,99999999999\n";
        let err = parse_servers_csv(Path::new("n.csv"), text).unwrap_err();
        assert!(matches!(err, TraceError::BadField { line: 2, column: 4, .. }), "{err}");
        let text = "sn,cpu_milli,memory_mib,tail_percent\nn0,32000,1024,50\n";
        assert!(parse_servers_csv(Path::new("n.csv"), text).is_err());
        let dir = std::env::temp_dir().join(format!("ironclaim-trace-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = dir.join("bad.yaml");
        std::fs::write(&yaml, "servers:\n  - name: a\n    cpu_milli: 1000\n    memory_mib: 1\n    boot_s: 99999999999\n").unwrap();
        assert!(read_servers(&yaml).is_err());
        std::fs::write(&yaml, "pods:\n  - name: a\n    cpu_milli: 1\n    memory_mib: 1\n    arrival_s: 9\n    departure_s: 3\n").unwrap();
        assert!(read_pods(&yaml).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// `gpu_watts` is the GPUs' part of the range; stated idle and peak
    /// watts without it keep the estimated share; more than the range is
    /// refused, naming the line and column.
    #[test]
    fn the_gpus_part_of_a_servers_power_range_is_read_kept_or_refused() {
        let text = "sn,cpu_milli,memory_mib,gpu,model,idle_watts,peak_watts,gpu_watts\n\
                    a,96000,393216,8,G2,400,2400,1600\n\
                    b,96000,393216,8,G2,400,2400,\n\
                    c,96000,393216,0,,400,2400,\n";
        let rows = parse_servers_csv(Path::new("n.csv"), text).unwrap();
        let servers = servers_from_rows(&rows);
        assert_eq!(servers[0].power.gpu_watts, Some(1600.0));
        let estimated = estimated_power(96_000, 393_216 << 20, 8, "G2");
        let share = estimated.gpu_watts.unwrap() / (estimated.peak_watts - estimated.idle_watts);
        let kept = servers[1].power.gpu_watts.unwrap();
        assert!((kept - share * 2000.0).abs() < 1e-6, "{kept} vs {}", share * 2000.0);
        assert_eq!(servers[2].power.gpu_watts, None);
        let err = parse_servers_csv(Path::new("n.csv"), "sn,cpu_milli,memory_mib,gpu,idle_watts,peak_watts,gpu_watts\nn0,32000,1024,1,100,300,250\n")
            .unwrap_err();
        assert!(matches!(err, TraceError::BadField { line: 2, column: 7, .. }), "{err}");
        assert!(err.to_string().contains("gpu_watts 250 is more than peak_watts - idle_watts (200)"), "{err}");
        let doc = "servers:\n  - name: a\n    cpu_milli: 1000\n    memory_mib: 1\n    idle_watts: 100\n    peak_watts: 300\n    gpu_watts: 250\n";
        let dir = std::env::temp_dir().join(format!("ironclaim-trace-gpu-watts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = dir.join("bad.yaml");
        std::fs::write(&yaml, doc).unwrap();
        let err = read_servers(&yaml).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).ok();
        assert!(err.contains("servers[0] (a): gpu_watts 250 is more than peak_watts - idle_watts (200)"), "{err}");
    }

    #[test]
    fn a_pod_list_is_not_read_as_servers_nor_a_server_list_as_pods() {
        let err = parse_servers_csv(Path::new("openb_pod_list_default.csv"), OPENB_PODS).unwrap_err();
        assert_eq!(err.to_string(), "openb_pod_list_default.csv: the column `gpu_milli` is a pod column: this is a pod list, not a server list");
        let nodes = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\n";
        let err = parse_pods_csv(Path::new("nodes.csv"), nodes).unwrap_err();
        assert_eq!(err.to_string(), "nodes.csv: the column `sn` is a server column: this is a server list, not a pod list");
        let user_servers = "name,cpu_milli,memory_mib,idle_watts\nr1,32000,1024,150\n";
        assert!(matches!(parse_pods_csv(Path::new("s.csv"), user_servers), Err(TraceError::WrongList { .. })));
    }

    #[test]
    fn an_unknown_yaml_field_is_refused() {
        let doc = "pods:\n  - name: web\n    cpu: 1\n";
        assert!(parse_user_yaml(Path::new("u.yaml"), doc).is_err());
    }

    #[test]
    fn a_csv_without_time_columns_is_a_static_list_in_file_order() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,12000,16384,1,1000\nb,6000,12288,1,460\n";
        let list = parse_pod_list_csv(Path::new("multigpu.csv"), text).unwrap();
        assert!(!list.timed);
        assert_eq!(list.rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let err = parse_pods_csv(Path::new("multigpu.csv"), text).unwrap_err();
        assert!(matches!(&err, TraceError::MissingColumn { column, .. } if column == "creation_time|arrival_s"), "{err}");
    }

    #[test]
    fn a_partial_time_column_names_file_line_and_column() {
        let text = "name,cpu_milli,memory_mib,creation_time,deletion_time\na,1000,1024,0,50\nb,1000,1024,,\n";
        let err = parse_pod_list_csv(Path::new("p.csv"), text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "p.csv:3:4: creation_time is empty: a trace with a creation_time column needs it on every row (a static trace has no time columns)"
        );
        let text = "name,cpu_milli,memory_mib,deletion_time\na,1000,1024,50\n";
        let err = parse_pod_list_csv(Path::new("p.csv"), text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "p.csv: column 4 `deletion_time` has no arrival column beside it (creation_time|arrival_s): a trace times every pod or none"
        );
    }
}
