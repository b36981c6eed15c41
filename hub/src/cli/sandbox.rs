//! `create`, `ls`, `rm` and the lifecycle verbs (`suspend`, `pause`, `resume`,
//! `reset`, `fork`; `snapshot` is in `snapshot.rs`).

use std::time::{Duration, SystemTime};

use clap::Args;
use sandhub_api::hub::{CreateSandbox, ForkRequest, Sandbox};
use sandhub_client::{Result, Sandboxes};
use serde::Serialize;

use super::{
    args::{parse_duration, parse_key_value, parse_volume_mount, to_map, whole_seconds},
    output, ClientArgs, Output,
};

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Template to start from (the hub's `default` when unset); a pool of
    /// the same name is claimed from first.
    #[arg(long, env = "SANDHUB_TEMPLATE")]
    template: Option<String>,

    /// Claim a warm sandbox from this pool (its template applies).
    #[arg(long, env = "SANDHUB_POOL")]
    pool: Option<String>,

    /// A label, repeatable (env: comma-separated).
    #[arg(long = "label", value_name = "KEY=VALUE", env = "SANDHUB_LABELS",
          value_delimiter = ',', value_parser = parse_key_value)]
    labels: Vec<(String, String)>,

    /// Environment for every process in the sandbox, repeatable (env: one
    /// per line). Forces a cold start.
    #[arg(long = "env", value_name = "KEY=VALUE", env = "SANDHUB_SANDBOX_ENV",
          value_delimiter = '\n', value_parser = parse_key_value)]
    env: Vec<(String, String)>,

    /// Delete the sandbox this long after creation (e.g. 10m, 2h).
    #[arg(long, value_name = "DURATION", env = "SANDHUB_SHUTDOWN_AFTER", value_parser = parse_duration)]
    shutdown_after: Option<Duration>,

    /// Delete the sandbox (or what --idle-action says) after this long
    /// with no API calls and no running process (e.g. 5m).
    #[arg(long, value_name = "DURATION", env = "SANDHUB_IDLE_TIMEOUT", value_parser = parse_duration)]
    idle_timeout: Option<Duration>,

    /// What the idle timeout does: delete (default), suspend or pause.
    #[arg(long, env = "SANDHUB_IDLE_ACTION", value_parser = ["delete", "suspend", "pause"])]
    idle_action: Option<String>,

    /// Calls that need the sandbox running resume it first when it is
    /// paused or suspended (instead of failing).
    #[arg(long, env = "SANDHUB_AUTO_RESUME")]
    auto_resume: bool,

    /// A named volume to mount, `NAME:PATH[:ro]`, repeatable (env:
    /// comma-separated). Added to the template's; forces a cold start.
    #[arg(long = "volume", value_name = "NAME:PATH[:ro]", env = "SANDHUB_SANDBOX_VOLUMES",
          value_delimiter = ',', value_parser = parse_volume_mount)]
    volumes: Vec<sandhub_api::volumes::VolumeMount>,

    /// Narrowing of the template's network (forces a cold start).
    #[command(flatten)]
    network: super::network::NetworkFlags,

    #[command(flatten)]
    client: ClientArgs,
}

pub async fn create(args: CreateArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let sandbox = hub
        .create(CreateSandbox {
            template: args.template,
            pool: args.pool,
            labels: to_map(args.labels),
            env: to_map(args.env),
            shutdown_after_seconds: args.shutdown_after.map(whole_seconds),
            idle_timeout_seconds: args.idle_timeout.map(whole_seconds),
            idle_action: args
                .idle_action
                .as_deref()
                .and_then(sandhub_api::hub::IdleAction::parse),
            auto_resume: args.auto_resume.then_some(true),
            network: args.network.spec(),
            secrets: Vec::new(),
            volumes: args.volumes,
        })
        .await?;
    output::show(args.client.output, &sandbox, || &sandbox.id)?;
    Ok(0)
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only sandboxes with this label, repeatable (env: comma-separated).
    #[arg(long = "label", value_name = "KEY=VALUE", env = "SANDHUB_LABELS",
          value_delimiter = ',', value_parser = parse_key_value)]
    labels: Vec<(String, String)>,

    #[command(flatten)]
    client: ClientArgs,
}

pub async fn list(args: ListArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let sandboxes = hub.list(&to_map(args.labels)).await?;
    output::show(args.client.output, &sandboxes, || {
        sandbox_table(&sandboxes, SystemTime::now())
    })?;
    Ok(0)
}

