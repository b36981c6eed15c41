//! E2B's outbound network words (`allow_internet_access`, `network.allowOut`
//! / `denyOut` on create, `PUT /sandboxes/{id}/network`) translated into
//! Sandhub's policy (docs/networking.md, "E2B"). Pure, unit-tested.
//!
//! The two models differ in one rule: in E2B an `allowOut` entry wins over
//! a `denyOut` entry; in Sandhub deny wins. So:
//!
//! - `denyOut` holding `0.0.0.0/0` (which `allow_internet_access: false`
//!   means) is "only `allowOut`": our `allow_out` is theirs, and nothing
//!   else is denied (their other deny entries are inside it anyway);
//! - otherwise it is "everything but `denyOut`": our `deny_out` is theirs,
//!   and an `allowOut` CIDR that overlaps a denied one (E2B would reopen
//!   it) cannot be said in our words: 400, saying why. An `allowOut` name
//!   is taken (it is allowed anyway), but a name whose address falls in a
//!   denied CIDR is refused here where E2B would let it through (documented);
//! - neither: no narrowing (the template's policy).
//!
//! A template decides whether a sandbox is online at all: these words only
//! narrow it, as every create request does (a `none` template stays
//! offline whatever `allowOut` says: the hub's 400 says so).
//!
//! Fields we cannot honour are refused when ignoring them would change
//! what the user relies on (`maskRequestHost`, `rules`, `egressProxy`),
//! and ignored when ignoring them only narrows (`dnsServers`: the gateway
//! is the sandbox's only resolver) or concerns inbound traffic
//! (`allowPublicTraffic`, `httpsPorts`).

use sandhub_api::{
    error::Code,
    hub::{Network, NetworkSpec},
    network::{parse_list, Pattern, Target},
};
use sandhub_client::{Error, Result};
use serde::Deserialize;
use serde_json::Value;

/// E2B's `SandboxNetworkConfig` and `SandboxNetworkUpdateConfig` (the PUT
/// body carries `allow_internet_access` too). Unknown fields are ignored,
/// as E2B's own models keep them aside.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bNetwork {
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub mask_request_host: Option<String>,
    #[serde(default)]
    pub rules: Option<Value>,
    #[serde(default)]
    pub egress_proxy: Option<Value>,
    // `dnsServers`, `allowPublicTraffic` and `httpsPorts` are ignored (see
    // the module's docs), like any field E2B adds later.
}

fn invalid(msg: String) -> Error {
    Error::new(Code::InvalidArgument, msg)
}

/// What to do when the words mean "nothing may be reached".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offline {
    /// `none` (create from a template without a gateway, or a PUT: on a
    /// running egress sandbox `none` keeps the gateway, refusing all).
    None,
    /// An egress narrowing that refuses everything (`deny_out: ["*"]`), so
    /// a later PUT can open what the template allows.
    DenyAll,
}

