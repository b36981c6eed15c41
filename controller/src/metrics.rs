//! Prometheus metrics with upstream's names and labels (spec §2.6), plus the v1.0.9
//! lifecycle metrics. Reconcilers record through the typed helpers; `/metrics` encodes.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upstream's latency buckets in milliseconds (100 ms … 4 min), with 25 and 50 ms in front
/// because our warm claims land there.
pub const LATENCY_BUCKETS_MS: [f64; 14] = [
    25.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 30000.0, 60000.0,
    120000.0, 240000.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_MS)
}

type Labels<const N: usize> = [(&'static str, String); N];
type HistFamily<const N: usize> = Family<Labels<N>, Histogram, fn() -> Histogram>;

fn hist_family<const N: usize>() -> HistFamily<N> {
    Family::new_with_constructor(latency_histogram as fn() -> Histogram)
}

/// Labels of the per-Sandbox lifecycle metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SandboxLabels {
    pub namespace: String,
    pub sandbox_template: String,
    /// `SandboxClaim`, `SandboxWarmPool` or `None`.
    pub owned_by: String,
}

impl SandboxLabels {
    fn base(&self) -> Labels<3> {
        [
            ("namespace", self.namespace.clone()),
            ("sandbox_template", self.sandbox_template.clone()),
            ("owned_by", self.owned_by.clone()),
        ]
    }
    fn with(&self, key: &'static str, value: &str) -> Labels<4> {
        let [a, b, c] = self.base();
        [a, b, c, (key, value.to_string())]
    }
}

/// One row of the `agent_sandboxes` gauge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SandboxGaugeKey {
    pub namespace: String,
    pub ready_condition: String,
    pub expired: bool,
    pub launch_type: String,
    pub sandbox_template: String,
    pub owned_by: String,
    pub created_by: String,
}

/// Labels of `agent_sandbox_claim_creation_total`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClaimCreation {
    pub namespace: String,
    pub sandbox_template: String,
    pub launch_type: String,
    pub warmpool_name: String,
    /// `ready` or `not_ready`.
    pub pod_condition: String,
    pub created_by: String,
}

pub struct Metrics {
    registry: Registry,
    claim_startup_latency: HistFamily<2>,
    claim_controller_startup_latency: HistFamily<2>,
    client_claim_startup_latency: HistFamily<2>,
    creation_latency: HistFamily<3>,
    claim_creation: Family<Labels<6>, Counter>,
    sandboxes: Family<Labels<7>, Gauge>,
    suspend: Family<Labels<4>, Counter>,
    resume: Family<Labels<4>, Counter>,
    suspend_latency: HistFamily<3>,
    resume_latency: HistFamily<3>,
    finished: Family<Labels<4>, Counter>,
    expired: Family<Labels<4>, Counter>,
    reconcile_errors: Family<Labels<2>, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m_claim_startup: HistFamily<2> = hist_family();
        let m_claim_ctrl: HistFamily<2> = hist_family();
        let m_client: HistFamily<2> = hist_family();
        let m_creation: HistFamily<3> = hist_family();
        let m_suspend_lat: HistFamily<3> = hist_family();
        let m_resume_lat: HistFamily<3> = hist_family();
        let claim_creation = Family::<Labels<6>, Counter>::default();
        let sandboxes = Family::<Labels<7>, Gauge>::default();
        let suspend = Family::<Labels<4>, Counter>::default();
        let resume = Family::<Labels<4>, Counter>::default();
        let finished = Family::<Labels<4>, Counter>::default();
        let expired = Family::<Labels<4>, Counter>::default();
        let reconcile_errors = Family::<Labels<2>, Counter>::default();

