//! Printing answers: aligned tables for people, JSON for scripts.

use std::{
    collections::BTreeMap,
    io::Write,
    time::{Duration, SystemTime},
};

use sandhub_client::{Error, Result};
use serde::Serialize;

use super::args::Output;

/// Pretty JSON on stdout, one document per call.
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::internal(format!("encoding JSON: {e}")))?;
    line(&text)
}

/// An answer in the caller's format: `text` for people, `value` as JSON
/// for scripts.
pub fn show<T, D>(format: Output, value: &T, text: impl FnOnce() -> D) -> Result<()>
where
    T: Serialize + ?Sized,
    D: std::fmt::Display,
{
    match format {
        Output::Text => line(&text().to_string()),
        Output::Json => json(value),
    }
}

/// One line on stdout. A closed pipe (`| head`) is not worth a message.
pub fn line(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Error::internal(format!("writing to stdout: {e}"))),
    }
}

/// Columns padded to their widest cell, kubectl style; the last column is
/// not padded so that lines carry no trailing spaces.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            text.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 3;
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        text.push('\n');
    }
    text.pop();
    text
}

/// `k=v,k2=v2`, or `<none>`.
pub fn pairs(map: &BTreeMap<String, String>) -> String {
    if map.is_empty() {
        return "<none>".into();
    }
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// How long ago an RFC 3339 time was, in its largest unit (`45s`, `12m`,
/// `3h`, `2d`); `?` when the hub sent something unparsable.
pub fn age(rfc3339: &str, now: SystemTime) -> String {
    let Ok(then) = humantime::parse_rfc3339_weak(rfc3339) else {
        return "?".into();
    };
    // A clock slightly behind the hub's is not a negative age.
    let secs = now.duration_since(then).unwrap_or(Duration::ZERO).as_secs();
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        7200..=172_799 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

pub fn optional<T: ToString>(value: &Option<T>) -> String {
    value.as_ref().map_or_else(|| "-".to_string(), T::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_without_trailing_spaces() {
        let t = table(
            &["ID", "STATE"],
            &[
                vec!["a".into(), "Ready".into()],
                vec!["long-id".into(), "Pending".into()],
            ],
        );
        assert_eq!(t, "ID        STATE\na         Ready\nlong-id   Pending");
    }

    #[test]
    fn ages() {
        let now = humantime::parse_rfc3339("2026-01-02T00:00:00Z").unwrap();
        assert_eq!(age("2026-01-01T23:59:15.500Z", now), "44s");
        assert_eq!(age("2026-01-01T23:30:00Z", now), "30m");
        assert_eq!(age("2026-01-01T20:00:00Z", now), "4h");
        assert_eq!(age("2025-12-30T00:00:00Z", now), "3d");
        assert_eq!(age("2026-01-02T00:00:05Z", now), "0s");
        assert_eq!(age("yesterday", now), "?");
    }

    #[test]
    fn label_pairs() {
        assert_eq!(pairs(&BTreeMap::new()), "<none>");
        let m = BTreeMap::from([("a".into(), "1".into()), ("b".into(), "2".into())]);
        assert_eq!(pairs(&m), "a=1,b=2");
    }
}
