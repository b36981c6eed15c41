//! `sandhub image import|ls|rm|prune`: the hub's image store (local
//! backend).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use sandhub_api::hub::Image;
use sandhub_client::Result;

use super::{output, ClientArgs};

#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,

    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Import an OCI layout (directory or tar) or a `docker save` tar.
    Import {
        /// The archive file, or an OCI layout directory (sent as a tar).
        path: PathBuf,
        /// `name:tag` for the image (default: the archive's own tag).
        #[arg(long, env = "SANDHUB_IMAGE_TAG")]
        tag: Option<String>,
        /// Which image of an OCI layout holding several (its
        /// `org.opencontainers.image.ref.name`, e.g. `app:1`).
        #[arg(long = "ref", env = "SANDHUB_IMAGE_REF")]
        pick: Option<String>,
    },
    /// List images.
    Ls,
    /// Remove a tag, or an image by id or by its last tag.
    Rm {
        /// `name:tag` or `sha256:<id>`.
        reference: String,
    },
    /// Remove untagged images no template uses, and unused layers.
    Prune,
}

pub async fn run(args: ImageArgs) -> Result<i32> {
    let hub = args.client.connect()?;
    let format = args.client.output;
    match args.command {
        ImageCommand::Import { path, tag, pick } => {
            let image = hub
                .import_image_path(&path, tag.as_deref(), pick.as_deref())
                .await?;
            output::show(format, &image, || image.id.clone())?;
        }
        ImageCommand::Ls => {
            let images = hub.list_images().await?;
            output::show(format, &images, || table(&images))?;
        }
        ImageCommand::Rm { reference } => {
            let image = hub.remove_image(&reference).await?;
            output::show(format, &image, || image.id.clone())?;
        }
        ImageCommand::Prune => {
            let r = hub.prune_images().await?;
            output::show(format, &r, || {
                format!(
                    "{} images, {} layers, {} blobs removed",
                    r.images.len(),
                    r.layers,
                    r.blobs
                )
            })?;
        }
    }
    Ok(0)
}

fn table(images: &[Image]) -> String {
    let rows: Vec<Vec<String>> = images
        .iter()
        .map(|i| {
            vec![
                if i.tags.is_empty() {
                    "<none>".into()
                } else {
                    i.tags.join(",")
                },
                i.id.chars().take(19).collect(),
                i.layers.len().to_string(),
                i.size_bytes.to_string(),
            ]
        })
        .collect();
    output::table(&["TAGS", "ID", "LAYERS", "SIZE_BYTES"], &rows)
}