/// Sandhub's narrowing for E2B's words; `None`: the template's policy.
/// `allow_internet_access` is the create body's top-level field (or the
/// PUT body's).
pub fn translate(
    net: &E2bNetwork,
    allow_internet_access: Option<bool>,
    offline: Offline,
) -> Result<Option<NetworkSpec>> {
    if net.mask_request_host.is_some() {
        return Err(invalid(
            "network.maskRequestHost is not supported by Sandhub: requests to a sandbox keep their own Host".into(),
        ));
    }
    if net
        .rules
        .as_ref()
        .is_some_and(|r| !r.is_null() && r.as_object().is_none_or(|o| !o.is_empty()))
    {
        return Err(invalid(
            "network.rules (per-host request transforms) are not supported by Sandhub".into(),
        ));
    }
    if net.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(invalid(
            "network.egressProxy is not supported by Sandhub: egress goes through the hub's own gateway".into(),
        ));
    }
    let allow = net.allow_out.clone().unwrap_or_default();
    let mut deny = net.deny_out.clone().unwrap_or_default();
    let allow_p = parse_list("network.allowOut", &allow).map_err(invalid)?;
    let mut deny_p = parse_list("network.denyOut", &deny).map_err(invalid)?;
    for (i, p) in deny_p.iter().enumerate() {
        if !matches!(p.target, Target::Cidr(..)) || p.port.is_some() {
            return Err(invalid(format!(
                "network.denyOut[{i}] {:?}: E2B's denyOut takes CIDR blocks or IP addresses only",
                deny[i]
            )));
        }
    }
    let internet_off = allow_internet_access.or(net.allow_internet_access) == Some(false);
    if internet_off {
        deny.push("0.0.0.0/0".into());
        deny_p.push(everything());
    }
    if allow.is_empty() && deny.is_empty() {
        return Ok(None);
    }
    if deny_p.iter().any(|p| *p == everything()) {
        if allow.is_empty() {
            return Ok(Some(match offline {
                Offline::None => Network::None.into(),
                Offline::DenyAll => NetworkSpec {
                    mode: Network::Egress,
                    allow_out: Vec::new(),
                    deny_out: vec!["*".into()],
                },
            }));
        }
        return Ok(Some(NetworkSpec {
            mode: Network::Egress,
            allow_out: allow,
            deny_out: Vec::new(),
        }));
    }
    for (i, a) in allow_p.iter().enumerate() {
        let Target::Cidr(anet, _) = a.target else {
            continue;
        };
        for (j, d) in deny_p.iter().enumerate() {
            let Target::Cidr(dnet, _) = d.target else {
                continue;
            };
            if a.matches_ip(dnet) || d.matches_ip(anet) {
                return Err(invalid(format!(
                    "network.allowOut[{i}] {:?} overlaps network.denyOut[{j}] {:?}: in E2B an allow entry wins over a deny entry, in Sandhub deny wins, so this cannot be expressed; deny 0.0.0.0/0 and list what is allowed instead",
                    allow[i], deny[j]
                )));
            }
        }
    }
    Ok(Some(NetworkSpec {
        mode: Network::Egress,
        allow_out: Vec::new(),
        deny_out: deny,
    }))
}

fn everything() -> Pattern {
    Pattern {
        target: Target::Cidr([0, 0, 0, 0].into(), 0),
        port: None,
        proto: Default::default(),
    }
}

