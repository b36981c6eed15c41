//! `sandhub volume create|ls|get|rm|cp|snapshot`: named volumes, a
//! tenant's disk that outlives its sandboxes (local backend), their files
//! with no sandbox running, and their snapshots.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use sandhub_api::volumes::{CreateVolume, SnapshotRef, Volume, VolumeSnapshot};
use sandhub_client::Result;

use super::{output, ClientArgs, Output};

#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    command: VolumeCommand,

    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Subcommand)]
enum VolumeCommand {
    /// Create an empty volume.
    Create {
        /// Volume name (a DNS-1123 label).
        name: String,
        /// Most MiB its files may take.
        #[arg(long)]
        size_mb: u64,
        /// A label, `KEY=VALUE` (repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Start as a copy of a snapshot, `VOLUME@SNAPSHOT`.
        #[arg(long, value_name = "VOLUME@SNAPSHOT")]
        from_snapshot: Option<String>,
    },
    /// Copy files between here and a volume, with no sandbox running:
    /// `sandhub volume cp ./local VOL:/path` or `VOL:/path ./local`.
    Cp {
        /// A local path, `-` for stdin, or VOLUME:path.
        src: String,
        /// A local path, `-` for stdout, or VOLUME:path.
        dst: String,
        /// Copy directories and their contents (empty directories and
        /// symbolic links are skipped).
        #[arg(short, long)]
        recursive: bool,
    },
    /// Take a read-only snapshot of a volume.
    Snapshot {
        /// Volume name.
        volume: String,
        /// Snapshot name (a DNS-1123 label).
        snapshot: String,
    },
    /// List a volume's snapshots.
    Snapshots {
        /// Volume name.
        volume: String,
    },
    /// Delete a volume's snapshot.
    RmSnapshot {
        /// Volume name.
        volume: String,
        /// Snapshot name.
        snapshot: String,
    },
    /// List volumes.
    Ls,
    /// Show one volume.
    Get {
        /// Volume name.
        name: String,
    },
    /// Delete a volume and every file in it.
    Rm {
        /// Volume name.
        name: String,
    },
}

fn parse_label(s: &str) -> std::result::Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

pub async fn run(args: VolumeArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let format = args.client.output;
    match args.command {
        VolumeCommand::Create {
            name,
            size_mb,
            labels,
            from_snapshot,
        } => {
            let request = CreateVolume {
                name,
                size_mb,
                labels: labels.into_iter().collect::<BTreeMap<_, _>>(),
                access_mode: None,
                from_snapshot: from_snapshot.map(SnapshotRef::Text),
            };
            let volume = hub.create_volume(&request).await?;
            output::show(format, &volume, || &volume.name)?;
        }
        VolumeCommand::Ls => {
            let volumes = hub.list_volumes().await?;
            output::show(format, &volumes, || volume_table(&volumes))?;
        }
        VolumeCommand::Get { name } => {
            let volume = hub.get_volume(&name).await?;
            output::show(format, &volume, || {
                volume_table(std::slice::from_ref(&volume))
            })?;
        }
        VolumeCommand::Rm { name } => {
            hub.delete_volume(&name).await?;
            if format == Output::Text {
                output::line(&name)?;
            }
        }
        VolumeCommand::Cp {
            src,
            dst,
            recursive,
        } => {
            return super::cp::copy(
                hub,
                &src,
                &dst,
                recursive,
                super::cp::Remote::Volume,
                format,
            )
            .await
        }
        VolumeCommand::Snapshot { volume, snapshot } => {
            let snap = hub.create_volume_snapshot(&volume, &snapshot).await?;
            output::show(format, &snap, || format!("{}@{}", snap.volume, snap.name))?;
        }
        VolumeCommand::Snapshots { volume } => {
            let snaps = hub.list_volume_snapshots(&volume).await?;
            output::show(format, &snaps, || snapshot_table(&snaps))?;
        }
        VolumeCommand::RmSnapshot { volume, snapshot } => {
            hub.delete_volume_snapshot(&volume, &snapshot).await?;
            if format == Output::Text {
                output::line(&format!("{volume}@{snapshot}"))?;
            }
        }
    }
    Ok(0)
}

fn snapshot_table(snaps: &[VolumeSnapshot]) -> String {
    let rows: Vec<Vec<String>> = snaps
        .iter()
        .map(|s| vec![format!("{}@{}", s.volume, s.name), s.created_at.clone()])
        .collect();
    output::table(&["SNAPSHOT", "CREATED"], &rows)
}

fn volume_table(volumes: &[Volume]) -> String {
    let rows: Vec<Vec<String>> = volumes
        .iter()
        .map(|v| {
            vec![
                v.name.clone(),
                v.size_mb.to_string(),
                output::pairs(&v.labels),
                v.created_at.clone(),
            ]
        })
        .collect();
    output::table(&["NAME", "SIZE_MB", "LABELS", "CREATED"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_labels() {
        let v = Volume {
            name: "data".into(),
            size_mb: 64,
            labels: [("team".to_string(), "ml".to_string())].into(),
            created_at: "2026-12-05T01:00:00.000Z".into(),
            access_mode: None,
        };
        assert_eq!(
            volume_table(&[v]),
            "NAME   SIZE_MB   LABELS    CREATED\ndata   64        team=ml   2026-12-05T01:00:00.000Z"
        );
        assert_eq!(parse_label("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_label("ab").is_err());
    }
}
