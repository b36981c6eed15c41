//! The `grpc-timeout` header: up to 8 digits and a unit (H, M, S, m, u, n).

use std::time::Duration;

pub fn parse(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The finest unit that keeps the value within 8 digits (rounded up, so the
/// backend never sees a later deadline than the router's).
pub fn encode(d: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = d.as_nanos().max(1);
    for (unit, per) in [
        ("n", 1u128),
        ("u", 1_000),
        ("m", 1_000_000),
        ("S", 1_000_000_000),
        ("M", 60_000_000_000),
        ("H", 3_600_000_000_000),
    ] {
        let n = nanos.div_ceil(per);
        if n <= MAX {
            return format!("{n}{unit}");
        }
    }
    format!("{MAX}H")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_encode() {
        assert_eq!(parse("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("123456789S"), None);
        assert_eq!(parse("5x"), None);
        assert_eq!(parse("m"), None);
        assert_eq!(encode(Duration::from_millis(100)), "100000u");
        assert_eq!(
            parse(&encode(Duration::from_millis(1500))),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse(&encode(Duration::from_secs(86_400 * 400)))
                .unwrap()
                .as_secs(),
            86_400 * 400
        );
    }
}
