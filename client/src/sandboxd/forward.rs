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
}