/// A sandbox's narrowing in E2B's words, for its info:
/// `(allowInternetAccess, network)`.
pub fn describe(spec: Option<&NetworkSpec>) -> (Option<bool>, Option<Value>) {
    let Some(spec) = spec else {
        return (None, None);
    };
    let offline = spec.mode == Network::None
        || (spec.allow_out.is_empty() && spec.deny_out.iter().any(|d| d == "*"));
    if offline {
        return (
            Some(false),
            Some(serde_json::json!({"denyOut": ["0.0.0.0/0"]})),
        );
    }
    if !spec.allow_out.is_empty() {
        let mut deny = vec!["0.0.0.0/0".to_string()];
        deny.extend(spec.deny_out.iter().cloned());
        return (
            Some(false),
            Some(serde_json::json!({"allowOut": spec.allow_out, "denyOut": deny})),
        );
    }
    (None, Some(serde_json::json!({"denyOut": spec.deny_out})))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(v: Value) -> E2bNetwork {
        serde_json::from_value(v).unwrap()
    }

    fn spec(v: Value) -> NetworkSpec {
        serde_json::from_value(v).unwrap()
    }

    fn message(r: Result<Option<NetworkSpec>>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        e.message
    }

    #[test]
    fn internet_off_is_deny_all_and_allow_out_then_is_the_allow_list() {
        let none = E2bNetwork::default();
        assert_eq!(translate(&none, None, Offline::None).unwrap(), None);
        assert_eq!(translate(&none, Some(true), Offline::None).unwrap(), None);
        assert_eq!(
            translate(&none, Some(false), Offline::None).unwrap(),
            Some(Network::None.into())
        );
        assert_eq!(
            translate(&none, Some(false), Offline::DenyAll).unwrap(),
            Some(spec(
                serde_json::json!({"mode": "egress", "deny_out": ["*"]})
            ))
        );
        let only = net(
            serde_json::json!({"allowOut": ["pypi.test", "198.18.5.0/24"],
                                          "denyOut": ["0.0.0.0/0", "10.0.0.0/8"]}),
        );
        assert_eq!(
            translate(&only, None, Offline::None).unwrap(),
            Some(spec(
                serde_json::json!({"allow_out": ["pypi.test", "198.18.5.0/24"]})
            ))
        );
        // allow_internet_access: false with allowOut: the same.
        let put =
            net(serde_json::json!({"allowOut": ["pypi.test"], "allow_internet_access": false}));
        assert_eq!(
            translate(&put, None, Offline::None).unwrap(),
            Some(spec(serde_json::json!({"allow_out": ["pypi.test"]})))
        );
    }

    #[test]
    fn a_partial_deny_is_kept_and_an_allow_inside_it_is_refused() {
        let partial = net(
            serde_json::json!({"denyOut": ["198.18.5.0/24"], "allowOut": ["pypi.test", "203.0.113.0/24"]}),
        );
        assert_eq!(
            translate(&partial, None, Offline::None).unwrap(),
            Some(spec(
                serde_json::json!({"mode": "egress", "deny_out": ["198.18.5.0/24"]})
            ))
        );
        for allow in ["198.18.5.7", "198.18.0.0/16", "198.18.5.128/25"] {
            let m = message(translate(
                &net(serde_json::json!({"denyOut": ["198.18.5.0/24"], "allowOut": [allow]})),
                None,
                Offline::None,
            ));
            assert!(m.contains("allowOut[0]") && m.contains("denyOut[0]"), "{m}");
            assert!(m.contains("deny wins"), "{m}");
        }
    }

    #[test]
    fn bad_and_unsupported_fields_are_named() {
        let m = message(translate(
            &net(serde_json::json!({"denyOut": ["evil.test"]})),
            None,
            Offline::None,
        ));
        assert!(m.contains("denyOut[0]") && m.contains("CIDR"), "{m}");
        let m = message(translate(
            &net(serde_json::json!({"allowOut": ["a.*.test"]})),
            None,
            Offline::None,
        ));
        assert!(m.contains("allowOut[0]"), "{m}");
        for (field, v) in [
            ("maskRequestHost", serde_json::json!("x.test")),
            ("rules", serde_json::json!({"api.test": {}})),
            (
                "egressProxy",
                serde_json::json!({"address": "1.2.3.4:1080"}),
            ),
        ] {
            let m = message(translate(
                &net(serde_json::json!({ field: v })),
                None,
                Offline::None,
            ));
            assert!(m.contains(field), "{m}");
        }
        // Ignored: inbound-side fields and DNS servers; null proxies and
        // empty rules are no request at all.
        let ignored = net(
            serde_json::json!({"dnsServers": ["8.8.8.8"], "allowPublicTraffic": false,
            "httpsPorts": [3000], "egressProxy": null, "rules": {}}),
        );
        assert_eq!(translate(&ignored, None, Offline::None).unwrap(), None);
    }

    #[test]
    fn the_info_reads_back_in_e2b_words() {
        assert_eq!(describe(None), (None, None));
        let (off, n) = describe(Some(&Network::None.into()));
        assert_eq!(off, Some(false));
        assert_eq!(n.unwrap()["denyOut"], serde_json::json!(["0.0.0.0/0"]));
        let (off, n) = describe(Some(&spec(serde_json::json!({"allow_out": ["pypi.test"]}))));
        assert_eq!(off, Some(false));
        assert_eq!(n.unwrap()["allowOut"], serde_json::json!(["pypi.test"]));
    }
}
