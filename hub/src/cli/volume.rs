//! `sandhub volume create|ls|get|rm`: named volumes, a tenant's disk that
//! outlives its sandboxes (local backend).

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use sandhub_api::volumes::{CreateVolume, Volume};
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
        } => {
            let request = CreateVolume {
                name,
                size_mb,
                labels: labels.into_iter().collect::<BTreeMap<_, _>>(),
                access_mode: None,
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
    }
    Ok(0)
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
