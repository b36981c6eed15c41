//! [`SandboxdClient`]: one sandboxd, reached directly. REST (files,
//! health) over pooled HTTP/1.1 and gRPC (processes, watches) over one
//! HTTP/2 channel, both on a Unix socket directory (the hub's local
//! backend) or TCP (a Pod on Kubernetes).
//!
//! Construction connects nothing and is cheap; clones share the pool and
//! the channel. Constructors must run inside a Tokio runtime (the gRPC
//! channel spawns its worker there).

mod files;
mod forward;
mod keep;
pub use keep::{process_events as kept_process_events, KeptEvent, KeptEvents, KeptProcess};
mod process;
pub use process::{MAX_REST_EXECS, TIMED_OUT_EXIT_CODE};
mod transport;
mod watch;

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicUsize},
        Arc,
    },
};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use sandhub_api::{
    proto::{
        keep::v1::kept_process_service_client::KeptProcessServiceClient,
        process::v1::process_service_client::ProcessServiceClient,
        watcher::v1::file_watcher_service_client::FileWatcherServiceClient,
    },
    sandboxd::{Health, Metadata as SandboxMetadata, GRPC_SOCKET, REST_SOCKET},
};
use serde::de::DeserializeOwned;
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use self::transport::{Connector, Metadata, Traced};
use crate::{Error, Result};

/// Request bodies: empty, or a caller's upload stream. Its error type is
/// ours, so a failing upload stream surfaces as the caller's own error.
type Body = UnsyncBoxBody<Bytes, Error>;

type Grpc = InterceptedService<Traced, Metadata>;

#[derive(Clone)]
pub struct SandboxdClient {
    http: Client<Connector, Body>,
    /// `http://sandboxd` on a Unix socket (only the Host header sees it),
    /// else e.g. `http://10.0.0.7:8080`; no trailing slash.
    rest_base: Arc<str>,
    channel: Channel,
    /// Sent on every REST request: the bearer token, and routing headers
    /// when a router stands between us and sandboxd.
    rest_headers: Arc<HeaderMap>,
    /// Sent on every gRPC call (same purpose; the router needs a different
    /// `x-sandbox-port` for gRPC than for REST).
    grpc_metadata: Metadata,
    /// Whether unary execs go over REST (`EXECUTE_ROUTE`); cleared, for
    /// every clone, the first time this sandboxd answers that it has no
    /// such route.
    rest_execute: Arc<AtomicBool>,
    /// Unary execs on REST right now, each holding a connection of its
    /// own; past [`MAX_REST_EXECS`] they share the gRPC channel.
    rest_executing: Arc<AtomicUsize>,
}

