//! `network: egress` on the local backend: the operator's flags, and
//! attaching a gateway (`sandhub-gateway`) to each such sandbox once it
//! runs. The gateway's loop lives on the hub's runtime; its TUN fd is the
//! sandbox's only way out, so a hub that is gone (or a gateway that is
//! stopped) leaves the sandbox offline, never open.
//!
//! The policy a sandbox was started with is recorded beside its runtime
//! handle (`network` in the row's runtime JSON), so a restarted hub
//! re-attaches the same policy, not whatever the template says by then.
//!
//! `--default-network` sets the network of the built-in `default` template
//! (`egress` unless the operator says `none`); a hub that cannot make a TUN
//! device in a network namespace (no `/dev/net/tun`, not root) falls back
//! to `none` with one warning at start ([`Egress::default_network`]).

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{Arc, Mutex},
};

use anyhow::Context;
use clap::Args;
use sandhub_api::{
    error::Code,
    hub::{Network, NetworkSpec, Template},
    network::{parse_list, Pattern, Target, Transport},
    secrets::SecretRef,
    validate,
};
use sandhub_client::{Error, Result};
use sandhub_gateway::{
    broker::{Broker, Secret},
    policy::internal,
    Config, Gateway, Limits, OperatorPolicy, SandboxPolicy,
};

use super::{
    runtime::{Launched, NetNs},
    secrets::{placeholder, OperatorSecrets},
    store::SandboxRow,
};

/// The operator's egress flags (`sandhub serve`).
#[derive(Debug, Clone, Args)]
pub struct EgressArgs {
    /// The resolver the egress gateway asks for the names sandboxes
    /// connect to (`IP` or `IP:PORT`); default: the first `nameserver` of
    /// the host's /etc/resolv.conf.
    #[arg(long, value_name = "ADDR", env = "SANDHUB_EGRESS_DNS")]
    pub egress_dns: Option<String>,

    /// Private ranges (CIDRs, comma-separated) that `network: egress`
    /// sandboxes may reach when their policy allows: 10/8, 172.16/12,
    /// 192.168/16, 100.64/10 and fc00::/7 are closed otherwise.
    /// Loopback, link-local and the host's own addresses stay closed
    /// whatever this says.
    #[arg(
        long,
        value_name = "CIDR",
        env = "SANDHUB_EGRESS_ALLOW_PRIVATE",
        value_delimiter = ','
    )]
    pub egress_allow_private: Vec<String>,

    /// Destinations no egress sandbox may reach, whatever its template
    /// says (patterns as in `allow_out`, comma-separated).
    #[arg(
        long,
        value_name = "PATTERN",
        env = "SANDHUB_EGRESS_DENY",
        value_delimiter = ','
    )]
    pub egress_deny: Vec<String>,

    /// What an egress template with an empty `allow_out` may reach:
    /// `allow` (every name and open address) or `deny` (nothing).
    #[arg(long, env = "SANDHUB_EGRESS_DEFAULT", default_value = "allow",
          value_parser = ["allow", "deny"])]
    pub egress_default: String,

    /// Connections one egress sandbox may have open or opening at once.
    #[arg(long, env = "SANDHUB_EGRESS_MAX_FLOWS", default_value_t = DEFAULT_MAX_FLOWS)]
    pub egress_max_flows: usize,

    /// An egress connection that moves no byte either way this long is
    /// reset (its slot comes back).
    #[arg(long, env = "SANDHUB_EGRESS_IDLE_TIMEOUT", default_value = "1h",
          value_parser = sandhub_common::parse_duration)]
    pub egress_idle_timeout: std::time::Duration,

    /// A rate cap per egress sandbox, in Mbit/s of TCP payload (out and in
    /// together): while a sandbox's rate since its last one-second window
    /// is above it, its new connections are refused (the reason is in its
    /// decision log). Unset: no cap.
    #[arg(long, env = "SANDHUB_EGRESS_RATE_MBIT")]
    pub egress_rate_mbit: Option<u64>,

    /// More CA certificates (a PEM file) the gateway trusts, beside the
    /// system's, when it opens TLS upstream to broker a secret (an
    /// internal API with a private CA; the tests' own CA).
    #[arg(long, value_name = "PEM", env = "SANDHUB_EGRESS_CA_FILE")]
    pub egress_ca_file: Option<std::path::PathBuf>,

    /// Secret values the operator provides, per tenant: a JSON object
    /// `{"TENANT": {"NAME": "value"}}` (`default` is the tenant of a hub
    /// without API keys), mode 0600. A tenant's own value
    /// (`PUT /v1/secrets/NAME`) wins over the file's.
    #[arg(long, value_name = "FILE", env = "SANDHUB_SECRETS_FILE")]
    pub secrets_file: Option<std::path::PathBuf>,
    /// The network of the built-in `default` template (a `default`
    /// template a tenant stores wins): `egress` (online through the
    /// gateway, private ranges closed) or `none` (loopback only). Where
    /// this hub cannot run gateways (no /dev/net/tun, not root) `egress`
    /// falls back to `none`, with a warning at start.
    #[arg(long, env = "SANDHUB_DEFAULT_NETWORK", default_value = "egress",
          value_parser = ["egress", "none"])]
    pub default_network: String,
}

