//! `--kube-api-qps` / `--kube-api-burst`: a client-side token bucket in
//! front of every API request, as client-go's rate limiter.
//!
//! Upstream's default is unlimited (-1): on a claim burst the API server's
//! own fairness is the better judge. The limit is for shared clusters whose
//! operators want the controller to stay under a fixed request rate.
//!
//! The layer sits under kube's `Buffer`, whose worker asks `poll_ready`
//! before each call, so a request without a token waits there and the ones
//! behind it queue in the buffer.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Tokens refill at `rate` per second up to `burst`.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    stamp: Instant,
}

impl Bucket {
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        Self::with_capacity(rate, f64::from(burst.max(1)), now)
    }

    /// A full bucket holding at most `burst` tokens (fractional allowed).
    pub fn with_capacity(rate: f64, burst: f64, now: Instant) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            stamp: now,
        }
    }

    /// Takes a token, or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        match self.take_up_to(1, now) {
            (1, _) => Ok(()),
            (_, wait) => Err(wait.unwrap_or_default()),
        }
    }

    /// Takes as many of `want` tokens as there are; when short, also says
    /// how long until the next one.
    pub fn take_up_to(&mut self, want: usize, now: Instant) -> (usize, Option<Duration>) {
        let elapsed = now.saturating_duration_since(self.stamp).as_secs_f64();
        self.stamp = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        let n = (self.tokens.floor() as usize).min(want);
        self.tokens -= n as f64;
        if n == want {
            return (n, None);
        }
        let next = Duration::from_secs_f64((1.0 - self.tokens) / self.rate);
        (n, Some(next))
    }
}

/// The layer; `None` from [`QpsLayer::from_flags`] means unlimited.
#[derive(Debug, Clone)]
pub struct QpsLayer {
    rate: f64,
    burst: u32,
}

impl QpsLayer {
    /// A limit for `qps > 0`; zero, negative or non-finite values mean none.
    pub fn from_flags(qps: f64, burst: u32) -> Option<Self> {
        (qps.is_finite() && qps > 0.0).then_some(Self { rate: qps, burst })
    }
}

impl<S> Layer<S> for QpsLayer {
    type Service = Qps<S>;
    fn layer(&self, inner: S) -> Qps<S> {
        Qps {
            inner,
            bucket: Bucket::new(self.rate, self.burst, Instant::now()),
            holding: false,
            sleep: None,
        }
    }
}

pub struct Qps<S> {
    inner: S,
    bucket: Bucket,
    /// A token taken for the next call.
    holding: bool,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S, Req> Service<Req> for Qps<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.holding {
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.bucket.take(Instant::now()) {
                Ok(()) => self.holding = true,
                Err(wait) => {
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.holding = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let t = Instant::now();
        let mut b = Bucket::new(10.0, 3, t);
        for _ in 0..3 {
            assert!(b.take(t).is_ok());
        }
        let wait = b.take(t).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert!(b.take(t + Duration::from_millis(100)).is_ok());
        // Idle time refills only up to the burst.
        let later = t + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(b.take(later).is_ok());
        }
        assert!(b.take(later).is_err());
    }

    #[test]
    fn only_positive_rates_limit() {
        assert!(QpsLayer::from_flags(-1.0, 10).is_none());
        assert!(QpsLayer::from_flags(0.0, 10).is_none());
        assert!(QpsLayer::from_flags(f64::NAN, 10).is_none());
        assert!(QpsLayer::from_flags(5.0, 10).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn calls_beyond_the_burst_wait_for_tokens() {
        let layer = QpsLayer::from_flags(20.0, 2).unwrap();
        let mut svc = layer.layer(tower::service_fn(|_: ()| async { Ok::<_, ()>(()) }));
        let start = Instant::now();
        for _ in 0..6 {
            svc.ready().await.unwrap().call(()).await.unwrap();
        }
        // 2 at once, then 4 more at 20/s.
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(199) && took < Duration::from_millis(260),
            "{took:?}"
        );
    }
}
