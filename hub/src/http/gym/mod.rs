//! The Gym-style environment API (`/gym/v1`): environments over sandboxes,
//! for RL trainers. Their sandboxes are ordinary sandboxes of the caller's
//! tenant, labelled with the env's id; on the local backend the envs
//! themselves are kept in the state store and survive a hub restart.

mod env;
mod matcher;
mod registry;
mod returns;

use axum::{extract::Path, extract::State, http::StatusCode};
use sandhub_api::{
    error::ErrorBody,
    gym::{
        BatchStep, BatchStepOutcome, BatchStepResult, CreateEnv, EnvCreated, ResetRequest,
        ResetResult, StepRequest, StepResult,
    },
};
use sandhub_client::Error;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::http::{Api, ApiJson, ApiJsonOrDefault, ApiResult, AppState};
pub use registry::Gym;

/// Most steps one batch request may carry.
const MAX_BATCH: usize = 1024;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_env, list_envs))
        .routes(routes!(delete_env))
        .routes(routes!(reset_env))
        .routes(routes!(step_env))
        .routes(routes!(step_batch))
}

/// Create an environment (and its first sandbox).
#[utoipa::path(post, path = "/gym/v1/envs", tag = "gym", request_body = CreateEnv,
    responses((status = 201, body = EnvCreated), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody, description = "The template asks for what the operator does not allow (network: host)"),
        (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody, description = "The template cannot start as it is (e.g. its `user` is not in its image)"),
        (status = 429, body = ErrorBody, description = "Over a tenant quota (sandboxes, memory, snapshots)")))]
async fn create_env(
    State(state): State<AppState>,
    Api(api): Api,
    ApiJson(spec): ApiJson<CreateEnv>,
) -> ApiResult<(StatusCode, ApiJson<EnvCreated>)> {
    let created = state.gym.create(api, spec).await?;
    Ok((StatusCode::CREATED, ApiJson(created)))
}

/// One environment as `GET /gym/v1/envs` shows it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct EnvSummary {
    env_id: String,
    /// Episodes started (resets).
    episode: u32,
    /// Steps taken in the current episode.
    step: u32,
    /// The current episode ended: the next step needs a reset.
    done: bool,
    sandbox_id: Option<String>,
    /// The current episode's return so far.
    episode_return: f64,
    /// The last finished episodes' returns, oldest first (memory only:
    /// what this hub process saw).
    episodes: Vec<returns::EpisodeReturn>,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
struct EnvList {
    envs: Vec<EnvSummary>,
}

/// The caller's live environments, with their episodes' returns, for
/// watching a run.
#[utoipa::path(get, path = "/gym/v1/envs", tag = "gym",
    responses((status = 200, body = EnvList)))]
async fn list_envs(State(state): State<AppState>, Api(api): Api) -> ApiResult<ApiJson<EnvList>> {
    Ok(ApiJson(EnvList {
        envs: state.gym.list(api.tenant()).await,
    }))
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
    state.gym.close_by_id(api.as_ref(), &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Start an episode: reset the workspace (or claim a fresh sandbox), write
/// the task's files, run its setup, return the first observation.
#[utoipa::path(post, path = "/gym/v1/envs/{id}/reset", tag = "gym",
    params(("id" = String, Path, description = "Environment id")),
    request_body(content = Option<ResetRequest>, content_type = "application/json"),
    responses((status = 200, body = ResetResult), (status = 403, body = ErrorBody, description = "The template asks for what the operator does not allow (network: host)"), (status = 404, body = ErrorBody),
        (status = 412, body = ErrorBody), (status = 429, body = ErrorBody, description = "Over a tenant quota (sandboxes, memory, snapshots)")))]
async fn reset_env(
    State(state): State<AppState>,
    Api(api): Api,
    Path(id): Path<String>,
    // The body is optional: an empty one is a reset without a seed.
    ApiJsonOrDefault(req): ApiJsonOrDefault<ResetRequest>,
) -> ApiResult<ApiJson<ResetResult>> {
    Ok(ApiJson(state.gym.reset(api.as_ref(), &id, req.seed).await?))
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
