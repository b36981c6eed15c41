//! Signed webhooks: each tenant registers URLs (`PUT /v1/webhooks/{name}`)
//! that receive its lifecycle events as signed POSTs, at least once.
//!
//! # Layout
//!
//! ```text
//! mod.rs       WebhookArgs (the operator's flags), Webhooks: registrations (checked,
//!              bounded, secrets write-only), the operator's file, the deliverer
//! store.rs     the tables in the hub's SQLite file: registrations, the outbox (written
//!              in each event's own transaction), the last attempts
//! outbound.rs  where a delivery may go (the egress closed ranges) and the POST itself
//! sign.rs      Sandhub-Signature (Stripe's scheme)
//! ```
//!
//! Delivery: an event is stored with one outbox row per webhook that takes
//! its type, in one transaction, so a `kill -9` loses neither. The
//! deliverer leases due rows, POSTs each, and deletes a row on a 2xx; any
//! other outcome is recorded and retried with exponential backoff
//! (`--webhook-backoff` doubling up to `--webhook-max-backoff`) until
//! `--webhook-max-age` (24 h) has passed since the event. A row leased by a
//! hub that died is due again when its lease ends: at least once, never
//! lost. A receiver dedupes by `Sandhub-Event-Id`.

mod outbound;
mod sign;
mod store;

use std::{path::Path, path::PathBuf, sync::Arc, time::Duration};

use bytes::Bytes;
use clap::Args;
use sandhub_api::{error::Code, validate};
use sandhub_client::{Error, Result};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

pub use outbound::{Outbound, Unreachable};
pub use sign::{signature, EVENT_ID_HEADER, SIGNATURE_HEADER};
pub use store::{Attempt, Outbox, WebhookRow, WebhookStore};

use crate::{backend::now_ms, events::EventType};

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
    /// has them).
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
    /// Events waiting for delivery (retries included).
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
struct OperatorWebhook {
    tenant: String,
    name: String,
    url: String,
    #[serde(default)]
    events: Vec<String>,
    secret: String,
}

const MIN_SECRET: usize = 16;
const MAX_SECRET: usize = 256;
/// Rows one deliverer pass takes.
const BATCH: usize = 64;

fn invalid(msg: String) -> Error {
    Error::new(Code::InvalidArgument, msg)
}

/// Registrations, the outbound rules and the deliverer of one hub.
pub struct Webhooks {
    store: WebhookStore,
    outbound: Outbound,
    args: WebhookArgs,
    wake: Arc<Notify>,
    /// Attempts since the hub started, for `sandhub_webhook_deliveries_total`.
    pub outcomes: DeliveryOutcomes,
}

/// Delivery attempts by how they ended.
#[derive(Default)]
pub struct DeliveryOutcomes {
    /// The receiver answered 2xx.
    pub delivered: std::sync::atomic::AtomicU64,
    /// It failed and will be retried.
    pub retrying: std::sync::atomic::AtomicU64,
    /// It failed past `--webhook-max-age`: given up.
    pub gave_up: std::sync::atomic::AtomicU64,
}