/// The defaults the flags have (for hubs built without clap).
impl Default for EgressArgs {
    fn default() -> Self {
        EgressArgs {
            egress_dns: None,
            egress_allow_private: Vec::new(),
            egress_deny: Vec::new(),
            egress_default: "allow".into(),
            egress_max_flows: DEFAULT_MAX_FLOWS,
            egress_idle_timeout: Limits::default().idle_timeout,
            egress_rate_mbit: None,
            egress_ca_file: None,
            secrets_file: None,
            default_network: "egress".into(),
        }
    }
}

const DEFAULT_MAX_FLOWS: usize = 256;

/// Whether this hub can attach gateways: makes what an attach makes (a
/// TUN device with its address and route) in a fresh network namespace of
/// its own, which goes away with the probe. Fails as an attach would
/// without `/dev/net/tun`, or without the rights to make namespaces and
/// devices. Once, at start: one namespace and one device.
fn gateways_possible() -> std::io::Result<()> {
    let ns = NetNs::fresh()?;
    sandhub_gateway::tun::create_in(ns.fd()).map(drop)
}

/// The first `nameserver` of a resolv.conf.
fn first_nameserver(conf: &str) -> Option<IpAddr> {
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .find_map(|rest| rest.trim().parse().ok())
}

fn parse_dns(s: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip: IpAddr = s
        .trim_matches(|c| c == '[' || c == ']')
        .parse()
        .with_context(|| format!("--egress-dns {s}: not an address"))?;
    Ok(SocketAddr::new(ip, 53))
}

/// The upstream resolver and the operator's part of the decision, from
/// `--egress-dns`, `--egress-allow-private`, `--egress-deny` and
/// `--egress-default` (`sandhub serve` and `sandhub egress-proxy` alike).
pub fn operator_config(
    egress_dns: Option<&str>,
    allow_private_flag: &[String],
    deny_flag: &[String],
    default: &str,
) -> anyhow::Result<(SocketAddr, OperatorPolicy)> {
    let upstream_dns = match &egress_dns {
        Some(s) => parse_dns(s)?,
        None => {
            let ip = std::fs::read_to_string("/etc/resolv.conf")
                .ok()
                .and_then(|c| first_nameserver(&c))
                // Nothing to ask: names simply do not resolve.
                .unwrap_or(IpAddr::from([127, 0, 0, 1]));
            SocketAddr::new(ip, 53)
        }
    };
    let mut allow_private = Vec::new();
    for (i, c) in allow_private_flag.iter().enumerate() {
        match c.parse::<Pattern>() {
            Ok(Pattern {
                target: Target::Cidr(net, len),
                port: None,
                proto: Transport::Tcp,
            }) => allow_private.push((net, len)),
            _ => anyhow::bail!(
                "--egress-allow-private[{i}] {c:?}: a CIDR without port, host bits zero"
            ),
        }
    }
    let deny = parse_list("--egress-deny", deny_flag).map_err(anyhow::Error::msg)?;
    let operator = OperatorPolicy::new(allow_private, deny, default != "deny", &[internal::cidr()]);
    Ok((upstream_dns, operator))
}

