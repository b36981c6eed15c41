//! Signed webhooks on Kubernetes: the same API, checks, signing and
//! outbound rules as the local backend (`crate::webhooks::Rules`), with no
//! state in any replica.
//!
//! # Layout
//!
//! ```text
//! mod.rs       KubeWebhooks: /v1/webhooks over the objects (any replica serves any call)
//! record.rs    the objects, as data: a Secret per tenant (registrations, secrets
//!              included), a state ConfigMap per webhook (identity, progress), bounds
//! progress.rs  one webhook's cursor, head retry and last attempts (pure)
//! lease.rs     who delivers: the holder of a coordination.k8s.io Lease (pure
//!              decision, and its loop)
//! deliver.rs   the holder's deliverer: the registrations it finds, a task per
//!              webhook reading this replica's event ring from the cursor
//! ```
//!
//! **Why this shape.** Every replica derives the same events under the
//! same ids (kube/events.rs), so one of them can deliver from its own ring
//! and, after it dies, another continues from the last id it settled: a
//! durable cursor per webhook is all the state deliveries need. The Lease
//! makes that one replica; the cursor in a ConfigMap makes a `kill -9` of
//! it lose nothing the next holder's ring still has (at least once: what
//! the dead holder sent after its last write of the cursor is sent again).

mod deliver;
mod lease;
mod progress;
mod record;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    Api,
};
use sandhub_api::error::Code;
use sandhub_client::{Error, Result};

use self::{
    progress::Progress,
    record::{Identity, Registration, Registrations},
};
use super::{model::tenant_label_value, tenant::kube_error, TENANT_LABEL};
use crate::{
    backend::{now_ms, rfc3339},
    events::{EventLog, EventType},
    webhooks::{
        DeliveryList, DeliveryOutcomes, PutWebhook, Rules, WebhookArgs, WebhookInfo, WebhookList,
        WebhookService,
    },
};

/// Conflicting writes retried before giving up with UNAVAILABLE.
const WRITE_ATTEMPTS: usize = 5;
/// Events counted for a webhook's `pending`, at most.
const PENDING_SCAN: usize = 10_000;

/// `/v1/webhooks` on Kubernetes, and (once spawned) this replica's bid to
/// deliver them.
pub struct KubeWebhooks {
    secrets: Api<Secret>,
    states: Api<ConfigMap>,
    leases: Api<k8s_openapi::api::coordination::v1::Lease>,
    log: Arc<EventLog>,
    rules: Arc<Rules>,
    /// This replica's bid for the Lease, once spawned.
    elector: Mutex<Option<Arc<Mutex<lease::Elector>>>>,
}

fn corrupt(what: &str) -> Error {
    Error::internal(format!(
        "the tenant's webhooks object is unreadable ({what})"
    ))
}

/// Whether a webhook that takes `events` (empty: all) takes `kind`.
fn takes(events: &[String], kind: EventType) -> bool {
    events.is_empty() || events.iter().any(|t| t == kind.as_str())
}

