//! Brokered secrets (`secrets` on templates and create requests, and
//! `/v1/secrets` values): each refusal is `400 INVALID_ARGUMENT` naming
//! the entry (`secrets[1] "KEY": ...`).
//!
//! Why each rule: the name becomes an environment variable; hosts are
//! *names* because the gateway knows a flow's name from its fake-IP DNS
//! and intercepts nothing else (an address range would intercept TLS by
//! address, where the certificate could not be for a name the sandbox
//! asked); the header is never `Host` nor one that frames or routes the
//! message (hop-by-hop, `Content-Length`, `Transfer-Encoding`), so a
//! secret can change what is said, never where or how much; and values
//! and formats are header-safe, so a value can never add a header line.

use std::collections::BTreeSet;

use crate::{
    error::{Code, ErrorBody},
    network::{Pattern, Target, Transport},
    secrets::{
        SecretRef, DEFAULT_PORT, MAX_SECRETS, MAX_SECRET_FORMAT, MAX_SECRET_HEADER,
        MAX_SECRET_HOSTS, MAX_SECRET_NAME, MAX_SECRET_VALUE, MIN_SECRET_VALUE,
    },
};

fn invalid(message: String) -> ErrorBody {
    ErrorBody::new(Code::InvalidArgument, message)
}

/// Headers a secret may not be put in.
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// A secret's name: what an environment variable may be called.
pub fn secret_name(name: &str) -> Result<(), ErrorBody> {
    let mut bytes = name.bytes();
    let ok = name.len() <= MAX_SECRET_NAME
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "secret name {name:?}: letters, digits and `_`, not starting with a digit, \
             1 to {MAX_SECRET_NAME} characters"
        )))
    }
}

/// Whether every byte may stand in an HTTP header value (visible ASCII,
/// space and tab: no CR, LF or NUL, so nothing can start a new line).
fn header_safe(s: &str) -> bool {
    s.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
}

/// A value to store (`PUT /v1/secrets/{name}`, `--secrets-file`).
pub fn secret_value(name: &str, value: &str) -> Result<(), ErrorBody> {
    if !(MIN_SECRET_VALUE..=MAX_SECRET_VALUE).contains(&value.len()) || !header_safe(value) {
        return Err(invalid(format!(
            "secret {name:?}: value must be {MIN_SECRET_VALUE} to {MAX_SECRET_VALUE} bytes of \
             visible ASCII, space or tab (it goes into an HTTP header)"
        )));
    }
    Ok(())
}

/// An HTTP token (RFC 9110 `tchar`).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A secret's hosts, parsed: names and `*.` wildcards, the port 443
/// unless one is given.
pub fn secret_hosts(field: &str, hosts: &[String]) -> Result<Vec<Pattern>, ErrorBody> {
    if hosts.is_empty() || hosts.len() > MAX_SECRET_HOSTS {
        return Err(invalid(format!(
            "{field}.hosts: 1 to {MAX_SECRET_HOSTS} entries"
        )));
    }
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let p: Pattern = h
                .parse()
                .map_err(|e| invalid(format!("{field}.hosts[{i}] {h:?}: {e}")))?;
            if p.proto != Transport::Tcp {
                return Err(invalid(format!(
                    "{field}.hosts[{i}] {h:?}: secrets are brokered over TCP (TLS); no `udp:` entries"
                )));
            }
            match p.target {
                Target::Name(_) | Target::Below(_) => Ok(Pattern {
                    port: Some(p.port.unwrap_or(DEFAULT_PORT)),
                    ..p
                }),
                _ => Err(invalid(format!(
                    "{field}.hosts[{i}] {h:?}: a name or `*.name`, not `*` or an address \
                     (the gateway brokers by the name the sandbox resolved)"
                ))),
            }
        })
        .collect()
}

/// One `secrets` entry; `field` names it (`secrets[0] "KEY"`).
pub fn secret_ref(field: &str, s: &SecretRef) -> Result<Vec<Pattern>, ErrorBody> {
    secret_name(&s.name).map_err(|e| invalid(format!("{field}: {}", e.message)))?;
    let hosts = secret_hosts(field, &s.hosts)?;
    if s.header.len() > MAX_SECRET_HEADER || !is_token(&s.header) {
        return Err(invalid(format!(
            "{field}.header {:?}: an HTTP header name (a token, at most {MAX_SECRET_HEADER} \
             characters)",
            s.header
        )));
    }
    if FORBIDDEN_HEADERS.contains(&s.header.to_ascii_lowercase().as_str()) {
        return Err(invalid(format!(
            "{field}.header {:?}: not `Host`, a hop-by-hop header, `Content-Length` or \
             `Transfer-Encoding`",
            s.header
        )));
    }
    if s.format.len() > MAX_SECRET_FORMAT
        || s.format.matches("{value}").count() != 1
        || !header_safe(&s.format)
    {
        return Err(invalid(format!(
            "{field}.format {:?}: `{{value}}` exactly once, header-safe characters, at most \
             {MAX_SECRET_FORMAT}",
            s.format
        )));
    }
    Ok(hosts)
}