/// The gateways of one hub.
pub struct Egress {
    cfg: Arc<Config>,
    running: Mutex<HashMap<String, (String, Gateway)>>,
    /// Per tenant, what gateways that are gone counted (so the tenant's
    /// series on `/metrics` never go down while the hub runs).
    retired: Mutex<HashMap<String, sandhub_gateway::meter::Totals>>,
    /// `--secrets-file`.
    operator_secrets: OperatorSecrets,
    /// The built-in `default` template's network, as it runs on this hub.
    default_network: Network,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("upstream_dns", &self.cfg.upstream_dns)
            .finish()
    }
}

impl Egress {
    /// The hub's egress: its flags, and its secrets broker with the CA in
    /// `state_dir/egress-ca` (made there on the first start).
    pub fn new(args: &EgressArgs, state_dir: &Path) -> anyhow::Result<Egress> {
        let (upstream_dns, operator) = operator_config(
            args.egress_dns.as_deref(),
            &args.egress_allow_private,
            &args.egress_deny,
            &args.egress_default,
        )?;
        let broker = Broker::new(&state_dir.join("egress-ca"), args.egress_ca_file.as_deref())
            .context("the egress CA (brokered secrets)")?;
        let operator_secrets = match &args.secrets_file {
            Some(p) => OperatorSecrets::load(p).context("--secrets-file")?,
            None => OperatorSecrets::default(),
        };
        Ok(Egress {
            cfg: Arc::new(Config {
                upstream_dns,
                operator,
                broker: Some(Arc::new(broker)),
                limits: Limits {
                    max_flows: args.egress_max_flows.max(1),
                    idle_timeout: args
                        .egress_idle_timeout
                        .max(std::time::Duration::from_secs(1)),
                    rate_mbit: args.egress_rate_mbit.filter(|&r| r > 0),
                    ..Limits::default()
                },
            }),
            running: Mutex::new(HashMap::new()),
            retired: Mutex::new(HashMap::new()),
            operator_secrets,
            default_network: match args.default_network.as_str() {
                "none" => Network::None,
                _ => match gateways_possible() {
                    Ok(()) => Network::Egress,
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "--default-network egress: this hub cannot run egress gateways, so \
                             the built-in `default` template is `network: none` (offline); \
                             templates that say `network: egress` will fail to start"
                        );
                        Network::None
                    }
                },
            },
        })
    }

    /// The CA certificate (PEM) egress sandboxes trust.
    pub fn ca_pem(&self) -> Option<String> {
        self.cfg.broker.as_ref().map(|b| b.ca_pem().to_string())
    }

    /// `--secrets-file`'s values.
    pub fn operator_secrets(&self) -> &OperatorSecrets {
        &self.operator_secrets
    }

    /// The network of the built-in `default` template on this hub:
    /// `--default-network`, or `none` where gateways cannot run.
    pub fn default_network(&self) -> Network {
        self.default_network
    }

    /// `--egress-default allow`.
    pub fn default_allows_all(&self) -> bool {
        self.cfg.operator.default_allows_all
    }

    /// Starts the gateway of a running sandbox, replacing any it had.
    pub async fn attach(
        &self,
        tenant: &str,
        id: &str,
        launched: &Launched,
        policy: SandboxPolicy,
        egress_mb: Option<u64>,
        secrets: Vec<Secret>,
    ) -> Result<()> {
        let l = launched.clone();
        let dev = tokio::task::spawn_blocking(move || {
            let ns = NetNs::of(&l)?;
            sandhub_gateway::tun::create_in(ns.fd())
        })
        .await
        .map_err(|e| Error::internal(format!("egress task failed: {e}")))?
        .map_err(|e| {
            Error::new(
                Code::FailedPrecondition,
                format!("the egress gateway's TUN device could not be made (is /dev/net/tun there?): {e}"),
            )
        })?;
        if dev.loopback_dns.is_none() {
            tracing::warn!(%id, "egress: 127.0.0.1:53 was taken inside the sandbox; DNS only at 100.127.0.1");
        }
        let gw = sandhub_gateway::start_metered(
            dev.tun,
            dev.loopback_dns,
            self.cfg.clone(),
            policy,
            id.to_string(),
            sandhub_gateway::Metering {
                meter: Default::default(),
                cap_bytes: egress_mb.map(|mb| mb.saturating_mul(1024 * 1024)),
            },
            secrets,
        )
        .map_err(|e| Error::internal(format!("starting the egress gateway: {e}")))?;
        let old = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), (tenant.to_string(), gw));
        if let Some((t, old)) = old {
            self.retire(&t, &old);
        }
        tracing::info!(%id, "egress gateway attached");
        Ok(())
    }

    /// What a sandbox's running gateway counted.
    pub fn usage(&self, id: &str) -> Option<sandhub_api::hub::EgressUsage> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let t = running.get(id)?.1.meter().totals();
        Some(sandhub_api::hub::EgressUsage {
            bytes_out: t.bytes_out,
            bytes_in: t.bytes_in,
            connections_opened: t.connections_opened,
            connections_refused: t.connections_refused,
        })
    }

    /// A sandbox's decision log, oldest first (empty without a gateway).
    pub fn decisions(&self, id: &str) -> Vec<sandhub_api::hub::EgressDecision> {
        let meter = {
            let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            match running.get(id) {
                Some((_, g)) => g.meter().clone(),
                None => return Vec::new(),
            }
        };
        meter
            .decisions()
            .into_iter()
            .map(|d| sandhub_api::hub::EgressDecision {
                at: crate::backend::rfc3339(d.at_ms as i64),
                name: d.name,
                address: d.address.to_string(),
                port: d.port,
                allowed: d.allowed,
                reason: (!d.reason.is_empty()).then_some(d.reason),
                bytes_out: d.bytes_out,
                bytes_in: d.bytes_in,
                brokered: d.brokered,
                udp: d.udp,
            })
            .collect()
    }

    /// Every tenant's totals while the hub runs (gateways running and
    /// gone) and its gateways running now, for `/metrics`. A tenant whose
    /// gateways are all gone stays, with 0 running, so its gauge drops.
    pub fn usage_by_tenant(&self) -> Vec<crate::backend::TenantEgress> {
        let mut sums: BTreeMap<String, (sandhub_gateway::meter::Totals, usize)> = self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(tenant, t)| (tenant.clone(), (*t, 0)))
            .collect();
        for (tenant, gw) in self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            let (sum, running) = sums.entry(tenant.clone()).or_default();
            add(sum, gw.meter().totals());
            *running += 1;
        }
        sums.into_iter()
            .map(|(tenant, (t, gateways))| crate::backend::TenantEgress {
                tenant,
                usage: sandhub_api::hub::EgressUsage {
                    bytes_out: t.bytes_out,
                    bytes_in: t.bytes_in,
                    connections_opened: t.connections_opened,
                    connections_refused: t.connections_refused,
                },
                gateways,
            })
            .collect()
    }

    fn retire(&self, tenant: &str, gw: &Gateway) {
        let mut r = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        add(
            r.entry(tenant.to_string()).or_default(),
            gw.meter().totals(),
        );
    }

    /// Gives a running gateway a new policy, applied to the next
    /// connection and the next DNS query (`PATCH .../network`). False when
    /// the sandbox has no gateway running (it is offline anyway).
    pub fn set_policy(&self, id: &str, policy: SandboxPolicy) -> bool {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        match running.get(id) {
            Some((_, gw)) => {
                gw.set_policy(policy);
                true
            }
            None => false,
        }
    }

    /// Stops a sandbox's gateway (if any): it is offline from now on.
    pub fn detach(&self, id: &str) {
        let gw = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some((tenant, gw)) = gw {
            self.retire(&tenant, &gw);
        }
    }
}

