//! A sandbox's network: its mode and, for `egress`, the outbound policy
//! (issue #27). Data and pure parsing only; the gateway that enforces it
//! lives in `gateway/`.
//!
//! # Wire forms
//!
//! `network` in a template (and in a create request, to narrow it) is either
//! the mode alone, exactly as before this module existed:
//!
//! ```json
//! "network": "none"          "network": "host"          "network": "egress"
//! ```
//!
//! or an object:
//!
//! ```json
//! "network": {"mode": "egress",
//!             "allow_out": ["pypi.test", "*.git.example.com", "203.0.113.0/24:443"],
//!             "deny_out": ["evil.git.example.com"]}
//! ```
//!
//! A spec with both lists empty is written back as the plain string, so a
//! stored template or an answer reads byte for byte as it did before.
//!
//! # Patterns
//!
//! | pattern | matches |
//! |---|---|
//! | `*` | every name and every address the always-closed and private rules leave open |
//! | `pkgs.example.org` | that name (case-insensitive, a trailing `.` ignored) |
//! | `*.example.org` | names strictly below `example.org`, not `example.org` itself |
//! | `203.0.113.0/24`, `203.0.113.7` | addresses in the CIDR (a bare address is /32 or /128) |
//! | `2001:db8::/32`, `[2001:db8::/32]:443`, `[2001:db8::1]:22` | IPv6: brackets when a port follows |
//! | any of these + `:PORT` | the same, on that TCP port only |
//! | `udp:` + any of these + `:PORT` | UDP datagrams to that port (the port is required) |
//!
//! Names are matched by name entries, addresses by CIDR entries: a CIDR
//! allows a workload to dial an address directly, and a CIDR in `deny_out`
//! also refuses a name whose resolved address falls in it. `*` stands for
//! both. Deny wins over allow. An allow entry opens its own transport only
//! (plain: TCP, `udp:`: UDP); a plain deny entry refuses both.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use serde::{
    de::{self, MapAccess, Visitor},
    ser::SerializeMap,
    Deserialize, Deserializer, Serialize, Serializer,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Network {
    /// Only a loopback interface.
    #[default]
    None,
    /// The host's network namespace.
    Host,
    /// Its own network namespace whose only way out is the hub's egress
    /// gateway, under the template's `allow_out` / `deny_out`.
    Egress,
}

/// Most entries in one of `allow_out` and `deny_out`.
pub const MAX_NETWORK_ENTRIES: usize = 256;
/// Longest pattern accepted (a DNS name is at most 253 bytes).
pub const MAX_PATTERN_LEN: usize = 300;

/// A template's (or a create request's) `network`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkSpec {
    pub mode: Network,
    /// Where an `egress` sandbox may connect; empty: the operator's default
    /// (`--egress-default`).
    pub allow_out: Vec<String>,
    /// Where it may never connect, whatever `allow_out` says.
    pub deny_out: Vec<String>,
}

impl From<Network> for NetworkSpec {
    fn from(mode: Network) -> Self {
        NetworkSpec {
            mode,
            ..Default::default()
        }
    }
}

impl NetworkSpec {
    /// Whether this is the plain mode with no lists (written as a string).
    pub fn is_plain(&self) -> bool {
        self.allow_out.is_empty() && self.deny_out.is_empty()
    }
}

/// The wire word of a mode.
pub fn mode_word(m: Network) -> &'static str {
    match m {
        Network::None => "none",
        Network::Host => "host",
        Network::Egress => "egress",
    }
}

impl Serialize for NetworkSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_plain() {
            return s.serialize_str(mode_word(self.mode));
        }
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("mode", mode_word(self.mode))?;
        if !self.allow_out.is_empty() {
            m.serialize_entry("allow_out", &self.allow_out)?;
        }
        if !self.deny_out.is_empty() {
            m.serialize_entry("deny_out", &self.deny_out)?;
        }
        m.end()
    }
}

/// A spec written always as an object (`{"mode": "none"}` rather than
/// `"none"`): the form of a request body, which is a JSON object on every
/// route (`PATCH /v1/sandboxes/{id}/network`).
#[derive(Debug, Clone, Copy)]
pub struct AsObject<'a>(pub &'a NetworkSpec);

