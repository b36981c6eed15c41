//! The Gym-style environment API (`/gym/v1`): environments over sandboxes,
//! for RL trainers. Environments live in the hub's memory; their sandboxes
//! are ordinary sandboxes of the caller's tenant.

mod env;
mod matcher;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use axum::{extract::Path, extract::State, http::StatusCode};
use sandhub_api::{
    error::ErrorBody,
    gym::{
        BatchStep, BatchStepOutcome, BatchStepResult, CreateEnv, EnvCreated, ResetRequest,
        ResetResult, Space, StepRequest, StepResult, DEFAULT_ACTION_MAX_LENGTH,
    },
};
use sandhub_client::{Error, Result};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    rest::{Api, ApiJson, ApiJsonOrDefault, ApiResult, AppState},
    service::new_id,
    tenancy::TenantView,
};
use env::Env;

/// Most steps one batch request may carry.
const MAX_BATCH: usize = 1024;

type EnvSlot = Arc<tokio::sync::Mutex<Env>>;

#[derive(Default)]
pub struct Gym {
    envs: Mutex<HashMap<String, EnvSlot>>,
}

impl Gym {
    /// The caller's environment; another tenant's is simply not found.
    fn get(&self, tenant: &str, id: &str) -> Result<EnvSlot> {
        let slot = self.envs.lock().unwrap().get(id).cloned();
        match slot {
            Some(slot) if slot.try_lock().map(|e| e.tenant == tenant).unwrap_or(true) => Ok(slot),
            _ => Err(Error::not_found(format!("environment {id} not found"))),
        }
    }

    async fn checked(&self, tenant: &str, id: &str) -> Result<EnvSlot> {
        let slot = self.get(tenant, id)?;
        if slot.lock().await.tenant != tenant {
            return Err(Error::not_found(format!("environment {id} not found")));
        }
        Ok(slot)
    }

    async fn step(&self, api: &dyn TenantView, id: &str, action: String) -> Result<StepResult> {
        let slot = self.checked(api.tenant(), id).await?;
        let mut env = slot.lock().await;
        env.step(api, action).await
    }
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_env))
        .routes(routes!(delete_env))
        .routes(routes!(reset_env))
        .routes(routes!(step_env))
        .routes(routes!(step_batch))
}

/// Create an environment (and its first sandbox).
#[utoipa::path(post, path = "/gym/v1/envs", tag = "gym", request_body = CreateEnv,
    responses((status = 201, body = EnvCreated), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn create_env(
    State(state): State<AppState>,
    Api(api): Api,
    ApiJson(spec): ApiJson<CreateEnv>,
) -> ApiResult<(StatusCode, ApiJson<EnvCreated>)> {
    let mut env = Env::new(api.tenant().to_string(), spec)?;
    env.prepare(api.as_ref()).await?;
    let created = EnvCreated {
        env_id: new_id("env"),
        observation_space: Space {
            kind: "text".into(),
            max_length: env.observation_max(),
        },
        action_space: Space {
            kind: "text".into(),
            max_length: DEFAULT_ACTION_MAX_LENGTH,
        },
    };
    state.gym.envs.lock().unwrap().insert(
        created.env_id.clone(),
        Arc::new(tokio::sync::Mutex::new(env)),
    );
    Ok((StatusCode::CREATED, ApiJson(created)))
}

/// Close an environment and delete its sandbox.
#[utoipa::path(delete, path = "/gym/v1/envs/{id}", tag = "gym",
    params(("id" = String, Path, description = "Environment id")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_env(
    State(state): State<AppState>,
    Api(api): Api,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let slot = state.gym.checked(api.tenant(), &id).await?;
    state.gym.envs.lock().unwrap().remove(&id);
    slot.lock().await.close(api.as_ref()).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Start an episode: reset the workspace (or claim a fresh sandbox), write
/// the task's files, run its setup, return the first observation.
#[utoipa::path(post, path = "/gym/v1/envs/{id}/reset", tag = "gym",
    params(("id" = String, Path, description = "Environment id")),
    request_body(content = Option<ResetRequest>, content_type = "application/json"),
    responses((status = 200, body = ResetResult), (status = 404, body = ErrorBody), (status = 412, body = ErrorBody)))]
async fn reset_env(
    State(state): State<AppState>,
    Api(api): Api,
    Path(id): Path<String>,
    // The body is optional: an empty one is a reset without a seed.
    ApiJsonOrDefault(req): ApiJsonOrDefault<ResetRequest>,
) -> ApiResult<ApiJson<ResetResult>> {
    let slot = state.gym.checked(api.tenant(), &id).await?;
    let mut env = slot.lock().await;
    Ok(ApiJson(env.reset(api.as_ref(), req.seed).await?))
}

/// Run one action (a shell command) and score it.
#[utoipa::path(post, path = "/gym/v1/envs/{id}/step", tag = "gym", request_body = StepRequest,
    params(("id" = String, Path, description = "Environment id")),
    responses((status = 200, body = StepResult), (status = 404, body = ErrorBody), (status = 412, body = ErrorBody)))]
async fn step_env(
    State(state): State<AppState>,
    Api(api): Api,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<StepRequest>,
) -> ApiResult<ApiJson<StepResult>> {
    Ok(ApiJson(
        state.gym.step(api.as_ref(), &id, req.action).await?,
    ))
}

/// Step many environments at once (concurrently); results come back in
/// request order, each a result or an error.
#[utoipa::path(post, path = "/gym/v1/step", tag = "gym", request_body = BatchStep,
    responses((status = 200, body = BatchStepResult), (status = 400, body = ErrorBody)))]
async fn step_batch(
    State(state): State<AppState>,
    Api(api): Api,
    ApiJson(req): ApiJson<BatchStep>,
) -> ApiResult<ApiJson<BatchStepResult>> {
    if req.steps.len() > MAX_BATCH {
        return Err(Error::invalid(format!("at most {MAX_BATCH} steps per batch")).into());
    }
    let gym = &state.gym;
    let results = futures::future::join_all(req.steps.into_iter().map(|item| {
        let api = api.clone();
        async move {
            match gym.step(api.as_ref(), &item.env_id, item.action).await {
                Ok(result) => BatchStepOutcome {
                    env_id: item.env_id,
                    result: Some(result),
                    error: None,
                },
                Err(e) => BatchStepOutcome {
                    env_id: item.env_id,
                    result: None,
                    error: Some(e.body()),
                },
            }
        }
    }))
    .await;
    Ok(ApiJson(BatchStepResult { results }))
}