fn add(sum: &mut sandhub_gateway::meter::Totals, t: sandhub_gateway::meter::Totals) {
    sum.bytes_out += t.bytes_out;
    sum.bytes_in += t.bytes_in;
    sum.connections_opened += t.connections_opened;
    sum.connections_refused += t.connections_refused;
}

/// What an egress sandbox was started with: its template's `network` and,
/// if its create request (or a `PATCH` since) narrowed it, that narrowing.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    pub template: NetworkSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<NetworkSpec>,
    /// The template's `egress_mb` at launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_mb: Option<u64>,
    /// The secrets the create request added to the template's (kept
    /// across launches, like the narrowing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_secrets: Vec<SecretRef>,
    /// Every secret of this launch: the template's, then the request's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRef>,
    /// Each secret's placeholder (its environment variable's value),
    /// kept across launches. Never a value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub placeholders: BTreeMap<String, String>,
    /// Set by a `PATCH` on a sandbox that runs with a gateway: a `none`
    /// narrowing then keeps the gateway (refusing everything) rather than
    /// launching without one, so the sandbox can be opened again by a
    /// later `PATCH`, before and after a restart, suspend or resume alike.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_gateway: bool,
}

impl Recorded {
    /// What a launch of `row` applies: the template's `network` as it is
    /// now, and the narrowing its create request recorded (kept in the
    /// row's runtime JSON across suspend and resume).
    pub fn for_launch(row: &SandboxRow, template: &Template) -> Result<Recorded> {
        let before = Self::of_row(row);
        let request_secrets = before
            .as_ref()
            .map(|r| r.request_secrets.clone())
            .unwrap_or_default();
        let secrets = validate::merge_secrets(&template.secrets, &request_secrets)?;
        let mut placeholders = BTreeMap::new();
        for s in &secrets {
            let kept = before.as_ref().and_then(|r| r.placeholders.get(&s.name));
            placeholders.insert(s.name.clone(), kept.cloned().unwrap_or_else(placeholder));
        }
        Ok(Recorded {
            template: template.network.clone(),
            keep_gateway: before.as_ref().is_some_and(|r| r.keep_gateway),
            sandbox: before.and_then(|r| r.sandbox),
            egress_mb: template.egress_mb,
            request_secrets,
            secrets,
            placeholders,
        })
    }

