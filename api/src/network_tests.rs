//! Tests of `network.rs`: the wire forms and the pattern language.

use super::*;

fn p(s: &str) -> Pattern {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn bad(s: &str) -> String {
    match s.parse::<Pattern>() {
        Ok(p) => panic!("{s} parsed as {p:?}"),
        Err(e) => e.0,
    }
}

#[test]
fn patterns_parse() {
    assert_eq!(
        p("*"),
        Pattern {
            target: Target::Any,
            port: None,
            proto: Transport::Tcp,
        }
    );
    assert_eq!(p("*:443").port, Some(443));
    assert_eq!(p("PyPI.test.").target, Target::Name("pypi.test".into()));
    assert_eq!(
        p("*.git.example.com:22"),
        Pattern {
            target: Target::Below("git.example.com".into()),
            port: Some(22),
            proto: Transport::Tcp,
        }
    );
    assert_eq!(
        p("203.0.113.0/24:443"),
        Pattern {
            target: Target::Cidr("203.0.113.0".parse().unwrap(), 24),
            port: Some(443),
            proto: Transport::Tcp,
        }
    );
    assert_eq!(
        p("203.0.113.7").target,
        Target::Cidr("203.0.113.7".parse().unwrap(), 32)
    );
    assert_eq!(
        p("2001:db8::/32").target,
        Target::Cidr("2001:db8::".parse().unwrap(), 32)
    );
    assert_eq!(p("[2001:db8::/32]:443").port, Some(443));
    assert_eq!(
        p("[2001:db8::1]").target,
        Target::Cidr("2001:db8::1".parse().unwrap(), 128)
    );
    assert_eq!(
        p("0.0.0.0/0").target,
        Target::Cidr("0.0.0.0".parse().unwrap(), 0)
    );
}

#[test]
fn bad_patterns_say_why() {
    assert!(bad("").contains("empty"));
    assert!(bad("a.*.com").contains("first label"));
    assert!(bad("*foo.com").contains("first label"));
    assert!(bad("foo.*").contains("first label"));
    assert!(bad("**.com").contains("first label"));
    assert!(bad("pypi.test:0").contains("1-65535"));
    assert!(bad("pypi.test:65536").contains("1-65535"));
    assert!(bad("pypi.test:").contains("1-65535"));
    assert!(bad("pypi.test:+1").contains("1-65535"));
    assert!(bad("10.0.0.1/8").contains("host bits"));
    assert!(bad("2001:db8::1/32").contains("host bits"));
    assert!(bad("10.0.0.0/33").contains("over 32"));
    assert!(bad("300.1.1.1").contains("no address"));
    assert!(bad("[10.0.0.0/8]:80").contains("IPv6"));
    assert!(bad("[2001:db8::/32]443").contains("after"));
    assert!(bad("exa mple.com").contains("no DNS name"));
    assert!(bad("-a.com").contains("no DNS name"));
    assert!(bad("a..com").contains("no DNS name"));
    assert!(bad(&format!("{}.com", "a".repeat(64))).contains("no DNS name"));
    assert!(bad(&"a".repeat(400)).contains("longer"));
    assert!(bad(":80").contains("no host"));
}

#[test]
fn wildcards_match_strictly_below() {
    let w = p("*.example.org");
    assert!(w.matches_name("a.example.org"));
    assert!(w.matches_name("a.b.example.org"));
    assert!(!w.matches_name("example.org"));
    assert!(!w.matches_name("badexample.org"));
    assert!(!w.matches_ip("1.2.3.4".parse().unwrap()));
}

#[test]
fn cidrs_match_their_family_and_mapped_v4() {
    let c = p("203.0.113.0/24");
    assert!(c.matches_ip("203.0.113.200".parse().unwrap()));
    assert!(!c.matches_ip("203.0.114.1".parse().unwrap()));
    assert!(c.matches_ip("::ffff:203.0.113.9".parse().unwrap()));
    assert!(!p("2001:db8::/32").matches_ip("203.0.113.9".parse().unwrap()));
    assert!(!c.matches_name("203.0.113.1"));
}

#[test]
fn covering_is_subset_by_target_and_port() {
    assert!(p("*").covers(&p("a.test:443")));
    assert!(p("*").covers(&p("10.0.0.0/8")));
    assert!(!p("*:443").covers(&p("a.test")));
    assert!(p("*.test").covers(&p("a.test:80")));
    assert!(p("*.test").covers(&p("*.a.test")));
    assert!(p("*.test").covers(&p("*.test")));
    assert!(!p("*.a.test").covers(&p("*.test")));
    assert!(!p("a.test").covers(&p("*.a.test")));
    assert!(!p("a.test").covers(&p("b.test")));
    assert!(p("a.test").covers(&p("a.test:22")));
    assert!(!p("a.test:22").covers(&p("a.test")));
    assert!(p("10.0.0.0/8").covers(&p("10.1.0.0/16:80")));
    assert!(!p("10.1.0.0/16").covers(&p("10.0.0.0/8")));
    assert!(!p("10.0.0.0/8").covers(&p("a.test")));
    assert!(!p("a.test").covers(&p("*")));
}

#[test]
fn wire_forms_round_trip_and_stay_plain() {
    for (json, mode) in [
        ("\"none\"", Network::None),
        ("\"host\"", Network::Host),
        ("\"egress\"", Network::Egress),
    ] {
        let s: NetworkSpec = serde_json::from_str(json).unwrap();
        assert_eq!(s, mode.into());
        assert_eq!(serde_json::to_string(&s).unwrap(), json);
    }
    let s: NetworkSpec =
        serde_json::from_str(r#"{"mode":"egress","allow_out":["a.test"],"deny_out":["b.test"]}"#)
            .unwrap();
    assert_eq!(s.allow_out, ["a.test"]);
    assert_eq!(
        serde_json::to_string(&s).unwrap(),
        r#"{"mode":"egress","allow_out":["a.test"],"deny_out":["b.test"]}"#
    );
    // An object without lists is written back as the string.
    let s: NetworkSpec = serde_json::from_str(r#"{"mode":"host"}"#).unwrap();
    assert_eq!(serde_json::to_string(&s).unwrap(), "\"host\"");
    // Lists without a mode mean egress.
    let s: NetworkSpec = serde_json::from_str(r#"{"allow_out":["a.test"]}"#).unwrap();
    assert_eq!(s.mode, Network::Egress);
    assert!(serde_json::from_str::<NetworkSpec>(r#"{"mode":"egress","allow":[]}"#).is_err());
    assert!(serde_json::from_str::<NetworkSpec>("\"internet\"").is_err());
}

#[test]
fn lists_name_the_bad_entry_and_are_capped() {
    let e = parse_list("allow_out", &["a.test".into(), "a.*.test".into()]).unwrap_err();
    assert!(e.starts_with("allow_out[1] \"a.*.test\""), "{e}");
    let many: Vec<String> = (0..=MAX_NETWORK_ENTRIES)
        .map(|i| format!("h{i}.test"))
        .collect();
    assert!(parse_list("deny_out", &many)
        .unwrap_err()
        .contains("at most 256"));
    assert_eq!(parse_list("deny_out", &many[..256]).unwrap().len(), 256);
}

#[test]
fn udp_entries_need_a_port_and_match_udp_only() {
    assert_eq!(
        p("udp:stun.test:3478"),
        Pattern {
            target: Target::Name("stun.test".into()),
            port: Some(3478),
            proto: Transport::Udp,
        }
    );
    assert_eq!(
        p("udp:203.0.113.0/24:3478").target,
        Target::Cidr("203.0.113.0".parse().unwrap(), 24)
    );
    assert_eq!(p("udp:[2001:db8::1]:53").proto, Transport::Udp);
    assert_eq!(p("udp:*:3478").target, Target::Any);
    for s in [
        "udp:stun.test",
        "udp:203.0.113.5",
        "udp:*",
        "udp:[2001:db8::1]",
        "udp:2001:db8::1",
    ] {
        let e = bad(s);
        assert!(e.contains("port") || e.contains("IPv6"), "{s}: {e}");
    }
    assert!(bad("udp:").contains("empty"), "{}", bad("udp:"));
    assert!(bad("udp:stun.test:0").contains("1-65535"));
    assert!(
        bad("udp:udp:x:1").contains("no address"),
        "{}",
        bad("udp:udp:x:1")
    );
    // Allow entries open their own transport; plain deny entries refuse both.
    let (plain, udp) = (p("stun.test:3478"), p("udp:stun.test:3478"));
    assert!(plain.allows_transport(Transport::Tcp) && !plain.allows_transport(Transport::Udp));
    assert!(udp.allows_transport(Transport::Udp) && !udp.allows_transport(Transport::Tcp));
    assert!(plain.denies_transport(Transport::Udp) && plain.denies_transport(Transport::Tcp));
    assert!(udp.denies_transport(Transport::Udp) && !udp.denies_transport(Transport::Tcp));
    // Narrowing keeps the transport: neither covers the other.
    assert!(!p("*").covers(&udp) && !udp.covers(&plain));
    assert!(p("udp:*.test:3478").covers(&udp));
    assert!(!p("udp:*.test:3479").covers(&udp));
}