        registry.register(
            "agent_sandbox_claim_startup_latency_ms",
            "Claim creation to claim Ready, in milliseconds",
            m_claim_startup.clone(),
        );
        registry.register(
            "agent_sandbox_claim_controller_startup_latency_ms",
            "Controller first observing a claim to claim Ready, in milliseconds",
            m_claim_ctrl.clone(),
        );
        registry.register(
            "agent_sandbox_client_claim_startup_latency_ms",
            "Client first request (annotation) to claim Ready, in milliseconds",
            m_client.clone(),
        );
        registry.register(
            "agent_sandbox_creation_latency_ms",
            "Sandbox creation to Sandbox Ready, in milliseconds",
            m_creation.clone(),
        );
        registry.register(
            "agent_sandbox_claim_creation",
            "Claims bound to a Sandbox",
            claim_creation.clone(),
        );
        registry.register("agent_sandboxes", "Sandboxes by state", sandboxes.clone());
        registry.register(
            "agent_sandbox_suspend",
            "Sandbox suspends, by result",
            suspend.clone(),
        );
        registry.register(
            "agent_sandbox_resume",
            "Sandbox resumes, by result",
            resume.clone(),
        );
        registry.register(
            "agent_sandbox_suspend_latency_ms",
            "Suspend requested to Pod gone, in milliseconds",
            m_suspend_lat.clone(),
        );
        registry.register(
            "agent_sandbox_resume_latency_ms",
            "Resume requested to Sandbox Ready, in milliseconds",
            m_resume_lat.clone(),
        );
        registry.register(
            "agent_sandbox_finished",
            "Sandboxes whose Pod finished, by reason",
            finished.clone(),
        );
        registry.register(
            "agent_sandbox_expired",
            "Sandboxes that reached spec.shutdownTime, by shutdown_policy",
            expired.clone(),
        );
        // controller-runtime's name, with the error's kind as a second label.
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that failed, by controller and error kind",
            reconcile_errors.clone(),
        );
        let build_info = Family::<Labels<6>, Gauge>::default();
        build_info
            .get_or_create(&[
                ("git_version", env!("CARGO_PKG_VERSION").to_string()),
                (
                    "git_commit",
                    option_env!("SANDHUB_GIT_COMMIT")
                        .unwrap_or("unknown")
                        .to_string(),
                ),
                (
                    "build_date",
                    option_env!("SANDHUB_BUILD_DATE")
                        .unwrap_or("unknown")
                        .to_string(),
                ),
                ("go_version", "none".to_string()),
                ("compiler", "rustc".to_string()),
                (
                    "platform",
                    format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
                ),
            ])
            .set(1);
        registry.register("agent_sandbox_build_info", "Build information", build_info);

        Self {
            registry,
            claim_startup_latency: m_claim_startup,
            claim_controller_startup_latency: m_claim_ctrl,
            client_claim_startup_latency: m_client,
            creation_latency: m_creation,
            claim_creation,
            sandboxes,
            suspend,
            resume,
            suspend_latency: m_suspend_lat,
            resume_latency: m_resume_lat,
            finished,
            expired,
            reconcile_errors,
        }
    }

    fn two(launch_type: &str, template: &str) -> Labels<2> {
        [
            ("launch_type", launch_type.to_string()),
            ("sandbox_template", template.to_string()),
        ]
    }

    pub fn observe_claim_startup(&self, launch_type: &str, template: &str, ms: f64) {
        self.claim_startup_latency
            .get_or_create(&Self::two(launch_type, template))
            .observe(ms);
    }
    pub fn observe_claim_controller_startup(&self, launch_type: &str, template: &str, ms: f64) {
        self.claim_controller_startup_latency
            .get_or_create(&Self::two(launch_type, template))
            .observe(ms);
    }
    pub fn observe_client_claim_startup(&self, launch_type: &str, template: &str, ms: f64) {
        self.client_claim_startup_latency
            .get_or_create(&Self::two(launch_type, template))
            .observe(ms);
    }
    pub fn observe_creation(&self, namespace: &str, launch_type: &str, template: &str, ms: f64) {
        self.creation_latency
            .get_or_create(&[
                ("namespace", namespace.to_string()),
                ("launch_type", launch_type.to_string()),
                ("sandbox_template", template.to_string()),
            ])
            .observe(ms);
    }
    pub fn inc_claim_creation(&self, c: &ClaimCreation) {
        self.claim_creation
            .get_or_create(&[
                ("namespace", c.namespace.clone()),
                ("sandbox_template", c.sandbox_template.clone()),
                ("launch_type", c.launch_type.clone()),
                ("warmpool_name", c.warmpool_name.clone()),
                ("pod_condition", c.pod_condition.clone()),
                ("created_by", c.created_by.clone()),
            ])
            .inc();
    }
    /// `controller` is the lowercase kind (`sandbox`, `sandboxclaim`, ...);
    /// `error` is [`crate::error::Error::metric_label`].
    pub fn inc_reconcile_error(&self, controller: &str, error: &str) {
        self.reconcile_errors
            .get_or_create(&[
                ("controller", controller.to_string()),
                ("error", error.to_string()),
            ])
            .inc();
    }
    /// `result` is `success` or `failure`.
    pub fn inc_suspend(&self, l: &SandboxLabels, result: &str) {
        self.suspend.get_or_create(&l.with("result", result)).inc();
    }
    pub fn inc_resume(&self, l: &SandboxLabels, result: &str) {
        self.resume.get_or_create(&l.with("result", result)).inc();
    }
    pub fn observe_suspend_latency(&self, l: &SandboxLabels, ms: f64) {
        self.suspend_latency.get_or_create(&l.base()).observe(ms);
    }
    pub fn observe_resume_latency(&self, l: &SandboxLabels, ms: f64) {
        self.resume_latency.get_or_create(&l.base()).observe(ms);
    }
    pub fn inc_finished(&self, l: &SandboxLabels, reason: &str) {
        self.finished.get_or_create(&l.with("reason", reason)).inc();
    }
    pub fn inc_expired(&self, l: &SandboxLabels, shutdown_policy: &str) {
        self.expired
            .get_or_create(&l.with("shutdown_policy", shutdown_policy))
            .inc();
    }

    /// Replaces the `agent_sandboxes` gauge with a fresh count (called at scrape time).
    pub fn set_sandbox_counts(&self, counts: impl IntoIterator<Item = (SandboxGaugeKey, i64)>) {
        self.sandboxes.clear();
        for (k, n) in counts {
            self.sandboxes
                .get_or_create(&[
                    ("namespace", k.namespace),
                    ("ready_condition", k.ready_condition),
                    ("expired", k.expired.to_string()),
                    ("launch_type", k.launch_type),
                    ("sandbox_template", k.sandbox_template),
                    ("owned_by", k.owned_by),
                    ("created_by", k.created_by),
                ])
                .set(n);
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_upstream_names() {
        let m = Metrics::new();
        let l = SandboxLabels {
            namespace: "ns".into(),
            sandbox_template: "t".into(),
            owned_by: "None".into(),
        };
        m.inc_expired(&l, "Retain");
        m.inc_suspend(&l, "success");
        m.observe_claim_startup("warm", "t", 42.0);
        m.inc_reconcile_error("sandboxclaim", "lost_race");
        m.set_sandbox_counts([(
            SandboxGaugeKey {
                namespace: "ns".into(),
                ..Default::default()
            },
            3,
        )]);
        let text = m.encode();
        for name in [
            "agent_sandbox_expired_total{namespace=\"ns\",sandbox_template=\"t\",owned_by=\"None\",shutdown_policy=\"Retain\"} 1",
            "agent_sandbox_suspend_total{",
            "agent_sandbox_claim_startup_latency_ms_bucket{le=\"50.0\",launch_type=\"warm\",sandbox_template=\"t\"} 1",
            "agent_sandboxes{namespace=\"ns\"",
            "agent_sandbox_build_info{",
            "controller_runtime_reconcile_errors_total{controller=\"sandboxclaim\",error=\"lost_race\"} 1",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