    /// The record in a row's runtime JSON, if any.
    pub fn of_row(row: &SandboxRow) -> Option<Recorded> {
        let v = row.runtime.as_ref()?.get(RECORD_KEY)?;
        serde_json::from_value(v.clone()).ok()
    }

    /// The runtime JSON of a row not launched yet whose create request
    /// narrowed its template's network or added secrets.
    pub fn pre_launch(
        template: &NetworkSpec,
        sandbox: Option<NetworkSpec>,
        request_secrets: Vec<SecretRef>,
    ) -> serde_json::Value {
        let r = Recorded {
            template: template.clone(),
            sandbox,
            egress_mb: None,
            request_secrets,
            secrets: Vec::new(),
            placeholders: BTreeMap::new(),
            keep_gateway: false,
        };
        serde_json::json!({ RECORD_KEY: r })
    }

    /// The placeholders the sandbox's environment holds, and, when it has
    /// secrets, where its tools find the CA bundle.
    pub fn secret_env(&self) -> Vec<(String, String)> {
        if self.placeholders.is_empty() {
            return Vec::new();
        }
        self.placeholders
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain(super::secrets::ca_env())
            .collect()
    }

    /// The mode the sandbox runs in: the template's, unless its request
    /// took it offline (a `PATCH` to `none` keeps the gateway instead).
    pub fn mode(&self) -> Network {
        match &self.sandbox {
            Some(s) if s.mode == Network::None && !self.keep_gateway => Network::None,
            _ => self.template.mode,
        }
    }

    /// The parsed layers the gateway enforces (a `none` narrowing on a
    /// kept gateway: refuse everything).
    pub fn policy(&self) -> Result<SandboxPolicy> {
        Ok(SandboxPolicy::layered(
            &self.template,
            self.sandbox.as_ref(),
        )?)
    }