impl std::fmt::Debug for SandboxdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxdClient")
            .field("rest_base", &self.rest_base)
            .field("headers", &self.rest_headers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl SandboxdClient {
    /// The sandboxd serving `rest.sock` and `grpc.sock` in `dir`
    /// (`sandboxd --unix-socket <dir>`).
    pub fn unix(dir: &Path) -> Self {
        Self::build(
            Connector::unix(dir.join(REST_SOCKET)),
            "http://sandboxd".into(),
            transport::unix_channel(dir.join(GRPC_SOCKET)),
        )
    }

    /// A sandboxd on TCP: `rest_base` like `http://10.0.0.7:8080`, `grpc_uri`
    /// like `http://10.0.0.7:9090`.
    pub fn tcp(rest_base: impl Into<String>, grpc_uri: impl Into<String>) -> Result<Self> {
        let rest_base = rest_base.into();
        let rest_base = rest_base.trim_end_matches('/').to_string();
        let uri: http::Uri = rest_base
            .parse()
            .map_err(|e| Error::invalid(format!("REST address {rest_base}: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(Error::invalid(format!(
                "REST address {rest_base}: expected http://host:port"
            )));
        }
        let channel = transport::tcp_channel(grpc_uri.into())?;
        Ok(Self::build(Connector::tcp(), rest_base, channel))
    }

    fn build(connector: Connector, rest_base: String, channel: Channel) -> Self {
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(transport::POOL_IDLE_TIMEOUT)
            .build(connector);
        SandboxdClient {
            http,
            rest_base: rest_base.into(),
            channel,
            rest_headers: Arc::default(),
            grpc_metadata: Metadata::default(),
            rest_execute: Arc::new(AtomicBool::new(true)),
            rest_executing: Arc::default(),
        }
    }

    /// Sends `token` as a bearer token on every REST and gRPC call
    /// (`sandboxd --auth-token-file`).
    pub fn with_token(self, token: &str) -> Result<Self> {
        let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| Error::invalid("the auth token contains characters a header cannot"))?;
        header.set_sensitive(true);
        let mut both = HeaderMap::new();
        both.insert(header::AUTHORIZATION, header);
        Ok(self.with_headers(both.clone(), both))
    }

    /// Adds `rest` to every REST request and `grpc` to every gRPC call's
    /// metadata (replacing same-named ones), e.g. a router's `X-Sandbox-*`.
    pub fn with_headers(mut self, rest: HeaderMap, grpc: HeaderMap) -> Self {
        let mut merged = (*self.rest_headers).clone();
        merged.extend(rest);
        self.rest_headers = Arc::new(merged);
        self.grpc_metadata = self.grpc_metadata.extended(grpc);
        self
    }

    /// `GET /v1/health`: answers without a token; UNAVAILABLE while draining.
    pub async fn health(&self) -> Result<Health> {
        let response = self.send(Method::GET, "/v1/health", empty()).await?;
        json(response).await
    }

    /// `GET /v1/metadata`: the sandbox's environment, secrets redacted.
    pub async fn metadata(&self) -> Result<SandboxMetadata> {
        let response = self.send(Method::GET, "/v1/metadata", empty()).await?;
        json(response).await
    }

    fn process(&self) -> ProcessServiceClient<Grpc> {
        // Execute answers with all output in one message; sandboxd puts no
        // limit on it, so neither may the client.
        ProcessServiceClient::with_interceptor(Traced(self.channel.clone()), self.bearer())
            .max_decoding_message_size(usize::MAX)
    }

    fn kept(&self) -> KeptProcessServiceClient<Grpc> {
        KeptProcessServiceClient::with_interceptor(Traced(self.channel.clone()), self.bearer())
    }

    fn watcher(&self) -> FileWatcherServiceClient<Grpc> {
        FileWatcherServiceClient::with_interceptor(Traced(self.channel.clone()), self.bearer())
    }

    fn bearer(&self) -> Metadata {
        self.grpc_metadata.clone()
    }

    /// Sends one REST request; a non-2xx answer becomes its error.
    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Body,
    ) -> Result<Response<Incoming>> {
        let response = self.send_any(method, path_and_query, body, None).await?;
        if response.status().is_success() {
            Ok(response)
        } else {
            Err(error_of(response).await)
        }
    }

    /// Sends one REST request, with the trace context, under a client span
    /// named `span_name` (by default the request's path); any answer is `Ok`.
    async fn send_any(
        &self,
        method: Method,
        path_and_query: &str,
        body: Body,
        span_name: Option<&str>,
    ) -> Result<Response<Incoming>> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.rest_base, path_and_query));
        for (name, value) in self.rest_headers.iter() {
            request = request.header(name, value);
        }
        let mut request = request
            .body(body)
            .map_err(|e| Error::invalid(format!("building request {path_and_query}: {e}")))?;
        let span = crate::propagate::call_span(span_name.unwrap_or(request.uri().path()));
        let response = if span.is_none() {
            self.http.request(request).await
        } else {
            span.in_scope(|| crate::propagate::apply(request.headers_mut()));
            tracing::Instrument::instrument(self.http.request(request), span).await
        };
        response.map_err(transport_error)
    }
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

fn full(bytes: Vec<u8>) -> Body {
    http_body_util::Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed_unsync()
}

async fn body_bytes(response: Response<Incoming>) -> Result<Bytes> {
    Ok(response
        .into_body()
        .collect()
        .await
        .map_err(|e| Error::unavailable(format!("reading sandboxd's answer: {e}")))?
        .to_bytes())
}

async fn json<T: DeserializeOwned>(response: Response<Incoming>) -> Result<T> {
    let bytes = body_bytes(response).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::internal(format!(
            "sandboxd sent a body that is not the expected JSON: {e}"
        ))
    })
}

async fn error_of(response: Response<Incoming>) -> Error {
    let status = response.status().as_u16();
    match body_bytes(response).await {
        Ok(body) => Error::from_http(status, &body),
        Err(_) => Error::from_http(status, b""),
    }
}

/// A request that never got an answer. An upload stream's own error is
/// passed through as it was; everything else means sandboxd is out of
/// reach or went away mid-request.
fn transport_error(e: hyper_util::client::legacy::Error) -> Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut chain = Vec::new();
    while let Some(err) = source {
        if let Some(ours) = err.downcast_ref::<Error>() {
            return ours.clone();
        }
        chain.push(err.to_string());
        source = err.source();
    }
    let what = if e.is_connect() {
        "connecting to sandboxd"
    } else {
        "talking to sandboxd"
    };
    Error::unavailable(format!("{what}: {}", chain.join(": ")))
}
