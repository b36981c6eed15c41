//! The hub's Gym-style environment API (`/gym/v1/...`) and its liveness
//! route: what the Python SDK's `hub.gym` and `hub.health()` stand on.
//! Additive to [`HubClient`]; the [`crate::Sandboxes`] trait has no
//! environments in it, so these are inherent methods.

use reqwest::Method;
use sandhub_api::gym::{
    BatchStep, BatchStepResult, CreateEnv, EnvCreated, ResetRequest, ResetResult, StepRequest,
    StepResult,
};

use super::{transport_error, HubClient, QUICK};
use crate::{paths::encode, Result};

/// A step runs a command with its own timeout (at most the hub's
/// maximum), and a batch runs many; neither gets a client-side bound
/// shorter than the hub's own.
const STEP: std::time::Duration = std::time::Duration::from_secs(3600);

impl HubClient {
    /// `POST /gym/v1/envs`.
    pub async fn gym_create(&self, spec: &CreateEnv) -> Result<EnvCreated> {
        // Creating an environment may start a sandbox cold.
        self.call(
            self.request(Method::POST, "/gym/v1/envs")
                .json(spec)
                .timeout(super::SLOW),
        )
        .await
    }

    /// `POST /gym/v1/envs/{id}/reset`.
    pub async fn gym_reset(&self, env_id: &str, request: &ResetRequest) -> Result<ResetResult> {
        let path = format!("/gym/v1/envs/{}/reset", encode(env_id));
        self.call(
            self.request(Method::POST, &path)
                .json(request)
                .timeout(super::SLOW),
        )
        .await
    }

    /// `POST /gym/v1/envs/{id}/step`.
    pub async fn gym_step(&self, env_id: &str, action: &str) -> Result<StepResult> {
        let path = format!("/gym/v1/envs/{}/step", encode(env_id));
        let body = StepRequest {
            action: action.to_string(),
        };
        self.call(self.request(Method::POST, &path).json(&body).timeout(STEP))
            .await
    }

    /// `DELETE /gym/v1/envs/{id}`.
    pub async fn gym_close(&self, env_id: &str) -> Result<()> {
        let path = format!("/gym/v1/envs/{}", encode(env_id));
        self.call_empty(self.request(Method::DELETE, &path).timeout(super::SLOW))
            .await
    }

    /// `POST /gym/v1/step`: one step in each of many environments.
    pub async fn gym_step_many(&self, batch: &BatchStep) -> Result<BatchStepResult> {
        self.call(
            self.request(Method::POST, "/gym/v1/step")
                .json(batch)
                .timeout(STEP),
        )
        .await
    }

    /// `GET /healthz`: the hub process answers (no key needed).
    pub async fn healthz(&self) -> Result<String> {
        let response = self
            .send(self.request(Method::GET, "/healthz").timeout(QUICK))
            .await?;
        response.text().await.map_err(transport_error)
    }
}
