//! Signed webhooks: each tenant registers URLs (`PUT /v1/webhooks/{name}`)
//! that receive its lifecycle events as signed POSTs, at least once.
//!
//! # Layout
//!
//! ```text
//! mod.rs       WebhookArgs (the operator's flags), the API's shapes, Rules: what both
//!              backends share (a registration checked, the operator's file, one
//!              delivery attempt and its verdict), WebhookService: the seam /v1/webhooks
//!              calls, implemented here (local) and in kube/webhooks/
//! local.rs     the local backend's Webhooks: registrations, outbox and deliverer over
//!              store.rs
//! store.rs     the tables in the hub's SQLite file: registrations, the outbox (written
//!              in each event's own transaction), the last attempts
//! outbound.rs  where a delivery may go (the egress closed ranges) and the POST itself
//! sign.rs      Sandhub-Signature (Stripe's scheme)
//! ```
//!
//! Local delivery: an event is stored with one outbox row per webhook that
//! takes its type, in one transaction, so a `kill -9` loses neither. The
//! deliverer leases due rows, POSTs each, and deletes a row on a 2xx; any
//! other outcome is recorded and retried with exponential backoff
//! (`--webhook-backoff` doubling up to `--webhook-max-backoff`) until
//! `--webhook-max-age` (24 h) has passed since the event. A row leased by a
//! hub that died is due again when its lease ends: at least once, never
//! lost. A receiver dedupes by `Sandhub-Event-Id`. On Kubernetes the same
//! rules and attempts run from a per-webhook cursor (kube/webhooks/).

mod local;
mod outbound;
mod sign;
mod store;

use std::{path::PathBuf, sync::atomic::AtomicU64, sync::atomic::Ordering, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use clap::Args;
use sandhub_api::{error::Code, validate};
use sandhub_client::{Error, Result};
use serde::{Deserialize, Serialize};

pub use local::Webhooks;
pub use outbound::{Outbound, Unreachable};
pub use sign::{signature, EVENT_ID_HEADER, SIGNATURE_HEADER};
pub use store::{Attempt, Outbox, WebhookRow, WebhookStore, KEPT_ATTEMPTS};

use crate::events::EventType;

/// The operator's webhook flags.
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// Webhooks set at start: a JSON file, a list of `{tenant, name, url,
    /// events, secret}` (as `PUT /v1/webhooks/{name}` takes them, plus the
    /// tenant); put (replacing any of the same name) each time the hub starts.
    #[arg(long, env = "SANDHUB_WEBHOOKS_FILE")]
    pub webhooks_file: Option<PathBuf>,

    /// Private ranges (CIDRs, comma-separated) webhook URLs may reach;
    /// closed by default, like sandbox egress.
    #[arg(long, env = "SANDHUB_WEBHOOK_ALLOW_PRIVATE", value_delimiter = ',')]
    pub webhook_allow_private: Vec<String>,

    /// Lets webhook URLs reach loopback (127.0.0.0/8, ::1), for a receiver
    /// on this machine (tests, a local relay). The hub's own listener stays
    /// refused.
    #[arg(long, env = "SANDHUB_WEBHOOK_ALLOW_LOOPBACK")]
    pub webhook_allow_loopback: bool,

    /// Most webhooks one tenant may register.
    #[arg(long, env = "SANDHUB_WEBHOOK_MAX_PER_TENANT", default_value_t = 16)]
    pub webhook_max_per_tenant: usize,

    /// Most deliveries one tenant may have waiting (all its webhooks);
    /// events past it are not queued for its webhooks (the stream still
    /// has them). Local backend; on kubernetes the event ring bounds them.
    #[arg(
        long,
        env = "SANDHUB_WEBHOOK_MAX_OUTBOX_PER_TENANT",
        default_value_t = 10_000
    )]
    pub webhook_max_outbox_per_tenant: u64,

    /// How long one delivery (connect, send, answer) may take.
    #[arg(long, env = "SANDHUB_WEBHOOK_TIMEOUT", default_value = "10s", value_parser = sandhub_common::parse_duration)]
    pub webhook_timeout: Duration,

    /// The first retry's delay; each next one doubles it.
    #[arg(long, env = "SANDHUB_WEBHOOK_BACKOFF", default_value = "10s", value_parser = sandhub_common::parse_duration)]
    pub webhook_backoff: Duration,

    /// The longest delay between two attempts.
    #[arg(long, env = "SANDHUB_WEBHOOK_MAX_BACKOFF", default_value = "1h", value_parser = sandhub_common::parse_duration)]
    pub webhook_max_backoff: Duration,

    /// How long an event is retried before it is given up.
    #[arg(long, env = "SANDHUB_WEBHOOK_MAX_AGE", default_value = "24h", value_parser = sandhub_common::parse_duration)]
    pub webhook_max_age: Duration,

    /// Deliveries in flight at once (all tenants).
    #[arg(long, env = "SANDHUB_WEBHOOK_CONCURRENCY", default_value_t = 16)]
    pub webhook_concurrency: usize,

    /// Kubernetes backend: how long the replica that delivers webhooks
    /// holds its Lease without renewing it; another replica takes over
    /// this long after the holder stopped (renewed every third of it).
    #[arg(long, env = "SANDHUB_WEBHOOK_LEASE_DURATION", default_value = "15s", value_parser = sandhub_common::parse_duration)]
    pub webhook_lease_duration: Duration,
}

