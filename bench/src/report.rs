//! The result of a suite: a table of measurement / baseline / measured /
//! ratio / target / verdict rows, printed as Markdown (so it can be pasted
//! into docs/benchmarks.md as is) or as JSON.

use std::fmt;

use serde::Serialize;

use crate::machine::Machine;

/// Everything one suite measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The suite's name, which is also the component it measures and the
    /// heading of the measured column.
    pub suite: &'static str,
    pub machine: Machine,
    pub rows: Vec<Row>,
    /// Supporting numbers without a target (thread counts, RSS breakdown,
    /// sample counts), in the order they were measured.
    pub details: Vec<Detail>,
}

#[derive(Debug, Serialize)]
pub struct Detail {
    pub name: String,
    pub value: String,
}

/// One measurement, optionally next to its baseline and against a target.
#[derive(Debug, Serialize)]
pub struct Row {
    pub measurement: String,
    pub baseline: Option<Value>,
    /// The component under test's number.
    pub measured: Value,
    /// `measured / baseline`, whatever the unit: above 1 means slower for a
    /// latency and faster for a throughput.
    pub ratio: Option<f64>,
    pub target: Option<Target>,
    /// None when the row has no target.
    pub pass: Option<bool>,
}

/// A number with its unit.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Value {
    pub amount: f64,
    pub unit: Unit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Microseconds,
    MegabytesPerSecond,
    Mebibytes,
    /// Operations (e.g. Gym env steps) per second.
    PerSecond,
    /// A plain count (e.g. failed calls).
    Count,
    /// A share (e.g. of one CPU core), in percent.
    Percent,
}

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Target {
    /// The ratio must not exceed this (latencies).
    RatioAtMost(f64),
    /// The ratio must reach at least this (throughputs).
    RatioAtLeast(f64),
    /// The measured value itself must not exceed this.
    AtMost(Value),
    /// The measured value may exceed the baseline by this much at most
    /// (a latency the component adds, e.g. "+1 ms").
    AboveBaselineAtMost(Value),
}

impl Value {
    pub fn new(amount: f64, unit: Unit) -> Self {
        Value { amount, unit }
    }
}

impl Row {
    /// A measurement next to its baseline; the ratio is measured / baseline.
    pub fn compare(
        measurement: impl Into<String>,
        baseline: Value,
        measured: Value,
        target: Option<Target>,
    ) -> Self {
        debug_assert_eq!(baseline.unit, measured.unit);
        let ratio = measured.amount / baseline.amount;
        let pass = target.map(|t| match t {
            Target::RatioAtMost(max) => ratio <= max,
            Target::RatioAtLeast(min) => ratio >= min,
            Target::AtMost(max) => measured.amount <= max.amount,
            Target::AboveBaselineAtMost(d) => measured.amount - baseline.amount <= d.amount,
        });
        Row {
            measurement: measurement.into(),
            baseline: Some(baseline),
            measured,
            ratio: Some(ratio),
            target,
            pass,
        }
    }

    /// A measurement with no baseline, against an absolute target or none.
    pub fn absolute(measurement: impl Into<String>, measured: Value, max: Option<Value>) -> Self {
        Row {
            measurement: measurement.into(),
            baseline: None,
            measured,
            ratio: None,
            target: max.map(Target::AtMost),
            pass: max.map(|m| measured.amount <= m.amount),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unit {
            Unit::Microseconds if self.amount >= 10_000.0 => {
                write!(f, "{:.1} ms", self.amount / 1000.0)
            }
            Unit::Microseconds => write!(f, "{:.0} µs", self.amount),
            Unit::MegabytesPerSecond => write!(f, "{:.0} MB/s", self.amount),
            Unit::Mebibytes => write!(f, "{:.2} MiB", self.amount),
            Unit::PerSecond if self.amount < 10.0 => write!(f, "{:.2}/s", self.amount),
            Unit::PerSecond => write!(f, "{:.0}/s", self.amount),
            Unit::Count => write!(f, "{:.0}", self.amount),
            Unit::Percent => write!(f, "{:.2}%", self.amount),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::RatioAtMost(r) => write!(f, "≤ {r}×"),
            Target::RatioAtLeast(r) => write!(f, "≥ {r}×"),
            Target::AtMost(v) => write!(f, "≤ {v}"),
            Target::AboveBaselineAtMost(v) => write!(f, "≤ +{v}"),
        }
    }
}

impl Report {
    pub fn detail(&mut self, name: impl Into<String>, value: impl fmt::Display) {
        self.details.push(Detail {
            name: name.into(),
            value: value.to_string(),
        });
    }

