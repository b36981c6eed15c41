//! `sandhub egress-proxy`: the egress gateway in proxy form
//! (`sandhub_gateway::proxy`) for `network: egress` Pods on Kubernetes,
//! run as the `sandhub-egress` Deployment (deploy/egress/).
//!
//! Who a client is: the sandbox id and proxy credential in its
//! `HTTP_PROXY` / `ALL_PROXY` URL, the credential derived from the key the
//! hub holds (`--sandboxd-token-key-file`). What it may reach: the policy
//! its SandboxClaim records (kube/egress.rs), read from a watch of the
//! hub's claims at each new connection, so `PATCH .../network` applies to
//! the next one. A claim that is gone, or has no policy, opens nothing.
//! Counters per sandbox, summed by tenant on `/metrics` with the local
//! hub's series names (`sandhub_egress_*`).
//!
//! Brokered secrets: the claim's record lists the sandbox's secrets and
//! placeholders; the values come from the tenants' Secrets and the
//! operator's `--secrets-file` ([`values`]); TLS toward the Pod is
//! terminated with the CA all replicas share ([`ca`]).
//!
//! # Layout
//!
//! ```text
//! mod.rs     flags, the claims directory, /metrics, run()
//! ca.rs      the shared CA: its Secret, and the ConfigMap Pods mount
//! meter.rs   the hub's meter route: one sandbox's counters and decisions
//! values.rs  secret values: the tenants' Secrets (watched), the operator's file
//! ```

mod ca;
mod meter;
mod values;

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use clap::Args;
use kube::{runtime::reflector::ObjectRef, ResourceExt};
use sandhub_api::{k8s::SandboxClaim, sandboxd_token::SandboxdTokens};
use sandhub_gateway::{
    meter::{Meter, Totals},
    proxy::{Directory, Proxy, ProxyLimits, ProxySandbox},
    Config, Limits,
};

use crate::kube::{
    egress::{Recorded, POLICY_ANNOTATION},
    TENANT_LABEL,
};

