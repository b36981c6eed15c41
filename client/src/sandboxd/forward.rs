//! Raw passthrough to sandboxd's REST API, for a proxy (the hub's files
//! routes) that must keep every sandboxd semantic: ranges, conditional
//! requests, listings, and error bodies as sandboxd wrote them.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::{transport_error, SandboxdClient};
use crate::{Error, Result};

impl SandboxdClient {
    /// Sends one request as given and returns sandboxd's response whatever
    /// its status. Only transport failures are errors.
    pub async fn forward<B>(
        &self,
        method: Method,
        path_and_query: &str,
        headers: HeaderMap,
        body: B,
    ) -> Result<Response<Incoming>>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: std::fmt::Display,
    {
        let body = body
            .map_err(|e| Error::invalid(format!("reading the request body: {e}")))
            .boxed_unsync();
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.rest_base, path_and_query));
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        for (name, value) in self.rest_headers.iter() {
            request = request.header(name, value);
        }
        let request = request
            .body(body)
            .map_err(|e| Error::invalid(format!("building request {path_and_query}: {e}")))?;
        self.http.request(request).await.map_err(transport_error)
    }

    /// GETs `route` and decodes its JSON body as `T`; None on a transport
    /// failure, a non-2xx answer, a body over `max_bytes`, JSON that is not
    /// a `T`, or no whole answer within `timeout`. For Sandhub's extension
    /// routes, whose answers come from inside the sandbox: they are heard
    /// only while sane, and never become an error of the caller's request.
    pub async fn get_json_bounded<T: serde::de::DeserializeOwned>(
        &self,
        route: &str,
        max_bytes: usize,
        timeout: std::time::Duration,
    ) -> Option<T> {
        let call = async {
            let response = self
                .forward(
                    Method::GET,
                    route,
                    HeaderMap::new(),
                    http_body_util::Empty::<Bytes>::new(),
                )
                .await
                .ok()?;
            if !response.status().is_success() {
                return None;
            }
            let body = http_body_util::Limited::new(response.into_body(), max_bytes)
                .collect()
                .await
                .ok()?
                .to_bytes();
            serde_json::from_slice::<T>(&body).ok()
        };
        tokio::time::timeout(timeout, call).await.ok().flatten()
    }
}