impl KubeWebhooks {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        log: Arc<EventLog>,
        args: &WebhookArgs,
    ) -> anyhow::Result<KubeWebhooks> {
        Ok(KubeWebhooks {
            secrets: Api::namespaced(client.clone(), namespace),
            states: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client, namespace),
            log,
            rules: Arc::new(Rules::new(args)?),
            elector: Mutex::new(None),
        })
    }

    /// The hub's own listen address: never a webhook's target.
    pub fn add_own_address(&self, addr: std::net::SocketAddr) {
        self.rules.add_own_address(addr);
    }

    /// Puts the operator's `--webhooks-file` (every replica does, at its
    /// start: a replace keeps each webhook's identity and cursor).
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

    /// Starts this replica's bid for the Lease, and the deliverer that
    /// works while it holds it.
    pub fn spawn(&self) {
        let host = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "sandhub".into());
        let me = format!("{host}_{:016x}", rand::random::<u64>());
        let elector = Arc::new(Mutex::new(lease::Elector::new(
            me,
            self.rules.args.webhook_lease_duration,
        )));
        tokio::spawn(lease::run(
            self.leases.clone(),
            record::LEASE_NAME.to_string(),
            elector.clone(),
        ));
        *self.elector.lock().unwrap_or_else(|p| p.into_inner()) = Some(elector.clone());
        let deliverer = deliver::Deliverer {
            secrets: self.secrets.clone(),
            states: self.states.clone(),
            log: self.log.clone(),
            rules: self.rules.clone(),
            elector,
            limit: tokio::sync::Semaphore::new(self.rules.args.webhook_concurrency.max(1)),
        };
        tokio::spawn(deliverer.run());
    }

    /// For a stopping replica: stops its deliveries and frees the Lease if
    /// it holds it, so another replica takes over at its next look (a
    /// few seconds) rather than after `--webhook-lease-duration`.
    pub async fn release(&self) {
        let Some(elector) = self
            .elector
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return;
        };
        let me = {
            let mut e = elector.lock().unwrap_or_else(|p| p.into_inner());
            e.resign();
            e.me.clone()
        };
        match lease::release(&self.leases, record::LEASE_NAME, &me).await {
            Ok(true) => tracing::info!("webhook delivery Lease released"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "releasing the webhook delivery Lease"),
        }
    }

    /// The tenant's registrations (none: an empty set), and the Secret's
    /// resourceVersion.
    async fn registrations(&self, tenant: &str) -> Result<(Registrations, Option<Secret>)> {
        let key = tenant_label_value(tenant);
        let secret = self
            .secrets
            .get_opt(&record::secret_name(&key))
            .await
            .map_err(|e| kube_error("reading the tenant's webhooks", e))?;
        let regs = match &secret {
            None => Registrations {
                tenant: tenant.to_string(),
                ..Default::default()
            },
            Some(s) => {
                let regs = Registrations::of(s).ok_or_else(|| corrupt("it does not parse"))?;
                if regs.tenant != tenant {
                    return Err(corrupt("it names another tenant"));
                }
                regs
            }
        };
        Ok((regs, secret))
    }

    /// Reads, changes with `edit`, writes at the version read; again on a
    /// conflict. `edit` answers what the call answers, or an error.
    async fn edit<T>(
        &self,
        tenant: &str,
        create: bool,
        mut edit: impl FnMut(&mut Registrations) -> Result<T>,
    ) -> Result<T> {
        let key = tenant_label_value(tenant);
        for _ in 0..WRITE_ATTEMPTS {
            let (mut regs, secret) = self.registrations(tenant).await?;
            let out = edit(&mut regs)?;
            let written = match &secret {
                Some(s) => {
                    let patch =
                        record::registrations_patch(s.metadata.resource_version.as_deref(), &regs);
                    self.secrets
                        .patch(
                            &record::secret_name(&key),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                        .map(|_| ())
                }
                None if create => {
                    let mut s = record::new_secret(tenant, &key);
                    s.data.get_or_insert_with(Default::default).insert(
                        record::REGISTRATIONS_KEY.to_string(),
                        k8s_openapi::ByteString(regs.to_bytes()),
                    );
                    self.secrets
                        .create(&PostParams::default(), &s)
                        .await
                        .map(|_| ())
                }
                None => return Ok(out),
            };
            match written {
                Ok(()) => return Ok(out),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(kube_error("writing the tenant's webhooks", e)),
            }
        }
        Err(Error::new(
            Code::Unavailable,
            "the tenant's webhooks changed under every attempt; try again",
        ))
    }

    /// The cluster's revision now: every write after this call has a
    /// higher resourceVersion, so its events have higher ids.
    async fn revision(&self) -> Result<u64> {
        let list = self
            .states
            .list_metadata(&ListParams::default().limit(1))
            .await
            .map_err(|e| kube_error("reading the cluster's revision", e))?;
        list.metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .ok_or_else(|| Error::unavailable("the Kubernetes API gave no revision"))
    }

    /// The webhook's stored progress, if it is registration `uid`'s.
    async fn progress(&self, key: &str, name: &str, uid: &str) -> Result<Option<Progress>> {
        let cm = self
            .states
            .get_opt(&record::state_name(key, name))
            .await
            .map_err(|e| kube_error("reading the webhook's deliveries", e))?;
        Ok(cm.as_ref().and_then(|cm| deliver::stored_progress(cm, uid)))
    }

    fn info(&self, key: &str, name: &str, r: &Registration, p: Option<&Progress>) -> WebhookInfo {
        let fresh;
        let p = match p {
            Some(p) => p,
            None => {
                fresh = Progress::fresh(&r.uid, r.after);
                &fresh
            }
        };
        let events = self
            .log
            .after(key, p.cursor, PENDING_SCAN)
            .unwrap_or_default();
        let pending = p.pending(&events, |e| takes(&r.events, e.kind));
        WebhookInfo {
            name: name.to_string(),
            url: r.url.clone(),
            events: r.events.clone(),
            updated_at: rfc3339(r.updated_at),
            pending,
        }
    }
}