    /// A running sandbox's network after `PATCH .../network` with
    /// `request`: it replaces the sandbox's own narrowing, which must
    /// narrow the template's by the create rule. What can change depends
    /// on how the sandbox runs: with a gateway, anything within the
    /// template; offline or on the host's network, nothing (but the same
    /// mode again, which changes nothing).
    pub fn patched(&self, request: NetworkSpec, default_allows_all: bool) -> Result<Recorded> {
        match self.mode() {
            Network::Egress => {
                validate::narrow_network(&self.template, &request, default_allows_all)?;
                let mut next = self.clone();
                // Plain `egress` is the template's policy: no narrowing.
                next.sandbox =
                    (request.mode != Network::Egress || !request.is_plain()).then_some(request);
                next.keep_gateway = true;
                Ok(next)
            }
            mode => refuse_patch(mode, &request).map(|()| self.clone()),
        }
    }
}

/// `PATCH .../network` on a sandbox that runs without a gateway: only the
/// mode it has is accepted (a no-op); anything else needs a new sandbox,
/// since the mode decides how the sandbox's namespaces are made.
pub fn refuse_patch(mode: Network, request: &NetworkSpec) -> Result<()> {
    validate::network(request)?;
    if request.mode == mode && request.is_plain() {
        return Ok(());
    }
    let why = match mode {
        Network::None => "it has no egress gateway (it was started offline); create a sandbox from an `egress` template instead",
        _ => "it runs on the host's network, which cannot be narrowed while it runs",
    };
    Err(Error::new(
        Code::FailedPrecondition,
        format!(
            "network: the sandbox runs with network `{}` and cannot change to `{}`: {why}",
            sandhub_api::network::mode_word(mode),
            sandhub_api::network::mode_word(request.mode)
        ),
    ))
}

