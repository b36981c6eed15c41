//! `--baseline-bin`: the same phases against two hub builds, so a
//! regression shows as a ratio measured on one machine in one run.
//!
//! Each round runs every selected phase against one binary, then against
//! the other, with its own hub and state dir; which binary goes first
//! alternates between rounds, so a machine that gets busier or quieter
//! during the run weighs on both alike. A row is the median of the new
//! binary's rounds over the median of the old one's, with the ranges as
//! details. A latency (or memory) more than 10% above the old build's, or
//! a throughput more than 10% below it, is a MISS.

use std::{collections::BTreeMap, path::PathBuf};

use super::Args;
use crate::{
    report::{Report, Row, Target, Unit, Value},
    stats::median,
};

/// What one measurement gave in each round, per binary.
#[derive(Default)]
struct Samples {
    unit: Option<Unit>,
    old: Vec<f64>,
    new: Vec<f64>,
}

pub async fn run(args: Args, baseline: PathBuf) -> anyhow::Result<Report> {
    let new_bin = args.sandhub_bin();
    let mut order: Vec<String> = Vec::new();
    let mut samples: BTreeMap<String, Samples> = BTreeMap::new();
    let mut machine = None;
    for round in 0..args.rounds {
        let sides = if round % 2 == 0 {
            [(true, &baseline), (false, &new_bin)]
        } else {
            [(false, &new_bin), (true, &baseline)]
        };
        for (is_old, bin) in sides {
            eprintln!(
                "round {}/{}: {} ({})",
                round + 1,
                args.rounds,
                if is_old { "baseline" } else { "new" },
                bin.display()
            );
            let mut one = args.clone();
            one.sandhub_bin = Some(bin.clone());
            one.baseline_bin = None;
            let report = Box::pin(super::run(one)).await?;
            for row in report.rows {
                if !order.contains(&row.measurement) {
                    order.push(row.measurement.clone());
                }
                let s = samples.entry(row.measurement).or_default();
                s.unit = Some(row.measured.unit);
                if is_old { &mut s.old } else { &mut s.new }.push(row.measured.amount);
            }
            machine.get_or_insert(report.machine);
        }
    }
    let mut report = Report {
        suite: "hub",
        machine: machine.expect("at least one round ran"),
        rows: Vec::new(),
        details: Vec::new(),
    };
    report.detail("baseline binary", baseline.display());
    report.detail("new binary", new_bin.display());
    report.detail(
        "rounds",
        format!("{} per binary, alternating which goes first", args.rounds),
    );
    for name in order {
        let s = &samples[&name];
        let (Some(unit), false, false) = (s.unit, s.old.is_empty(), s.new.is_empty()) else {
            continue;
        };
        let (old, new) = (median(&s.old), median(&s.new));
        if old == 0.0 {
            continue;
        }
        report.rows.push(Row::compare(
            format!("{name}, new ÷ baseline"),
            Value::new(old, unit),
            Value::new(new, unit),
            target(unit),
        ));
        report.detail(
            name,
            format!(
                "baseline {} .. {}, new {} .. {}",
                Value::new(min(&s.old), unit),
                Value::new(max(&s.old), unit),
                Value::new(min(&s.new), unit),
                Value::new(max(&s.new), unit),
            ),
        );
    }
    Ok(report)
}

/// No more than 10% worse than the baseline, in the unit's direction.
fn target(unit: Unit) -> Option<Target> {
    match unit {
        Unit::Microseconds | Unit::Mebibytes | Unit::Percent => Some(Target::RatioAtMost(1.1)),
        Unit::PerSecond | Unit::MegabytesPerSecond => Some(Target::RatioAtLeast(0.9)),
        Unit::Count => None,
    }
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_may_not_grow_and_throughputs_may_not_shrink() {
        let lat = Row::compare(
            "x",
            Value::new(100.0, Unit::Microseconds),
            Value::new(115.0, Unit::Microseconds),
            target(Unit::Microseconds),
        );
        assert_eq!(lat.pass, Some(false));
        let rate = Row::compare(
            "y",
            Value::new(100.0, Unit::PerSecond),
            Value::new(95.0, Unit::PerSecond),
            target(Unit::PerSecond),
        );
        assert_eq!(rate.pass, Some(true));
        assert!(target(Unit::Count).is_none());
    }
}
