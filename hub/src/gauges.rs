//! Pool and tenant gauges (issue #30): what `/metrics` shows of each warm
//! pool (`ready`, `target`, `starting`, `failing`) and of each tenant's
//! use against its quotas, read from the backend at scrape time.
//!
//! The backend answers with a plain [`Gauges`] snapshot; [`GaugeMetrics`]
//! turns it into series. Every family is cleared before it is filled, so a
//! deleted pool or a tenant with nothing left stops being reported instead
//! of showing its last value forever. Labels are a tenant and a pool name:
//! both bounded by the operator's quotas (tenants come from the key file,
//! pools per tenant from `--tenant-max-pool-replicas`), never ids.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

/// One warm pool as the metrics see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolGauge {
    pub tenant: String,
    pub pool: String,
    /// Warm sandboxes the pool should hold.
    pub target: u64,
    /// Members ready to be claimed.
    pub ready: u64,
    /// Members still starting.
    pub starting: u64,
    /// Whether the pool's last warm start failed (it is retrying).
    pub failing: bool,
}

/// One tenant's use, and the quota each is measured against (`None`: no
/// limit, or none known to this backend).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantGauge {
    pub tenant: String,
    /// Sandboxes counted by the quota (running, suspended, warm).
    pub sandboxes: u64,
    pub sandboxes_quota: Option<u64>,
    /// The memory limits of those sandboxes, summed.
    pub memory_reserved_bytes: u64,
    pub memory_quota_bytes: Option<u64>,
    /// Disk the tenant's snapshots take.
    pub snapshot_bytes: u64,
    pub snapshot_quota_bytes: Option<u64>,
}

/// What a backend reports at each scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gauges {
    pub pools: Vec<PoolGauge>,
    pub tenants: Vec<TenantGauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    tenant: String,
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

type PoolFamily = Family<PoolLabels, Gauge>;
type TenantFamily = Family<TenantLabels, Gauge>;

/// The series, registered once.
#[derive(Default)]
pub struct GaugeMetrics {
    pool_target: PoolFamily,
    pool_ready: PoolFamily,
    pool_starting: PoolFamily,
    pool_failing: PoolFamily,
    tenant_sandboxes: TenantFamily,
    tenant_sandboxes_quota: TenantFamily,
    tenant_memory: TenantFamily,
    tenant_memory_quota: TenantFamily,
    tenant_snapshots: TenantFamily,
    tenant_snapshots_quota: TenantFamily,
}

/// The series' names under the registry's `sandhub_` prefix, for the
/// dashboard test and the docs.
pub const SERIES: &[&str] = &[
    "pool_target",
    "pool_ready",
    "pool_starting",
    "pool_failing",
    "tenant_sandboxes",
    "tenant_sandboxes_quota",
    "tenant_memory_reserved_bytes",
    "tenant_memory_quota_bytes",
    "tenant_snapshot_bytes",
    "tenant_snapshot_quota_bytes",
];