impl Default for WebhookArgs {
    fn default() -> Self {
        WebhookArgs {
            webhooks_file: None,
            webhook_allow_private: Vec::new(),
            webhook_allow_loopback: false,
            webhook_max_per_tenant: 16,
            webhook_max_outbox_per_tenant: 10_000,
            webhook_timeout: Duration::from_secs(10),
            webhook_backoff: Duration::from_secs(10),
            webhook_max_backoff: Duration::from_secs(3600),
            webhook_max_age: Duration::from_secs(24 * 3600),
            webhook_concurrency: 16,
            webhook_lease_duration: Duration::from_secs(15),
        }
    }
}

/// `PUT /v1/webhooks/{name}`'s body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutWebhook {
    /// `http://` or `https://`; it must not reach loopback, link-local,
    /// private or the hub's own addresses (unless the operator opened them).
    pub url: String,
    /// Event types to send (`created`, `deleted`, ...); empty or absent:
    /// every type.
    #[serde(default)]
    pub events: Vec<String>,
    /// The HMAC key of `Sandhub-Signature`, 16 to 256 bytes. Write-only:
    /// never returned.
    pub secret: String,
}

/// A webhook as the API shows it: never its secret.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WebhookInfo {
    pub name: String,
    pub url: String,
    /// Empty: every type.
    pub events: Vec<String>,
    pub updated_at: String,
    /// Events waiting for delivery (retries included). On Kubernetes: the
    /// events after the webhook's cursor that the answering replica holds.
    pub pending: u64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookInfo>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DeliveryList {
    /// Newest first; the last 100 attempts.
    pub deliveries: Vec<Attempt>,
}

/// One entry of `--webhooks-file`: [`PutWebhook`]'s fields and the tenant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorWebhook {
    pub tenant: String,
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub events: Vec<String>,
    pub secret: String,
}

const MIN_SECRET: usize = 16;
const MAX_SECRET: usize = 256;
/// The longest error an attempt records (a receiver's or resolver's words).
const MAX_ERROR_CHARS: usize = 300;

fn invalid(msg: String) -> Error {
    Error::new(Code::InvalidArgument, msg)
}

pub(crate) fn not_found(name: &str) -> Error {
    Error::not_found(format!("webhook {name} not found"))
}

pub(crate) fn too_many(max: usize) -> Error {
    Error::new(
        Code::ResourceExhausted,
        format!("this tenant has {max} webhooks, the most allowed; delete one first"),
    )
}

/// `/v1/webhooks` over one backend: the local one (`local.rs`) or
/// Kubernetes (`kube/webhooks/`). Both check with the same [`Rules`].
#[async_trait]
pub trait WebhookService: Send + Sync + 'static {
    /// Registers or replaces `tenant`'s webhook `name`.
    async fn put(&self, tenant: &str, name: &str, spec: PutWebhook) -> Result<WebhookInfo>;
    async fn get(&self, tenant: &str, name: &str) -> Result<WebhookInfo>;
    async fn list(&self, tenant: &str) -> Result<WebhookList>;
    /// Deletes it, with what it was still owed and its attempts.
    async fn delete(&self, tenant: &str, name: &str) -> Result<()>;
    /// Its last attempts, newest first.
    async fn deliveries(&self, tenant: &str, name: &str) -> Result<DeliveryList>;
    /// Attempts by outcome since this process started (`/metrics`).
    fn outcomes(&self) -> &DeliveryOutcomes;
}

