//! One environment: a sandbox, a task, and the episode bookkeeping.

use std::{collections::BTreeMap, time::Instant};

use sandhub_api::{
    error::Code,
    gym::{
        CreateEnv, Info, ResetResult, StepResult, DEFAULT_ACTION_MAX_LENGTH,
        DEFAULT_ENV_IDLE_TIMEOUT_SECONDS, DEFAULT_OBSERVATION_MAX_BYTES,
        DEFAULT_STEP_TIMEOUT_SECONDS, ENV_LABEL,
    },
    hub::{Command, CreateSandbox, ExecRequest},
};
use sandhub_client::{write_bytes, Error, Result, WriteOptions};

use super::matcher::{compile, Compiled, StepOutput};
use super::returns::Returns;
use crate::backend::{Episode, GymEnvRow, TenantView};

pub struct Env {
    pub id: String,
    pub tenant: String,
    spec: CreateEnv,
    reward: Vec<Compiled>,
    termination: Vec<Compiled>,
    /// Everything a call changes; persisted after each one.
    state: Episode,
    /// Closed (deleted, or expired): every later call is NOT_FOUND, and
    /// nothing may start a sandbox for it again.
    pub closed: bool,
    /// Whether its sandboxes get the env's idle timeout. Only where the
    /// env is stored and swept (the local backend); the kubernetes backend
    /// has no idle timeouts and refuses one.
    pub sandbox_idle_timeout: bool,
    /// The rewards this process saw (memory only), for watching a run.
    pub returns: Returns,
}