impl GaugeMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let pools: [(&str, &str, &PoolFamily); 4] = [
            (
                SERIES[0],
                "Warm sandboxes a pool should hold",
                &self.pool_target,
            ),
            (
                SERIES[1],
                "A pool's members ready to be claimed",
                &self.pool_ready,
            ),
            (
                SERIES[2],
                "A pool's members still starting",
                &self.pool_starting,
            ),
            (
                SERIES[3],
                "1 while a pool's warm starts fail (it retries with backoff)",
                &self.pool_failing,
            ),
        ];
        for (name, help, f) in pools {
            registry.register(name, help, f.clone());
        }
        let tenants: [(&str, &str, &TenantFamily); 6] = [
            (
                SERIES[4],
                "Sandboxes a tenant holds (running, suspended and warm)",
                &self.tenant_sandboxes,
            ),
            (
                SERIES[5],
                "Most sandboxes a tenant may hold (--tenant-max-sandboxes)",
                &self.tenant_sandboxes_quota,
            ),
            (
                SERIES[6],
                "Memory limits of a tenant's sandboxes, summed",
                &self.tenant_memory,
            ),
            (
                SERIES[7],
                "Most memory limits a tenant may hold (--tenant-max-memory-mb)",
                &self.tenant_memory_quota,
            ),
            (
                SERIES[8],
                "Disk a tenant's snapshots take",
                &self.tenant_snapshots,
            ),
            (
                SERIES[9],
                "Most snapshot disk a tenant may use (--max-snapshot-mb-per-tenant)",
                &self.tenant_snapshots_quota,
            ),
        ];
        for (name, help, f) in tenants {
            registry.register(name, help, f.clone());
        }
    }

    /// Replaces every series with `g`'s values.
    pub fn set(&self, g: &Gauges) {
        for f in [
            &self.pool_target,
            &self.pool_ready,
            &self.pool_starting,
            &self.pool_failing,
        ] {
            f.clear();
        }
        for p in &g.pools {
            let l = PoolLabels {
                tenant: p.tenant.clone(),
                pool: p.pool.clone(),
            };
            set(&self.pool_target, &l, p.target);
            set(&self.pool_ready, &l, p.ready);
            set(&self.pool_starting, &l, p.starting);
            set(&self.pool_failing, &l, u64::from(p.failing));
        }
        for f in [
            &self.tenant_sandboxes,
            &self.tenant_sandboxes_quota,
            &self.tenant_memory,
            &self.tenant_memory_quota,
            &self.tenant_snapshots,
            &self.tenant_snapshots_quota,
        ] {
            f.clear();
        }
        for t in &g.tenants {
            let l = TenantLabels {
                tenant: t.tenant.clone(),
            };
            set(&self.tenant_sandboxes, &l, t.sandboxes);
            set(&self.tenant_memory, &l, t.memory_reserved_bytes);
            set(&self.tenant_snapshots, &l, t.snapshot_bytes);
            // A quota with no limit is left out rather than shown as a
            // huge number that would flatten every plot beside it.
            let quotas = [
                (&self.tenant_sandboxes_quota, t.sandboxes_quota),
                (&self.tenant_memory_quota, t.memory_quota_bytes),
                (&self.tenant_snapshots_quota, t.snapshot_quota_bytes),
            ];
            for (f, q) in quotas {
                if let Some(q) = q {
                    set(f, &l, q);
                }
            }
        }
    }
}

fn set<L>(f: &Family<L, Gauge>, labels: &L, v: u64)
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
{
    f.get_or_create(labels)
        .set(i64::try_from(v).unwrap_or(i64::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    fn render(m: &GaugeMetrics) -> String {
        let mut r = Registry::with_prefix("sandhub");
        m.register(&mut r);
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        out
    }

    #[test]
    fn a_deleted_pool_stops_being_reported_and_unlimited_quotas_are_left_out() {
        let m = GaugeMetrics::default();
        let pool = |name: &str| PoolGauge {
            tenant: "t1".into(),
            pool: name.into(),
            target: 3,
            ready: 2,
            starting: 1,
            failing: true,
        };
        m.set(&Gauges {
            pools: vec![pool("a"), pool("b")],
            tenants: vec![TenantGauge {
                tenant: "t1".into(),
                sandboxes: 5,
                sandboxes_quota: Some(100),
                memory_reserved_bytes: 1 << 30,
                memory_quota_bytes: None,
                ..Default::default()
            }],
        });
        let text = render(&m);
        assert!(
            text.contains(r#"sandhub_pool_ready{tenant="t1",pool="b"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"sandhub_pool_failing{tenant="t1",pool="a"} 1"#));
        assert!(text.contains(r#"sandhub_tenant_sandboxes_quota{tenant="t1"} 100"#));
        assert!(text.contains(r#"sandhub_tenant_memory_reserved_bytes{tenant="t1"} 1073741824"#));
        assert!(!text.contains("sandhub_tenant_memory_quota_bytes{"));

        m.set(&Gauges {
            pools: vec![pool("a")],
            tenants: vec![],
        });
        let text = render(&m);
        assert!(!text.contains(r#"pool="b""#), "{text}");
        assert!(!text.contains("sandhub_tenant_sandboxes{"), "{text}");
    }
}