impl Serialize for AsObject<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("mode", mode_word(self.0.mode))?;
        if !self.0.allow_out.is_empty() {
            m.serialize_entry("allow_out", &self.0.allow_out)?;
        }
        if !self.0.deny_out.is_empty() {
            m.serialize_entry("deny_out", &self.0.deny_out)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for NetworkSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NetworkSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "\"none\", \"host\", \"egress\" or {\"mode\": ..., \"allow_out\": [...], \"deny_out\": [...]}",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<NetworkSpec, E> {
                Network::deserialize(de::value::StrDeserializer::<E>::new(v)).map(Into::into)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NetworkSpec, A::Error> {
                let mut spec = NetworkSpec::default();
                let mut mode = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "mode" => mode = Some(map.next_value::<Network>()?),
                        "allow_out" => spec.allow_out = map.next_value()?,
                        "deny_out" => spec.deny_out = map.next_value()?,
                        other => {
                            return Err(de::Error::unknown_field(
                                other,
                                &["mode", "allow_out", "deny_out"],
                            ))
                        }
                    }
                }
                // Lists without a mode can only mean the gateway.
                spec.mode = mode.unwrap_or(if spec.is_plain() {
                    Network::None
                } else {
                    Network::Egress
                });
                Ok(spec)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for NetworkSpec {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{Array, Object, ObjectBuilder, OneOfBuilder, Type};
        let mode = || {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["none", "host", "egress"]))
        };
        let list = || Array::new(Object::with_type(Type::String));
        OneOfBuilder::new()
            .item(mode())
            .item(
                ObjectBuilder::new()
                    .property("mode", mode())
                    .property("allow_out", list())
                    .property("deny_out", list())
                    .additional_properties(Some(
                        utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
                    )),
            )
            .description(Some(
                "`none` (only lo), `host` (operator-only), `egress` (through the hub's gateway), \
                 or {mode, allow_out, deny_out}: patterns are names, `*.` wildcards, CIDRs \
                 (`[v6/len]:port` with a port), each with an optional `:port` (TCP); \
                 `udp:HOST:PORT` opens a UDP port; deny wins.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for NetworkSpec {}

/// What a pattern names, before its port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `*`: every name and every open address.
    Any,
    /// One name, lowercase, without a trailing dot.
    Name(String),
    /// `*.suffix`: names strictly below `suffix` (stored without `*.`).
    Below(String),
    /// An address range; host bits are zero.
    Cidr(IpAddr, u8),
}

/// The transport an entry speaks of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// A plain entry. In `allow_out` it opens TCP only; in `deny_out` it
    /// refuses TCP and UDP alike (deny wins, so a plain deny closes a
    /// destination whatever a `udp:` allow entry says).
    #[default]
    Tcp,
    /// `udp:HOST:PORT`: UDP datagrams to that port only (the gateway's own
    /// DNS responder needs no entry).
    Udp,
}

/// One parsed `allow_out` / `deny_out` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    pub target: Target,
    /// `None`: every port.
    pub port: Option<u16>,
    /// `udp:` entries name a UDP port; plain ones are TCP.
    pub proto: Transport,
}

/// The prefix of a UDP entry (`udp:stun.example.org:3478`).
pub const UDP_PREFIX: &str = "udp:";

/// Why a pattern was refused (the caller names the entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError(pub String);

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(why: impl Into<String>) -> Result<T, PatternError> {
    Err(PatternError(why.into()))
}

fn parse_port(p: &str) -> Result<u16, PatternError> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return err(format!("port `{p}` must be a number 1-65535"));
    }
    match p.parse::<u32>() {
        Ok(n @ 1..=65535) => Ok(n as u16),
        _ => err(format!("port `{p}` must be a number 1-65535")),
    }
}

/// Whether `name` is a DNS name we accept: labels of 1-63 `[a-z0-9-_]`
/// not starting or ending with `-`, 253 bytes at most. Lowercase only
/// (callers lowercase first).
pub fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        })
}

/// A name as the gateway compares it: lowercase, no trailing dot.
pub fn normalize_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

fn parse_cidr(s: &str) -> Result<Target, PatternError> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip = IpAddr::from_str(addr).map_err(|_| PatternError(format!("`{addr}` is no address")))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) if !l.is_empty() && l.len() <= 3 && l.bytes().all(|b| b.is_ascii_digit()) => {
            match l.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return err(format!("prefix length /{l} is over {max}")),
            }
        }
        Some(l) => return err(format!("prefix length /{l} is not a number")),
    };
    if mask(ip, len) != ip {
        return err(format!(
            "host bits are set in {s} (the network is {}/{len})",
            mask(ip, len)
        ));
    }
    Ok(Target::Cidr(ip, len))
}

/// `ip` with every bit past `len` cleared.
pub fn mask(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = if len == 0 {
                0
            } else {
                u32::MAX << (32 - len.min(32) as u32)
            };
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len.min(128) as u32)
            };
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

/// Whether `ip` lies in `net/len` (families must agree; an IPv4-mapped
/// IPv6 address is compared as its IPv4 address).
pub fn cidr_contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    net.is_ipv4() == ip.is_ipv4() && mask(ip, len) == net
}

impl FromStr for Pattern {
    type Err = PatternError;

    fn from_str(s: &str) -> Result<Pattern, PatternError> {
        if s.is_empty() {
            return err("an empty pattern");
        }
        if s.len() > MAX_PATTERN_LEN {
            return err(format!("longer than {MAX_PATTERN_LEN} characters"));
        }
        // `udp:` first: what follows is an ordinary entry, which must
        // name its port (UDP has no "every port": each one is opened on
        // purpose, since the gateway relays datagrams it cannot read).
        if let Some(rest) = s.strip_prefix(UDP_PREFIX) {
            let p = parse_plain(rest)?;
            if p.port.is_none() {
                return err("a `udp:` entry needs a port (`udp:HOST:PORT`)");
            }
            return Ok(Pattern {
                proto: Transport::Udp,
                ..p
            });
        }
        parse_plain(s)
    }
}

