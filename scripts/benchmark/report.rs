//! The table: each row printed as it is measured and kept, so that `--save FILE` can write
//! them all as JSON and `--compare FILE` can set them beside a saved run.
//!
//! A row is a figure beside its floor (`vs_floor`: the ratio is figure / floor), beside a
//! target (`vs_target`: figure / target), or a figure alone (`info`). Rates (units ending in
//! `/s`) are better higher, everything else (times, memory) lower.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub label: String,
    pub value: f64,
    pub unit: String,
    /// The floor's figure, in the same unit.
    #[serde(default)]
    pub floor: Option<f64>,
    /// What the figure is held to, for people ("≤ 20 ms", "0.02 ms fake").
    #[serde(default)]
    pub against: Option<String>,
    #[serde(default)]
    pub ratio: Option<f64>,
}

impl Row {
    fn higher_is_better(&self) -> bool {
        self.unit.ends_with("/s")
    }
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());

fn figure(value: f64, unit: &str) -> String {
    let decimals = if value.abs() >= 100.0 || unit == "MiB" { 0 } else { 2 };
    format!("{value:.decimals$} {unit}")
}

fn print(row: &Row) {
    let against = match (&row.against, row.floor) {
        (Some(against), _) => against.clone(),
        (None, Some(floor)) => figure(floor, &row.unit),
        (None, None) => "-".into(),
    };
    let ratio = row.ratio.map(|r| format!("{r:.2}")).unwrap_or_default();
    println!("{:<66} {:>16} {:>16} {:>8}", row.label, figure(row.value, &row.unit), against, ratio);
}

fn keep(row: Row) {
    print(&row);
    ROWS.lock().unwrap().push(row);
}

pub fn header() {
    println!("{:<66} {:>16} {:>16} {:>8}", "measure", "kestrel", "floor", "ratio");
}

/// A figure beside its floor, measured the same way in the same run.
pub fn vs_floor(label: &str, value: f64, unit: &str, floor: f64) {
    let ratio = Some(value / floor).filter(|r| r.is_finite());
    keep(Row { label: label.into(), value, unit: unit.into(), floor: Some(floor), against: None, ratio });
}

/// A figure beside a target (`target` in the figure's unit; `how` says it for people).
pub fn vs_target(label: &str, value: f64, unit: &str, target: f64, how: &str) {
    let ratio = Some(value / target).filter(|r| r.is_finite());
    keep(Row { label: label.into(), value, unit: unit.into(), floor: None, against: Some(how.into()), ratio });
}

/// A figure alone.
pub fn info(label: &str, value: f64, unit: &str) {
    keep(Row { label: label.into(), value, unit: unit.into(), floor: None, against: None, ratio: None });
}

pub fn save(path: &str) {
    let rows = ROWS.lock().unwrap();
    let saved = serde_json::json!({
        "machine": machine(),
        "rows": &*rows,
    });
    std::fs::write(path, serde_json::to_string_pretty(&saved).unwrap() + "\n").expect("the file is written");
    println!("saved {} rows to {path}", rows.len());
}

/// What the rows were measured on: cores, the CPU's model, memory.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map_or("", |rest| rest.trim_start_matches([' ', '\t', ':']));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|kb| kb.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024 / 1024);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cores} cores, {model}, {memory} GiB")
}

/// How much worse a ratio may get before `--compare` calls it a regression.
const WORSE_BY: f64 = 0.25;

/// Sets this run's rows beside the saved ones; whether any ratio got worse by more than
/// `WORSE_BY`.
pub fn compare(path: &str) -> bool {
    let saved: serde_json::Value = match std::fs::read_to_string(path).map(|text| serde_json::from_str(&text)) {
        Ok(Ok(saved)) => saved,
        _ => {
            println!("compare: {path} is not a saved run");
            return true;
        }
    };
    let before: Vec<Row> = serde_json::from_value(saved["rows"].clone()).unwrap_or_default();
    println!();
    println!("compared with {path} ({})", saved["machine"].as_str().unwrap_or("?"));
    println!("{:<66} {:>10} {:>10} {:>8}", "measure (ratio to floor or target)", "saved", "now", "change");
    let mut worse = 0;
    for row in ROWS.lock().unwrap().iter() {
        let Some(old) = before.iter().find(|old| old.label == row.label) else { continue };
        let (Some(was), Some(now)) = (old.ratio, row.ratio) else { continue };
        // Positive is better; the same measure as the threshold's.
        let change = match (row.higher_is_better(), was == now) {
            (_, true) => 0.0,
            (true, false) => now / was - 1.0,
            (false, false) => 1.0 - now / was,
        };
        let regressed = match row.higher_is_better() {
            true => now < was * (1.0 - WORSE_BY),
            false => now > was * (1.0 + WORSE_BY),
        };
        worse += usize::from(regressed);
        let mark = if regressed { "  WORSE" } else { "" };
        println!("{:<66} {was:>10.2} {now:>10.2} {:>+7.0}%{mark}", row.label, change * 100.0);
    }
    println!("{worse} row(s) worse by more than {:.0} %", WORSE_BY * 100.0);
    worse > 0
}