/// Delivery attempts by how they ended.
#[derive(Default)]
pub struct DeliveryOutcomes {
    /// The receiver answered 2xx.
    pub delivered: AtomicU64,
    /// It failed and will be retried.
    pub retrying: AtomicU64,
    /// It failed past `--webhook-max-age`: given up.
    pub gave_up: AtomicU64,
}

/// A registration that passed every check: its URL and its event types
/// (canonical, without repeats; empty: every type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub url: String,
    pub events: Vec<String>,
    pub secret: String,
}

/// How an attempt settles its event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The receiver answered 2xx: done.
    Delivered,
    /// It failed; try again at this Unix time (ms).
    RetryAt(i64),
    /// It failed, and the event is older than `--webhook-max-age`: done.
    GaveUp,
}

impl Verdict {
    /// Whether the event is settled (nothing more is tried for it).
    pub fn done(self) -> bool {
        !matches!(self, Verdict::RetryAt(_))
    }
}

/// The verdict on attempt number `attempt` (1 for the first) of an event
/// made at `created_at` (Unix ms), ending at `now`: the backoff doubles from
/// `--webhook-backoff` up to `--webhook-max-backoff`, until the event is
/// `--webhook-max-age` old.
pub fn verdict(
    args: &WebhookArgs,
    delivered: bool,
    attempt: u32,
    created_at: i64,
    now: i64,
) -> Verdict {
    if delivered {
        return Verdict::Delivered;
    }
    if now.saturating_sub(created_at) >= args.webhook_max_age.as_millis() as i64 {
        return Verdict::GaveUp;
    }
    let backoff = args
        .webhook_backoff
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
        .min(args.webhook_max_backoff);
    Verdict::RetryAt(now.saturating_add(backoff.as_millis() as i64))
}

/// What both backends share: the checks of a registration, the outbound
/// rules, one attempt, and the counters of attempts.
pub struct Rules {
    outbound: Outbound,
    pub args: WebhookArgs,
    pub outcomes: DeliveryOutcomes,
}

