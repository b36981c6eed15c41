//! `get_sandbox_metrics`: a sandbox's latest resource sample against its
//! limits, so a model can see it is about to run out of memory or disk
//! before a command dies of it.

use rmcp::{handler::server::wrapper::Parameters, tool, tool_router, Json};
use sandhub_api::usage::SandboxUsage;
use schemars::JsonSchema;
use serde::Serialize;

use super::sandbox::SandboxParams;
use crate::{
    errors::ToolError,
    provider::SandboxesProvider,
    server::{Hub, SandhubMcp},
};

#[derive(Debug, Default, Serialize, JsonSchema)]
pub struct SandboxMetricsResult {
    pub sandbox_claim_name: String,
    /// One line: each resource as used/limit (percent), e.g.
    /// "cpu 0.48/0.5 cores (96%), memory 61/64 MiB (95%), ...".
    pub summary: String,
    /// When the sample was taken (RFC 3339); absent while the sandbox is
    /// not running or has no sample yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    /// CPU cores used over the last second, and the limit.
    pub cpu_cores: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_limit: Option<f64>,
    pub memory_mb: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_mb: Option<u64>,
    pub memory_peak_mb: f64,
    pub pids: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_limit_mb: Option<u64>,
    /// Processes the kernel killed for want of memory since it started.
    pub oom_kills: u64,
}

fn mb(bytes: u64) -> f64 {
    (bytes as f64 / f64::from(1 << 20) * 10.0).round() / 10.0
}

fn of(used: f64, limit: Option<f64>, unit: &str) -> String {
    match limit {
        Some(l) if l > 0.0 => format!("{used}/{l}{unit} ({:.0}%)", used / l * 100.0),
        _ => format!("{used}{unit} (no limit)"),
    }
}

/// The result for a sandbox with a sample (`None`: not running, or too
/// young to have one).
pub(crate) fn result(id: &str, usage: Option<&SandboxUsage>) -> SandboxMetricsResult {
    let Some(u) = usage else {
        return SandboxMetricsResult {
            sandbox_claim_name: id.to_string(),
            summary: "no sample: the sandbox is not running, or started less than 2 seconds ago"
                .into(),
            ..Default::default()
        };
    };
    let (s, l) = (&u.latest, &u.limits);
    let mut parts = vec![
        format!("cpu {}", of(s.cpu_cores, l.cpu, " cores")),
        format!(
            "memory {}",
            of(mb(s.memory_bytes), l.memory_mb.map(|m| m as f64), " MiB")
        ),
        format!("pids {}", of(s.pids as f64, l.pids.map(|p| p as f64), "")),
    ];
    if let Some(d) = s.disk_bytes {
        parts.push(format!(
            "disk {}",
            of(mb(d), l.disk_mb.map(|m| m as f64), " MiB")
        ));
    }
    if u.oom_kills > 0 {
        parts.push(format!("{} process(es) OOM-killed", u.oom_kills));
    }
    SandboxMetricsResult {
        sandbox_claim_name: id.to_string(),
        summary: parts.join(", "),
        timestamp: Some(s.timestamp.clone()),
        cpu_cores: s.cpu_cores,
        cpu_limit: l.cpu,
        memory_mb: mb(s.memory_bytes),
        memory_limit_mb: l.memory_mb,
        memory_peak_mb: mb(u.memory_peak_bytes),
        pids: s.pids,
        pids_limit: l.pids,
        disk_mb: s.disk_bytes.map(mb),
        disk_limit_mb: l.disk_mb,
        oom_kills: u.oom_kills,
    }
}

#[tool_router(router = metrics_router, vis = "pub(crate)")]
impl<P: SandboxesProvider> SandhubMcp<P> {
    #[tool(
        description = "Show a sandbox's current resource use against its limits: CPU cores, \
        memory, processes and disk, and how many processes were killed for want of memory. \
        Check it when a command is slow or was killed, or before a big job, to see whether \
        the sandbox is about to run out of memory or disk.",
        annotations(
            title = "Sandbox metrics",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    pub async fn get_sandbox_metrics(
        &self,
        Parameters(p): Parameters<SandboxParams>,
        hub: Hub,
    ) -> Result<Json<SandboxMetricsResult>, ToolError> {
        let (sb, id) = self.owned(hub, &p.sandbox_claim_name).await?;
        let sandbox = sb.get(&id).await.map_err(|e| self.gone_or(&id, e))?;
        Ok(Json(result(&id, sandbox.usage.as_ref())))
    }
}

#[cfg(test)]
mod tests {
    use sandhub_api::usage::{UsageLimits, UsageSample};

    use super::*;

    #[test]
    fn the_summary_reads_used_over_limit() {
        let u = SandboxUsage {
            latest: UsageSample {
                timestamp: "2026-01-01T00:00:00Z".into(),
                cpu_cores: 0.5,
                memory_bytes: 60 << 20,
                pids: 3,
                disk_bytes: Some(10 << 20),
                ..Default::default()
            },
            memory_peak_bytes: 64 << 20,
            oom_kills: 2,
            limits: UsageLimits {
                memory_mb: Some(64),
                disk_mb: Some(100),
                cpu: Some(1.0),
                pids: None,
            },
        };
        let r = result("sb-1", Some(&u));
        assert_eq!(
            r.summary,
            "cpu 0.5/1 cores (50%), memory 60/64 MiB (94%), pids 3 (no limit), \
             disk 10/100 MiB (10%), 2 process(es) OOM-killed"
        );
        assert_eq!(r.memory_limit_mb, Some(64));
        assert!(result("sb-1", None).summary.starts_with("no sample"));
    }
}
