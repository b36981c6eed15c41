//! `sandhub snapshot ID` (take one), `snapshot ls ID`, `snapshot rm ID SNAP...`.

use clap::{Args, Subcommand};
use sandhub_client::{Result, Sandboxes};
use serde::Serialize;

use super::{output, ClientArgs, Output};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: Option<SnapshotCommand>,

    /// Sandbox id to snapshot; prints the snapshot id, which `fork
    /// --snapshot` takes.
    #[arg(required = true)]
    id: Option<String>,

    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// List the snapshots of a sandbox (also once it is deleted).
    Ls {
        /// Sandbox id.
        id: String,
    },
    /// Delete snapshots of a sandbox and the disk space they hold.
    Rm {
        /// Sandbox id the snapshots were taken of.
        id: String,
        /// Snapshot ids.
        #[arg(required = true, value_name = "SNAPSHOT")]
        snapshots: Vec<String>,
    },
}

pub async fn run(args: SnapshotArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let format = args.client.output;
    match (args.command, args.id) {
        (Some(SnapshotCommand::Ls { id }), _) => {
            let snapshots = hub.list_snapshots(&id).await?;
            match format {
                Output::Json => output::json(&snapshots)?,
                Output::Text => {
                    let rows: Vec<Vec<String>> = snapshots
                        .iter()
                        .map(|s| {
                            vec![
                                s.id.clone(),
                                s.created_at.clone(),
                                output::optional(&s.size_bytes),
                            ]
                        })
                        .collect();
                    output::line(output::table(&["ID", "CREATED", "BYTES"], &rows).trim_end())?;
                }
            }
            Ok(0)
        }
        (Some(SnapshotCommand::Rm { id, snapshots }), _) => {
            remove(&hub, &id, &snapshots, format).await
        }
        (None, Some(id)) => {
            let snapshot = hub.snapshot(&id).await?;
            output::show(format, &snapshot, || &snapshot.id)?;
            Ok(0)
        }
        // clap requires the id when there is no subcommand.
        (None, None) => Ok(2),
    }
}

#[derive(Serialize)]
struct Removed<'a> {
    deleted: Vec<&'a str>,
}

/// Deletes each snapshot in turn and reports every failure, not just the
/// first; exits 1 if any failed.
async fn remove(
    hub: &impl Sandboxes,
    id: &str,
    snapshots: &[String],
    format: Output,
) -> Result<i32> {
    let mut deleted = Vec::new();
    let mut failed = false;
    for snap in snapshots {
        match hub.delete_snapshot(id, snap).await {
            Ok(()) => deleted.push(snap.as_str()),
            Err(e) => {
                failed = true;
                eprintln!("error: {e}");
            }
        }
    }
    match format {
        Output::Text => {
            for snap in &deleted {
                output::line(snap)?;
            }
        }
        Output::Json => output::json(&Removed { deleted })?,
    }
    Ok(i32::from(failed))
}