/// Cuts to at most `max` bytes on a character boundary.
fn cap(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Errors that mean the sandbox itself is gone or broken, as opposed to a
/// command that failed inside a healthy one.
fn sandbox_failed(e: &Error) -> bool {
    matches!(
        e.code,
        Code::Unavailable | Code::Internal | Code::NotFound | Code::FailedPrecondition
    )
}

impl Env {
    pub fn new(id: String, tenant: String, spec: CreateEnv) -> Result<Self> {
        sandhub_api::limits::optional_lifetime("idle_timeout_seconds", spec.idle_timeout_seconds)?;
        // Timeouts in range, so no step can overflow a deadline.
        spec.validate()?;
        if spec.observation_max_bytes == Some(0) {
            return Err(Error::invalid("observation_max_bytes must be at least 1"));
        }
        let reward = spec
            .reward
            .iter()
            .cloned()
            .map(compile)
            .collect::<Result<_>>()?;
        let termination = spec
            .termination
            .iter()
            .cloned()
            .map(compile)
            .collect::<Result<_>>()?;
        Ok(Env {
            id,
            tenant,
            spec,
            reward,
            termination,
            state: Episode::default(),
            closed: false,
            sandbox_idle_timeout: true,
            returns: Returns::default(),
        })
    }

    /// An environment as stored, after a hub restart. Its configuration was
    /// accepted once; if it no longer is, the env is reported broken rather
    /// than run under different rules.
    pub fn restore(row: GymEnvRow) -> Result<Self> {
        let id = row.id.clone();
        let mut env = Env::new(row.id, row.tenant, row.spec).map_err(|e| {
            Error::internal(format!(
                "stored gym environment {id} is no longer valid: {}",
                e.message
            ))
        })?;
        env.state = row.episode;
        Ok(env)
    }

    /// Takes the episode state another replica recorded (its configuration
    /// never changes after creation).
    pub fn refresh(&mut self, row: GymEnvRow) {
        self.state = row.episode;
    }

    /// The row that stores this environment, used at `now`.
    pub fn row(&self, now: i64) -> GymEnvRow {
        GymEnvRow {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            spec: self.spec.clone(),
            episode: self.state.clone(),
            idle_timeout_seconds: self.idle_timeout_seconds(),
            created_at: now,
            last_used: now,
        }
    }

    /// What `GET /gym/v1/envs` shows of it.
    pub fn summary(&self) -> super::EnvSummary {
        super::EnvSummary {
            env_id: self.id.clone(),
            episode: self.state.episode,
            step: self.state.step,
            done: self.state.done,
            sandbox_id: self.state.sandbox.clone(),
            episode_return: self.returns.current,
            episodes: self.returns.finished.iter().cloned().collect(),
        }
    }

    pub fn episode(&self) -> &Episode {
        &self.state
    }

    pub fn idle_timeout_seconds(&self) -> u64 {
        self.spec
            .idle_timeout_seconds
            .unwrap_or(DEFAULT_ENV_IDLE_TIMEOUT_SECONDS)
    }

    pub fn observation_max(&self) -> usize {
        self.spec
            .observation_max_bytes
            .unwrap_or(DEFAULT_OBSERVATION_MAX_BYTES)
    }

    fn env_vars(&self) -> BTreeMap<String, String> {
        let mut env = self
            .spec
            .task
            .as_ref()
            .map(|t| t.env.clone())
            .unwrap_or_default();
        if let Some(seed) = self.state.seed {
            env.insert("SANDHUB_SEED".into(), seed.to_string());
        }
        env
    }

    fn info(&self, sandbox: &str) -> Info {
        Info {
            step: self.state.step,
            episode: self.state.episode,
            sandbox_id: sandbox.to_string(),
            ..Info::default()
        }
    }

    /// A sandbox for a new episode: the old one reset (milliseconds), or a
    /// new one when asked for, or when the old one failed. A new one is
    /// labelled with the env's id and shares its idle timeout, so that one
    /// the env lost track of (a crash between its creation and the next
    /// save) is still found and reaped.
    async fn episode_sandbox(&mut self, api: &dyn TenantView) -> Result<String> {
        if let Some(id) = self.state.sandbox.clone() {
            if !self.spec.fresh_sandbox && !self.state.broken {
                match api.reset(&id).await {
                    Ok(_) => return Ok(id),
                    Err(e) => {
                        tracing::warn!(sandbox = %id, error = %e, "reset failed; starting a new sandbox")
                    }
                }
            }
            let _ = api.delete(&id).await;
            self.state.sandbox = None;
        }
        let created = api
            .create(CreateSandbox {
                template: self.spec.template.clone(),
                pool: self.spec.pool.clone(),
                labels: BTreeMap::from([(ENV_LABEL.to_string(), self.id.clone())]),
                idle_timeout_seconds: self
                    .sandbox_idle_timeout
                    .then(|| self.idle_timeout_seconds()),
                ..CreateSandbox::default()
            })
            .await?;
        self.state.sandbox = Some(created.id.clone());
        self.state.broken = false;
        Ok(created.id)
    }

    /// Acquires the first sandbox, so that a bad template fails env creation.
    pub async fn prepare(&mut self, api: &dyn TenantView) -> Result<()> {
        self.episode_sandbox(api).await.map(|_| ())
    }

    pub async fn reset(&mut self, api: &dyn TenantView, seed: Option<u64>) -> Result<ResetResult> {
        self.state.seed = seed;
        let started = Instant::now();
        let id = self.episode_sandbox(api).await?;
        self.returns.close(self.state.episode, self.state.step);
        self.state.step = 0;
        self.state.episode += 1;
        self.state.done = false;
        let task = self.spec.task.clone().unwrap_or_default();
        for (path, content) in &task.files {
            write_bytes(
                api,
                &id,
                path,
                content.clone().into_bytes(),
                WriteOptions::default(),
            )
            .await
            .map_err(|e| Error::new(e.code, format!("writing task file {path}: {}", e.message)))?;
        }
        let mut output = String::new();
        for command in &task.setup {
            let result = api
                .exec(
                    &id,
                    self.exec_request(command.clone(), DEFAULT_STEP_TIMEOUT_SECONDS * 5.0),
                )
                .await?;
            output.push_str(&result.stdout);
            output.push_str(&result.stderr);
            if result.exit_code != 0 || result.timed_out {
                return Err(Error::new(
                    Code::FailedPrecondition,
                    format!(
                        "task setup command {command:?} exited {}{}: {}",
                        result.exit_code,
                        if result.timed_out { " (timed out)" } else { "" },
                        cap(result.stderr, 2048)
                    ),
                ));
            }
        }
        let observation = cap(task.prompt.unwrap_or(output), self.observation_max());
        let mut info = self.info(&id);
        info.elapsed_ms = started.elapsed().as_millis() as u64;
        Ok(ResetResult { observation, info })
    }

    fn exec_request(&self, command: String, timeout: f64) -> ExecRequest {
        ExecRequest {
            command: Command::Shell(command),
            env: self.env_vars(),
            cwd: String::new(),
            timeout_seconds: Some(timeout),
            stdin: String::new(),
            container: None,
        }
    }

    pub async fn step(&mut self, api: &dyn TenantView, action: String) -> Result<StepResult> {
        let Some(id) = self
            .state
            .sandbox
            .clone()
            .filter(|_| self.state.episode > 0)
        else {
            return Err(Error::new(
                Code::FailedPrecondition,
                "call reset before step",
            ));
        };
        if self.state.done {
            return Err(Error::new(
                Code::FailedPrecondition,
                "the episode has ended (terminated or truncated); call reset",
            ));
        }
        if action.len() > DEFAULT_ACTION_MAX_LENGTH {
            return Err(Error::invalid(format!(
                "action is longer than {DEFAULT_ACTION_MAX_LENGTH} bytes"
            )));
        }
        let started = Instant::now();
        let timeout = self
            .spec
            .step_timeout_seconds
            .unwrap_or(DEFAULT_STEP_TIMEOUT_SECONDS);
        let result = match api.exec(&id, self.exec_request(action, timeout)).await {
            Ok(r) => r,
            Err(e) if sandbox_failed(&e) => return Ok(self.failed(&id, e, started)),
            Err(e) => return Err(e),
        };
        self.state.step += 1;
        let env = self.env_vars();
        let out = StepOutput {
            exit_code: Some(result.exit_code),
            stdout: &result.stdout,
            stderr: &result.stderr,
        };
        let mut terminated = false;
        for m in &self.termination {
            match m.holds(api, &id, &env, &out).await {
                Ok(true) => {
                    terminated = true;
                    break;
                }
                Ok(false) => {}
                Err(e) if sandbox_failed(&e) => return Ok(self.failed(&id, e, started)),
                Err(e) => return Err(e),
            }
        }
        let truncated = !terminated
            && self
                .spec
                .max_episode_steps
                .is_some_and(|max| self.state.step >= max);
        let ending = terminated || truncated;
        let mut terms = Vec::with_capacity(self.reward.len());
        for m in &self.reward {
            let term = if m.only_at_end() && !ending {
                0.0
            } else {
                match m.holds(api, &id, &env, &out).await {
                    Ok(true) => m.weight(),
                    Ok(false) => 0.0,
                    Err(e) if sandbox_failed(&e) => return Ok(self.failed(&id, e, started)),
                    Err(e) => return Err(e),
                }
            };
            terms.push(term);
        }
        self.state.done = ending;
        let observation = cap(
            format!("{}{}", result.stdout, result.stderr),
            self.observation_max(),
        );
        let mut info = self.info(&id);
        info.exit_code = Some(result.exit_code);
        info.stdout = cap(result.stdout, self.observation_max());
        info.stderr = cap(result.stderr, self.observation_max());
        info.elapsed_ms = started.elapsed().as_millis() as u64;
        info.reward_terms = terms.clone();
        let reward = terms.iter().sum();
        self.returns
            .step(self.state.episode, self.state.step, reward, ending);
        Ok(StepResult {
            observation,
            reward,
            terminated,
            truncated,
            info,
        })
    }

    /// The sandbox failed under the episode: report it, end the episode,
    /// and make the next reset start from a fresh sandbox.
    fn failed(&mut self, id: &str, e: Error, started: Instant) -> StepResult {
        tracing::warn!(sandbox = %id, error = %e, "sandbox failed mid-episode");
        self.state.broken = true;
        self.state.done = true;
        let mut info = self.info(id);
        info.env_error = Some(e.to_string());
        info.elapsed_ms = started.elapsed().as_millis() as u64;
        StepResult {
            observation: String::new(),
            reward: 0.0,
            terminated: false,
            truncated: true,
            info,
        }
    }

    /// Frees the sandbox; the env answers NOT_FOUND from now on.
    pub async fn close(&mut self, api: &dyn TenantView) {
        self.closed = true;
        if let Some(id) = self.state.sandbox.take() {
            match api.delete(&id).await {
                Ok(()) => {}
                // Already reaped (idle) or deleted by its owner.
                Err(e) if e.code == Code::NotFound => {}
                // Its own idle timeout still reaps it.
                Err(e) => {
                    tracing::warn!(env = %self.id, sandbox = %id, error = %e, "deleting a closed env's sandbox")
                }
            }
        }
    }
}
