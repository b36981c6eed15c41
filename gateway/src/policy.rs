//! Deciding a flow: pure functions over parsed patterns, no I/O.
//!
//! A flow is allowed when all of these hold, in this order (the first that
//! fails is the reason given):
//!
//! 1. its address is not **always closed**: unspecified, loopback,
//!    link-local (169.254.0.0/16, fe80::/10: the metadata address lives
//!    there), multicast and reserved ranges, the gateway's own internal
//!    range, the host's own addresses (the hub listens on them; a
//!    `network: host` sandbox's servers too), and whatever the operator adds;
//! 2. its address is not **private** (10/8, 172.16/12, 192.168/16,
//!    100.64/10, fc00::/7), unless an operator `--egress-allow-private`
//!    CIDR holds it;
//! 3. no **deny** entry matches it (operator's, template's, the sandbox's
//!    own): a name entry by the flow's name, a CIDR entry by its address
//!    (also the address a name resolved to), on a matching port;
//! 4. **every allow layer** (the template's list, or the operator's default
//!    when that list is empty; and the sandbox's own narrowing list, if
//!    any) has an entry for it: a name entry for a name flow, a CIDR entry
//!    for a flow to a literal address, `*` for both.
//!
//! IPv4-mapped IPv6 addresses are judged as their IPv4 address.

use std::net::{IpAddr, Ipv4Addr};

use sandhub_api::{
    error::ErrorBody,
    hub::{Network, NetworkSpec},
    network::{cidr_contains, normalize_name, Pattern, Target},
    validate,
};

/// A CIDR: network address (host bits zero) and prefix length.
pub type Cidr = (IpAddr, u8);

/// Ranges no policy opens.
const ALWAYS_CLOSED: &[(&str, u8)] = &[
    ("0.0.0.0", 8),
    ("127.0.0.0", 8),
    ("169.254.0.0", 16),
    ("192.0.0.0", 24),
    ("224.0.0.0", 4),
    ("240.0.0.0", 4),
    ("::", 128),
    ("::1", 128),
    ("fe80::", 10),
    ("fec0::", 10),
    ("ff00::", 8),
];

/// Ranges closed unless the operator opens them.
const PRIVATE: &[(&str, u8)] = &[
    ("10.0.0.0", 8),
    ("172.16.0.0", 12),
    ("192.168.0.0", 16),
    ("100.64.0.0", 10),
    ("fc00::", 7),
];

fn table(t: &[(&str, u8)]) -> Vec<Cidr> {
    t.iter()
        .filter_map(|(a, l)| a.parse().ok().map(|ip| (ip, *l)))
        .collect()
}

fn in_any(list: &[Cidr], ip: IpAddr) -> bool {
    list.iter().any(|(net, len)| cidr_contains(*net, *len, ip))
}

/// An IPv4-mapped IPv6 address as IPv4; anything else unchanged.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// A flow's transport: the pattern language's own ([`Transport`]), so a
/// `udp:` entry and a UDP flow are the same word.
pub use sandhub_api::network::Transport as Proto;

/// Why a flow or a name was refused (for logs and, later, the decision log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Loopback, link-local, the host's or the gateway's own, ...
    Closed(IpAddr),
    /// A private range the operator did not open.
    Private(IpAddr),
    /// A deny entry (`operator`, `template`, `sandbox`) matched.
    Denied(&'static str),
    /// No allow entry of this layer matched.
    NotAllowed(&'static str),
    /// The sandbox's network was set to `none` while it runs.
    Offline,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Reason::Closed(ip) => write!(f, "{ip} is in an always-closed range"),
            Reason::Private(ip) => write!(f, "{ip} is private and not opened by the operator"),
            Reason::Denied(who) => write!(f, "denied by the {who}'s deny_out"),
            Reason::NotAllowed(who) => write!(f, "not in the {who}'s allow_out"),
            Reason::Offline => f.write_str("the sandbox's network was set to `none`"),
        }
    }
}

