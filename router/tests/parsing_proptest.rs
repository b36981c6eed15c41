//! Property tests of the routing parsers: whatever a client sends, parsing
//! never panics, accepts exactly the documented forms, and path routing
//! forwards exactly the bytes after the port segment.

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use sandhub_router::routing::{
    is_dns1123_label, parse_headers, parse_path, parse_pod_ip, parse_port, HeaderRules, RouteError,
};

fn reference_label(s: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| ok_char(c) || c == '-')
        && s.starts_with(ok_char)
        && s.ends_with(ok_char)
}

fn label() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn label_rule_matches_reference(s in ".{0,70}") {
        prop_assert_eq!(is_dns1123_label(&s), reference_label(&s));
    }

    #[test]
    fn generated_labels_are_accepted(s in label()) {
        prop_assert!(is_dns1123_label(&s));
    }

    #[test]
    fn port_accepts_exactly_1_to_65535(s in "[0-9+ -]{0,7}") {
        let want = s.bytes().all(|b| b.is_ascii_digit())
            && !s.is_empty()
            && s.len() <= 5
            && s.parse::<u64>().is_ok_and(|p| (1..=65535).contains(&p));
        prop_assert_eq!(parse_port(&s).is_ok(), want);
        if let Ok(p) = parse_port(&s) {
            prop_assert_eq!(u64::from(p), s.parse::<u64>().unwrap());
        }
    }

    #[test]
    fn pod_ip_never_loopback_or_link_local(a in any::<u8>(), b in any::<u8>(), c in any::<u8>(), d in any::<u8>()) {
        let s = format!("{a}.{b}.{c}.{d}");
        let res = parse_pod_ip(&s, false);
        if a == 127 || (a == 169 && b == 254) || (224..=239).contains(&a) || s == "0.0.0.0" || s == "255.255.255.255" {
            prop_assert_eq!(res, Err(RouteError::BadIp));
        } else {
            prop_assert!(res.is_ok());
        }
    }

    #[test]
    fn arbitrary_header_values_never_panic(
        id in proptest::collection::vec(any::<u8>(), 0..80),
        ns in proptest::collection::vec(any::<u8>(), 0..80),
        port in proptest::collection::vec(any::<u8>(), 0..8),
        ip in proptest::collection::vec(any::<u8>(), 0..50),
        grpc in any::<bool>(),
    ) {
        let mut h = HeaderMap::new();
        for (name, v) in [("x-sandbox-id", id), ("x-sandbox-namespace", ns), ("x-sandbox-port", port), ("x-sandbox-pod-ip", ip)] {
            if let Ok(v) = HeaderValue::from_bytes(&v) {
                h.insert(HeaderName::from_static(name), v);
            }
        }
        if let Ok(t) = parse_headers(&h, HeaderRules { grpc, allow_loopback: false }) {
            prop_assert!(is_dns1123_label(&t.id));
            prop_assert!(is_dns1123_label(&t.namespace));
            prop_assert!(t.port >= 1);
        }
    }

    #[test]
    fn valid_headers_round_trip(id in label(), ns in label(), port in 1u16..=65535) {
        let mut h = HeaderMap::new();
        h.insert("x-sandbox-id", id.parse().unwrap());
        h.insert("x-sandbox-namespace", ns.parse().unwrap());
        h.insert("x-sandbox-port", port.to_string().parse().unwrap());
        let t = parse_headers(&h, HeaderRules { grpc: true, allow_loopback: false }).unwrap();
        prop_assert_eq!((t.id, t.namespace, t.port), (id, ns, port));
    }

    #[test]
    fn path_routes_forward_the_rest_verbatim(
        ns in label(), id in label(), port in 1u16..=65535,
        rest in "(/[A-Za-z0-9%._~-]{0,12}){0,4}/?",
    ) {
        let path = format!("/sb/{ns}/{id}/{port}{rest}");
        let r = parse_path("/sb", &path).unwrap().unwrap();
        prop_assert_eq!((r.namespace, r.id, r.port), (ns.as_str(), id.as_str(), port));
        let want = if rest.is_empty() { "/" } else { rest.as_str() };
        prop_assert_eq!(r.rest, want);
        prop_assert!(path.starts_with(r.base));
    }

    #[test]
    fn arbitrary_paths_never_panic(path in "/[ -~]{0,80}") {
        if let Some(Ok(r)) = parse_path("/sb", &path) {
            prop_assert!(r.rest.starts_with('/'));
            prop_assert!(is_dns1123_label(r.namespace) && is_dns1123_label(r.id) && r.port >= 1);
        }
    }
}