#[derive(Debug, Clone, Args)]
pub struct EgressProxyArgs {
    /// Where Pods reach the proxy (HTTP CONNECT, absolute-form HTTP and
    /// SOCKS5 on one port).
    #[arg(
        long,
        env = "SANDHUB_EGRESS_PROXY_LISTEN",
        default_value = "0.0.0.0:3128"
    )]
    pub listen: SocketAddr,

    /// `/metrics` and `/healthz` (never on the proxy's port: Pods reach
    /// that one).
    #[arg(
        long,
        env = "SANDHUB_EGRESS_PROXY_METRICS_LISTEN",
        default_value = "0.0.0.0:9464"
    )]
    pub metrics_listen: SocketAddr,

    /// Kubeconfig; default: in-cluster, else $KUBECONFIG or ~/.kube/config.
    #[arg(long, env = "SANDHUB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// The namespace of the hub's claims (the hub's --namespace).
    #[arg(long, env = "SANDHUB_NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// The key the hub derives Pods' proxy credentials from (the hub's
    /// --sandboxd-token-key-file).
    #[arg(long, env = "SANDHUB_SANDBOXD_TOKEN_KEY_FILE")]
    pub sandboxd_token_key_file: PathBuf,

    /// The resolver for the names Pods connect to (`IP` or `IP:PORT`);
    /// default: the first `nameserver` of /etc/resolv.conf.
    #[arg(long, value_name = "ADDR", env = "SANDHUB_EGRESS_DNS")]
    pub egress_dns: Option<String>,

    /// Private ranges (CIDRs) Pods may reach when their policy allows.
    /// Note that in a cluster the Pod and Service ranges are usually
    /// private: opening them opens every Service to egress sandboxes.
    #[arg(
        long,
        value_name = "CIDR",
        env = "SANDHUB_EGRESS_ALLOW_PRIVATE",
        value_delimiter = ','
    )]
    pub egress_allow_private: Vec<String>,

    /// Destinations no sandbox may reach, whatever its template says.
    #[arg(
        long,
        value_name = "PATTERN",
        env = "SANDHUB_EGRESS_DENY",
        value_delimiter = ','
    )]
    pub egress_deny: Vec<String>,

    /// What an egress template with an empty `allow_out` may reach.
    #[arg(long, env = "SANDHUB_EGRESS_DEFAULT", default_value = "allow",
          value_parser = ["allow", "deny"])]
    pub egress_default: String,

    /// Connections one sandbox may have open or opening at once.
    #[arg(long, env = "SANDHUB_EGRESS_MAX_FLOWS", default_value_t = 256)]
    pub egress_max_flows: usize,

    /// A carried connection that moves no byte this long is closed.
    #[arg(long, env = "SANDHUB_EGRESS_IDLE_TIMEOUT", default_value = "1h",
          value_parser = sandhub_common::parse_duration)]
    pub egress_idle_timeout: Duration,

    /// A rate cap per egress sandbox, in Mbit/s of TCP payload (out and in
    /// together), as on `sandhub serve`: while a sandbox's rate since its
    /// last one-second window is above it, its new connections are
    /// refused (per proxy replica: each meters what it carries).
    #[arg(long, env = "SANDHUB_EGRESS_RATE_MBIT")]
    pub egress_rate_mbit: Option<u64>,

    /// Client connections at once over all sandboxes (authenticated or
    /// not); more are closed at accept.
    #[arg(long, env = "SANDHUB_EGRESS_PROXY_MAX_CLIENTS", default_value_t = 4096)]
    pub max_clients: usize,

    /// The operator's secret values (the hub's --secrets-file: a JSON
    /// object `{"TENANT": {"NAME": "value"}}`, mode 0600). Tenants' own
    /// values (`PUT /v1/secrets`) are read from their Secrets.
    #[arg(long, value_name = "FILE", env = "SANDHUB_SECRETS_FILE")]
    pub secrets_file: Option<PathBuf>,

    /// More CA certificates (a PEM file) the proxy trusts, beside the
    /// system's, when it opens TLS upstream to broker a secret.
    #[arg(long, value_name = "PEM", env = "SANDHUB_EGRESS_CA_FILE")]
    pub egress_ca_file: Option<PathBuf>,
}

/// Claims (from the watch) → what the proxy needs; one meter per sandbox.
struct Claims {
    store: kube::runtime::reflector::Store<SandboxClaim>,
    namespace: String,
    tokens: SandboxdTokens,
    /// Sandbox id → (tenant label, meter).
    meters: Mutex<HashMap<String, (String, Arc<Meter>)>>,
    /// Per tenant label, what sandboxes that are gone counted (series
    /// never go down while the proxy runs).
    retired: Mutex<HashMap<String, Totals>>,
    /// Brokered secrets' values.
    values: values::Values,
}

impl Directory for Claims {
    fn lookup(&self, id: &str) -> Option<ProxySandbox> {
        let claim = self
            .store
            .get(&ObjectRef::new(id).within(&self.namespace))?;
        let recorded = Recorded::from_annotation(claim.annotations().get(POLICY_ANNOTATION)?)?;
        let policy = match recorded.policy() {
            Ok(p) => p,
            Err(e) => {
                // Written by the hub after validation: a record that does
                // not parse opens nothing.
                tracing::warn!(sandbox = %id, error = %e, "egress proxy: a claim's policy does not parse");
                return None;
            }
        };
        let tenant = tenant_of(&claim);
        // Values as they are now: a `PUT` or `DELETE` applies to the next
        // connection.
        let secrets = self.values.secrets(id, &tenant, &recorded);
        let meter = self
            .meters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_insert_with(|| (tenant, Arc::default()))
            .1
            .clone();
        Some(ProxySandbox {
            credential: self.tokens.proxy_credential(&self.namespace, id),
            policy: Arc::new(policy),
            secrets: Arc::new(secrets),
            meter,
            cap_bytes: recorded.egress_mb.map(|mb| mb.saturating_mul(1024 * 1024)),
        })
    }
}