/// The operator's part, the same for every sandbox of a hub.
#[derive(Debug, Clone)]
pub struct OperatorPolicy {
    closed: Vec<Cidr>,
    private: Vec<Cidr>,
    /// `--egress-allow-private`.
    pub allow_private: Vec<Cidr>,
    /// `--egress-deny`.
    pub deny: Vec<Pattern>,
    /// `--egress-default allow`: an egress template with no `allow_out`
    /// may reach any open name or address.
    pub default_allows_all: bool,
    /// Test only ([`OperatorPolicy::open_loopback_for_tests`]): loopback
    /// is reachable, so tests can run their "internet" on 127.0.0.1.
    loopback_for_tests: bool,
}

impl OperatorPolicy {
    /// `extra_closed`: more always-closed ranges (the gateway's internal
    /// range, the hub's listen addresses).
    pub fn new(
        allow_private: Vec<Cidr>,
        deny: Vec<Pattern>,
        default_allows_all: bool,
        extra_closed: &[Cidr],
    ) -> Self {
        let mut closed = table(ALWAYS_CLOSED);
        closed.extend_from_slice(extra_closed);
        OperatorPolicy {
            closed,
            private: table(PRIVATE),
            allow_private,
            deny,
            default_allows_all,
            loopback_for_tests: false,
        }
    }

    /// Opens loopback (and only loopback) despite step 1. For tests that
    /// serve their target hosts on 127.0.0.1 without a network namespace;
    /// no flag of any binary calls it. Everything else of the decision
    /// (names, lists, private and link-local ranges) stays as it is.
    #[doc(hidden)]
    pub fn open_loopback_for_tests(mut self) -> Self {
        self.loopback_for_tests = true;
        self
    }

    /// Steps 1 and 2: whether `ip` may be reached at all. `host_addrs`:
    /// the host's own addresses, read by the caller.
    pub fn address_open(&self, ip: IpAddr, host_addrs: &[IpAddr]) -> Result<(), Reason> {
        let ip = canonical(ip);
        if self.loopback_for_tests && ip.is_loopback() {
            return Ok(());
        }
        if in_any(&self.closed, ip) || host_addrs.iter().any(|h| canonical(*h) == ip) {
            return Err(Reason::Closed(ip));
        }
        if in_any(&self.private, ip) && !in_any(&self.allow_private, ip) {
            return Err(Reason::Private(ip));
        }
        Ok(())
    }
}

/// One sandbox's lists, parsed.
#[derive(Debug, Clone, Default)]
pub struct SandboxPolicy {
    /// The template's `allow_out` (empty: the operator's default).
    pub template_allow: Vec<Pattern>,
    pub template_deny: Vec<Pattern>,
    /// The create request's narrowing `allow_out` (empty: none).
    pub sandbox_allow: Vec<Pattern>,
    pub sandbox_deny: Vec<Pattern>,
    /// `network: none` set on the running sandbox (`PATCH`): every name
    /// and every connection is refused, whatever the lists say. The
    /// gateway keeps running so that a later change can open it again.
    pub offline: bool,
}

/// One connection attempt. `name` is set when the workload dialed a name
/// (a fake IP); `ip` is then the address it resolved to, if known yet.
#[derive(Debug, Clone, Copy)]
pub struct Flow<'a> {
    pub name: Option<&'a str>,
    pub ip: Option<IpAddr>,
    pub port: u16,
    pub proto: Proto,
}

fn deny_hits(list: &[Pattern], flow: &Flow<'_>) -> bool {
    list.iter().any(|p| {
        p.denies_transport(flow.proto)
            && p.matches_port(flow.port)
            && (flow.name.is_some_and(|n| p.matches_name(n))
                || flow.ip.is_some_and(|ip| p.matches_ip(canonical(ip))))
    })
}

fn allow_hits(list: &[Pattern], flow: &Flow<'_>) -> bool {
    list.iter().any(|p| {
        p.allows_transport(flow.proto)
            && p.matches_port(flow.port)
            && match flow.name {
                Some(n) => p.matches_name(n),
                None => flow.ip.is_some_and(|ip| p.matches_ip(canonical(ip))),
            }
    })
}

/// `--egress-default allow`: every name and address, over TCP (UDP is
/// opened only by `udp:` entries).
const ANY: Pattern = Pattern {
    target: Target::Any,
    port: None,
    proto: Proto::Tcp,
};

