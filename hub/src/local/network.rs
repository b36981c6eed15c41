//! `PATCH /v1/sandboxes/{id}/network` on the local backend: a running
//! sandbox's own narrowing of its template's `network` is replaced, kept
//! in its row (so a restarted hub, and a resume, apply it), and handed to
//! its running gateway, which judges the next connection and the next DNS
//! query by it.

use sandhub_api::hub::{NetworkSpec, Sandbox};
use sandhub_client::Result;

use super::{egress::Recorded, hub::Hub};

impl Hub {
    pub(super) async fn set_network(
        &self,
        tenant: &str,
        id: &str,
        request: NetworkSpec,
    ) -> Result<Sandbox> {
        // Bad patterns are the caller's 400 before anything else is asked.
        sandhub_api::validate::network(&request)?;
        let _guard = self.lock_existing(tenant, id).await?;
        let mut row = self.ready_row(tenant, id, "changing its network")?;
        let Some(current) = Recorded::of_row(&row) else {
            // Nothing recorded: it was started without a gateway and with
            // no narrowing, in its template's mode (`none` or `host`).
            let mode = self
                .template(tenant, &row.template)
                .ok()
                .map(|t| t.network.mode)
                .filter(|m| *m != sandhub_api::hub::Network::Egress)
                .unwrap_or_default();
            super::egress::refuse_patch(mode, &request)?;
            return Ok(self.view(&row).await);
        };
        let next = current.patched(request, self.backend.egress.default_allows_all())?;
        if next == current {
            return Ok(self.view(&row).await);
        }
        let policy = next.policy()?;
        // Kept first: if the store fails nothing has changed.
        let mut runtime = row.runtime.take().unwrap_or_else(|| serde_json::json!({}));
        if let Some(obj) = runtime.as_object_mut() {
            obj.insert(
                super::egress::RECORD_KEY.into(),
                serde_json::to_value(&next)
                    .map_err(|e| sandhub_client::Error::internal(e.to_string()))?,
            );
        }
        self.store.set_runtime(id, row.state, Some(&runtime))?;
        row.runtime = Some(runtime);
        if !self.backend.egress.set_policy(id, policy) {
            // Its gateway did not come back after a restart: it is offline
            // (fail closed); the record is what a resume will apply.
            tracing::warn!(%id, "network changed on a sandbox whose gateway is not running");
        }
        tracing::info!(%id, "network changed");
        Ok(self.view(&row).await)
    }
}