impl Rules {
    pub fn new(args: &WebhookArgs) -> anyhow::Result<Rules> {
        let mut allow_private = Vec::new();
        for c in &args.webhook_allow_private {
            let (ip, len) = c
                .split_once('/')
                .and_then(|(ip, len)| Some((ip.parse().ok()?, len.parse().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--webhook-allow-private {c}: expected a CIDR"))?;
            allow_private.push((ip, len));
        }
        Ok(Rules {
            outbound: Outbound::new(
                allow_private,
                args.webhook_allow_loopback,
                args.webhook_timeout,
            ),
            args: args.clone(),
            outcomes: DeliveryOutcomes::default(),
        })
    }

    /// The hub's own listen address: never a webhook's target.
    pub fn add_own_address(&self, addr: std::net::SocketAddr) {
        self.outbound.add_own(addr);
    }

    /// The operator's `--webhooks-file`, parsed (each entry is then put
    /// through the backend's [`WebhookService::put`]).
    pub fn operator_file(&self) -> anyhow::Result<Vec<OperatorWebhook>> {
        let Some(path) = &self.args.webhooks_file else {
            return Ok(Vec::new());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--webhooks-file {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("--webhooks-file {}: {e}", path.display()))
    }

    /// Checks `PUT /v1/webhooks/{name}`: the name, the URL (parsed, then
    /// its address: a name that resolves nowhere yet is accepted, and
    /// checked at delivery), the event types and the secret's length.
    pub async fn check(&self, name: &str, spec: PutWebhook) -> Result<Checked> {
        validate::name("webhook", name)?;
        let target = outbound::parse(&spec.url).map_err(|e| invalid(format!("url: {e}")))?;
        let mut events = Vec::new();
        for t in &spec.events {
            let kind = EventType::parse(t).ok_or_else(|| {
                invalid(format!(
                    "events: unknown event type `{t}`; one of: {}",
                    EventType::names()
                ))
            })?;
            if !events.contains(&kind.as_str().to_string()) {
                events.push(kind.as_str().to_string());
            }
        }
        if !(MIN_SECRET..=MAX_SECRET).contains(&spec.secret.len()) {
            return Err(invalid(format!(
                "secret: must be {MIN_SECRET} to {MAX_SECRET} bytes"
            )));
        }
        // Last: only a request valid in every other way resolves a name.
        if let Err(Unreachable::Refused(e)) = self.outbound.resolve(&target).await {
            return Err(Error::new(
                Code::PermissionDenied,
                format!("url: {e} (webhooks obey the egress closed ranges)"),
            ));
        }
        Ok(Checked {
            url: spec.url,
            events,
            secret: spec.secret,
        })
    }

    /// One delivery of event `event_id` (`body`, its JSON) to `url`, signed
    /// with `secret`: attempt number `attempt`, of an event made at
    /// `created_at` (Unix ms). Counted, logged on failure (never the
    /// secret), and judged.
    pub async fn attempt(&self, to: Delivery<'_>) -> (Attempt, Verdict) {
        let started = std::time::Instant::now();
        let t = crate::backend::now_s();
        let body = Bytes::from(to.body.to_string());
        let headers = [
            (SIGNATURE_HEADER, signature(to.secret, t, &body)),
            (EVENT_ID_HEADER, to.event_id.to_string()),
        ];
        let (status, error) = match self.outbound.post(to.url, &headers, body).await {
            Ok(s) if (200..300).contains(&s) => (Some(s), None),
            Ok(s) => (Some(s), Some(format!("the receiver answered {s}"))),
            Err(e) => (None, Some(e)),
        };
        let now = crate::backend::now_ms();
        let verdict = verdict(&self.args, error.is_none(), to.attempt, to.created_at, now);
        let counter = match verdict {
            Verdict::Delivered => &self.outcomes.delivered,
            Verdict::RetryAt(_) => &self.outcomes.retrying,
            Verdict::GaveUp => &self.outcomes.gave_up,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = &error {
            tracing::info!(tenant = %to.tenant, webhook = %to.name, event = to.event_id,
                attempt = to.attempt, error = %e, gave_up = verdict == Verdict::GaveUp,
                "webhook delivery failed");
        }
        let error = error.map(|e| {
            let e: String = e.chars().take(MAX_ERROR_CHARS).collect();
            if verdict == Verdict::GaveUp {
                format!("{e}; given up after --webhook-max-age")
            } else {
                e
            }
        });
        let record = Attempt {
            event_id: to.event_id,
            attempt: to.attempt,
            time: crate::backend::rfc3339(now),
            status,
            error,
            duration_ms: started.elapsed().as_millis() as u64,
        };
        (record, verdict)
    }
}

/// One delivery to make ([`Rules::attempt`]).
pub struct Delivery<'a> {
    /// For the log line only.
    pub tenant: &'a str,
    pub name: &'a str,
    pub url: &'a str,
    pub secret: &'a str,
    pub event_id: u64,
    pub body: &'a str,
    /// 1 for the first try.
    pub attempt: u32,
    /// When the event happened (Unix ms): `--webhook-max-age` counts from it.
    pub created_at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_cap_and_stops_at_the_max_age() {
        let args = WebhookArgs {
            webhook_backoff: Duration::from_secs(10),
            webhook_max_backoff: Duration::from_secs(35),
            webhook_max_age: Duration::from_secs(3600),
            ..WebhookArgs::default()
        };
        let t0 = 1_000_000;
        assert_eq!(verdict(&args, true, 9, 0, t0), Verdict::Delivered);
        assert_eq!(
            verdict(&args, false, 1, t0, t0),
            Verdict::RetryAt(t0 + 10_000)
        );
        assert_eq!(
            verdict(&args, false, 2, t0, t0),
            Verdict::RetryAt(t0 + 20_000)
        );
        assert_eq!(
            verdict(&args, false, 3, t0, t0),
            Verdict::RetryAt(t0 + 35_000)
        );
        assert_eq!(
            verdict(&args, false, 60, t0, t0),
            Verdict::RetryAt(t0 + 35_000)
        );
        let late = t0 + 3_600_000;
        assert_eq!(verdict(&args, false, 4, t0, late), Verdict::GaveUp);
        assert!(Verdict::GaveUp.done() && Verdict::Delivered.done());
        assert!(!Verdict::RetryAt(1).done());
    }
}
