//! Middleware without `middleware::from_fn`'s per-request cost.
//!
//! `from_fn` boxes a clone of the whole inner service (the router and every
//! layer under it) for each request, so that its async fn can call it
//! later: about 3% of the hub's CPU per layer under the port proxy's load
//! (`perf`, docs/benchmarks.md). The hub's own layers decide before the
//! inner service runs and, at most, look at its answer after, so they need
//! no clone: a [`Plain`] middleware is called on the way in and on the way
//! out, and the inner service is called in between, in place.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use axum::{extract::Request, response::Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

/// A middleware in two synchronous halves.
pub trait Plain: Clone + Send + Sync + 'static {
    /// What the way in hands the way out.
    type Carry: Send + 'static;

    /// Whether the inner service gets `request` next.
    fn enter(&self, request: &mut Request) -> Entry<Self::Carry>;

    /// Sees (and may change) the inner service's answer; by default, leaves it.
    fn leave(_carry: Self::Carry, _response: &mut Response) {}
}

/// What the way in decided.
pub enum Entry<C> {
    /// The inner service gets the request next.
    Pass(C),
    /// This is the answer: the inner service never sees the request.
    Answer(Response),
}

/// Wraps a router (or a route, with `route_layer`) in `M`.
#[derive(Debug, Clone)]
pub struct PlainLayer<M>(pub M);

impl<S, M: Clone> Layer<S> for PlainLayer<M> {
    type Service = PlainService<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        PlainService {
            inner,
            middleware: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PlainService<S, M> {
    inner: S,
    middleware: M,
}

impl<S, M> Service<Request> for PlainService<S, M>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    M: Plain,
{
    type Response = Response;
    type Error = Infallible;
    type Future = PlainFuture<S::Future, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        match self.middleware.enter(&mut request) {
            Entry::Pass(carry) => PlainFuture::Inner {
                inner: self.inner.call(request),
                carry: Some(carry),
            },
            Entry::Answer(answer) => PlainFuture::Answered {
                answer: Some(answer),
            },
        }
    }
}

pin_project! {
    /// The inner service's answer, passed through [`Plain::leave`]; or the
    /// middleware's own.
    #[project = Projected]
    pub enum PlainFuture<F, M: Plain> {
        Inner { #[pin] inner: F, carry: Option<M::Carry> },
        Answered { answer: Option<Response> },
    }
}

impl<F, M> Future for PlainFuture<F, M>
where
    F: Future<Output = Result<Response, Infallible>>,
    M: Plain,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projected::Inner { inner, carry } => {
                let Ok(mut response) = std::task::ready!(inner.poll(cx));
                if let Some(carry) = carry.take() {
                    M::leave(carry, &mut response);
                }
                Poll::Ready(Ok(response))
            }
            Projected::Answered { answer } => Poll::Ready(Ok(answer
                .take()
                .expect("a PlainFuture is not polled after it is ready"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::{body::Body, http::StatusCode, routing::get, Router};
    use tower::ServiceExt;

    /// Refuses `/no`, counts the rest in a header on the way out.
    #[derive(Clone)]
    struct Tag;

    impl Plain for Tag {
        type Carry = String;

        fn enter(&self, request: &mut Request) -> Entry<String> {
            if request.uri().path() == "/no" {
                let mut refused = Response::new(Body::empty());
                *refused.status_mut() = StatusCode::FORBIDDEN;
                return Entry::Answer(refused);
            }
            request.extensions_mut().insert(7u32);
            Entry::Pass(request.uri().path().to_string())
        }

        fn leave(path: String, response: &mut Response) {
            response
                .headers_mut()
                .insert("x-seen", path.parse().expect("a path is a header value"));
        }
    }

    async fn call(app: Router, path: &str) -> Response {
        app.oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_way_in_can_answer_or_pass_and_the_way_out_sees_the_answer() {
        let app = Router::new()
            .route(
                "/yes",
                get(|axum::Extension(n): axum::Extension<u32>| async move { format!("{n}") }),
            )
            .route("/no", get(|| async { "never" }))
            .layer(PlainLayer(Tag));
        let passed = call(app.clone(), "/yes").await;
        assert_eq!(passed.status(), StatusCode::OK);
        assert_eq!(passed.headers()["x-seen"], "/yes");
        let body = axum::body::to_bytes(passed.into_body(), 64).await.unwrap();
        assert_eq!(&body[..], b"7", "what the way in set reached the handler");
        let refused = call(app, "/no").await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert!(refused.headers().get("x-seen").is_none());
    }
}