    pub fn print_json(&self) -> anyhow::Result<()> {
        println!("{}", serde_json::to_string_pretty(self)?);
        Ok(())
    }

    pub fn print_table(&self) {
        print!("{}", self.table());
    }

    fn table(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "sandhub-bench {}: {} CPUs ({}), Linux {}, work dir on {}, load average {}\n\n",
            self.suite, m.nproc, m.cpu_model, m.kernel, m.work_dir_fs, m.load_average
        );
        let header = [
            "measurement",
            "baseline",
            self.suite,
            "ratio",
            "target",
            "result",
        ]
        .map(String::from)
        .to_vec();
        let dash = || "—".to_string();
        let mut lines = vec![header];
        for r in &self.rows {
            lines.push(vec![
                r.measurement.clone(),
                r.baseline.map_or_else(dash, |b| b.to_string()),
                r.measured.to_string(),
                r.ratio.map_or_else(dash, |x| format!("{x:.2}×")),
                r.target.map_or_else(dash, |t| t.to_string()),
                match r.pass {
                    Some(true) => "PASS".into(),
                    Some(false) => "MISS".into(),
                    None => dash(),
                },
            ]);
        }
        out += &markdown(&lines);
        if !self.details.is_empty() {
            out += "\n";
            for d in &self.details {
                out += &format!("- {}: {}\n", d.name, d.value);
            }
        }
        out
    }
}

/// A Markdown table with padded columns (widths in characters, so `µ`,
/// `≤` and `—` line up too).
fn markdown(lines: &[Vec<String>]) -> String {
    let cols = lines[0].len();
    let width = |c: usize| {
        lines
            .iter()
            .map(|l| l[c].chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..cols).map(width).collect();
    let row = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, &w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    let mut out = row(&lines[0]);
    out += &row(&rule);
    for l in &lines[1..] {
        out += &row(l);
    }
    out
}

/// Prints `phase: done/total` to stderr at every tenth of the way, so a
/// long phase shows it is alive without flooding the terminal.
pub struct Progress {
    phase: &'static str,
    total: u64,
    next_tenth: u64,
}

impl Progress {
    pub fn new(phase: &'static str, total: u64) -> Self {
        Progress {
            phase,
            total,
            next_tenth: 1,
        }
    }

    pub fn update(&mut self, done: u64) {
        if self.total > 0 && done * 10 >= self.next_tenth * self.total {
            eprintln!("{}: {done}/{}", self.phase, self.total);
            self.next_tenth = done * 10 / self.total + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(x: f64) -> Value {
        Value::new(x, Unit::Microseconds)
    }

    #[test]
    fn ratio_targets() {
        let r = Row::compare("exec", us(100.0), us(140.0), Some(Target::RatioAtMost(1.5)));
        assert_eq!(r.pass, Some(true));
        assert!((r.ratio.unwrap() - 1.4).abs() < 1e-9);
        let mbps = |x| Value::new(x, Unit::MegabytesPerSecond);
        let r = Row::compare(
            "up",
            mbps(1000.0),
            mbps(400.0),
            Some(Target::RatioAtLeast(0.5)),
        );
        assert_eq!(r.pass, Some(false));
        let added = Some(Target::AboveBaselineAtMost(us(1000.0)));
        assert_eq!(
            Row::compare("connect", us(300.0), us(1200.0), added).pass,
            Some(true)
        );
        assert_eq!(
            Row::compare("connect", us(300.0), us(1400.0), added).pass,
            Some(false)
        );
    }

    #[test]
    fn absolute_targets() {
        let mib = |x| Value::new(x, Unit::Mebibytes);
        assert_eq!(
            Row::absolute("rss", mib(4.0), Some(mib(5.0))).pass,
            Some(true)
        );
        assert_eq!(
            Row::absolute("rss", mib(6.0), Some(mib(5.0))).pass,
            Some(false)
        );
        assert_eq!(Row::absolute("rss", mib(6.0), None).pass, None);
    }

    #[test]
    fn table_columns_line_up() {
        let t = markdown(&[
            vec!["a".into(), "µs".into()],
            vec!["long".into(), "—".into()],
        ]);
        let widths: Vec<usize> = t.lines().map(|l| l.chars().count()).collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{t}");
    }
}
