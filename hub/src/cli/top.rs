//! `sandhub top`: the caller's running sandboxes by CPU and memory, from
//! the latest usage sample each carries (`GET /v1/sandboxes`), redrawn in
//! place every `--interval` until Ctrl-C; `--once` prints one table (or
//! JSON with `-o json`) and exits, for scripts.

use std::time::Duration;

use clap::Args;
use sandhub_api::hub::{Sandbox, SandboxState};
use sandhub_client::{Result, Sandboxes};

use super::{
    args::{parse_duration, parse_key_value, to_map},
    output, ClientArgs, Output,
};

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print once and exit (no screen redraws).
    #[arg(long, env = "SANDHUB_TOP_ONCE")]
    once: bool,

    /// Time between refreshes (e.g. 2s).
    #[arg(long, value_name = "DURATION", default_value = "1s", env = "SANDHUB_TOP_INTERVAL",
          value_parser = parse_duration)]
    interval: Duration,

    /// Sort by `cpu` (default) or `memory`.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "memory"], env = "SANDHUB_TOP_SORT")]
    sort: String,

    /// Only sandboxes with this label, repeatable (env: comma-separated).
    #[arg(long = "label", value_name = "KEY=VALUE", env = "SANDHUB_LABELS",
          value_delimiter = ',', value_parser = parse_key_value)]
    labels: Vec<(String, String)>,

    #[command(flatten)]
    client: ClientArgs,
}

pub async fn top(args: TopArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let labels = to_map(args.labels);
    let by_memory = args.sort == "memory";
    loop {
        let mut running: Vec<Sandbox> = hub
            .list(&labels)
            .await?
            .into_iter()
            .filter(|s| s.state == SandboxState::Ready)
            .collect();
        sort(&mut running, by_memory);
        if args.once || args.client.output == Output::Json {
            output::show(args.client.output, &running, || table(&running))?;
            return Ok(0);
        }
        // Home, draw, clear what the last (longer) table left below.
        output::line(&format!("\x1b[H{}\x1b[J", table(&running)))?;
        tokio::select! {
            _ = tokio::time::sleep(args.interval.max(Duration::from_millis(200))) => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
    }
}

fn sort(sandboxes: &mut [Sandbox], by_memory: bool) {
    let key = |s: &Sandbox| -> (u64, u64) {
        let u = s.usage.as_ref();
        let cpu = u.map_or(0, |u| (u.latest.cpu_cores * 1000.0) as u64);
        let mem = u.map_or(0, |u| u.latest.memory_bytes);
        if by_memory {
            (mem, cpu)
        } else {
            (cpu, mem)
        }
    };
    sandboxes.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.id.cmp(&b.id)));
}

fn mib(bytes: u64) -> String {
    format!("{}Mi", bytes.div_ceil(1 << 20))
}

fn table(sandboxes: &[Sandbox]) -> String {
    let rows: Vec<Vec<String>> = sandboxes
        .iter()
        .map(|s| {
            let Some(u) = &s.usage else {
                return vec![
                    s.id.clone(),
                    s.template.clone(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ];
            };
            let (l, x) = (&u.limits, &u.latest);
            let cpu = match l.cpu {
                Some(c) => format!("{:.2}/{c}", x.cpu_cores),
                None => format!("{:.2}", x.cpu_cores),
            };
            let mem = match l.memory_mb {
                Some(m) => format!(
                    "{}/{m}Mi ({:.0}%)",
                    x.memory_bytes.div_ceil(1 << 20),
                    x.memory_bytes as f64 / (m.max(1) << 20) as f64 * 100.0
                ),
                None => mib(x.memory_bytes),
            };
            let pids = match l.pids {
                Some(p) => format!("{}/{p}", x.pids),
                None => x.pids.to_string(),
            };
            let disk = match (x.disk_bytes, l.disk_mb) {
                (Some(d), Some(m)) => format!("{}/{m}Mi", d.div_ceil(1 << 20)),
                (Some(d), None) => mib(d),
                _ => "-".into(),
            };
            vec![
                s.id.clone(),
                s.template.clone(),
                cpu,
                mem,
                pids,
                disk,
                u.oom_kills.to_string(),
            ]
        })
        .collect();
    output::table(
        &["ID", "TEMPLATE", "CPU", "MEMORY", "PIDS", "DISK", "OOM"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use sandhub_api::usage::{SandboxUsage, UsageLimits, UsageSample};

    use super::*;

    fn sb(id: &str, cpu: f64, mem: u64) -> Sandbox {
        let mut s: Sandbox = serde_json::from_value(serde_json::json!({
            "id": id, "template": "default", "state": "Ready", "labels": {},
            "launch": "cold", "created_at": "2026-01-01T00:00:00Z"
        }))
        .unwrap();
        s.usage = Some(SandboxUsage {
            latest: UsageSample {
                cpu_cores: cpu,
                memory_bytes: mem << 20,
                pids: 3,
                ..Default::default()
            },
            limits: UsageLimits {
                memory_mb: Some(64),
                cpu: Some(1.0),
                ..Default::default()
            },
            ..Default::default()
        });
        s
    }

    #[test]
    fn sorted_by_cpu_then_memory() {
        let mut all = vec![sb("a", 0.1, 60), sb("b", 0.9, 10), sb("c", 0.1, 10)];
        sort(&mut all, false);
        let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["b", "a", "c"]);
        sort(&mut all, true);
        assert_eq!(all[0].id, "a");
        let t = table(&all);
        assert!(t.starts_with("ID"), "{t}");
        assert!(t.contains("60/64Mi (94%)"), "{t}");
        assert!(t.contains("0.90/1"), "{t}");
    }
}
