//! `network: egress` on the local backend: the operator's flags, and
//! attaching a gateway (`sandhub-gateway`) to each such sandbox once it
//! runs. The gateway's loop lives on the hub's runtime; its TUN fd is the
//! sandbox's only way out, so a hub that is gone (or a gateway that is
//! stopped) leaves the sandbox offline, never open.
//!
//! The policy a sandbox was started with is recorded beside its runtime
//! handle (`network` in the row's runtime JSON), so a restarted hub
//! re-attaches the same policy, not whatever the template says by then.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
};

use anyhow::Context;
use clap::Args;
use sandhub_api::{
    error::Code,
    hub::{Network, NetworkSpec, Template},
    network::{parse_list, Pattern, Target},
    validate,
};
use sandhub_client::{Error, Result};
use sandhub_gateway::{policy::internal, Config, Gateway, Limits, OperatorPolicy, SandboxPolicy};

use super::{
    runtime::{Launched, NetNs},
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
        }
    }
}

const DEFAULT_MAX_FLOWS: usize = 256;

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

/// The gateways of one hub.
pub struct Egress {
    cfg: Arc<Config>,
    running: Mutex<HashMap<String, (String, Gateway)>>,
    /// Per tenant, what gateways that are gone counted (so the tenant's
    /// series on `/metrics` never go down while the hub runs).
    retired: Mutex<HashMap<String, sandhub_gateway::meter::Totals>>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("upstream_dns", &self.cfg.upstream_dns)
            .finish()
    }
}

impl Egress {
    pub fn new(args: &EgressArgs) -> anyhow::Result<Egress> {
        let upstream_dns = match &args.egress_dns {
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
        for (i, c) in args.egress_allow_private.iter().enumerate() {
            match c.parse::<Pattern>() {
                Ok(Pattern {
                    target: Target::Cidr(net, len),
                    port: None,
                }) => allow_private.push((net, len)),
                _ => anyhow::bail!(
                    "--egress-allow-private[{i}] {c:?}: a CIDR without port, host bits zero"
                ),
            }
        }
        let deny = parse_list("--egress-deny", &args.egress_deny).map_err(anyhow::Error::msg)?;
        let operator = OperatorPolicy::new(
            allow_private,
            deny,
            args.egress_default != "deny",
            &[internal::cidr()],
        );
        Ok(Egress {
            cfg: Arc::new(Config {
                upstream_dns,
                operator,
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
        })
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
            })
            .collect()
    }

    /// Every tenant's totals while the hub runs (gateways running and
    /// gone), for `/metrics`.
    pub fn usage_by_tenant(&self) -> Vec<(String, sandhub_api::hub::EgressUsage)> {
        let mut sums = self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (tenant, gw) in self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            add(sums.entry(tenant.clone()).or_default(), gw.meter().totals());
        }
        sums.into_iter()
            .map(|(tenant, t)| {
                (
                    tenant,
                    sandhub_api::hub::EgressUsage {
                        bytes_out: t.bytes_out,
                        bytes_in: t.bytes_in,
                        connections_opened: t.connections_opened,
                        connections_refused: t.connections_refused,
                    },
                )
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
    pub fn for_launch(row: &SandboxRow, template: &Template) -> Recorded {
        let old = Self::of_row(row);
        Recorded {
            template: template.network.clone(),
            keep_gateway: old.as_ref().is_some_and(|r| r.keep_gateway),
            sandbox: old.and_then(|r| r.sandbox),
            egress_mb: template.egress_mb,
        }
    }

    /// The record in a row's runtime JSON, if any.
    pub fn of_row(row: &SandboxRow) -> Option<Recorded> {
        let v = row.runtime.as_ref()?.get(RECORD_KEY)?;
        serde_json::from_value(v.clone()).ok()
    }

    /// The runtime JSON of a row not launched yet whose create request
    /// narrowed its template's network.
    pub fn pre_launch(template: &NetworkSpec, sandbox: NetworkSpec) -> serde_json::Value {
        let r = Recorded {
            template: template.clone(),
            sandbox: Some(sandbox),
            egress_mb: None,
            keep_gateway: false,
        };
        serde_json::json!({ RECORD_KEY: r })
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
        let (template_allow, template_deny) = validate::parse_network(&self.template)?;
        let (sandbox_allow, sandbox_deny) = match &self.sandbox {
            Some(s) if s.mode == Network::Egress => validate::parse_network(s)?,
            _ => Default::default(),
        };
        Ok(SandboxPolicy {
            template_allow,
            template_deny,
            sandbox_allow,
            sandbox_deny,
            offline: self
                .sandbox
                .as_ref()
                .is_some_and(|s| s.mode == Network::None),
        })
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
        let mut row = SandboxRow {
            id: "sb-1".into(),
            tenant: "t".into(),
            template: "web".into(),
            state: sandhub_api::hub::SandboxState::Pending,
            labels: Default::default(),
            env: Default::default(),
            launch: sandhub_api::hub::Launch::Cold,
            created_at: 0,
            shutdown_at: None,
            idle_timeout_seconds: None,
            last_activity: 0,
            pool: None,
            claimed: true,
            forked_from: None,
            runtime: Some(Recorded::pre_launch(&tpl, narrow.clone())),
        };
        let t = Template {
            network: tpl.clone(),
            ..Default::default()
        };
        let r = Recorded::for_launch(&row, &t);
        assert_eq!(r.sandbox.as_ref(), Some(&narrow));
        assert_eq!(r.mode(), Network::Egress);
        let p = r.policy().unwrap();
        assert_eq!(p.sandbox_allow.len(), 1);
        // After launch the handle carries the record; a resume finds it.
        row.runtime = Some(serde_json::json!({"shim_pid": 1, RECORD_KEY: r}));
        assert_eq!(Recorded::for_launch(&row, &t).sandbox, Some(narrow));
        // A request for `none` takes an egress template offline.
        row.runtime = Some(Recorded::pre_launch(&tpl, Network::None.into()));
        assert_eq!(Recorded::for_launch(&row, &t).mode(), Network::None);
        // No record: the template alone.
        row.runtime = None;
        assert_eq!(Recorded::for_launch(&row, &t).sandbox, None);
    }

    #[test]
    fn operator_flags_are_checked() {
        let bad = EgressArgs {
            egress_allow_private: vec!["10.0.0.1/8".into()],
            ..Default::default()
        };
        assert!(Egress::new(&bad).is_err());
        let bad = EgressArgs {
            egress_deny: vec!["a.*.test".into()],
            ..Default::default()
        };
        assert!(Egress::new(&bad).unwrap_err().to_string().contains("[0]"));
        let ok = EgressArgs {
            egress_dns: Some("198.18.0.2".into()),
            egress_allow_private: vec!["10.20.0.0/16".into()],
            egress_deny: vec!["*.corp.test".into()],
            egress_default: "deny".into(),
            egress_max_flows: 8,
            ..Default::default()
        };
        let e = Egress::new(&ok).unwrap();
        assert!(!e.default_allows_all());
    }

    #[test]
    fn a_patch_narrows_by_the_create_rule_and_none_keeps_the_gateway_closed() {
        let spec = |v: serde_json::Value| -> NetworkSpec { serde_json::from_value(v).unwrap() };
        let rec = Recorded {
            template: spec(serde_json::json!({"allow_out": ["*.test"]})),
            sandbox: None,
            egress_mb: None,
            keep_gateway: false,
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
