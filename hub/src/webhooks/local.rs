//! The local backend's webhooks: registrations, the outbox and the last
//! attempts in the hub's SQLite file (`store.rs`), and the deliverer task
//! that drains the outbox (see the module docs of `webhooks`).

use std::{path::Path, sync::Arc, time::Duration};

use async_trait::async_trait;
use sandhub_client::Result;
use tokio::sync::Notify;

use super::{
    not_found, store, too_many, Delivery, DeliveryList, DeliveryOutcomes, Outbox, PutWebhook,
    Rules, WebhookArgs, WebhookInfo, WebhookList, WebhookRow, WebhookService, WebhookStore,
};
use crate::backend::now_ms;

/// Rows one deliverer pass takes.
const BATCH: usize = 64;

/// Registrations, the outbound rules and the deliverer of one hub.
pub struct Webhooks {
    store: WebhookStore,
    rules: Rules,
    wake: Arc<Notify>,
}

impl Webhooks {
    /// Opens the tables in the hub's SQLite file `db`; the returned
    /// [`Outbox`] is the event log's hook that fills the outbox.
    pub fn open(db: &Path, args: &WebhookArgs) -> anyhow::Result<(Arc<Webhooks>, Arc<Outbox>)> {
        let store = WebhookStore::open(db).map_err(|e| anyhow::anyhow!("{e}"))?;
        let wake = Arc::new(Notify::new());
        let hooks = Arc::new(Webhooks {
            store,
            rules: Rules::new(args)?,
            wake: wake.clone(),
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
        self.rules.add_own_address(addr);
    }

    /// Puts the operator's `--webhooks-file` (after [`Self::add_own_address`]).
    pub async fn load_operator_file(&self) -> anyhow::Result<()> {
        for w in self.rules.operator_file()? {
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

    /// Delivers until the process ends.
    pub fn spawn_deliverer(self: &Arc<Self>) {
        let hooks = self.clone();
        tokio::spawn(async move { hooks.deliver_loop().await });
    }

    async fn deliver_loop(self: Arc<Self>) {
        let lease = self.rules.args.webhook_timeout + Duration::from_secs(30);
        let limit = Arc::new(tokio::sync::Semaphore::new(
            self.rules.args.webhook_concurrency.max(1),
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
        let (record, verdict) = self
            .rules
            .attempt(Delivery {
                tenant: &row.tenant,
                name: &row.name,
                url: &hook.url,
                secret: &hook.secret,
                event_id: row.event_id,
                body: &row.body,
                attempt: row.attempts.saturating_add(1),
                created_at: row.created_at,
            })
            .await;
        let (done, retry_at) = match verdict {
            super::Verdict::RetryAt(at) => (false, at),
            _ => (true, 0),
        };
        if let Err(e) = self.store.settle(&row, &record, now_ms(), done, retry_at) {
            tracing::warn!(error = %e, "recording a webhook delivery");
        }
    }
}

#[async_trait]
impl WebhookService for Webhooks {
    /// Registers or replaces one; the URL's address is checked now too (a
    /// name that resolves nowhere yet is accepted, and checked at delivery).
    async fn put(&self, tenant: &str, name: &str, spec: PutWebhook) -> Result<WebhookInfo> {
        let checked = self.rules.check(name, spec).await?;
        let row = WebhookRow {
            tenant: tenant.to_string(),
            name: name.to_string(),
            url: checked.url,
            events: checked.events,
            secret: checked.secret,
            updated_at: now_ms(),
        };
        let max = self.rules.args.webhook_max_per_tenant;
        if !self.store.put(&row, max)? {
            return Err(too_many(max));
        }
        self.info(row)
    }

    async fn get(&self, tenant: &str, name: &str) -> Result<WebhookInfo> {
        let row = self
            .store
            .get(tenant, name)?
            .ok_or_else(|| not_found(name))?;
        self.info(row)
    }

    async fn list(&self, tenant: &str) -> Result<WebhookList> {
        Ok(WebhookList {
            webhooks: self
                .store
                .list(tenant)?
                .into_iter()
                .map(|r| self.info(r))
                .collect::<Result<_>>()?,
        })
    }

    async fn delete(&self, tenant: &str, name: &str) -> Result<()> {
        if self.store.delete(tenant, name)? {
            Ok(())
        } else {
            Err(not_found(name))
        }
    }

    async fn deliveries(&self, tenant: &str, name: &str) -> Result<DeliveryList> {
        self.store
            .get(tenant, name)?
            .ok_or_else(|| not_found(name))?;
        Ok(DeliveryList {
            deliveries: self.store.attempts(tenant, name)?,
        })
    }

    fn outcomes(&self) -> &DeliveryOutcomes {
        &self.rules.outcomes
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

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
        let got = hooks.get("alice", "ops").await.unwrap();
        assert_eq!(
            (got.url.as_str(), got.events.clone()),
            ("http://192.0.2.1/x", vec!["deleted".to_string()])
        );
        assert!(
            hooks.get("bob", "ops").await.is_err(),
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
