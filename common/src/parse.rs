//! Command-line values in the forms the upstream Go programs take them, so a
//! flag copied from an upstream manifest means the same here.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;

/// Go-style durations (`180s`, `200ms`, `1m30s`, `0`); a bare number is
/// seconds (`45`, `1.5`). Negative, infinite and unknown values are refused.
/// The `String` error suits clap's `value_parser`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}"));
    }
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Go's listen-address forms: `:8080` (every interface), `host:port` (a
/// host name is resolved, first address wins); empty or `0` disables the
/// listener (`Ok(None)`).
pub fn parse_bind(s: &str) -> anyhow::Result<Option<SocketAddr>> {
    let s = s.trim();
    if s.is_empty() || s == "0" {
        return Ok(None);
    }
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    if let Ok(addr) = full.parse() {
        return Ok(Some(addr));
    }
    full.to_socket_addrs()
        .with_context(|| format!("bad listen address {s:?}"))?
        .next()
        .map(Some)
        .with_context(|| format!("{s:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_go_and_bare_second_forms() {
        assert_eq!(parse_duration("180s"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 45 "), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn durations_refuse_negative_infinite_and_words() {
        for bad in ["-1", "-0.5", "inf", "NaN", "soon", "", "5 parsecs", "1e400"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.starts_with("invalid duration"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn bind_addresses_in_go_forms() {
        assert_eq!(
            parse_bind(":8080").unwrap().unwrap().to_string(),
            "0.0.0.0:8080"
        );
        assert_eq!(
            parse_bind("127.0.0.1:1").unwrap().unwrap().to_string(),
            "127.0.0.1:1"
        );
        assert_eq!(
            parse_bind("[::1]:9").unwrap().unwrap().to_string(),
            "[::1]:9"
        );
        assert!(parse_bind("0").unwrap().is_none());
        assert!(parse_bind("").unwrap().is_none());
        assert!(parse_bind("  ").unwrap().is_none());
    }

    #[test]
    fn bind_resolves_host_names() {
        let addr = parse_bind("localhost:8081").unwrap().unwrap();
        assert!(addr.ip().is_loopback(), "{addr}");
        assert_eq!(addr.port(), 8081);
    }

    #[test]
    fn bind_refuses_what_is_no_address() {
        for bad in [
            "8080",
            "127.0.0.1",
            "127.0.0.1:99999",
            "::8080:x",
            "host with space:1",
        ] {
            assert!(parse_bind(bad).is_err(), "{bad:?}");
        }
    }
}