impl Webhooks {
    /// Opens the tables in the hub's SQLite file `db`; the returned
    /// [`Outbox`] is the event log's hook that fills the outbox.
    pub fn open(db: &Path, args: &WebhookArgs) -> anyhow::Result<(Arc<Webhooks>, Arc<Outbox>)> {
        let store = WebhookStore::open(db).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut allow_private = Vec::new();
        for c in &args.webhook_allow_private {
            let (ip, len) = c
                .split_once('/')
                .and_then(|(ip, len)| Some((ip.parse().ok()?, len.parse().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--webhook-allow-private {c}: expected a CIDR"))?;
            allow_private.push((ip, len));
        }
        let wake = Arc::new(Notify::new());
        let hooks = Arc::new(Webhooks {
            store,
            outbound: Outbound::new(
                allow_private,
                args.webhook_allow_loopback,
                args.webhook_timeout,
            ),
            args: args.clone(),
            wake: wake.clone(),
            outcomes: DeliveryOutcomes::default(),
        });
        let outbox = Arc::new(Outbox {
            max_per_tenant: args.webhook_max_outbox_per_tenant,
            wake,
            wrote: Default::default(),
        });
        Ok((hooks, outbox))
    }

    /// The hub's own listen address: never a webhook's target.
    pub fn add_own_address(&self, addr: std::net::SocketAddr) {
        self.outbound.add_own(addr);
    }

    /// Puts the operator's `--webhooks-file` (after [`Self::add_own_address`]).
    pub async fn load_operator_file(&self) -> anyhow::Result<()> {
        let Some(path) = &self.args.webhooks_file else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--webhooks-file {}: {e}", path.display()))?;
        let list: Vec<OperatorWebhook> = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("--webhooks-file {}: {e}", path.display()))?;
        for w in list {
            let spec = PutWebhook {
                url: w.url,
                events: w.events,
                secret: w.secret,
            };
            self.put(&w.tenant, &w.name, spec).await.map_err(|e| {
                anyhow::anyhow!("--webhooks-file: webhook {} of {}: {e}", w.name, w.tenant)
            })?;
        }
        Ok(())
    }

    /// Registers or replaces one; the URL's address is checked now too (a
    /// name that resolves nowhere yet is accepted, and checked at delivery).
    pub async fn put(&self, tenant: &str, name: &str, spec: PutWebhook) -> Result<WebhookInfo> {
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
        let row = WebhookRow {
            tenant: tenant.to_string(),
            name: name.to_string(),
            url: spec.url,
            events,
            secret: spec.secret,
            updated_at: now_ms(),
        };
        if !self.store.put(&row, self.args.webhook_max_per_tenant)? {
            return Err(Error::new(
                Code::ResourceExhausted,
                format!(
                    "this tenant has {} webhooks, the most allowed; delete one first",
                    self.args.webhook_max_per_tenant
                ),
            ));
        }
        self.info(row)
    }

    fn info(&self, row: WebhookRow) -> Result<WebhookInfo> {
        let pending = self.store.pending(&row.tenant, &row.name)?;
        Ok(WebhookInfo {
            name: row.name,
            url: row.url,
            events: row.events,
            updated_at: crate::backend::rfc3339(row.updated_at),
            pending,
        })
    }

    fn not_found(name: &str) -> Error {
        Error::not_found(format!("webhook {name} not found"))
    }

    pub fn get(&self, tenant: &str, name: &str) -> Result<WebhookInfo> {
        let row = self
            .store
            .get(tenant, name)?
            .ok_or_else(|| Self::not_found(name))?;
        self.info(row)
    }

    pub fn list(&self, tenant: &str) -> Result<WebhookList> {
        Ok(WebhookList {
            webhooks: self
                .store
                .list(tenant)?
                .into_iter()
                .map(|r| self.info(r))
                .collect::<Result<_>>()?,
        })
    }

    pub fn delete(&self, tenant: &str, name: &str) -> Result<()> {
        if self.store.delete(tenant, name)? {
            Ok(())
        } else {
            Err(Self::not_found(name))
        }
    }

    pub fn deliveries(&self, tenant: &str, name: &str) -> Result<DeliveryList> {
        self.store
            .get(tenant, name)?
            .ok_or_else(|| Self::not_found(name))?;
        Ok(DeliveryList {
            deliveries: self.store.attempts(tenant, name)?,
        })
    }

    /// Delivers until the process ends.
    pub fn spawn_deliverer(self: &Arc<Self>) {
        let hooks = self.clone();
        tokio::spawn(async move { hooks.deliver_loop().await });
    }

    async fn deliver_loop(self: Arc<Self>) {
        let lease = self.args.webhook_timeout + Duration::from_secs(30);
        let limit = Arc::new(tokio::sync::Semaphore::new(
            self.args.webhook_concurrency.max(1),
        ));
        loop {
            let now = now_ms();
            let due = self
                .store
                .take_due(now, BATCH, now + lease.as_millis() as i64)
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "reading the webhook outbox");
                    Vec::new()
                });
            if due.is_empty() {
                let wait = match self.store.next_due() {
                    Ok(Some(at)) => Duration::from_millis((at - now).clamp(10, 1000) as u64),
                    _ => Duration::from_secs(1),
                };
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            for row in due {
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    return;
                };
                let hooks = self.clone();
                tokio::spawn(async move {
                    hooks.deliver(row).await;
                    drop(permit);
                });
            }
        }
    }

    async fn deliver(&self, row: store::OutboxRow) {
        let Ok(Some(hook)) = self.store.get(&row.tenant, &row.name) else {
            return; // deleted meanwhile: its rows went with it
        };
        let started = std::time::Instant::now();
        let t = crate::backend::now_s();
        let body = Bytes::from(row.body.clone());
        let headers = [
            (SIGNATURE_HEADER, signature(&hook.secret, t, &body)),
            (EVENT_ID_HEADER, row.event_id.to_string()),
        ];
        let outcome = self.outbound.post(&hook.url, &headers, body).await;
        let attempt = row.attempts.saturating_add(1);
        let (status, error) = match outcome {
            Ok(s) if (200..300).contains(&s) => (Some(s), None),
            Ok(s) => (Some(s), Some(format!("the receiver answered {s}"))),
            Err(e) => (None, Some(e)),
        };
        let now = now_ms();
        let delivered = error.is_none();
        let expired = now - row.created_at >= self.args.webhook_max_age.as_millis() as i64;
        let backoff = self
            .args
            .webhook_backoff
            .saturating_mul(1u32 << (attempt - 1).min(20))
            .min(self.args.webhook_max_backoff);
        let outcome = match (delivered, expired) {
            (true, _) => &self.outcomes.delivered,
            (false, false) => &self.outcomes.retrying,
            (false, true) => &self.outcomes.gave_up,
        };
        outcome.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(e) = &error {
            tracing::info!(tenant = %row.tenant, webhook = %row.name, event = row.event_id,
                attempt, error = %e, gave_up = expired, "webhook delivery failed");
        }
        let record = Attempt {
            event_id: row.event_id,
            attempt,
            time: crate::backend::rfc3339(now),
            status,
            error: match (&error, expired) {
                (Some(e), true) => Some(format!("{e}; given up after --webhook-max-age")),
                (e, _) => e.clone(),
            },
            duration_ms: started.elapsed().as_millis() as u64,
        };
        if let Err(e) = self.store.settle(
            &row,
            &record,
            now,
            delivered || expired,
            now + backoff.as_millis() as i64,
        ) {
            tracing::warn!(error = %e, "recording a webhook delivery");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(file: Option<PathBuf>) -> WebhookArgs {
        WebhookArgs {
            webhooks_file: file,
            ..WebhookArgs::default()
        }
    }

    #[tokio::test]
    async fn the_operator_file_puts_webhooks_and_refuses_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hooks.json");
        std::fs::write(
            &file,
            r#"[{"tenant": "alice", "name": "ops", "url": "http://192.0.2.1/x",
                 "events": ["deleted"], "secret": "0123456789abcdef"}]"#,
        )
        .unwrap();
        let (hooks, _) = Webhooks::open(&dir.path().join("db"), &args(Some(file.clone()))).unwrap();
        hooks.load_operator_file().await.unwrap();
        let got = hooks.get("alice", "ops").unwrap();
        assert_eq!(
            (got.url.as_str(), got.events.clone()),
            ("http://192.0.2.1/x", vec!["deleted".to_string()])
        );
        assert!(
            hooks.get("bob", "ops").is_err(),
            "another tenant's name is not found"
        );
        for bad in [
            r#"[{"tenant": "a", "name": "n", "url": "http://192.0.2.1/", "secret": "0123456789abcdef", "colour": 1}]"#,
            r#"[{"tenant": "a", "name": "n", "url": "http://169.254.169.254/", "secret": "0123456789abcdef"}]"#,
        ] {
            std::fs::write(&file, bad).unwrap();
            assert!(hooks.load_operator_file().await.is_err(), "{bad}");
        }
    }
}
