//! Putting a secret's value into a request: in the secret's header only,
//! and only where that header holds this sandbox's placeholder.

use http::{HeaderMap, HeaderValue};

use super::Secret;

/// Rewrites `headers` for `secrets` (those of the flow's name): every
/// value of a secret's header that contains the secret's placeholder
/// becomes the secret's formatted value (`Bearer {value}` with the
/// value). Other headers, other values of that header, and a placeholder
/// that is not this sandbox's stay as they are.
///
/// The whole value is replaced, not only the placeholder inside it: the
/// operator's `format` says what the header is (`Bearer <key>`), so a
/// workload that wrote `Bearer <placeholder>` (what SDKs do with the
/// environment variable) and one that wrote the bare placeholder send the
/// same thing.
///
/// Answers whether a value went in: such a request also asks for an
/// uncompressed answer (`Accept-Encoding: identity`), so that an answer
/// echoing the value can be masked ([`super::scrub`] reads bytes, not
/// gzip).
pub fn rewrite(headers: &mut HeaderMap, secrets: &[Secret]) -> bool {
    let mut inserted = false;
    for s in secrets {
        let holds = headers
            .get_all(&s.header)
            .iter()
            .any(|v| contains(v.as_bytes(), s.placeholder.as_bytes()));
        if !holds {
            continue;
        }
        let old: Vec<HeaderValue> = headers.get_all(&s.header).iter().cloned().collect();
        let Ok(new) = HeaderValue::from_str(&s.formatted()) else {
            continue; // validated header-safe; never here
        };
        headers.remove(&s.header);
        for v in old {
            if contains(v.as_bytes(), s.placeholder.as_bytes()) {
                headers.append(&s.header, new.clone());
                inserted = true;
            } else {
                headers.append(&s.header, v);
            }
        }
    }
    if inserted {
        headers.insert(
            http::header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    inserted
}

pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret {
            name: "OPENAI_API_KEY".into(),
            placeholder: "sandhub-secret-aaaa".into(),
            value: "sk-real".into(),
            hosts: vec!["api.test".parse().unwrap()],
            header: http::HeaderName::from_static("authorization"),
            format: "Bearer {value}".into(),
        }
    }

    #[test]
    fn only_the_named_header_holding_the_placeholder_changes() {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            "Bearer sandhub-secret-aaaa".parse().unwrap(),
        );
        h.insert("x-other", "sandhub-secret-aaaa".parse().unwrap());
        h.insert("accept-encoding", "gzip, br".parse().unwrap());
        assert!(rewrite(&mut h, &[secret()]));
        assert_eq!(h["authorization"], "Bearer sk-real");
        assert_eq!(h["x-other"], "sandhub-secret-aaaa");
        // An answer that echoes the value must come back maskable.
        assert_eq!(h["accept-encoding"], "identity");
    }

    #[test]
    fn another_placeholder_or_none_stays() {
        for v in ["Bearer sandhub-secret-bbbb", "Bearer sk-guess", ""] {
            let mut h = HeaderMap::new();
            h.insert("authorization", v.parse().unwrap());
            h.insert("accept-encoding", "gzip".parse().unwrap());
            assert!(!rewrite(&mut h, &[secret()]));
            assert_eq!(h["authorization"], v);
            assert_eq!(h["accept-encoding"], "gzip");
        }
        let mut h = HeaderMap::new();
        assert!(!rewrite(&mut h, &[secret()]));
        assert!(h.is_empty());
    }
}