fn sandbox_table(sandboxes: &[Sandbox], now: SystemTime) -> String {
    let rows: Vec<Vec<String>> = sandboxes
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.template.clone(),
                s.state.as_str().to_string(),
                launch(s).to_string(),
                output::age(&s.created_at, now),
                output::pairs(&s.labels),
            ]
        })
        .collect();
    output::table(
        &["ID", "TEMPLATE", "STATE", "LAUNCH", "AGE", "LABELS"],
        &rows,
    )
}

fn launch(s: &Sandbox) -> &'static str {
    match s.launch {
        sandhub_api::hub::Launch::Warm => "warm",
        sandhub_api::hub::Launch::Cold => "cold",
    }
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// Sandbox ids.
    #[arg(required = true, value_name = "ID")]
    ids: Vec<String>,

    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Serialize)]
struct Removed<'a> {
    deleted: Vec<&'a str>,
}

/// Deletes all ids concurrently (a delete stops processes, which takes a
/// moment each) and reports every failure, not just the first.
pub async fn remove(args: RemoveArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let results =
        futures::future::join_all(args.ids.iter().map(|id| hub.delete(id.as_str()))).await;
    let mut deleted = Vec::new();
    let mut failed = false;
    for (id, result) in args.ids.iter().zip(results) {
        match result {
            Ok(()) => deleted.push(id.as_str()),
            Err(e) => {
                failed = true;
                // With several ids, each failure must say which one it is.
                if e.message.contains(id.as_str()) {
                    eprintln!("error: {e}");
                } else {
                    eprintln!("error: {}: {id}: {}", e.code, e.message);
                }
            }
        }
    }
    match args.client.output {
        Output::Text => {
            for id in &deleted {
                output::line(id)?;
            }
        }
        Output::Json => output::json(&Removed { deleted })?,
    }
    Ok(i32::from(failed))
}

#[derive(Debug, Args)]
pub struct IdArgs {
    /// Sandbox id.
    id: String,

    #[command(flatten)]
    client: ClientArgs,
}

pub async fn suspend(args: IdArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    print_state(&hub.suspend(&args.id).await?, args.client.output)
}

pub async fn pause(args: IdArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    print_state(&hub.pause(&args.id).await?, args.client.output)
}

pub async fn resume(args: IdArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    print_state(&hub.resume(&args.id).await?, args.client.output)
}

pub async fn reset(args: IdArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    print_state(&hub.reset(&args.id).await?, args.client.output)
}

fn print_state(sandbox: &Sandbox, format: Output) -> Result<i32> {
    output::show(format, sandbox, || {
        format!("{} {}", sandbox.id, sandbox.state.as_str())
    })?;
    Ok(0)
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// Sandbox id to fork.
    id: String,

    /// Fork from this snapshot instead of a fresh one.
    #[arg(long, env = "SANDHUB_SNAPSHOT")]
    snapshot: Option<String>,

    /// A label for the new sandbox, repeatable (env: comma-separated).
    #[arg(long = "label", value_name = "KEY=VALUE", env = "SANDHUB_LABELS",
          value_delimiter = ',', value_parser = parse_key_value)]
    labels: Vec<(String, String)>,

    #[command(flatten)]
    client: ClientArgs,
}

/// Prints the new sandbox's id.
pub async fn fork(args: ForkArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let sandbox = hub
        .fork(
            &args.id,
            ForkRequest {
                snapshot: args.snapshot,
                labels: to_map(args.labels),
            },
        )
        .await?;
    output::show(args.client.output, &sandbox, || &sandbox.id)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandhub_api::hub::{Launch, SandboxState};
    use std::collections::BTreeMap;

    #[test]
    fn table_rows() {
        let now = humantime::parse_rfc3339("2026-01-01T00:10:00Z").unwrap();
        let sandbox = Sandbox {
            id: "sb-1".into(),
            template: "default".into(),
            state: SandboxState::Ready,
            labels: BTreeMap::from([("team".into(), "rl".into())]),
            launch: Launch::Warm,
            created_at: "2026-01-01T00:00:00.000Z".into(),
            shutdown_at: None,
            idle_timeout_seconds: None,
            idle_action: None,
            auto_resume: false,
            pool: None,
            forked_from: None,
            entrypoint: None,
            egress: None,
            network: None,
            usage: None,
        };
        assert_eq!(
            sandbox_table(&[sandbox], now),
            "ID     TEMPLATE   STATE   LAUNCH   AGE   LABELS\n\
             sb-1   default    Ready   warm     10m   team=rl"
        );
    }
}