/// The key under which the row's runtime JSON keeps [`Recorded`].
pub const RECORD_KEY: &str = "network";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resolv_conf_names_the_gateway() {
        assert!(super::super::runtime::EGRESS_RESOLV_CONF
            .contains(&format!("nameserver {}\n", internal::GATEWAY)));
        assert_eq!(
            first_nameserver("# x\nsearch a\nnameserver 10.255.255.53\nnameserver 1.1.1.1\n"),
            Some("10.255.255.53".parse().unwrap())
        );
        assert_eq!(parse_dns("198.18.0.2").unwrap().port(), 53);
        assert_eq!(parse_dns("198.18.0.2:5353").unwrap().port(), 5353);
    }

    #[test]
    fn a_narrowing_is_recorded_before_launch_and_kept_across_launches() {
        let tpl: NetworkSpec =
            serde_json::from_value(serde_json::json!({"allow_out": ["*.test"]})).unwrap();
        let narrow: NetworkSpec =
            serde_json::from_value(serde_json::json!({"allow_out": ["pypi.test"]})).unwrap();
        let mut row = SandboxRow::for_tests(Some(Recorded::pre_launch(
            &tpl,
            Some(narrow.clone()),
            Vec::new(),
        )));
        let t = Template {
            network: tpl.clone(),
            ..Default::default()
        };
        let r = Recorded::for_launch(&row, &t).unwrap();
        assert_eq!(r.sandbox.as_ref(), Some(&narrow));
        assert_eq!(r.mode(), Network::Egress);
        let p = r.policy().unwrap();
        assert_eq!(p.sandbox_allow.len(), 1);
        // After launch the handle carries the record; a resume finds it.
        row.runtime = Some(serde_json::json!({"shim_pid": 1, RECORD_KEY: r}));
        assert_eq!(
            Recorded::for_launch(&row, &t).unwrap().sandbox,
            Some(narrow)
        );
        // A request for `none` takes an egress template offline.
        row.runtime = Some(Recorded::pre_launch(
            &tpl,
            Some(Network::None.into()),
            Vec::new(),
        ));
        assert_eq!(
            Recorded::for_launch(&row, &t).unwrap().mode(),
            Network::None
        );
        // No record: the template alone.
        row.runtime = None;
        assert_eq!(Recorded::for_launch(&row, &t).unwrap().sandbox, None);
    }

    #[test]
    fn operator_flags_are_checked() {
        let bad = EgressArgs {
            egress_allow_private: vec!["10.0.0.1/8".into()],
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        assert!(Egress::new(&bad, dir.path()).is_err());
        let bad = EgressArgs {
            egress_deny: vec!["a.*.test".into()],
            ..Default::default()
        };
        assert!(Egress::new(&bad, dir.path())
            .unwrap_err()
            .to_string()
            .contains("[0]"));
        let ok = EgressArgs {
            egress_dns: Some("198.18.0.2".into()),
            egress_allow_private: vec!["10.20.0.0/16".into()],
            egress_deny: vec!["*.corp.test".into()],
            egress_default: "deny".into(),
            egress_max_flows: 8,
            ..Default::default()
        };
        let e = Egress::new(&ok, dir.path()).unwrap();
        assert!(!e.default_allows_all());
        // The CA is made once and kept.
        let ca = e.ca_pem().unwrap();
        assert_eq!(Egress::new(&ok, dir.path()).unwrap().ca_pem().unwrap(), ca);
    }

    #[test]
    fn default_network_none_is_none_and_egress_is_egress_only_where_gateways_run() {
        let dir = tempfile::tempdir().unwrap();
        let off = EgressArgs {
            default_network: "none".into(),
            ..Default::default()
        };
        assert_eq!(
            Egress::new(&off, dir.path()).unwrap().default_network(),
            Network::None
        );
        // Whatever this machine allows, the answer is the probe's.
        let on = Egress::new(&EgressArgs::default(), dir.path()).unwrap();
        let expected = match gateways_possible() {
            Ok(()) => Network::Egress,
            Err(_) => Network::None,
        };
        assert_eq!(on.default_network(), expected);
    }

    #[test]
    fn a_patch_narrows_by_the_create_rule_and_none_keeps_the_gateway_closed() {
        let spec = |v: serde_json::Value| -> NetworkSpec { serde_json::from_value(v).unwrap() };
        let rec = Recorded {
            template: spec(serde_json::json!({"allow_out": ["*.test"]})),
            sandbox: None,
            egress_mb: None,
            keep_gateway: false,
            request_secrets: Vec::new(),
            secrets: Vec::new(),
            placeholders: BTreeMap::new(),
        };
        let narrowed = rec
            .patched(spec(serde_json::json!({"allow_out": ["pypi.test"]})), true)
            .unwrap();
        assert_eq!(narrowed.policy().unwrap().sandbox_allow.len(), 1);
        let widened = rec
            .patched(spec(serde_json::json!({"allow_out": ["pypi.org"]})), true)
            .unwrap_err();
        assert_eq!(widened.code, Code::InvalidArgument);
        assert!(
            widened.message.contains("allow_out[0]"),
            "{}",
            widened.message
        );
        // `none`: the gateway stays and refuses all, across launches too.
        let off = narrowed
            .patched(spec(serde_json::json!("none")), true)
            .unwrap();
        assert_eq!(off.mode(), Network::Egress);
        assert!(off.policy().unwrap().offline);
        let back = off
            .patched(spec(serde_json::json!("egress")), true)
            .unwrap();
        assert_eq!(back.sandbox, None);
        assert!(!back.policy().unwrap().offline);
        // Offline or host sandboxes: nothing but their own mode.
        let started_offline = Recorded {
            sandbox: Some(Network::None.into()),
            ..rec.clone()
        };
        let e = started_offline
            .patched(spec(serde_json::json!("egress")), true)
            .unwrap_err();
        assert_eq!(e.code, Code::FailedPrecondition);
        started_offline
            .patched(spec(serde_json::json!("none")), true)
            .unwrap();
        let host = Recorded {
            template: Network::Host.into(),
            ..rec
        };
        let e = host
            .patched(spec(serde_json::json!("none")), true)
            .unwrap_err();
        assert_eq!(e.code, Code::FailedPrecondition);
    }
}
