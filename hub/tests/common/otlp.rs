//! A real OTLP/HTTP trace receiver on loopback: `POST /v1/traces` with a
//! protobuf `ExportTraceServiceRequest`, decoded with the
//! `opentelemetry-proto` types (the collector's own schema), every span
//! kept with its service name. It also counts the TCP connections it
//! accepted, so a test can show that nothing connected at all.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest, common::v1::any_value::Value, trace::v1::Span,
};
use prost::Message;

/// One received span, with the `service.name` of its resource.
#[derive(Clone, Debug)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

impl Received {
    pub fn name(&self) -> &str {
        &self.span.name
    }

    /// The string value of attribute `key`.
    pub fn attr(&self, key: &str) -> Option<String> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(|v| match v {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::BoolValue(b) => b.to_string(),
                other => format!("{other:?}"),
            })
    }
}

pub struct OtlpReceiver {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let connections = Arc::new(AtomicU64::new(0));
        let (s, c) = (spans.clone(), connections.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let spans = s.clone();
                let service = hyper::service::service_fn(move |r: Request<Incoming>| {
                    let spans = spans.clone();
                    async move { Ok::<_, hyper::Error>(receive(r, &spans).await) }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        OtlpReceiver {
            addr,
            spans,
            connections,
            task,
        }
    }

    /// What `--otlp-endpoint` takes.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of `trace_id` once `done` holds for them (60 s at most).
    pub async fn trace_where(
        &self,
        trace_id: &[u8],
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + crate::common::WAIT;
        loop {
            let spans: Vec<Received> = self
                .spans()
                .into_iter()
                .filter(|s| s.span.trace_id == trace_id)
                .collect();
            if done(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the trace never completed; received: {:#?}",
                spans.iter().map(|s| s.name()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn receive(
    request: Request<Incoming>,
    spans: &Mutex<Vec<Received>>,
) -> Response<Full<Bytes>> {
    let ok = request.method() == hyper::Method::POST
        && request.uri().path() == "/v1/traces"
        && request
            .headers()
            .get("content-type")
            .is_some_and(|v| v == "application/x-protobuf");
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    let decoded = match (ok, body) {
        (true, Ok(body)) => ExportTraceServiceRequest::decode(body).ok(),
        _ => None,
    };
    let Some(export) = decoded else {
        return Response::builder()
            .status(400)
            .body(Full::new(Bytes::new()))
            .unwrap();
    };
    let mut got = spans.lock().unwrap();
    for resource in export.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                got.push(Received {
                    service: service.clone(),
                    span,
                });
            }
        }
    }
    Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::new()))
        .unwrap()
}