/// An entry without a transport prefix.
fn parse_plain(s: &str) -> Result<Pattern, PatternError> {
    if s.is_empty() {
        return err("an empty pattern");
    }
    // `[v6 or v6/len]` with an optional `:port`.
    if let Some(rest) = s.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return err("`[` without `]`");
        };
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(parse_port(p)?),
                None => return err(format!("`{after}` after `]` (expected `:PORT`)")),
            },
        };
        let target = parse_cidr(inside)?;
        if !matches!(target, Target::Cidr(IpAddr::V6(_), _)) {
            return err("brackets are for IPv6 addresses");
        }
        return Ok(Pattern {
            target,
            port,
            proto: Transport::Tcp,
        });
    }
    // Two or more colons and no brackets: a bare IPv6 address or CIDR,
    // never with a port (`2001:db8::1:443` would be ambiguous).
    if s.matches(':').count() >= 2 {
        return match parse_cidr(s)? {
            t @ Target::Cidr(IpAddr::V6(_), _) => Ok(Pattern {
                target: t,
                port: None,
                proto: Transport::Tcp,
            }),
            _ => err("not an IPv6 address; write [ADDR/LEN]:PORT for a port"),
        };
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(parse_port(p)?)),
        None => (s, None),
    };
    if host.is_empty() {
        return err("no host before the port");
    }
    if host == "*" {
        return Ok(Pattern {
            target: Target::Any,
            port,
            proto: Transport::Tcp,
        });
    }
    let looks_numeric = host
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b'.' || b == b'/');
    if looks_numeric || host.contains('/') {
        return Ok(Pattern {
            target: parse_cidr(host)?,
            port,
            proto: Transport::Tcp,
        });
    }
    let host = normalize_name(host);
    let (below, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host.as_str()),
    };
    if name.contains('*') {
        return err("`*` may only stand alone or as the first label (`*.example.org`)");
    }
    if !is_dns_name(name) {
        return err(format!(
            "`{name}` is no DNS name (labels of 1-63 of [a-z0-9-_], 253 bytes at most)"
        ));
    }
    let name = name.to_string();
    Ok(Pattern {
        target: if below {
            Target::Below(name)
        } else {
            Target::Name(name)
        },
        port,
        proto: Transport::Tcp,
    })
}

impl Pattern {
    /// Whether a name matches this pattern's target (any port).
    pub fn matches_name(&self, name: &str) -> bool {
        match &self.target {
            Target::Any => true,
            Target::Name(n) => n == name,
            Target::Below(suffix) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Target::Cidr(..) => false,
        }
    }

    /// Whether an address matches this pattern's target (any port).
    pub fn matches_ip(&self, ip: IpAddr) -> bool {
        match &self.target {
            Target::Any => true,
            Target::Cidr(net, len) => cidr_contains(*net, *len, ip),
            Target::Name(_) | Target::Below(_) => false,
        }
    }

    pub fn matches_port(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    /// Whether this entry, as an allow entry, opens `proto` (a plain
    /// entry opens TCP only, a `udp:` entry UDP only).
    pub fn allows_transport(&self, proto: Transport) -> bool {
        self.proto == proto
    }

    /// Whether this entry, as a deny entry, refuses `proto` (a plain one
    /// refuses both; a `udp:` one UDP only).
    pub fn denies_transport(&self, proto: Transport) -> bool {
        self.proto == Transport::Tcp || proto == Transport::Udp
    }

    /// Whether everything `other` matches, this matches too: how a create
    /// request's `allow_out` entry is checked against its template's.
    pub fn covers(&self, other: &Pattern) -> bool {
        let port_ok = match (self.port, other.port) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        let target_ok = match (&self.target, &other.target) {
            (Target::Any, _) => true,
            (_, Target::Any) => false,
            (Target::Name(a), Target::Name(b)) => a == b,
            (Target::Below(_), Target::Name(n)) => self.matches_name(n),
            (Target::Below(a), Target::Below(b)) => a == b || self.matches_name(b),
            (Target::Cidr(net, len), Target::Cidr(onet, olen)) => {
                olen >= len && net.is_ipv4() == onet.is_ipv4() && mask(*onet, *len) == *net
            }
            _ => false,
        };
        port_ok && target_ok && self.proto == other.proto
    }
}

/// Parses a list, naming the first bad entry (`field[i] "entry": why`).
pub fn parse_list(field: &str, list: &[String]) -> Result<Vec<Pattern>, String> {
    if list.len() > MAX_NETWORK_ENTRIES {
        return Err(format!(
            "{field} has {} entries; at most {MAX_NETWORK_ENTRIES}",
            list.len()
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, e)| {
            e.parse::<Pattern>()
                .map_err(|why| format!("{field}[{i}] {e:?}: {why}"))
        })
        .collect()
}

#[cfg(test)]
#[path = "network_tests.rs"]
mod tests;