impl SandboxPolicy {
    /// A sandbox's layers, parsed: its template's lists, and the narrowing
    /// its create request or a `PATCH` recorded (`sandbox`); a recorded
    /// `none` makes it offline. Both backends enforce what this returns.
    pub fn layered(
        template: &NetworkSpec,
        sandbox: Option<&NetworkSpec>,
    ) -> Result<Self, ErrorBody> {
        let (template_allow, template_deny) = validate::parse_network(template)?;
        let (sandbox_allow, sandbox_deny) = match sandbox {
            Some(s) if s.mode == Network::Egress => validate::parse_network(s)?,
            _ => Default::default(),
        };
        Ok(SandboxPolicy {
            template_allow,
            template_deny,
            sandbox_allow,
            sandbox_deny,
            offline: sandbox.is_some_and(|s| s.mode == Network::None),
        })
    }

    fn template_allow<'a>(&'a self, op: &OperatorPolicy) -> &'a [Pattern] {
        if !self.template_allow.is_empty() {
            &self.template_allow
        } else if op.default_allows_all {
            std::slice::from_ref(&ANY)
        } else {
            &[]
        }
    }

    /// Steps 3 and 4 (the lists) for a flow; steps 1 and 2 need its
    /// address: [`decide`] does all four.
    pub fn lists_allow(&self, op: &OperatorPolicy, flow: &Flow<'_>) -> Result<(), Reason> {
        if self.offline {
            return Err(Reason::Offline);
        }
        for (who, list) in [
            ("operator", &op.deny),
            ("template", &self.template_deny),
            ("sandbox", &self.sandbox_deny),
        ] {
            if deny_hits(list, flow) {
                return Err(Reason::Denied(who));
            }
        }
        if !allow_hits(self.template_allow(op), flow) {
            return Err(Reason::NotAllowed("template"));
        }
        if !self.sandbox_allow.is_empty() && !allow_hits(&self.sandbox_allow, flow) {
            return Err(Reason::NotAllowed("sandbox"));
        }
        Ok(())
    }

    /// Whether the DNS responder answers `name` (with a fake IP): some
    /// entry of every allow layer matches it on some port, and no deny
    /// entry without a port matches it (a deny with a port only refuses
    /// that port, at connect time).
    pub fn name_answered(&self, op: &OperatorPolicy, name: &str) -> Result<(), Reason> {
        if self.offline {
            return Err(Reason::Offline);
        }
        let name = normalize_name(name);
        for (who, list) in [
            ("operator", &op.deny),
            ("template", &self.template_deny),
            ("sandbox", &self.sandbox_deny),
        ] {
            if list
                .iter()
                .any(|p| p.port.is_none() && p.matches_name(&name))
            {
                return Err(Reason::Denied(who));
            }
        }
        if !self
            .template_allow(op)
            .iter()
            .any(|p| p.matches_name(&name))
        {
            return Err(Reason::NotAllowed("template"));
        }
        if !self.sandbox_allow.is_empty()
            && !self.sandbox_allow.iter().any(|p| p.matches_name(&name))
        {
            return Err(Reason::NotAllowed("sandbox"));
        }
        Ok(())
    }
}

/// The whole decision for a flow whose address is known.
pub fn decide(
    op: &OperatorPolicy,
    sb: &SandboxPolicy,
    flow: &Flow<'_>,
    host_addrs: &[IpAddr],
) -> Result<(), Reason> {
    if let Some(ip) = flow.ip {
        op.address_open(ip, host_addrs)?;
    }
    sb.lists_allow(op, flow)
}

/// The gateway's internal addresses inside every egress sandbox.
pub mod internal {
    use super::*;

    /// The range the gateway owns inside the sandbox; never a real
    /// destination, whatever `--egress-allow-private` says.
    pub const NET: Ipv4Addr = Ipv4Addr::new(100, 127, 0, 0);
    pub const PREFIX: u8 = 16;
    /// The gateway's end: the default route's next hop and the DNS server.
    pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(100, 127, 0, 1);
    /// The sandbox's address on its TUN device.
    pub const SANDBOX: Ipv4Addr = Ipv4Addr::new(100, 127, 0, 2);
    /// Fake IPs handed out for names: 100.127.128.0/17.
    pub const FAKE_NET: Ipv4Addr = Ipv4Addr::new(100, 127, 128, 0);
    pub const FAKE_PREFIX: u8 = 17;