#[async_trait]
impl WebhookService for KubeWebhooks {
    async fn put(&self, tenant: &str, name: &str, spec: PutWebhook) -> Result<WebhookInfo> {
        let checked = self.rules.check(name, spec).await?;
        let key = tenant_label_value(tenant);
        // Read before the write: events of writes up to now are older
        // than the webhook (those racing with this call may be sent).
        let after = self.revision().await?.saturating_mul(16).saturating_add(15);
        let fresh = Registration {
            uid: format!("{:016x}", rand::random::<u64>()),
            url: checked.url,
            events: checked.events,
            secret: checked.secret,
            updated_at: now_ms(),
            after,
        };
        let max = self.rules.args.webhook_max_per_tenant;
        let stored = self
            .edit(tenant, true, |regs| {
                if regs.put(name, fresh.clone(), max) {
                    Ok(regs.hooks[name].clone())
                } else if regs.hooks.len() >= max && !regs.hooks.contains_key(name) {
                    Err(crate::webhooks::too_many(max))
                } else {
                    Err(Error::new(
                        Code::ResourceExhausted,
                        format!(
                            "this tenant's webhooks would take more than {} KiB; delete one first",
                            record::MAX_REGISTRATIONS_BYTES / 1024
                        ),
                    ))
                }
            })
            .await?;
        // The state object the holder finds it by (and keeps its cursor in).
        let id = Identity {
            tenant_key: key.clone(),
            name: name.to_string(),
            uid: stored.uid.clone(),
        };
        let state = record::state_name(&key, name);
        match self
            .states
            .create(&PostParams::default(), &record::new_state(&id))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let old = self
                    .states
                    .get_opt(&state)
                    .await
                    .map_err(|e| kube_error("reading the webhook's state", e))?;
                let same = old.as_ref().and_then(record::identity_of).as_ref() == Some(&id);
                if !same {
                    self.states
                        .patch(
                            &state,
                            &PatchParams::default(),
                            &Patch::Merge(&record::identity_patch(&id, false)),
                        )
                        .await
                        .map_err(|e| kube_error("writing the webhook's state", e))?;
                }
            }
            Err(e) => return Err(kube_error("writing the webhook's state", e)),
        }
        let p = self.progress(&key, name, &stored.uid).await?;
        Ok(self.info(&key, name, &stored, p.as_ref()))
    }

    async fn get(&self, tenant: &str, name: &str) -> Result<WebhookInfo> {
        let (regs, _) = self.registrations(tenant).await?;
        let r = regs
            .hooks
            .get(name)
            .ok_or_else(|| crate::webhooks::not_found(name))?;
        let key = tenant_label_value(tenant);
        let p = self.progress(&key, name, &r.uid).await?;
        Ok(self.info(&key, name, r, p.as_ref()))
    }

    async fn list(&self, tenant: &str) -> Result<WebhookList> {
        let (regs, _) = self.registrations(tenant).await?;
        let key = tenant_label_value(tenant);
        let states = if regs.hooks.is_empty() {
            Vec::new()
        } else {
            self.states
                .list(&ListParams::default().labels(&format!(
                    "{}=true,{TENANT_LABEL}={key}",
                    record::STATE_LABEL
                )))
                .await
                .map_err(|e| kube_error("reading the webhooks' deliveries", e))?
                .items
        };
        let webhooks = regs
            .hooks
            .iter()
            .map(|(name, r)| {
                let p = states
                    .iter()
                    .find(|cm| {
                        cm.metadata.name.as_deref() == Some(record::state_name(&key, name).as_str())
                    })
                    .and_then(|cm| deliver::stored_progress(cm, &r.uid));
                self.info(&key, name, r, p.as_ref())
            })
            .collect();
        Ok(WebhookList { webhooks })
    }

    async fn delete(&self, tenant: &str, name: &str) -> Result<()> {
        // The state first: the holder reads it before each send, so nothing
        // is sent once this answers. Its cursor and attempts go with it.
        let key = tenant_label_value(tenant);
        match self
            .states
            .delete(&record::state_name(&key, name), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_error("deleting the webhook's deliveries", e)),
        }
        let existed = self
            .edit(tenant, false, |regs| Ok(regs.hooks.remove(name).is_some()))
            .await?;
        if existed {
            Ok(())
        } else {
            Err(crate::webhooks::not_found(name))
        }
    }

    async fn deliveries(&self, tenant: &str, name: &str) -> Result<DeliveryList> {
        let (regs, _) = self.registrations(tenant).await?;
        let r = regs
            .hooks
            .get(name)
            .ok_or_else(|| crate::webhooks::not_found(name))?;
        let key = tenant_label_value(tenant);
        let p = self.progress(&key, name, &r.uid).await?;
        Ok(DeliveryList {
            deliveries: p
                .map(|p| p.attempts.into_iter().collect())
                .unwrap_or_default(),
        })
    }

    fn outcomes(&self) -> &DeliveryOutcomes {
        &self.rules.outcomes
    }
}

/// How long a state ConfigMap may lack its registration before the holder
/// deletes it: a `PUT` writes the registration, then the state, so a state
/// is never younger than its registration by more than one call.
pub(crate) const ORPHAN_GRACE: Duration = Duration::from_secs(60);
