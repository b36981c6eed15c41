//! JSON bodies of the hub's Gym-style environment API (`/gym/v1/...`).
//! An environment is a sandbox plus a task, a reward and a termination
//! rule; actions are shell commands, observations their output.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{error::ErrorBody, limits};

pub const DEFAULT_OBSERVATION_MAX_BYTES: usize = 4096;
pub const DEFAULT_ACTION_MAX_LENGTH: usize = 65536;
pub const DEFAULT_STEP_TIMEOUT_SECONDS: f64 = 60.0;
/// An environment with no reset or step for this long is closed, and its
/// sandbox deleted: an abandoned one must not hold a sandbox forever.
pub const DEFAULT_ENV_IDLE_TIMEOUT_SECONDS: u64 = 3600;
/// The label every sandbox of an environment carries, valued the env's id.
pub const ENV_LABEL: &str = "sandhub.dev/gym-env";

fn one() -> f64 {
    1.0
}

/// `POST /gym/v1/envs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreateEnv {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Claim episodes' sandboxes from this warm pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<Task>,
    /// Summed, each matcher weighted; empty means reward 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reward: Vec<Matcher>,
    /// The episode terminates when any matcher matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub termination: Vec<Matcher>,
    /// After this many steps the episode is truncated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_episode_steps: Option<u32>,
    /// A new sandbox per episode instead of resetting the workspace.
    #[serde(default)]
    pub fresh_sandbox: bool,
    /// Each action is killed after this long (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_timeout_seconds: Option<f64>,
    /// Observations are cut to this many bytes (default 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_max_bytes: Option<usize>,
    /// With no reset or step for this long, the environment is closed and
    /// its sandbox deleted (default 3600, at most a year). Its sandbox
    /// carries the same idle timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
}

impl CreateEnv {
    /// Refuses timeouts (the step's, and each verify command's) outside
    /// [`limits::MIN_TIMEOUT_SECONDS`] to [`limits::MAX_TIMEOUT_SECONDS`].
    pub fn validate(&self) -> Result<(), ErrorBody> {
        limits::optional_timeout("step_timeout_seconds", self.step_timeout_seconds)?;
        for (list, matchers) in [("reward", &self.reward), ("termination", &self.termination)] {
            for (i, m) in matchers.iter().enumerate() {
                if let Matcher::Command {
                    timeout_seconds, ..
                } = m
                {
                    limits::optional_timeout(
                        &format!("{list}[{i}].timeout_seconds"),
                        *timeout_seconds,
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// What every episode starts from: files written and commands run at
/// reset, before the first observation. Commands see `SANDHUB_SEED`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Task {
    /// Workspace-relative path → content.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// Shell commands, in order; a failing one fails the reset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<String>,
    /// The first observation; default: the setup commands' output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Environment for setup, actions and verify commands.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Stream {
    Stdout,
    Stderr,
    /// stdout then stderr.
    #[default]
    Output,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum When {
    #[default]
    EveryStep,
    /// Only on the step that ends the episode.
    End,
}

/// One condition on a step; a reward adds `weight` when it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Matcher {
    /// The action's exit code equals `equals` (default 0).
    ExitCode {
        #[serde(default)]
        equals: i32,
        #[serde(default = "one")]
        weight: f64,
    },
    /// The action's output matches a regular expression (multi-line:
    /// `^` and `$` match at line boundaries).
    Regex {
        pattern: String,
        #[serde(default)]
        stream: Stream,
        #[serde(default = "one")]
        weight: f64,
    },
    /// A workspace file equals or contains a string.
    File {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        equals: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        contains: Option<String>,
        #[serde(default = "one")]
        weight: f64,
    },
    /// A verify command (a test suite) exits 0. The hub runs it itself,
    /// apart from the agent's commands: the agent cannot forge its result
    /// by printing anything.
    Command {
        command: String,
        #[serde(default)]
        when: When,
        #[serde(default = "one")]
        weight: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_seconds: Option<f64>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Space {
    /// Always `text`: actions are shell commands, observations output.
    #[serde(rename = "type")]
    pub kind: String,
    pub max_length: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvCreated {
    pub env_id: String,
    pub observation_space: Space,
    pub action_space: Space,
}

/// `POST /gym/v1/envs/{id}/reset`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResetRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub options: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Info {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed_ms: u64,
    pub step: u32,
    pub episode: u32,
    pub sandbox_id: String,
    /// Set when the sandbox itself failed (crashed, killed); the next
    /// reset starts a fresh one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_error: Option<String>,
    /// Each reward matcher's contribution, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reward_terms: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResetResult {
    pub observation: String,
    pub info: Info,
}

/// `POST /gym/v1/envs/{id}/step`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepRequest {
    /// A shell command.
    pub action: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepResult {
    pub observation: String,
    pub reward: f64,
    pub terminated: bool,
    pub truncated: bool,
    pub info: Info,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchStepItem {
    pub env_id: String,
    pub action: String,
}

/// `POST /gym/v1/step`: many environments, one round trip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchStep {
    pub steps: Vec<BatchStepItem>,
}

/// One entry per requested step, in request order: a result or an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchStepOutcome {
    pub env_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<StepResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchStepResult {
    pub results: Vec<BatchStepOutcome>,
}