/// A `secrets` list: each entry, at most [`MAX_SECRETS`], names unique.
pub fn secrets(list: &[SecretRef]) -> Result<(), ErrorBody> {
    if list.len() > MAX_SECRETS {
        return Err(invalid(format!(
            "secrets: at most {MAX_SECRETS} entries, {} given",
            list.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for (i, s) in list.iter().enumerate() {
        let field = format!("secrets[{i}] {:?}", s.name);
        secret_ref(&field, s)?;
        if !seen.insert(s.name.as_str()) {
            return Err(invalid(format!("{field}: named twice")));
        }
    }
    Ok(())
}

/// A template's list and a create request's together: the request adds
/// secrets, never renames one the template has.
pub fn merge_secrets(
    template: &[SecretRef],
    request: &[SecretRef],
) -> Result<Vec<SecretRef>, ErrorBody> {
    let mut out = template.to_vec();
    for (i, s) in request.iter().enumerate() {
        if template.iter().any(|t| t.name == s.name) {
            return Err(invalid(format!(
                "secrets[{i}] {:?}: the template names this secret already",
                s.name
            )));
        }
        out.push(s.clone());
    }
    if out.len() > MAX_SECRETS {
        return Err(invalid(format!(
            "secrets: the template's and the request's together are more than {MAX_SECRETS}"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: serde_json::Value) -> SecretRef {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn good_entries_pass_and_hosts_default_to_443() {
        let e = s(
            serde_json::json!({"name": "OPENAI_API_KEY", "hosts": ["api.openai.com", "*.example.org:8443"],
                                     "header": "Authorization", "format": "Bearer {value}"}),
        );
        let h = secret_ref("secrets[0]", &e).unwrap();
        assert_eq!(h[0].port, Some(443));
        assert_eq!(h[1].port, Some(8443));
        let plain = s(serde_json::json!({"name": "K", "hosts": ["a.test"], "header": "X-Api-Key"}));
        assert_eq!(plain.format, "{value}");
        secrets(&[e, plain]).unwrap();
    }

    #[test]
    fn bad_entries_name_the_entry() {
        let base = serde_json::json!({"name": "K", "hosts": ["a.test"], "header": "X-Key", "format": "{value}"});
        for (patch, needle) in [
            (serde_json::json!({"name": "1K"}), "secret name"),
            (serde_json::json!({"name": "K-1"}), "secret name"),
            (serde_json::json!({"hosts": []}), "hosts"),
            (serde_json::json!({"hosts": ["*"]}), "hosts[0]"),
            (serde_json::json!({"hosts": ["10.0.0.0/8"]}), "hosts[0]"),
            (
                serde_json::json!({"hosts": ["ok.test", "a.*.test"]}),
                "hosts[1]",
            ),
            (serde_json::json!({"header": "Host"}), "header"),
            (serde_json::json!({"header": "connection"}), "header"),
            (serde_json::json!({"header": "Transfer-Encoding"}), "header"),
            (serde_json::json!({"header": "X Key"}), "header"),
            (serde_json::json!({"header": "X-Key:"}), "header"),
            (serde_json::json!({"format": "Bearer"}), "format"),
            (serde_json::json!({"format": "{value}{value}"}), "format"),
            (serde_json::json!({"format": "a\r\nX: {value}"}), "format"),
        ] {
            let mut v = base.clone();
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            let e = secrets(&[s(v.clone())]).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument);
            assert!(e.message.contains(needle), "{v}: {}", e.message);
            assert!(e.message.contains("secrets[0]"), "{}", e.message);
        }
        let one = s(base.clone());
        assert!(secrets(&[one.clone(), one.clone()])
            .unwrap_err()
            .message
            .contains("twice"));
        let many: Vec<SecretRef> = (0..MAX_SECRETS + 1)
            .map(|i| SecretRef {
                name: format!("K{i}"),
                ..one.clone()
            })
            .collect();
        assert!(secrets(&many).is_err());
        let same = std::slice::from_ref(&one);
        assert!(merge_secrets(same, same).is_err());
    }

    #[test]
    fn values_are_header_safe_and_bounded() {
        secret_value("K", "sk-abc 123").unwrap();
        assert!(secret_value("K", "").is_err());
        assert!(secret_value("K", "short").is_err());
        assert!(secret_value("K", "a\nb").is_err());
        assert!(secret_value("K", "a\0b").is_err());
        assert!(secret_value("K", &"x".repeat(MAX_SECRET_VALUE + 1)).is_err());
    }
}
