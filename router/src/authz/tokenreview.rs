//! TokenReview: the API server says whether a Bearer token is valid. Answers
//! are cached (LRU, with a TTL) under the token's SHA-256, never the token.

use std::{
    num::NonZeroUsize,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::{api::PostParams, Api};
use lru::LruCache;
use sha2::{Digest, Sha256};

pub struct TokenReviewer {
    api: Api<TokenReview>,
    audiences: Vec<String>,
    ttl: Duration,
    cache: Mutex<LruCache<[u8; 32], (bool, Instant)>>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client, audiences: Vec<String>, ttl: Duration, size: usize) -> Self {
        let size = NonZeroUsize::new(size.max(1)).expect("at least 1");
        Self {
            api: Api::all(client),
            audiences: audiences.into_iter().filter(|a| !a.is_empty()).collect(),
            ttl,
            cache: Mutex::new(LruCache::new(size)),
        }
    }

    /// Whether the token authenticates; errors reaching the API server are errors.
    pub async fn authenticated(&self, token: &str) -> Result<bool, kube::Error> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(&(ok, at)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            if at.elapsed() < self.ttl {
                return Ok(ok);
            }
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..Default::default()
        };
        let answer = self.api.create(&PostParams::default(), &review).await?;
        let ok = answer
            .status
            .as_ref()
            .and_then(|s| s.authenticated)
            .unwrap_or(false);
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(key, (ok, Instant::now()));
        Ok(ok)
    }
}