    pub fn cidr() -> Cidr {
        (IpAddr::V4(NET), PREFIX)
    }

    pub fn is_internal(ip: IpAddr) -> bool {
        cidr_contains(IpAddr::V4(NET), PREFIX, canonical(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pats(list: &[&str]) -> Vec<Pattern> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn op() -> OperatorPolicy {
        OperatorPolicy::new(vec![], vec![], true, &[internal::cidr()])
    }

    fn sb(allow: &[&str], deny: &[&str]) -> SandboxPolicy {
        SandboxPolicy {
            template_allow: pats(allow),
            template_deny: pats(deny),
            ..Default::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn named<'a>(name: &'a str, addr: &str, port: u16) -> Flow<'a> {
        Flow {
            name: Some(name),
            ip: Some(ip(addr)),
            port,
            proto: Proto::Tcp,
        }
    }

    fn literal(addr: &str, port: u16) -> Flow<'static> {
        Flow {
            name: None,
            ip: Some(ip(addr)),
            port,
            proto: Proto::Tcp,
        }
    }

    #[test]
    fn an_offline_policy_refuses_every_name_and_flow_whatever_its_lists() {
        let op = OperatorPolicy::new(vec![], vec![], true, &[]);
        let mut p = sb(&["*"], &[]);
        assert!(p.name_answered(&op, "pypi.test").is_ok());
        p.offline = true;
        assert_eq!(p.name_answered(&op, "pypi.test"), Err(Reason::Offline));
        assert_eq!(
            decide(&op, &p, &named("pypi.test", "203.0.113.7", 443), &[]),
            Err(Reason::Offline)
        );
        assert_eq!(
            decide(&op, &p, &literal("203.0.113.7", 80), &[]),
            Err(Reason::Offline)
        );
    }

    #[test]
    fn always_closed_ranges_stay_closed_whatever_the_policy() {
        let o = OperatorPolicy::new(
            vec![(ip("0.0.0.0"), 0), (ip("::"), 0)],
            vec![],
            true,
            &[internal::cidr()],
        );
        let s = sb(&["*", "0.0.0.0/0", "::/0"], &[]);
        for a in [
            "127.0.0.1",
            "127.9.9.9",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "100.127.0.1",
            "100.127.200.1",
        ] {
            assert!(
                matches!(decide(&o, &s, &literal(a, 80), &[]), Err(Reason::Closed(_))),
                "{a}"
            );
            assert!(
                matches!(
                    decide(&o, &s, &named("x.test", a, 80), &[]),
                    Err(Reason::Closed(_))
                ),
                "{a} by name (rebinding)"
            );
        }
        // The host's own addresses (where the hub listens).
        let host = [ip("198.18.0.1")];
        assert_eq!(
            decide(&o, &s, &literal("198.18.0.1", 8080), &host),
            Err(Reason::Closed(ip("198.18.0.1")))
        );
        assert!(decide(&o, &s, &literal("198.18.0.2", 8080), &host).is_ok());
    }

    #[test]
    fn private_ranges_open_only_where_the_operator_says() {
        let s = sb(&["*"], &[]);
        for a in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "fd00::1",
        ] {
            assert!(
                matches!(
                    decide(&op(), &s, &literal(a, 80), &[]),
                    Err(Reason::Private(_))
                ),
                "{a}"
            );
        }
        assert!(decide(&op(), &s, &literal("172.32.0.1", 80), &[]).is_ok());
        let o = OperatorPolicy::new(
            vec![(ip("10.20.0.0"), 16)],
            vec![],
            true,
            &[internal::cidr()],
        );
        assert!(decide(&o, &s, &literal("10.20.3.4", 80), &[]).is_ok());
        assert!(decide(&o, &s, &named("db.test", "10.20.3.4", 80), &[]).is_ok());
        assert!(matches!(
            decide(&o, &s, &literal("10.21.0.1", 80), &[]),
            Err(Reason::Private(_))
        ));
        // The gateway's own range is not a private range the operator opens.
        let o = OperatorPolicy::new(
            vec![(ip("100.64.0.0"), 10)],
            vec![],
            true,
            &[internal::cidr()],
        );
        assert!(decide(&o, &s, &literal("100.100.0.1", 80), &[]).is_ok());
        assert!(decide(&o, &s, &literal("100.127.0.1", 53), &[]).is_err());
    }

    #[test]
    fn names_wildcards_cidrs_and_ports() {
        let s = sb(
            &[
                "pypi.test",
                "*.git.test",
                "198.18.5.0/24",
                "api.test:443",
                "[2001:db8::/32]:22",
            ],
            &[],
        );
        let o = op();
        let ok = |f: Flow<'_>| decide(&o, &s, &f, &[]).is_ok();
        assert!(ok(named("pypi.test", "198.18.0.2", 80)));
        assert!(ok(named("a.git.test", "198.18.0.2", 80)));
        assert!(!ok(named("git.test", "198.18.0.2", 80)));
        assert!(!ok(named("other.test", "198.18.0.2", 80)));
        assert!(ok(named("api.test", "198.18.0.2", 443)));
        assert!(!ok(named("api.test", "198.18.0.2", 80)));
        assert!(ok(literal("198.18.5.9", 1234)));
        assert!(!ok(literal("198.18.6.9", 1234)));
        // A CIDR allows dialing the address, not a name that resolves there.
        assert!(!ok(named("elsewhere.test", "198.18.5.9", 80)));
        assert!(ok(literal("2001:db8::5", 22)));
        assert!(!ok(literal("2001:db8::5", 23)));
        // Names are answered by DNS when some entry matches, on any port.
        assert!(s.name_answered(&o, "API.test.").is_ok());
        assert!(s.name_answered(&o, "x.git.test").is_ok());
        assert_eq!(
            s.name_answered(&o, "other.test"),
            Err(Reason::NotAllowed("template"))
        );
    }

    #[test]
    fn deny_wins_over_allow_and_applies_to_resolved_addresses() {
        let s = sb(
            &["*.test", "198.18.0.0/16"],
            &["bad.test", "198.18.9.0/24", "*.test:25"],
        );
        let o = op();
        assert_eq!(
            decide(&o, &s, &named("bad.test", "198.18.0.2", 80), &[]),
            Err(Reason::Denied("template"))
        );
        assert_eq!(
            decide(&o, &s, &named("good.test", "198.18.9.1", 80), &[]),
            Err(Reason::Denied("template"))
        );
        assert_eq!(
            decide(&o, &s, &named("good.test", "198.18.0.2", 25), &[]),
            Err(Reason::Denied("template"))
        );
        assert!(decide(&o, &s, &named("good.test", "198.18.0.2", 80), &[]).is_ok());
        assert_eq!(
            s.name_answered(&o, "bad.test"),
            Err(Reason::Denied("template"))
        );
        // A port-limited deny does not hide the name.
        assert!(s.name_answered(&o, "good.test").is_ok());
        // The operator's deny list wins over every tenant list.
        let o = OperatorPolicy::new(vec![], vec!["*.corp.test".parse().unwrap()], true, &[]);
        assert_eq!(
            decide(&o, &s, &named("x.corp.test", "198.18.0.2", 80), &[]),
            Err(Reason::Denied("operator"))
        );
        assert_eq!(
            s.name_answered(&o, "x.corp.test"),
            Err(Reason::Denied("operator"))
        );
    }

    #[test]
    fn empty_allow_lists_follow_the_operator_default_and_sandboxes_narrow() {
        let open = sb(&[], &[]);
        let allow_all = op();
        let deny_all = OperatorPolicy::new(vec![], vec![], false, &[]);
        assert!(decide(&allow_all, &open, &named("any.test", "198.18.0.2", 80), &[]).is_ok());
        assert!(decide(&allow_all, &open, &literal("198.18.0.2", 80), &[]).is_ok());
        assert_eq!(
            decide(&deny_all, &open, &named("any.test", "198.18.0.2", 80), &[]),
            Err(Reason::NotAllowed("template"))
        );
        let narrowed = SandboxPolicy {
            sandbox_allow: pats(&["pypi.test"]),
            sandbox_deny: pats(&["198.18.7.7"]),
            ..sb(&["*.test"], &[])
        };
        assert!(decide(
            &allow_all,
            &narrowed,
            &named("pypi.test", "198.18.0.2", 80),
            &[]
        )
        .is_ok());
        assert_eq!(
            decide(
                &allow_all,
                &narrowed,
                &named("api.test", "198.18.0.2", 80),
                &[]
            ),
            Err(Reason::NotAllowed("sandbox"))
        );
        assert_eq!(
            decide(
                &allow_all,
                &narrowed,
                &named("pypi.test", "198.18.7.7", 80),
                &[]
            ),
            Err(Reason::Denied("sandbox"))
        );
    }

    #[test]
    fn udp_flows_need_a_udp_entry_and_plain_denies_refuse_them() {
        let udp = |name: Option<&'static str>, addr: &str, port: u16| Flow {
            name,
            ip: Some(ip(addr)),
            port,
            proto: Proto::Udp,
        };
        // `*` (and the operator's default) opens TCP only.
        assert_eq!(
            decide(&op(), &sb(&["*"], &[]), &udp(None, "198.18.0.2", 53), &[]),
            Err(Reason::NotAllowed("template"))
        );
        assert_eq!(
            decide(
                &op(),
                &sb(&[], &[]),
                &udp(Some("stun.test"), "198.18.0.2", 3478),
                &[]
            ),
            Err(Reason::NotAllowed("template"))
        );
        let open = sb(&["*", "udp:stun.test:3478", "udp:198.18.5.0/24:7"], &[]);
        assert_eq!(
            decide(
                &op(),
                &open,
                &udp(Some("stun.test"), "198.18.0.2", 3478),
                &[]
            ),
            Ok(())
        );
        assert_eq!(
            decide(&op(), &open, &udp(None, "198.18.5.2", 7), &[]),
            Ok(())
        );
        // Another port, another name, and a TCP flow to the UDP port.
        for f in [
            udp(Some("stun.test"), "198.18.0.2", 3479),
            udp(Some("other.test"), "198.18.0.2", 3478),
            udp(None, "198.18.5.2", 8),
        ] {
            assert!(decide(&op(), &open, &f, &[]).is_err(), "{f:?}");
        }
        assert!(open
            .lists_allow(&op(), &named("stun.test", "198.18.0.2", 3478))
            .is_ok()); // via `*`
        let only_udp = sb(&["udp:stun.test:3478"], &[]);
        assert_eq!(
            only_udp.lists_allow(&op(), &named("stun.test", "198.18.0.2", 3478)),
            Err(Reason::NotAllowed("template"))
        );
        // The name resolves: a `udp:` entry makes it answerable.
        assert_eq!(only_udp.name_answered(&op(), "stun.test"), Ok(()));
        // Closed ranges and rebinding as for TCP.
        assert!(matches!(
            decide(
                &op(),
                &sb(&["udp:*:53"], &[]),
                &udp(Some("x.test"), "127.0.0.1", 53),
                &[]
            ),
            Err(Reason::Closed(_))
        ));
        // A plain deny refuses UDP too; a `udp:` deny leaves TCP alone.
        for deny in ["stun.test", "198.18.0.0/16", "udp:stun.test:3478"] {
            assert_eq!(
                decide(
                    &op(),
                    &sb(&["udp:stun.test:3478"], &[deny]),
                    &udp(Some("stun.test"), "198.18.0.2", 3478),
                    &[]
                ),
                Err(Reason::Denied("template")),
                "{deny}"
            );
        }
        assert_eq!(
            sb(&["*"], &["udp:stun.test:3478"])
                .lists_allow(&op(), &named("stun.test", "198.18.0.2", 3478)),
            Ok(())
        );
        // The operator's deny list applies to UDP as to TCP.
        let strict = OperatorPolicy::new(vec![], pats(&["stun.test"]), true, &[]);
        assert_eq!(
            decide(
                &strict,
                &open,
                &udp(Some("stun.test"), "198.18.0.2", 3478),
                &[]
            ),
            Err(Reason::Denied("operator"))
        );
    }
}
