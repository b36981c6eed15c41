//! The one JSON body extractor of every REST and Gym route.
//!
//! What it accepts, and why:
//! - The body must be a JSON *object*. serde reads `[]` as a struct whose
//!   fields all have defaults, so without this check `POST /v1/sandboxes`
//!   with `[]` would create a sandbox.
//! - `Content-Type: application/json` (or any `+json` type), no content
//!   type at all, and the two types command-line tools send by default
//!   (`application/x-www-form-urlencoded` from `curl -d`, `text/plain`) are
//!   all read as JSON, so the README's `curl -d '{...}'` lines work as
//!   printed. Any other explicit type (`multipart/form-data`,
//!   `application/xml`, ...) says the body is something else: 415.
//! - Except from a browser: those two default types are the ones a web
//!   page may send cross-site without asking first (a CORS "simple
//!   request"), and a hub on loopback without API keys would run whatever
//!   it was sent. Browsers always say where a cross-site request comes from
//!   (`Origin`); command-line tools and SDKs never do. So a request with an
//!   `Origin` must say `application/json`, which makes the browser ask the
//!   hub first (a preflight the hub never grants).
//! - Every rejection is JSON `{code, message}`; bad JSON names the field.

use axum::{
    body::Bytes,
    extract::{FromRequest, Request},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use sandhub_api::error::Code;
use sandhub_client::Error;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON object body, read as described in the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

/// Like [`ApiJson`], for routes whose body is optional: an empty body (or
/// only whitespace) is `T::default()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJsonOrDefault<T>(pub T);

impl<T: serde::Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let body = read_body(request, state).await?;
        parse(&body).map(ApiJson)
    }
}

impl<S, T> FromRequest<S> for ApiJsonOrDefault<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Default,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let body = read_body(request, state).await?;
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(ApiJsonOrDefault(T::default()));
        }
        parse(&body).map(ApiJsonOrDefault)
    }
}

/// The body's bytes, once its content type says it may be JSON; within
/// the router's body limit (413 past it).
async fn read_body<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, ApiError> {
    check_content_type(request.headers())?;
    Bytes::from_request(request, state).await.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                error: Error::new(
                    Code::PayloadTooLarge,
                    format!("request body is too large: {}", r.body_text()),
                ),
                status: None,
            }
        } else {
            ApiError::new(Code::InvalidArgument, r.body_text())
        }
    })
}

/// Which content types are read as JSON: see the module docs.
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let raw = String::from_utf8_lossy(value.as_bytes());
    let essence = raw
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.ends_with("+json") {
        return Ok(());
    }
    let unsupported = |message: String| {
        let mut e = ApiError::new(Code::InvalidArgument, message);
        e.status = Some(StatusCode::UNSUPPORTED_MEDIA_TYPE);
        e
    };
    match essence.as_str() {
        "application/x-www-form-urlencoded" | "text/plain" | "" => {
            if headers.contains_key(header::ORIGIN) {
                Err(unsupported(format!(
                    "a request from a web page (it carries an Origin header) must send its \
                     JSON body with Content-Type: application/json, not {essence}"
                )))
            } else {
                Ok(())
            }
        }
        other => Err(unsupported(format!(
            "the body must be JSON (Content-Type: application/json), not {other}"
        ))),
    }
}

/// `body` as a `T`, if it is one JSON object.
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        first => {
            let got = match first {
                None => "an empty body",
                Some(b'[') => "an array",
                Some(b'"') => "a string",
                Some(b't' | b'f') => "a boolean",
                Some(b'n') => "null",
                Some(b'-' | b'0'..=b'9') => "a number",
                Some(_) => "something that is not JSON",
            };
            return Err(ApiError::new(
                Code::InvalidArgument,
                format!("the body must be a JSON object ({{...}}), not {got}"),
            ));
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| describe(&e.path().to_string(), e.into_inner()))?;
    // Trailing garbage after the object is as bad as a broken one.
    de.end().map_err(|e| describe(".", e))?;
    Ok(value)
}

fn describe(path: &str, e: serde_json::Error) -> ApiError {
    let message = if e.is_syntax() || e.is_eof() {
        format!("the body is not valid JSON: {e}")
    } else if path == "." {
        format!("the JSON body does not fit this request: {e}")
    } else {
        format!("the JSON body does not fit this request: {path}: {e}")
    };
    ApiError::new(Code::InvalidArgument, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[serde(default)]
        a: Option<u32>,
    }

    fn message(r: Result<Body, ApiError>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.error.code, Code::InvalidArgument);
        e.error.message
    }

    #[test]
    fn only_objects_are_bodies() {
        assert_eq!(parse::<Body>(b" {\"a\": 1} ").unwrap(), Body { a: Some(1) });
        assert_eq!(parse::<Body>(b"{}").unwrap(), Body::default());
        for (body, got) in [
            (&b"[]"[..], "an array"),
            (b"", "an empty body"),
            (b"  ", "an empty body"),
            (b"\"x\"", "a string"),
            (b"1", "a number"),
            (b"null", "null"),
            (b"true", "a boolean"),
            (b"a=b", "something that is not JSON"),
        ] {
            let m = message(parse(body));
            assert!(m.contains("must be a JSON object"), "{m}");
            assert!(m.ends_with(got), "{m}");
        }
    }

    #[test]
    fn bad_json_and_bad_fields_are_named() {
        let m = message(parse(b"{\"a\": 1} x"));
        assert!(m.starts_with("the body is not valid JSON"), "{m}");
        let m = message(parse(b"{\"a\": "));
        assert!(m.starts_with("the body is not valid JSON"), "{m}");
        let m = message(parse(b"{\"a\": \"x\"}"));
        assert!(m.contains("a: invalid type"), "{m}");
        let m = message(parse(b"{\"b\": 1}"));
        assert!(m.contains("unknown field `b`"), "{m}");
        // A number no f64 holds.
        let m = message(parse(b"{\"a\": 1e400}"));
        assert!(m.contains("not valid JSON"), "{m}");
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn curl_content_types_are_json_but_not_from_a_browser() {
        for ok in [
            &[][..],
            &[("content-type", "application/json")],
            &[("content-type", "Application/JSON; charset=utf-8")],
            &[("content-type", "application/merge-patch+json")],
            &[("content-type", "application/x-www-form-urlencoded")],
            &[("content-type", "text/plain;charset=UTF-8")],
            &[
                ("content-type", "application/json"),
                ("origin", "https://evil.example"),
            ],
        ] {
            assert!(check_content_type(&headers(ok)).is_ok(), "{ok:?}");
        }
        for bad in [
            &[("content-type", "multipart/form-data; boundary=x")][..],
            &[("content-type", "application/xml")],
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("origin", "https://evil.example"),
            ],
            &[
                ("content-type", "text/plain"),
                ("origin", "https://evil.example"),
            ],
        ] {
            let e = check_content_type(&headers(bad)).unwrap_err();
            assert_eq!(
                e.status,
                Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{bad:?}"
            );
            assert_eq!(e.error.code, Code::InvalidArgument);
        }
    }
}