/// A claim's tenant label (a digest of the tenant's name).
fn tenant_of(claim: &SandboxClaim) -> String {
    claim
        .labels()
        .get(TENANT_LABEL)
        .cloned()
        .unwrap_or_default()
}

fn add(sum: &mut Totals, t: Totals) {
    sum.bytes_out += t.bytes_out;
    sum.bytes_in += t.bytes_in;
    sum.connections_opened += t.connections_opened;
    sum.connections_refused += t.connections_refused;
}

impl Claims {
    /// Meters of claims that are gone fold into their tenant's sums, so
    /// the map holds only live sandboxes.
    fn prune(&self) {
        let mut meters = self.meters.lock().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<String> = meters
            .keys()
            .filter(|id| {
                self.store
                    .get(&ObjectRef::new(id).within(&self.namespace))
                    .is_none()
            })
            .cloned()
            .collect();
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        for id in gone {
            if let Some((tenant, m)) = meters.remove(&id) {
                add(retired.entry(tenant).or_default(), m.totals());
            }
        }
    }

    /// Per tenant label: retired plus live.
    fn by_tenant(&self) -> Vec<(String, Totals)> {
        let mut sums = self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (tenant, m) in self
            .meters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            add(sums.entry(tenant.clone()).or_default(), m.totals());
        }
        let mut v: Vec<_> = sums.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// The Prometheus text of `sums`: the local hub's `sandhub_egress_*`
/// counters, labelled by tenant (the claims' tenant label, a digest:
/// labels never carry a tenant's name).
pub fn metrics_text(sums: &[(String, Totals)]) -> String {
    let mut out = String::new();
    type Field = fn(&Totals) -> u64;
    let series: [(&str, &str, Field); 4] = [
        (
            "egress_sent_bytes",
            "TCP payload bytes egress sandboxes sent out, by tenant",
            |t| t.bytes_out,
        ),
        (
            "egress_received_bytes",
            "TCP payload bytes egress sandboxes received, by tenant",
            |t| t.bytes_in,
        ),
        (
            "egress_connections_opened",
            "Connections the egress proxy carried, by tenant",
            |t| t.connections_opened,
        ),
        (
            "egress_connections_refused",
            "Connections the egress proxy refused, by tenant",
            |t| t.connections_refused,
        ),
    ];
    for (name, help, f) in series {
        out.push_str(&format!(
            "# HELP sandhub_{name} {help}.\n# TYPE sandhub_{name} counter\n"
        ));
        for (tenant, t) in sums {
            out.push_str(&format!(
                "sandhub_{name}_total{{tenant=\"{tenant}\"}} {}\n",
                f(t)
            ));
        }
    }
    out.push_str("# EOF\n");
    out
}

pub async fn run(args: EgressProxyArgs) -> anyhow::Result<()> {
    let tokens = SandboxdTokens::from_file(&args.sandboxd_token_key_file)
        .map_err(|e| anyhow::anyhow!("--sandboxd-token-key-file: {e}"))?;
    let (upstream_dns, operator) = crate::local::egress::operator_config(
        args.egress_dns.as_deref(),
        &args.egress_allow_private,
        &args.egress_deny,
        &args.egress_default,
    )?;
    let operator_secrets = match &args.secrets_file {
        Some(p) => crate::secrets_file::OperatorSecrets::load(p)?,
        None => Default::default(),
    };
    let client = crate::kube::client(args.kubeconfig.as_deref()).await?;
    let authority = ca::load_or_create(&client, &args.namespace).await?;
    let broker =
        sandhub_gateway::broker::Broker::with_authority(authority, args.egress_ca_file.as_deref())
            .context("--egress-ca-file")?;
    let cfg = Arc::new(Config {
        upstream_dns,
        operator,
        limits: Limits {
            max_flows: args.egress_max_flows.max(1),
            idle_timeout: args.egress_idle_timeout.max(Duration::from_secs(1)),
            rate_mbit: args.egress_rate_mbit.filter(|&r| r > 0),
            ..Limits::default()
        },
        broker: Some(Arc::new(broker)),
    });
    let claims = Arc::new(Claims {
        store: crate::kube::claim_cache(&client, &args.namespace, None, None),
        namespace: args.namespace.clone(),
        tokens,
        meters: Mutex::default(),
        retired: Mutex::default(),
        values: values::Values::watch(&client, &args.namespace, &operator_secrets),
    });
    let pruner = claims.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
            pruner.prune();
        }
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}", args.listen))?;
    let metrics_listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("--metrics-listen {}", args.metrics_listen))?;
    let reader = claims.clone();
    let metered = claims.clone();
    let meter_token = Arc::new(claims.tokens.meter_token(&args.namespace));
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            &format!("{}/{{id}}", sandhub_api::k8s::egress::METER_PATH),
            axum::routing::get(
                move |axum::extract::Path(id): axum::extract::Path<String>,
                      headers: axum::http::HeaderMap| {
                    let (claims, token) = (metered.clone(), meter_token.clone());
                    async move {
                        let auth = headers
                            .get(axum::http::header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok());
                        if !meter::authorized(auth, &token) {
                            return Err(axum::http::StatusCode::UNAUTHORIZED);
                        }
                        let m = claims
                            .meters
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get(&id)
                            .map(|(_, m)| m.clone());
                        Ok(axum::Json(meter::report(m.as_deref())))
                    }
                },
            ),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let text = metrics_text(&reader.by_tenant());
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    )
                }
            }),
        );
    tracing::info!(listen = %args.listen, metrics = %args.metrics_listen, namespace = %args.namespace, "egress proxy serving");
    let proxy = Proxy::new(
        cfg,
        claims,
        ProxyLimits {
            max_clients: args.max_clients.max(1),
            ..ProxyLimits::default()
        },
    );
    tokio::select! {
        r = proxy.serve(listener) => r.context("the proxy listener")?,
        r = axum::serve(metrics_listener, app) => r.context("the metrics listener")?,
        _ = sandhub_common::terminated() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_use_the_hubs_series_names_by_tenant() {
        let t = Totals {
            bytes_out: 5,
            bytes_in: 7,
            connections_opened: 1,
            connections_refused: 2,
        };
        let text = metrics_text(&[("abc".into(), t)]);
        assert!(text.contains("sandhub_egress_sent_bytes_total{tenant=\"abc\"} 5\n"));
        assert!(text.contains("sandhub_egress_received_bytes_total{tenant=\"abc\"} 7\n"));
        assert!(text.contains("sandhub_egress_connections_refused_total{tenant=\"abc\"} 2\n"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn the_shipped_deployment_runs_flags_this_command_has_on_the_port_pods_are_told() {
        use clap::Parser;
        use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            args: EgressProxyArgs,
        }
        let dep: Deployment =
            serde_yaml::from_str(include_str!("../../../deploy/egress/deployment.yaml")).unwrap();
        let c = &dep.spec.unwrap().template.spec.unwrap().containers[0];
        let argv = c.args.clone().unwrap();
        assert_eq!(argv[0], "egress-proxy");
        let parsed = Cmd::try_parse_from(
            std::iter::once("egress-proxy".to_string()).chain(argv[1..].iter().cloned()),
        )
        .unwrap()
        .args;
        let port = sandhub_api::k8s::egress::PROXY_PORT;
        assert_eq!(parsed.listen.port(), port);
        let svc: Service =
            serde_yaml::from_str(include_str!("../../../deploy/egress/service.yaml")).unwrap();
        let ports = svc.spec.unwrap().ports.unwrap();
        assert!(ports.iter().any(|p| p.port == port as i32));
        // The hub's default --egress-proxy names this Service and port.
        let hub = crate::kube::KubeArgs::augment_args(clap::Command::new("x"));
        let default = hub
            .get_arguments()
            .find(|a| a.get_id() == "egress_proxy")
            .and_then(|a| a.get_default_values().first().cloned())
            .unwrap();
        assert_eq!(default.to_str().unwrap(), format!("sandhub-egress:{port}"));
    }
}
